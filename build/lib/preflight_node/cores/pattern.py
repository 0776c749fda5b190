# -*- coding: utf-8 -*-
"""What a ``kernel.core_pattern`` means: where the kernel puts a core file.

Follows ``format_corename()`` in the kernel's fs/coredump.c and core(5):

* A pattern starting with ``|`` pipes the dump to a helper program
  (apport, systemd-coredump, ...); no file is written by the kernel.
* Otherwise the expanded pattern is a path; a relative one is relative to the
  crashing process's working directory.  The kernel does not create
  directories.
* ``%p``/``%i`` are the pid/tid in the crashing process's own PID namespace,
  ``%P``/``%I`` in the initial one.  ``%e``, ``%E``, ``%f`` and ``%h`` have
  ``/`` replaced by ``!`` (and a component that would be ``.`` or ``..`` gets
  its first dot replaced by ``!``).  Unknown specifiers and a trailing lone
  ``%`` are dropped.
* Without ``%p`` in the pattern and with ``kernel.core_uses_pid = 1`` the
  kernel appends ``.PID``.

The end of this file is ``kernel.core_pattern`` as a sysctl: the rules it adds
to the generic sysctl layer (``module_utils/preflight_node/sysctl/values.py``), which
are registered there when this module is imported: ``core_uses_pid`` read with
the pattern, the value described with where cores go, the override of a
running pipe pattern as its fix, and the ``<check>_pid`` check.
"""

from __future__ import annotations

import os
import re

from ..sysctl import values as sysctl
from ..checks import passed, warned


# Read with the pattern: whether the kernel appends .PID to a core's name (the core_dumps reader reads it; this
# module registers the same reading with the sysctl layer for the writer, which does not call that reader).
CORE_USES_PID = "kernel.core_uses_pid"


def read_uses_pid(root, proc_root):
    """``{core_uses_pid}``: the running kernel.core_uses_pid (None when unknown)."""
    try:
        return {"core_uses_pid": sysctl.read_runtime(root, proc_root, CORE_USES_PID)[1]}
    except OSError:
        return {"core_uses_pid": None}


# The kernel's buffer for the pattern is CORENAME_MAX_SIZE (128) bytes with the
# terminating NUL.
MAX_PATTERN_LENGTH = 127

# Specifiers whose expansion is escaped by cn_esc_printf().
_ESCAPED = frozenset("eEfh")

SPECIFIERS = {
    "%": "a literal %",
    "p": "PID in the crashing process's PID namespace",
    "P": "PID in the initial PID namespace",
    "i": "TID in the crashing process's PID namespace",
    "I": "TID in the initial PID namespace",
    "u": "real UID",
    "g": "real GID",
    "d": "dump mode (PR_GET_DUMPABLE)",
    "s": "signal number",
    "t": "time of dump, seconds since the Epoch",
    "h": "hostname (nodename)",
    "e": "comm, at most 15 characters",
    "f": "executable file name",
    "E": "executable path with / replaced by !",
    "c": "RLIMIT_CORE soft limit",
    "C": "CPU the task ran on",
    "F": "pidfd number (pipe helpers only)",
}

OVERRIDE_HINT = (
    "set a file pattern such as /tmp/core-%e.%p.%h.%t: sysctl -w kernel.core_pattern=/tmp/core-%e.%p.%h.%t "
    "and persist it in a drop-in that sorts after every other file setting kernel.core_pattern "
    "(the core_dumps role writes /etc/sysctl.d/60-preflight-core.conf)")


def is_pipe(pattern):
    """True when the kernel hands the dump to a helper program."""
    return str(pattern).startswith("|")


def pipe_program(pattern):
    """The helper program of a pipe pattern (first word after ``|``)."""
    words = str(pattern)[1:].split()
    return words[0] if words else ""


