# -*- coding: utf-8 -*-
"""Point an inventory group at its recorded profile (controller layer; ``python -m cluster_preflight baseline``).

The line is ``profile_file: "{{ inventory_dir }}/profiles/<group>.yml"`` (an absolute path when the profile is
not beside the inventory file), in ``group_vars/<group>.yml`` next to the inventory file, where Ansible reads it
for that group.  The file is created, or the line appended to it (atomically, every other line kept), only when
nothing sets ``profile_file`` for the group yet; otherwise nothing is edited and the exact line is printed for
the operator, with where the current value comes from.  Nothing here runs a play or templates a variable.
"""

from __future__ import annotations

import os

import yaml

from ..verdict.accounting import atomic_write
from ..outputs.cluster_names import load_inventory

PROFILE_VAR = "profile_file"
INVENTORY_DIR = "{{ inventory_dir }}"


def profile_value(inventory, profile_path):
    """What ``profile_file`` should say: relative to ``{{ inventory_dir }}`` when the profile is under the inventory
    file's directory (the cluster's directory moves with it), else the absolute path."""
    base = os.path.dirname(os.path.abspath(inventory))
    path = os.path.abspath(profile_path)
    if os.path.commonpath([base, path]) == base:
        return "%s/%s" % (INVENTORY_DIR, os.path.relpath(path, base))
    return path


def line(value):
    """The YAML line that sets ``profile_file`` to ``value``."""
    return "%s: %s" % (PROFILE_VAR, yaml.safe_dump(value, default_style='"', width=10000).strip())


def _inventory_value(inventory, group):
    """The ``profile_file`` the inventory file itself sets for ``group`` or for one of its nodes (untemplated), or
    "".  A parent group's value does not count: the group's own group_vars file overrides it."""
    manager, _variables = load_inventory(inventory)
    found = manager.groups.get(group)
    if found is None:
        return ""
    values = [found.get_vars().get(PROFILE_VAR)] + [host.get_vars().get(PROFILE_VAR) for host in found.get_hosts()]
    return next((str(value) for value in values if value), "")


def _read_mapping(path):
    """``(text, mapping)`` of an existing group_vars file; ``(None, {})`` when there is none; ValueError when it is
    not a YAML mapping this can append to."""
    if not os.path.exists(path):
        return None, {}
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError("%s is not YAML (%s)" % (path, str(exc).splitlines()[0])) from None
    if data is None:
        return text, {}
    if not isinstance(data, dict):
        raise ValueError("%s is not a mapping of variables" % path)
    return text, data


def wire(inventory, group, profile_path):
    """Point ``group`` at ``profile_path``: ``(state, text)`` with state ``written`` (group_vars file created or
    line added), ``already`` (it points there) or ``printed`` (left as it is: ``text`` holds the exact line to
    set and why it was not written)."""
    value = profile_value(inventory, profile_path)
    wanted = line(value)
    if isinstance(inventory, (list, tuple)) or os.path.isdir(inventory):
        return "printed", ("set it for group %s yourself (%s): %s" % (
            group, "several inventory sources" if isinstance(inventory, (list, tuple)) else "a directory inventory",
            wanted))
    path = os.path.join(os.path.dirname(os.path.abspath(inventory)), "group_vars", "%s.yml" % group)
    try:
        text, data = _read_mapping(path)
    except (OSError, ValueError) as exc:
        return "printed", "%s; add this line to it yourself: %s" % (exc, wanted)
    current = str(data.get(PROFILE_VAR) or "") if PROFILE_VAR in data else _inventory_value(inventory, group)
    if current in (value, os.path.abspath(profile_path)):
        return "already", "%s already sets %s" % (path if PROFILE_VAR in data else inventory, wanted)
    if current:
        where = path if PROFILE_VAR in data else "the inventory (%s or its host/group vars)" % inventory
        return "printed", ("group %s already has profile_file %s from %s: left as it is; to use the new profile "
                           "there, set: %s" % (group, current, where, wanted))
    new = (text or "---\n") + ("" if not text or text.endswith("\n") else "\n") + wanted + "\n"
    parsed = yaml.safe_load(new)
    if not isinstance(parsed, dict) or parsed.get(PROFILE_VAR) != value:
        return "printed", "%s cannot take a line appended at its end; add it yourself: %s" % (path, wanted)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        mode = os.stat(path).st_mode & 0o777 if text is not None else 0o644
        atomic_write(path, new, mode=mode)
    except OSError as exc:
        return "printed", "%s could not be written (%s); add this line yourself: %s" % (path, exc.strerror or exc,
                                                                                        wanted)
    return "written", "%s %s: %s" % (path, "now has" if text is not None else "created with", wanted)
