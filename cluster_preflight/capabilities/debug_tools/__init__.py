# -*- coding: utf-8 -*-
"""Capability ``debug_tools``, the controller half: gdb, strace, pdsh, nmap and py-spy on every node.

* reader (node half, ``module_utils/preflight_node/capabilities/debug_tools.py``): the OS family
  (``ID`` / ``ID_LIKE`` of ``/etc/os-release``) and which programs exist on
  ``debug_tools_search_paths``;
* here: ``validate``, ``read_args`` and the decider: one check per tool
  (``tool_gdb``, ``tool_py_spy``, ...) under the drift policy, whose fix is the
  install command of the node's OS family, and a ``packages`` warning when there
  is no package list for that family;
* writers: the role ``debug_tools`` (bring-up): packages from the
  distribution's configured mirror, py-spy into a tools venv from PyPI, a
  local index or a wheel directory (air-gapped clusters).
"""

from __future__ import annotations

from typing import Optional

import os
import re


from preflight_node.capabilities import debug_tools as node_half
from preflight_node.checks import check, not_applicable, passed, warned
from preflight_node.capabilities.debug_tools import FAMILIES, OS_RELEASE, OTHER, PYSPY

from ..common import Args, Checks, Facts, Node, Problems, Settings, off_or_unread, switched_on

CAPABILITY = node_half.CAPABILITY

INSTALL_COMMANDS = {
    "Debian": "apt-get install -y",
    "RedHat": "dnf install -y",
    "Suse": "zypper install -y",
    "Archlinux": "pacman -S --noconfirm",
    "Alpine": "apk add",
}
EPEL_HINT = ("; on RHEL, Rocky and Alma pdsh comes from EPEL: dnf install -y epel-release first (air-gapped: "
             "mirror EPEL next to the distribution's repositories)")
_PACKAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+_:~-]*$")
_PROGRAM_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]*$")
_VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+)*([a-z]+[0-9]*)?(\.post[0-9]+|\.dev[0-9]+)?$")
_URL_RE = re.compile(r"^(https?|file)://\S+$")



# --- settings ------------------------------------------------------------------------------------------


def program_of(package, binaries):
    """The program a package provides: ``debug_tools_binaries`` or the package's own name."""
    return (binaries or {}).get(package, package)


def check_name(program):
    """``py-spy`` -> ``tool_py_spy``: lower-case words joined by underscores."""
    return "tool_" + (re.sub(r"[^a-z0-9]+", "_", program.lower()).strip("_") or "unnamed")


def pyspy_on(settings):
    return switched_on(settings["debug_tools_pyspy"])


def pyspy_venv_program(settings):
    return os.path.join(settings["debug_tools_pyspy_venv"], "bin", PYSPY)


def _problem(name, found, expected, fix):
    return {"name": name, "found": found, "expected": expected, "fix": fix}


def _package_lists(settings, name, problems):
    value = settings.get(name)
    if not isinstance(value, dict):
        problems.append(_problem(name, repr(value), "a mapping of OS family to a list of package names",
                                 "set %s like the default in roles/debug_tools/defaults/main.yml" % name))
        return
    for family, packages in value.items():
        if not isinstance(packages, (list, tuple)):
            problems.append(_problem("%s.%s" % (name, family), repr(packages), "a list of package names",
                                     "write %s.%s as a YAML list, for example [gdb, strace]" % (name, family)))
            continue
        for package in packages:
            if not isinstance(package, str) or not _PACKAGE_RE.match(package):
                problems.append(_problem(
                    "%s.%s" % (name, family), repr(package), "a package name (letters, digits, . + _ : ~ -, "
                    "not starting with -)", "fix the entry: one package name per list entry"))


def _source(value):
    return value if isinstance(value, str) and value.strip() else None