def destination(pattern):
    """Where cores end up for a pipe pattern: a dict with ``handler``,
    ``where`` (human text), ``list_command`` and ``override`` (how to switch to
    a file pattern).  ``None`` for a file pattern."""
    if not is_pipe(pattern):
        return None
    program = pipe_program(pattern)
    base = os.path.basename(program)
    if "apport" in base:
        return {
            "handler": "apport",
            "program": program,
            "where": ("apport: crash reports in /var/crash, cores (when apport keeps them) in "
                      "/var/lib/apport/coredump; apport ignores crashes of programs not installed "
                      "from distribution packages, so a pip-installed training stack may leave no core at all"),
            "list_command": "ls -l /var/crash /var/lib/apport/coredump",
            "override": OVERRIDE_HINT + "; apport rewrites core_pattern when its service starts: "
                                        "systemctl disable --now apport",
        }
    if "systemd-coredump" in base:
        return {
            "handler": "systemd-coredump",
            "program": program,
            "where": ("systemd-coredump: list with `coredumpctl list`, files in /var/lib/systemd/coredump "
                      "(kept per Storage= and MaxUse= in /etc/systemd/coredump.conf)"),
            "list_command": "coredumpctl list",
            "override": OVERRIDE_HINT + "; systemd ships the pipe in /usr/lib/sysctl.d/50-coredump.conf, "
                                        "which a later-sorting /etc/sysctl.d drop-in overrides",
        }
    return {
        "handler": base or "unknown",
        "program": program,
        "where": "piped to %s: see that program's documentation for where it stores cores" % (program or "?"),
        "list_command": "",
        "override": OVERRIDE_HINT,
    }


def describe(pattern):
    """One line saying where cores go under ``pattern``."""
    dest = destination(pattern)
    if dest is not None:
        return "cores are piped to %s" % dest["where"]
    if not str(pattern).startswith("/"):
        return "cores are written relative to each crashing process's working directory"
    return "cores are written to %s" % pattern_dir(pattern)


def tokens(pattern):
    """Split a file pattern into ``('lit', text)`` and ``('spec', char)``."""
    result = []
    literal = []
    index = 0
    pattern = str(pattern)
    while index < len(pattern):
        char = pattern[index]
        if char == "%":
            if index + 1 >= len(pattern):
                break  # a trailing lone % is dropped
            spec = pattern[index + 1]
            index += 2
            if spec == "%":
                literal.append("%")
                continue
            if literal:
                result.append(("lit", "".join(literal)))
                literal = []
            result.append(("spec", spec))
            continue
        literal.append(char)
        index += 1
    if literal:
        result.append(("lit", "".join(literal)))
    return result


def has_pid(pattern):
    """True when the pattern holds ``%p`` (not ``%%p``)."""
    return ("spec", "p") in tokens(pattern)


def pattern_dir(pattern):
    """The directory part of a file pattern (``''`` for a bare relative name)."""
    return os.path.dirname(str(pattern))


def dir_has_specifier(pattern):
    return any(kind == "spec" for kind, _value in tokens(pattern_dir(pattern)))


def validate_desired(pattern):
    """Reasons a pattern must not be set as the desired value (empty list: fine)."""
    pattern = str(pattern)
    errors = []
    if not pattern.strip():
        errors.append("kernel.core_pattern must not be empty")
    if is_pipe(pattern):
        dest = destination(pattern)
        errors.append(
            "kernel.core_pattern %r pipes cores to %s; the preflight wants plain core files a job user "
            "can find next to the job (where cores would go: %s). Use a file pattern such as "
            "/tmp/core-%%e.%%p.%%h.%%t" % (pattern, dest["program"] or "a program", dest["where"]))
    if len(pattern.encode("utf-8")) > MAX_PATTERN_LENGTH:
        errors.append("kernel.core_pattern is %d bytes; the kernel takes at most %d"
                      % (len(pattern.encode("utf-8")), MAX_PATTERN_LENGTH))
    if "\n" in pattern:
        errors.append("kernel.core_pattern must be one line")
    return errors


def _escape(text):
    text = text.replace("/", "!")
    if text in (".", ".."):
        text = "!" + text[1:]
    return text


