# -*- coding: utf-8 -*-
"""The reference of the capabilities and their variables, ``docs/variables.md``, generated from the capability
registry and every role's argument specs.

First the capabilities, one row each in verdict order, from the registry (``module_utils/preflight_node/registry.py``:
what each reads, probes, is judged by and writes) and its role's ``short_description``: the one table of
capabilities the README, ``docs/architecture.md`` and ``docs/gate.md`` point to.  Then one section per role,
``preflight`` first, then the others by name: each role's entry point ``main`` lists its options with type,
choices and description; the default is the option's ``default`` when the spec has one, else the value in the
role's ``defaults/main.yml`` (``role_files.py``).

    python -m cluster_preflight.settings.variables_doc            # print the Markdown
    python -m cluster_preflight.settings.variables_doc --write    # regenerate docs/variables.md
    python -m cluster_preflight.settings.variables_doc --check    # exit 1 when docs/variables.md is stale
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import yaml

from cluster_preflight.settings.role_files import defaults_path, role_inputs, specs_path
from preflight_node import registry

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUTPUT = os.path.join("docs", "variables.md")
COMMAND = ".venv/bin/python -m cluster_preflight.settings.variables_doc --write"
FIRST = "preflight"
NO_DEFAULT = object()

# Ansible's documentation markup in descriptions: C(code), I(italic), B(bold), V(value), O(option).
_MARKUP = re.compile(r"\b([CIBVO])\(([^()]*)\)")


def _load(path):
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def roles(root):
    """Role names that declare argument specs, ``preflight`` first, then by name."""
    base = os.path.join(root, "roles")
    names = sorted(name for name in os.listdir(base) if specs_path(os.path.join(base, name)))
    return sorted(names, key=lambda name: (name != FIRST, name))


def _relative(root, path):
    return os.path.relpath(path, root).replace(os.sep, "/")


def _yes(flag, text="yes"):
    return text if flag else "–"


def capabilities_table(root):
    """The capabilities in verdict order: what each is, whether it reads, probes, is judged by the health check and
    writes in bring-up, the stages its outcome comes from, and where its checks and variables are."""
    lines = ["## Capabilities", "",
             "Every capability, in verdict order, as the registry (`module_utils/preflight_node/registry.py`) declares "
             "it: its checks are named `<capability>.<check>` in the verdict, its variables carry `<capability>_` as "
             "prefix (its section below). How to add one: [adding-a-capability.md](adding-a-capability.md).", "",
             "| capability | what it checks | reads the node | probe | health check | writes in bring-up | "
             "outcome also from |", "|---|---|---|---|---|---|---|"]
    for item in registry.CAPABILITIES:
        role = os.path.join(root, "roles", item.name)
        main = role_inputs(role, _load_templated)[2] if specs_path(role) else {}
        readme = os.path.join(role, "README.md")
        name = "[`%s`](#%s)" % (item.name, item.name)
        if os.path.isfile(readme):
            name += " ([README](%s))" % _relative(os.path.join(root, "docs"), readme)
        probe = _yes(item.probe, "after the all-reduce" if item.after_job else "yes")
        lines.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            name, _cell(_markup(" ".join(str(main.get("short_description") or "").split()))), _yes(item.reader),
            probe, _yes(item.local), _cell(item.bringup[0]) if item.bringup else "–",
            _cell(", ".join(item.stages)) or "–"))
    return "\n".join(lines) + "\n"


def _load_templated(path, _templated):
    return _load(path)


def _markup(text):
    def replace(match):
        kind, inner = match.groups()
        if kind == "I":
            return "*%s*" % inner
        if kind == "B":
            return "**%s**" % inner
        return "`%s`" % inner
    return _MARKUP.sub(replace, text)


def _paragraphs(description):
    """A description (a string or a list of strings) as a list of one-line paragraphs."""
    if description is None:
        return []
    items = description if isinstance(description, list) else [description]
    return [_markup(" ".join(str(item).split())) for item in items if str(item).strip()]


def _cell(text):
    """Text safe inside a Markdown table cell: no line breaks, ``|`` escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _plain(text):
    """Whether YAML reads ``text`` unquoted as this same string."""
    try:
        return yaml.safe_load(text) == text
    except yaml.YAMLError:
        return False


