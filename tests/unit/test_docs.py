"""The documentation: the generated variable reference is current, the README stays short, and every
relative Markdown link (and its #anchor) points at something that exists."""

import glob
import os
import re

import pytest

from cluster_preflight.settings import variables_doc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
README_MAX_LINES = 160

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def markdown_files():
    files = [README] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    files += sorted(glob.glob(os.path.join(ROOT, "roles", "*", "README.md")))
    files += [path for path in [os.path.join(ROOT, "bench", "README.md")] if os.path.isfile(path)]
    return files


def prose_lines(path):
    """The lines of a Markdown file outside fenced code blocks."""
    fenced = False
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if FENCE.match(line):
                fenced = not fenced
                continue
            if not fenced:
                yield line


def links(path):
    """Relative link targets of a Markdown file (code spans and code blocks left out)."""
    for line in prose_lines(path):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if not SCHEME.match(target):
                yield target


def slug(heading):
    """The anchor GitHub gives a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    found, seen = set(), {}
    for line in prose_lines(path):
        found.update(HTML_ANCHOR.findall(line))
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else "%s-%d" % (base, count))
    return found


def test_variables_doc_is_current():
    path = os.path.join(ROOT, variables_doc.OUTPUT)
    with open(path, encoding="utf-8") as handle:
        current = handle.read()
    assert current == variables_doc.render(ROOT), (
        "%s is stale: run %s" % (variables_doc.OUTPUT, variables_doc.COMMAND))


def test_variables_doc_covers_every_option_of_every_role():
    from capability_helpers import role_inputs  # pylint: disable=import-outside-toplevel

    text = variables_doc.render(ROOT)

    for role in sorted(os.listdir(os.path.join(ROOT, "roles"))):
        assert "\n## %s\n" % role in text
        for name in role_inputs(role)[1]:
            assert "| `%s` |" % name in text, name


def test_variables_doc_escapes_pipes_and_joins_list_descriptions(tmp_path):
    meta = tmp_path / "roles" / "demo" / "meta"
    meta.mkdir(parents=True)
    (meta / "argument_specs.yml").write_text(
        "argument_specs:\n  main:\n    short_description: Demo.\n    options:\n"
        "      demo_filter:\n        type: str\n        default: \"{{ x | int }}\"\n"
        "        description:\n          - First | part.\n          - Second part.\n"
        "      demo_mode:\n        type: str\n        choices: [soft, \"off\"]\n        description: Mode.\n",
        encoding="utf-8")
    (tmp_path / "roles" / "demo" / "defaults").mkdir()
    (tmp_path / "roles" / "demo" / "defaults" / "main.yml").write_text("demo_mode: soft\n", encoding="utf-8")
    text = variables_doc.render(str(tmp_path))
    assert "| `demo_filter` | str | `\"{{ x \\| int }}\"` |  | First \\| part. Second part. |" in text
    assert "| `demo_mode` | str | `soft` | `soft`, `\"off\"` | Mode. |" in text


def test_variables_doc_check_exits_1_naming_the_command_when_stale(tmp_path, capsys):
    meta = tmp_path / "roles" / "demo" / "meta"
    meta.mkdir(parents=True)
    (meta / "argument_specs.yml").write_text(
        "argument_specs:\n  main:\n    options:\n      demo_x:\n        type: int\n        description: X.\n",
        encoding="utf-8")
    (tmp_path / "docs").mkdir()
    assert variables_doc.main(["--check", "--root", str(tmp_path)]) == 1
    assert variables_doc.COMMAND in capsys.readouterr().err
    assert variables_doc.main(["--write", "--root", str(tmp_path)]) == 0
    assert variables_doc.main(["--check", "--root", str(tmp_path)]) == 0


def test_readme_is_short_and_names_the_two_commands():
    with open(README, encoding="utf-8") as handle:
        text = handle.read()
    assert len(text.splitlines()) <= README_MAX_LINES
    assert "./scripts/preflight" in text
    assert "./scripts/test" in text


@pytest.mark.parametrize("path", markdown_files(), ids=lambda path: os.path.relpath(path, ROOT))
def test_relative_links_point_at_files_that_exist(path):
    broken = []
    for target in links(path):
        file_part, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if not os.path.exists(resolved):
            broken.append("%s (no such file)" % target)
        elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
            broken.append("%s (no such heading)" % target)
    assert not broken, "%s: broken links: %s" % (os.path.relpath(path, ROOT), ", ".join(broken))