def component_regexes(pattern, fields):
    """Turn a file pattern into one compiled regex per path component.

    ``fields`` maps a specifier character to its exact expansion (a string),
    or to ``None`` when any decimal number is acceptable (for example ``%P``
    inside a PID namespace); ``fields['core_uses_pid']`` true appends ``.%p``
    when the pattern has no ``%p``, as the kernel does.  ``%t`` is always matched as a number in group
    ``t<N>``; the caller checks it against a time window.  A specifier the
    caller does not know matches any text without ``/``.

    Returns ``(absolute, [regex, ...], description)`` where description shows
    the expected path with ``<...>`` for the variable parts.
    """
    pattern = str(pattern)
    toks = tokens(pattern)
    if not has_pid(pattern) and fields.get("core_uses_pid"):
        toks = toks + [("lit", "."), ("spec", "p")]
    components = [[]]
    for kind, value in toks:
        if kind == "lit":
            parts = value.split("/")
            components[-1].append(("lit", parts[0]))
            for part in parts[1:]:
                components.append([("lit", part)])
        else:
            components[-1].append(("spec", value))
    absolute = pattern.startswith("/")
    regexes = []
    shown = []
    time_group = 0
    for component in components:
        regex = []
        text = []
        for kind, value in component:
            if kind == "lit":
                regex.append(re.escape(value))
                text.append(value)
                continue
            if value == "t":
                regex.append("(?P<t%d>[0-9]+)" % time_group)
                time_group += 1
                text.append("<epoch seconds>")
                continue
            if value not in fields and value not in SPECIFIERS:
                continue  # the kernel drops unknown specifiers
            exact = fields.get(value)
            if exact is None:
                if value in "pPiIugdscC":
                    regex.append("[0-9]+")
                else:
                    regex.append("[^/]*")
                text.append("<%s>" % SPECIFIERS.get(value, value))
                continue
            exact = str(exact)
            if value in _ESCAPED:
                exact = _escape(exact)
            regex.append(re.escape(exact))
            text.append(exact)
        regexes.append(re.compile("^" + "".join(regex) + "$"))
        shown.append("".join(text))
    return absolute, regexes, "/".join(shown)


def find_matches(base, absolute, regexes, time_window=None, limit=64):
    """Files matching the component regexes under ``/`` (absolute) or
    ``base`` (relative).  ``time_window`` is ``(low, high)`` for ``%t``."""
    start = "/" if absolute else base
    parts = list(regexes)
    candidates = [start]
    for depth, regex in enumerate(parts):
        last = depth == len(parts) - 1
        if not last and regex.pattern in ("^$", "^\\.$"):
            continue  # "//" and "/./" name the same directory
        if not last and regex.pattern == "^\\.\\.$":
            candidates = [os.path.dirname(path.rstrip("/")) or "/" for path in candidates]
            continue
        following = []
        for directory in candidates:
            try:
                names = sorted(os.listdir(directory))
            except OSError:
                continue
            for name in names:
                match = regex.match(name)
                if not match:
                    continue
                if time_window is not None and not _in_window(match, time_window):
                    continue
                path = os.path.join(directory, name)
                if last:
                    if os.path.isfile(path) and not os.path.islink(path):
                        following.append(path)
                elif os.path.isdir(path):
                    following.append(path)
                if len(following) >= limit:
                    break
        candidates = following
    return candidates


def _in_window(match, window):
    low, high = window
    for name, value in match.groupdict().items():
        if name.startswith("t") and value is not None:
            if not low <= int(value) <= high:
                return False
    return True


# ---------------------------------------------------------------------------------------------
# kernel.core_pattern as a sysctl: the rules registered with module_utils/preflight_node/sysctl/values.py

def _describe_setting(value):
    return "%s (%s)" % (value, describe(value))


def _runtime_fix(value):
    """A running pipe pattern is fixed by its helper's override (None: the generic fix)."""
    return destination(value)["override"] if is_pipe(value) else None


def pid_check(desired, core_uses_pid):
    """Whether the cores of several ranks of one job get distinct names."""
    expected = "%p in kernel.core_pattern (or kernel.core_uses_pid = 1)"
    if has_pid(desired):
        return passed("%s has %%p" % desired, expected)
    if core_uses_pid == "1":
        return passed("%s has no %%p but kernel.core_uses_pid = 1 appends .PID" % desired, expected)
    return warned("kernel.core_pattern %s has no %%p and kernel.core_uses_pid is %s: the ranks of one job that "
                  "crash together overwrite each other's core files" % (desired, core_uses_pid or "unset"),
                  expected, "add %p to the pattern, e.g. /tmp/core-%e.%p.%h.%t")


def _pid_checks(facts, desired, check_name):
    return {check_name + "_pid": pid_check(desired, facts.get("core_uses_pid"))}


sysctl.register_rules(sysctl.CORE_PATTERN, {"read": read_uses_pid, "describe": _describe_setting,
                                            "runtime_fix": _runtime_fix, "checks": _pid_checks})