def validate(settings: Settings) -> Problems:
    """Input problems beyond the types and choices of meta/argument_specs.yml."""
    problems = []
    _package_lists(settings, "debug_tools_packages", problems)
    _package_lists(settings, "debug_tools_pyspy_prerequisites", problems)
    binaries = settings.get("debug_tools_binaries")
    if not isinstance(binaries, dict):
        problems.append(_problem("debug_tools_binaries", repr(binaries), "a mapping of package to program name",
                                 "set debug_tools_binaries: {netcat-openbsd: nc}"))
    else:
        for package, program in binaries.items():
            if not isinstance(program, str) or not _PROGRAM_RE.match(program):
                problems.append(_problem(
                    "debug_tools_binaries.%s" % package, repr(program), "a program name without a directory",
                    "give the name of the program the package installs (the directories are "
                    "debug_tools_search_paths)"))
    paths = settings.get("debug_tools_search_paths")
    if not isinstance(paths, (list, tuple)) or not paths:
        problems.append(_problem("debug_tools_search_paths", repr(paths), "a non-empty list of absolute directories",
                                 "set debug_tools_search_paths: [/usr/local/bin, /usr/bin, /bin]"))
    else:
        for path in paths:
            if not isinstance(path, str) or not os.path.isabs(path):
                problems.append(_problem("debug_tools_search_paths", repr(path), "an absolute directory",
                                         "write each directory as an absolute path such as /usr/bin"))
    for name, minimum in (("debug_tools_install_timeout", 1), ("debug_tools_package_cache_valid_time", 0)):
        value = settings.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            problems.append(_problem(name, repr(value), "a whole number of seconds, at least %d" % minimum,
                                     "set %s (default in roles/debug_tools/defaults/main.yml)" % name))
    problems.extend(_pyspy_problems(settings))
    return problems


def _pyspy_problems(settings):
    problems = []
    if not pyspy_on(settings):
        return problems
    method = settings.get("debug_tools_pyspy_method")
    find_links = _source(settings.get("debug_tools_pyspy_find_links"))
    index_url = _source(settings.get("debug_tools_pyspy_index_url"))
    if method == "package":
        if not _source(settings.get("debug_tools_pyspy_package")):
            problems.append(_problem(
                "debug_tools_pyspy_package", repr(settings.get("debug_tools_pyspy_package")),
                "the OS package name of py-spy when debug_tools_pyspy_method is package",
                "set debug_tools_pyspy_package, or debug_tools_pyspy_method: pip (Debian 12 has no py-spy package)"))
        for name, value in (("debug_tools_pyspy_find_links", find_links), ("debug_tools_pyspy_index_url", index_url)):
            if value:
                problems.append(_problem(
                    name, "%s is %s while debug_tools_pyspy_method is package" % (name, value),
                    "%s only with debug_tools_pyspy_method pip" % name,
                    "set debug_tools_pyspy_method: pip to install from it, or leave %s empty" % name))
        return problems
    for name in ("debug_tools_pyspy_venv", "debug_tools_pyspy_link"):
        value = settings.get(name)
        if not isinstance(value, str) or not os.path.isabs(value):
            problems.append(_problem(name, repr(value), "an absolute path", "set %s to an absolute path" % name))
    venv, link = settings.get("debug_tools_pyspy_venv"), settings.get("debug_tools_pyspy_link")
    if isinstance(venv, str) and isinstance(link, str) and os.path.isabs(venv) and \
            (link.rstrip("/") + "/").startswith(venv.rstrip("/") + "/"):
        problems.append(_problem("debug_tools_pyspy_link", "%s is inside the venv %s" % (link, venv),
                                 "a link on PATH outside the tools venv", "set debug_tools_pyspy_link: "
                                 "/usr/local/bin/py-spy"))
    python = settings.get("debug_tools_pyspy_python")
    if not isinstance(python, str) or not python or any(char.isspace() for char in python):
        problems.append(_problem("debug_tools_pyspy_python", repr(python), "one program name or path, such as python3",
                                 "set debug_tools_pyspy_python: python3 (it runs as '<python> -m venv')"))
    version = settings.get("debug_tools_pyspy_version")
    if version not in (None, "") and (not isinstance(version, str) or not _VERSION_RE.match(version)):
        problems.append(_problem("debug_tools_pyspy_version", repr(version), "a release such as 0.4.3, or empty "
                                 "for the latest", "set debug_tools_pyspy_version: \"0.4.3\" (quoted)"))
    if find_links and not (os.path.isabs(find_links) or _URL_RE.match(find_links)):
        problems.append(_problem("debug_tools_pyspy_find_links", repr(find_links),
                                 "an absolute directory on the node holding the py-spy wheel (or an http(s)/file URL)",
                                 "copy the wheel (pip download py-spy==VERSION) to a directory on every node and "
                                 "give its absolute path"))
    if index_url and not _URL_RE.match(index_url):
        problems.append(_problem("debug_tools_pyspy_index_url", repr(index_url),
                                 "the URL of a local package index (http(s):// or file://)",
                                 "give the index's simple URL, such as http://mirror.local/pypi/simple"))
    if find_links and index_url:
        problems.append(_problem(
            "debug_tools_pyspy_find_links", "both debug_tools_pyspy_find_links (%s) and debug_tools_pyspy_index_url "
            "(%s) are set" % (find_links, index_url), "one local source: a wheel directory or an index",
            "keep one: the wheel directory installs with pip --no-index, which would ignore the index"))
    return problems


