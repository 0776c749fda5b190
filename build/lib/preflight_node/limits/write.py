# -*- coding: utf-8 -*-
"""Judging and rendering pam_limits drop-ins (node layer, ``module_utils/preflight_node/limits/write.py``).

The facts come from :func:`read_limits` in ``module_utils/preflight_node/limits/session.py`` (the reader, all a
node's facts call ships).  Here: validating the wanted lines and the drop-in path, :func:`render` (the
drop-in the bring-up writer ``library/limits_dropin.py`` writes), :func:`decide_limits` (facts + wanted
lines -> checks) and :func:`conflicts` (lines elsewhere that win over ours, by the pam_limits precedence:
a user or uid-range line beats a group line beats ``*``; among equals the file read last wins).  The
writer and the core_dumps decider (``cluster_preflight/capabilities/core_dumps/``) use exactly these.
"""

from __future__ import annotations

import os
import re

from ..checks import check, not_applicable, passed
from .session import LIMITS_CONF, LIMITS_DIR, parse


MAN = "see man limits.conf"
TYPES = ("soft", "hard", "-")
# Items of limits.conf(5).
ITEMS = ("core", "data", "fsize", "memlock", "nofile", "rss", "stack", "cpu", "nproc", "as", "maxlogins",
         "maxsyslogins", "nonewprivs", "priority", "locks", "sigpending", "msgqueue", "nice", "rtprio")
UNLIMITED = ("unlimited", "infinity", "-1")
HEADER = ("# Managed by the cluster preflight (module limits_dropin): %s limits only;\n"
          "# local edits are overwritten: change the preflight variables instead.\n")
_RANGE = re.compile(r"^@?[0-9]*:[0-9]*$")


def validate(domains, types, item, value):
    """Every problem with the inputs, each naming the bad value."""
    errors = []
    if item not in ITEMS:
        errors.append("item %r is not a limits.conf item (one of %s; %s)" % (item, ", ".join(ITEMS), MAN))
    for limit_type in types:
        if limit_type not in TYPES:
            errors.append("limit type %r is not one of soft, hard, - (%s)" % (limit_type, MAN))
    if not types:
        errors.append("types must name at least one of soft, hard, - (%s)" % MAN)
    if not domains:
        errors.append("domains must name at least one domain such as * or root (%s)" % MAN)
    for domain in domains:
        if not domain or any(char.isspace() for char in domain) or "#" in domain:
            errors.append("domain %r is not a user name, @group, * or uid range (%s)" % (domain, MAN))
        elif domain.startswith("%"):
            errors.append("domain %r: %% domains apply to maxlogins only (%s)" % (domain, MAN))
    normalized = str(value).strip().lower()
    if item in ("nice", "priority"):
        if not re.match(r"^-?[0-9]+$", normalized) or not -20 <= int(normalized) <= 19:
            errors.append("value %r for %s must be an integer from -20 to 19 (%s)" % (value, item, MAN))
    elif normalized not in UNLIMITED and not re.match(r"^[0-9]+$", normalized):
        errors.append("value %r for %s must be a non-negative integer or unlimited (%s)" % (value, item, MAN))
    return errors


def path_problem(path, limits_dir=LIMITS_DIR, limits_conf=LIMITS_CONF):
    """Why ``path`` would never be read as a drop-in of its own (None when it is fine)."""
    path = str(path or "")
    normalized = os.path.normpath(path) if path else ""
    if (not path.startswith("/") or not normalized.endswith(".conf")
            or os.path.dirname(normalized) != os.path.normpath(limits_dir)
            or normalized == os.path.normpath(limits_conf)):
        return ("path %s must be a *.conf file of its own in %s, otherwise pam_limits never reads it (%s)"
                % (path or "''", limits_dir, MAN))
    return None


def normalize_value(value):
    value = str(value).strip().lower()
    return "unlimited" if value in UNLIMITED else value


def entries_for(domains, types, item, value):
    """The lines a drop-in holds: one per domain and type."""
    return [{"domain": str(domain).strip(), "type": str(limit_type).strip().lower(), "item": item.strip().lower(),
             "value": str(value).strip().lower()} for domain in domains for limit_type in types]


def describe_entries(entries):
    return "; ".join("%s %s %s %s" % (e["domain"], e["type"], e["item"], e["value"]) for e in entries)


def is_uid_range(domain):
    return bool(_RANGE.match(domain)) and not domain.startswith("@")


def render(item, entries, comment=""):
    lines = [HEADER % item]
    for line in str(comment or "").splitlines():
        lines.append(("# " + line.strip()).rstrip() + "\n")
    for entry in entries:
        lines.append("%-10s %-5s %-8s %s\n" % (entry["domain"], entry["type"], entry["item"], entry["value"]))
    return "".join(lines)


def _applies_to(domain):
    if domain == "*":
        return "every user but root"
    if domain.startswith("@"):
        return "members of group %s (not root)" % domain[1:]
    if is_uid_range(domain):
        return "uids %s" % domain
    return "user %s" % domain


def _range_has_root(domain):
    low, _sep, high = domain.partition(":")
    if not low:
        return high == "0"  # ":N" matches uid N exactly
    return int(low) == 0


def _beats(our_domain, line_domain, later):
    """Whether a line for ``line_domain`` overrides ours for some users
    (pam_limits: a user or uid-range line beats a group line beats '*';
    among lines of the same kind the one read later wins)."""
    if our_domain == "*":
        if line_domain == "*":
            return later
        # root is never covered by '*', so a root line takes nothing from ours.
        return line_domain != "root"
    if our_domain.startswith("@"):
        if line_domain == our_domain:
            return later
        return not line_domain.startswith("@") and line_domain != "*"
    if line_domain == our_domain:
        return later
    if our_domain == "root" and is_uid_range(line_domain):
        return later and _range_has_root(line_domain)
    return False


