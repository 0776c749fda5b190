# -*- coding: utf-8 -*-
"""Which resource limits pam_limits gives a login session, read and judged.

pam_limits reads ``/etc/security/limits.conf`` first, then every
``limits.d/*.conf`` in lexical order.  A line for a user name (or a uid range)
beats a group line, which beats ``*``; among lines of the same kind the one
read last wins; ``*`` and group lines never apply to root (limits.conf(5)).

:func:`read_limits` reads a node (JSON-safe facts), :func:`decide_limits` turns
the facts and the wanted lines into checks.  ``library/limits_dropin.py`` (the
bring-up writer) and the core_dumps capability (the audit: read in
``module_utils/preflight_node/core_dumps.py``, decided in
``cluster_preflight/capabilities/core_dumps.py``) use exactly these, so they can
never disagree.  Paths are logical and joined to ``root`` only for
file-system access, so tests run on a sandbox tree.
"""

from __future__ import annotations

import os
import re

from .checks import check, not_applicable, passed
from .sysctl import read_text, rooted

MAN = "see man limits.conf"
LIMITS_CONF = "/etc/security/limits.conf"
LIMITS_DIR = "/etc/security/limits.d"
PAM_DIR = "/etc/pam.d"
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


def parse(text):
    """Lines of a limits file: list of ``(lineno, domain, type, item, value)``."""
    result = []
    for lineno, raw in enumerate((text or "").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        fields = line.split()
        if len(fields) != 4:
            continue
        domain, limit_type, item, value = (field.lower() if index else field for index, field in enumerate(fields))
        result.append((lineno, domain, limit_type, item, value))
    return result


def render(item, entries, comment=""):
    lines = [HEADER % item]
    for line in str(comment or "").splitlines():
        lines.append(("# " + line.strip()).rstrip() + "\n")
    for entry in entries:
        lines.append("%-10s %-5s %-8s %s\n" % (entry["domain"], entry["type"], entry["item"], entry["value"]))
    return "".join(lines)


def read_order(root, limits_conf, limits_dir, dropin, errors=None):
    """Files in the order pam_limits reads them (limits.conf, then limits.d/*.conf sorted).

    The drop-in is listed even when it does not exist yet.  A limits.d that
    cannot be listed is appended to ``errors`` when given, and raises otherwise.
    """
    files = [limits_conf]
    names = set()
    full_dir = rooted(root, limits_dir)
    if os.path.isdir(full_dir):
        try:
            names.update(name for name in os.listdir(full_dir) if name.endswith(".conf"))
        except OSError as exc:
            if errors is None:
                raise
            errors.append({"path": limits_dir, "error": str(exc.strerror or exc)})
    names.add(os.path.basename(dropin))
    files.extend(os.path.join(limits_dir, name) for name in sorted(names))
    return files


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


def pam_services(root, pam_dir):
    """PAM service files with a live ``pam_limits.so`` line; ``None`` without a PAM directory."""
    full = rooted(root, pam_dir)
    if not os.path.isdir(full):
        return None
    services = []
    try:
        names = sorted(os.listdir(full))
    except OSError:
        return None
    for name in names:
        try:
            text = read_text(root, os.path.join(pam_dir, name))
        except OSError:
            continue  # a sub-directory or an unreadable file loads nothing we could see
        if text is None:
            continue
        for raw in text.splitlines():
            line = raw.split("#", 1)[0]
            if "pam_limits.so" in line:
                services.append(os.path.join(pam_dir, name))
                break
    return services


def read_limits(root, path, limits_conf=LIMITS_CONF, limits_dir=LIMITS_DIR, pam_dir=PAM_DIR, item=None):
    """The drop-in, the lines every pam_limits file sets and the PAM services
    that load pam_limits, as JSON-safe facts.

    ``{path, limits_conf, limits_dir, pam_dir, limits_dir_exists, text, error,
    files, lines, unreadable, pam_services}``: ``text`` is the drop-in (None
    when it does not exist), ``files`` the read order (the drop-in included),
    ``lines`` every line of every file as it is on disk (only ``item``'s when
    given) with its file's ``order``, ``pam_services`` None without a PAM
    directory.  Nothing here raises for what a node may lack.
    """
    path = os.path.normpath(path)
    limits_conf = os.path.normpath(limits_conf)
    limits_dir = os.path.normpath(limits_dir)
    facts = {"path": path, "limits_conf": limits_conf, "limits_dir": limits_dir, "pam_dir": pam_dir,
             "limits_dir_exists": os.path.isdir(rooted(root, limits_dir)), "text": None, "error": None}
    unreadable = []
    files = read_order(root, limits_conf, limits_dir, path, errors=unreadable)
    lines = []
    for order, name in enumerate(files):
        try:
            text = read_text(root, name)
        except OSError as exc:
            if name == path:
                facts["error"] = "%s cannot be read: %s" % (path, exc.strerror or exc)
            else:
                unreadable.append({"path": name, "error": str(exc.strerror or exc)})
            continue
        if name == path and text is not None:
            facts["text"] = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        for lineno, domain, limit_type, line_item, line_value in parse(text):
            if item is None or line_item == item:
                lines.append({"file": name, "order": order, "lineno": lineno, "domain": domain,
                              "type": limit_type, "item": line_item, "value": line_value})
    facts.update(files=files, lines=lines, unreadable=unreadable, pam_services=pam_services(root, pam_dir))
    return facts


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