def wanted_programs(settings):
    """Every program the reader looks for: of every OS family's packages, plus py-spy."""
    binaries = settings.get("debug_tools_binaries") or {}
    programs = set()
    for packages in (settings.get("debug_tools_packages") or {}).values():
        programs.update(program_of(package, binaries) for package in packages or [])
    if pyspy_on(settings):
        programs.add(PYSPY)
    return sorted(programs)


def read_args(settings: Settings, node: Node) -> Args:
    """What :func:`read` needs on ``node``; None when ``debug_tools_enabled`` is off."""
    if not switched_on(settings["debug_tools_enabled"]):
        return None
    extra = {}
    venv_program = None
    if pyspy_on(settings) and settings.get("debug_tools_pyspy_method") == "pip":
        extra[PYSPY] = [settings["debug_tools_pyspy_link"]]
        venv_program = pyspy_venv_program(settings)
    return {
        "os_release": list(OS_RELEASE),
        "search_paths": list(settings["debug_tools_search_paths"]),
        "programs": wanted_programs(settings),
        "extra_paths": extra,
        "venv_program": venv_program,
    }


# --- decider -------------------------------------------------------------------------------------------


def install_command(family):
    return INSTALL_COMMANDS.get(family)


def _describe_os(os_facts):
    if os_facts.get("error"):
        return "the OS is unknown (%s)" % os_facts["error"]
    like = " ID_LIKE=%s" % " ".join(os_facts["id_like"]) if os_facts.get("id_like") else ""
    return "ID=%s%s in %s" % (os_facts.get("id") or "(none)", like, os_facts.get("path"))


def pip_source_args(settings):
    """The pip arguments of the py-spy source: a wheel directory, a local index, or PyPI (none)."""
    find_links = _source(settings.get("debug_tools_pyspy_find_links"))
    index_url = _source(settings.get("debug_tools_pyspy_index_url"))
    if find_links:
        return ["--no-index", "--find-links", find_links]
    if index_url:
        return ["--index-url", index_url]
    return []


def pyspy_requirement(settings):
    version = settings.get("debug_tools_pyspy_version")
    return "%s==%s" % (PYSPY, version) if version else PYSPY


def pyspy_source(settings):
    args = pip_source_args(settings)
    if not args:
        return "PyPI"
    return "the wheel directory %s" % args[2] if args[0] == "--no-index" else "the index %s" % args[1]


def _not_found(program, facts, settings, host):
    entry = (facts.get("programs") or {}).get(program)
    where = ", ".join(facts.get("search_paths") or settings["debug_tools_search_paths"])
    if entry is None:
        return "%s was not looked for on %s (the settings changed after the node was read)" % (program, host)
    text = "%s not found in %s on %s" % (program, where, host)
    if entry.get("unusable"):
        text += " (%s)" % "; ".join(entry["unusable"])
    return text


def _tool_check(program, packages, family, facts, settings, host):
    expected = "%s on the search path (package %s)" % (program, " or ".join(packages))
    entry = (facts.get("programs") or {}).get(program) or {}
    if entry.get("path"):
        return passed("%s at %s" % (program, entry["path"]), expected)
    command = install_command(family)
    by_hand = ("on %s: %s %s" % (host, command, " ".join(packages)) if command
               else "install %s with the package manager of %s" % (" ".join(packages), host))
    fix = "run bringup.yml (it installs from the node's configured package mirror), or %s" % by_hand
    if family == "RedHat" and "pdsh" in packages:
        fix += EPEL_HINT
    return check(settings["debug_tools_drift_policy"], _not_found(program, facts, settings, host), expected, fix)


