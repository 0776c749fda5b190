"""The commands of README.md's "The first five minutes", step by step, as the README has them at test time: the
lines of each step's ``bash`` blocks (comments and blank lines left out).  The README-as-written tests run exactly
these, so a command changed in the README is the command tested.  Test-side, not shipped."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
SECTION = "## The first five minutes"


def readme_steps(path=README):
    """``{step number: [command, ...]}`` of the README's first-five-minutes section."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start:end if end != -1 else len(text)]
    steps, current, in_block = {}, None, False
    for line in section.splitlines():
        item = re.match(r"^(\d+)\. \*\*", line)
        if item and not in_block:
            current = int(item.group(1))
            steps.setdefault(current, [])
            continue
        fence = line.strip()
        if fence.startswith("```"):
            in_block = fence == "```bash" if not in_block else False
            continue
        if in_block and current is not None:
            command = fence
            if command and not command.startswith("#"):
                steps[current].append(command)
    return steps


def inventory_of(commands):
    """The ``-i`` argument of the first command that has one (the cluster's inventory, as the README names it)."""
    for command in commands:
        match = re.search(r"(?:^|\s)-i\s+(\S+)", command)
        if match:
            return match.group(1)
    raise ValueError("no command with -i in %r" % (commands,))