def _value(value):
    """A default as YAML flow text in a code span."""
    if value is NO_DEFAULT:
        return "–"
    if isinstance(value, str):
        text = value if value and value == value.strip() and _plain(value) else json.dumps(value, ensure_ascii=False)
    else:
        text = yaml.safe_dump(value, default_flow_style=True, width=10 ** 6).strip()
        if text.endswith("..."):
            text = text[:-3].strip()
    if "`" in text:
        return "``` %s ```" % text
    return "`%s`" % text


def _type(spec):
    kind = spec.get("type", "str")
    if spec.get("elements"):
        kind = "%s of %s" % (kind, spec["elements"])
    if spec.get("required"):
        kind += ", required"
    return kind


def _choices(spec):
    if "choices" not in spec:
        return ""
    return ", ".join(_value(choice) for choice in spec["choices"])


def _rows(options, defaults, prefix=""):
    rows = []
    for name, spec in (options or {}).items():
        spec = spec or {}
        full = prefix + name
        if "default" in spec:
            default = spec["default"]
        elif not prefix and name in defaults:
            default = defaults[name]
        else:
            default = NO_DEFAULT
        rows.append("| `%s` | %s | %s | %s | %s |" % (
            _cell(full), _cell(_type(spec)), _cell(_value(default)), _cell(_choices(spec)),
            _cell(" ".join(_paragraphs(spec.get("description"))))))
        if spec.get("options"):
            rows += _rows(spec["options"], {}, prefix=full + "[]." if spec.get("type") == "list" else full + ".")
    return rows


def section(root, role):
    """The Markdown section of one role."""
    base = os.path.join(root, "roles", role)
    defaults, _options, main = role_inputs(base, _load_templated)
    lines = ["## %s" % role, ""]
    if main.get("short_description"):
        lines += [_markup(" ".join(str(main["short_description"]).split())), ""]
    for paragraph in _paragraphs(main.get("description")):
        lines += [paragraph, ""]
    spec = _relative(root, specs_path(base))
    sources = "Spec: [`%s`](../%s)" % (spec, spec)
    if defaults_path(base):
        sources += "; defaults: [`roles/%s/defaults/main.yml`](../roles/%s/defaults/main.yml)" % (role, role)
    lines += [sources + ".", ""]
    rows = _rows(main.get("options"), defaults if defaults_path(base) else {})
    if rows:
        lines += ["| variable | type | default | choices | description |", "|---|---|---|---|---|"] + rows
    else:
        lines.append("No variables.")
    return "\n".join(lines) + "\n"


def render(root=ROOT):
    """``docs/variables.md`` as it should read for the checkout at ``root``."""
    names = roles(root)
    head = [
        "# Capabilities and variables",
        "",
        "<!-- Generated from module_utils/preflight_node/registry.py and roles/*/meta by `%s`. Do not edit by "
        "hand. -->" % COMMAND,
        "",
        "Every capability, then every variable of every role, as its argument specs type it. Settings of the run as "
        "a whole are in `preflight`; each capability's variables carry its role's name as prefix. All of them are "
        "loaded, typed and validated on the controller before anything runs on a node. A default of – means the "
        "role sets none. Set them per node or group in the inventory, or with `-e`.",
        "",
        "Regenerate this page after changing the registry or a spec: `%s`." % COMMAND,
        "",
    ]
    head += ["- [Capabilities](#capabilities)"] + ["- [%s](#%s)" % (name, name) for name in names] + [""]
    return "\n".join(head) + "\n" + capabilities_table(root) + "\n" + "\n".join(section(root, name) for name in names)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m cluster_preflight.settings.variables_doc",
                                     description="Generate docs/variables.md from the capability registry and the roles' "
                                                 "argument specs.")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="regenerate docs/variables.md")
    group.add_argument("--check", action="store_true", help="exit 1 when docs/variables.md is stale")
    parser.add_argument("--root", default=ROOT, help="repository root (default: this checkout)")
    args = parser.parse_args(argv)
    text = render(args.root)
    path = os.path.join(args.root, OUTPUT)
    if args.write:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        print("wrote %s" % path)
        return 0
    if args.check:
        try:
            with open(path, encoding="utf-8") as handle:
                current = handle.read()
        except OSError:
            current = None
        if current != text:
            print("%s is stale: run %s" % (OUTPUT, COMMAND), file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