def conflicts_for(lines, ours, ours_order, item, entries):
    """Lines of other files that override ours for some users with a different
    value.  Each line carries the ``order`` of its file in the read order;
    ``ours_order`` is the drop-in's place there, so whether a line is read
    after ours does not depend on the drop-in existing yet."""
    found = []
    for entry in entries:
        want = normalize_value(entry["value"])
        wanted_types = ("soft", "hard") if entry["type"] == "-" else (entry["type"],)
        for line in lines:
            if line["file"] == ours or line["item"] != item:
                continue
            if not any(line["type"] in ("-", wanted) for wanted in wanted_types):
                continue
            if normalize_value(line["value"]) == want:
                continue
            if not _beats(entry["domain"], line["domain"], line["order"] > ours_order):
                continue
            conflict = {"file": line["file"], "line": line["lineno"], "domain": line["domain"],
                        "type": line["type"], "item": line["item"], "value": line["value"],
                        "overrides": "%s %s" % (entry["domain"], entry["type"]),
                        "applies_to": _applies_to(line["domain"])}
            if conflict not in found:
                found.append(conflict)
    return found


def _key(entry):
    return (entry["domain"], entry["type"], entry["item"], normalize_value(entry["value"]))


def decide_limits(facts, entries, policy, check_name):
    """Checks: ``<check_name>`` (the drop-in holds exactly ``entries``),
    ``<check_name>_conflicts`` (no line elsewhere wins over them) and
    ``<check_name>_pam`` (a PAM service loads pam_limits)."""
    path = facts["path"]
    item = entries[0]["item"] if entries else ""
    value = entries[0]["value"] if entries else ""
    expected = describe_entries(entries)
    fix = "run the node bring-up (it writes %s) or write those lines there by hand" % path
    checks = {}
    text = facts.get("text")
    ours = [{"domain": d, "type": t, "item": i, "value": v} for _n, d, t, i, v in parse(text)]
    if facts.get("error"):
        checks[check_name] = check(policy, facts["error"], "%s in %s" % (expected, path),
                                   "make %s readable, or run the preflight as root (preflight_become: true)" % path)
    elif text is not None and sorted(map(_key, ours)) == sorted(map(_key, entries)):
        checks[check_name] = passed("%s holds %s" % (path, expected), "%s in %s" % (expected, path))
    else:
        have = set(map(_key, ours))
        missing = [entry for entry in entries if _key(entry) not in have]
        if text is None:
            found = "%s does not exist" % path
            if not facts.get("limits_dir_exists"):
                found += " (nor does %s, so pam_limits reads no drop-in at all)" % facts["limits_dir"]
        elif missing:
            found = "%s lacks %s" % (path, describe_entries(missing))
        else:
            found = "%s holds other lines besides the managed ones" % path
        checks[check_name] = check(policy, found, "%s in %s" % (expected, path), fix)

    ours_order = facts["files"].index(path) if path in facts.get("files", []) else len(facts.get("files", []))
    conflicts = conflicts_for(facts.get("lines") or [], path, ours_order, item, entries)
    wanted = "no other line sets %s for these users to anything but %s" % (item, value)
    if conflicts:
        checks[check_name + "_conflicts"] = check(
            policy,
            "; ".join("'%s %s %s %s' at %s:%s overrides %s from %s for %s" % (
                c["domain"], c["type"], c["item"], c["value"], c["file"], c["line"], c["overrides"], path,
                c["applies_to"]) for c in conflicts),
            wanted,
            "remove or change %s (a user line beats a group line beats '*'; among equals the file read last "
            "wins; %s)" % (", ".join("%s:%s" % (c["file"], c["line"]) for c in conflicts), MAN))
    elif facts.get("unreadable"):
        checks[check_name + "_conflicts"] = check(
            policy, "cannot tell whether another line wins: %s" % "; ".join(
                "%s cannot be read (%s)" % (u["path"], u["error"]) for u in facts["unreadable"]),
            wanted, "make %s readable, or run the preflight as root (preflight_become: true)"
            % ", ".join(u["path"] for u in facts["unreadable"]))
    else:
        checks[check_name + "_conflicts"] = passed(
            "no line in %s or %s overrides %s" % (facts["limits_conf"], facts["limits_dir"], path), wanted)

    services = facts.get("pam_services")
    pam_dir = facts["pam_dir"]
    if services is None:
        checks[check_name + "_pam"] = not_applicable("no PAM directory %s: limits.d is not read here" % pam_dir,
                                                     "pam_limits.so in a PAM session stack")
    elif services:
        checks[check_name + "_pam"] = passed("pam_limits.so in %s" % ", ".join(services),
                                             "pam_limits.so in a PAM session stack")
    else:
        checks[check_name + "_pam"] = check(
            policy, "no service in %s loads pam_limits.so, so %s is never applied" % (pam_dir, path),
            "pam_limits.so in a PAM session stack",
            "add 'session required pam_limits.so' to the session stack (e.g. %s/common-session)" % pam_dir)
    return checks


def conflicts(facts, entries):
    """The conflicting lines alone (what the writer returns)."""
    path = facts["path"]
    item = entries[0]["item"] if entries else ""
    ours_order = facts["files"].index(path) if path in facts.get("files", []) else len(facts.get("files", []))
    return conflicts_for(facts.get("lines") or [], path, ours_order, item, entries)