def _pyspy_check(family, facts, settings, host):
    method = settings["debug_tools_pyspy_method"]
    entry = (facts.get("programs") or {}).get(PYSPY) or {}
    if method == "package":
        expected = "py-spy on the search path (package %s)" % settings["debug_tools_pyspy_package"]
    else:
        expected = "py-spy on the search path (%s from %s in %s, linked from %s)" % (
            pyspy_requirement(settings), pyspy_source(settings), settings["debug_tools_pyspy_venv"],
            settings["debug_tools_pyspy_link"])
    if entry.get("path"):
        return passed("py-spy at %s" % entry["path"], expected)
    found = _not_found(PYSPY, facts, settings, host)
    venv = facts.get("venv_program") or {}
    if method == "package":
        command = install_command(family)
        fix = "run bringup.yml, or %s" % (
            "on %s: %s %s" % (host, command, settings["debug_tools_pyspy_package"]) if command
            else "install %s with the package manager of %s" % (settings["debug_tools_pyspy_package"], host))
    elif venv.get("exists"):
        found += "; %s exists but is not linked" % venv["path"]
        fix = "run bringup.yml, or on %s: ln -sfn %s %s" % (host, venv["path"], settings["debug_tools_pyspy_link"])
    else:
        venv_dir = settings["debug_tools_pyspy_venv"]
        pip = " ".join(["%s/bin/pip install" % venv_dir] + pip_source_args(settings) + [pyspy_requirement(settings)])
        fix = "run bringup.yml, or on %s: %s -m venv %s && %s && ln -sfn %s/bin/py-spy %s" % (
            host, settings["debug_tools_pyspy_python"], venv_dir, pip, venv_dir, settings["debug_tools_pyspy_link"])
        if not pip_source_args(settings):
            fix += ("; without PyPI, put the py-spy wheel (pip download %s) in a directory on the node and set "
                    "debug_tools_pyspy_find_links, or set debug_tools_pyspy_index_url to a local index"
                    % pyspy_requirement(settings))
    return check(settings["debug_tools_drift_policy"], found, expected, fix)


def decide(host: str, facts: Facts, settings: Settings, probe: Optional[dict] = None,
           cluster: Optional[dict] = None) -> Checks:
    """``{packages?, tool_<program>..., tool_py_spy?}`` for ``host``.

    ``{enabled}`` (skipped) when switched off, ``{tools}`` (not_applicable) when nothing is asked for,
    ``{no_facts}`` (fail) when the node was not read.
    """
    first = off_or_unread("debug_tools", host, settings["debug_tools_enabled"], facts,
                          "the debug tools", "the OS family and the programs read on the node")
    if first is not None:
        return first
    os_facts = facts.get("os") or {}
    family = os_facts.get("family") or OTHER
    checks = {}
    lists = settings.get("debug_tools_packages") or {}
    packages = lists.get(family)
    if packages is None:
        if family == OTHER:
            fix = ("install gdb, strace, pdsh and nmap on %s by hand (its distribution is none of %s), or set "
                   "debug_tools_enabled: false for it" % (host, ", ".join(name for name, _ids in FAMILIES)))
        else:
            fix = ("set debug_tools_packages.%s to this distribution's package names of gdb, strace, pdsh and nmap "
                   "(or [] to check only py-spy)" % family)
        checks["packages"] = warned(
            "no package list for OS family %s on %s (%s)" % (family, host, _describe_os(os_facts)),
            "debug_tools_packages.%s set" % family, fix)
        packages = []
    binaries = settings.get("debug_tools_binaries") or {}
    by_program = {}
    for package in packages:
        program = program_of(package, binaries)
        if pyspy_on(settings) and check_name(program) == check_name(PYSPY):
            continue  # the py-spy check below covers it, with its own install method
        by_program.setdefault(program, []).append(package)
    for program in by_program:
        name = check_name(program)
        while name in checks:
            name += "_"
        checks[name] = _tool_check(program, by_program[program], family, facts, settings, host)
    if pyspy_on(settings):
        checks[check_name(PYSPY)] = _pyspy_check(family, facts, settings, host)
    if not checks:
        checks["tools"] = not_applicable(
            "no debug tools asked for on %s (debug_tools_packages.%s is empty and debug_tools_pyspy is false)"
            % (host, family), "a package in debug_tools_packages.%s or debug_tools_pyspy true" % family)
    return checks
