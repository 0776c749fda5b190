# -*- coding: utf-8 -*-
"""Where a role declares its inputs, read the same way by the settings pipeline, the variable reference and the
tests.

A role's inputs are its argument specs: ``meta/argument_specs.yml``, or the ``argument_specs`` of
``meta/main.yml`` (Ansible reads either).  Their values when nothing sets them are the role's defaults:
``defaults/main.yml`` when the role has one (a role that runs tasks in bring-up needs it: Ansible applies it when
the role runs), else each option's ``default`` in the specs (a role that only reads and judges is never run as a
role, so its specs alone declare its inputs, once).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Tuple

SPECS_FILE = os.path.join("meta", "argument_specs.yml")
META_FILE = os.path.join("meta", "main.yml")
DEFAULTS_FILE = os.path.join("defaults", "main.yml")

# load(path, templated) -> the YAML at ``path``; ``templated``: its strings may be templates the run renders.
Loader = Callable[[str, bool], Any]


def specs_path(role_dir: str) -> str:
    """The file holding the role's argument specs (``meta/argument_specs.yml`` first), or "" when none does."""
    for name in (SPECS_FILE, META_FILE):
        path = os.path.join(role_dir, name)
        if os.path.isfile(path) and (name == SPECS_FILE or _has_specs(path)):
            return path
    return ""


def _has_specs(path):
    with open(path, encoding="utf-8") as handle:
        return any(line.startswith("argument_specs:") for line in handle)


def defaults_path(role_dir: str) -> str:
    """The role's ``defaults/main.yml``, or "" when its specs hold its defaults."""
    path = os.path.join(role_dir, DEFAULTS_FILE)
    return path if os.path.isfile(path) else ""


def role_inputs(role_dir: str, load: Loader) -> Tuple[Dict[str, Any], Dict[str, dict], Dict[str, Any]]:
    """``(defaults, options, main)`` of the role at ``role_dir``: the value of each input when nothing sets it, its
    argument-spec option (type, choices, description), and the specs' entry point ``main`` (its descriptions).
    OSError when the role declares no inputs."""
    path = specs_path(role_dir)
    if not path:
        raise OSError("%s has neither %s nor argument_specs in %s" % (role_dir, SPECS_FILE, META_FILE))
    defaults_file = defaults_path(role_dir)
    specs = load(path, not defaults_file) or {}
    main = ((specs.get("argument_specs") or {}).get("main")) or {}
    options = main.get("options") or {}
    if defaults_file:
        defaults = load(defaults_file, True) or {}
    else:
        defaults = {name: (option or {}).get("default") for name, option in options.items()}
    return defaults, options, main
