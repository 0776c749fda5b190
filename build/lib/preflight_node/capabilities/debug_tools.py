# -*- coding: utf-8 -*-
"""Capability ``debug_tools``, the node half: the OS family and the debug programs a node has.

``read`` reads the OS family (``ID`` / ``ID_LIKE`` of ``/etc/os-release``) and looks for each program
(gdb, strace, pdsh, nmap, py-spy, ...) on the search paths.  What the controller decides from it
(validate, read_args, one check per tool whose fix is the install command of the node's OS family) is in
``cluster_preflight/capabilities/debug_tools/``; the role ``roles/debug_tools`` holds the variables and
the bring-up writers (packages from the distribution's mirror, py-spy into a tools venv).
"""

from __future__ import annotations

import os
import re

CAPABILITY = "debug_tools"

OS_RELEASE = ("/etc/os-release", "/usr/lib/os-release")  # os-release(5): the second is the fallback
PYSPY = "py-spy"
# ansible_facts.os_family names, so the audit and the bring-up role (which gathers os_family) agree.
FAMILIES = (
    ("Debian", ("debian", "ubuntu", "linuxmint", "raspbian", "pop", "kali")),
    ("RedHat", ("rhel", "fedora", "centos", "rocky", "almalinux", "ol", "amzn", "scientific", "cloudlinux",
                "virtuozzo", "eurolinux", "navix")),
    ("Suse", ("suse", "sles", "sled", "opensuse", "opensuse-leap", "opensuse-tumbleweed", "sles_sap")),
    ("Archlinux", ("arch", "archarm", "manjaro")),
    ("Alpine", ("alpine",)),
)
OTHER = "other"


def parse_os_release(text):
    """``KEY=value`` lines of os-release(5), quotes and backslash escapes removed."""
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _sep, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            quote, value = value[0], value[1:-1]
            if quote == '"':
                value = re.sub(r"\\(.)", r"\1", value)
        values[key.strip()] = value
    return values


def os_family(os_id, id_like):
    """``Debian``, ``RedHat``, ``Suse``, ``Archlinux``, ``Alpine`` (as ansible_facts.os_family) or ``other``."""
    for candidate in [os_id] + list(id_like):
        for family, ids in FAMILIES:
            if candidate in ids:
                return family
    return OTHER


def read_os(paths):
    """``{path, id, id_like, version_id, pretty_name, family, error}``; never raises."""
    errors = []
    for path in paths:
        try:
            with open(path, "rb") as handle:
                text = handle.read().decode("utf-8", "replace")
        except FileNotFoundError:
            errors.append("%s does not exist" % path)
            continue
        except (OSError, ValueError) as exc:
            errors.append("cannot read %s: %s" % (path, exc))
            continue
        values = parse_os_release(text)
        os_id = values.get("ID", "").lower()
        id_like = values.get("ID_LIKE", "").lower().split()
        return {"path": path, "id": os_id, "id_like": id_like, "version_id": values.get("VERSION_ID", ""),
                "pretty_name": values.get("PRETTY_NAME", ""), "family": os_family(os_id, id_like), "error": None}
    return {"path": None, "id": "", "id_like": [], "version_id": "", "pretty_name": "", "family": OTHER,
            "error": "; ".join(errors) or "no os-release file to read"}


def find_program(name, directories, extra=()):
    """``{path, unusable}``: the first executable ``name`` in ``directories`` (then ``extra`` full paths)."""
    unusable = []
    for path in [os.path.join(directory, name) for directory in directories] + list(extra):
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return {"path": path, "unusable": unusable}
        if os.path.islink(path) and not os.path.exists(path):
            try:
                target = os.readlink(path)
            except OSError:
                target = "?"
            unusable.append("%s is a link to %s, which does not exist" % (path, target))
        elif os.path.isfile(path):
            unusable.append("%s is not executable" % path)
    return {"path": None, "unusable": unusable}


def read(args, ops):
    """``{os, programs, search_paths, venv_program}``.

    ``os`` is :func:`read_os`; ``programs`` maps each program to :func:`find_program`;
    ``venv_program`` is ``{path, exists}`` of the tools venv's py-spy (pip method), else None.
    Reads files only; ``ops`` is not needed.
    """
    directories = list(args.get("search_paths") or [])
    extra = args.get("extra_paths") or {}
    programs = dict((name, find_program(name, directories, extra.get(name, ())))
                    for name in args.get("programs") or [])
    venv = args.get("venv_program")
    return {
        "os": read_os(args.get("os_release") or OS_RELEASE),
        "programs": programs,
        "search_paths": directories,
        "venv_program": {"path": venv, "exists": bool(venv and os.path.isfile(venv) and os.access(venv, os.X_OK))}
        if venv else None,
    }
