#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ensure or audit a pam_limits drop-in (for example core dumps unlimited)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: limits_dropin
short_description: Ensure or audit resource limits in a limits.d drop-in of their own
description:
  - Writes one file in C(/etc/security/limits.d) holding C(<domain> <type> <item> <value>) for every
    domain and type given (by default C(soft) and C(hard) C(core unlimited) for C(*) and for C(root),
    because pam_limits never applies C(*) or group lines to root). The file is written atomically with
    a managed header; C(/etc/security/limits.conf) and other drop-ins are only read, never written.
  - Every input is validated before anything is read or written; a bad type, item or value fails
    naming it and C(man limits.conf).
  - "Reads C(limits.conf) and every other C(limits.d/*.conf) the way pam_limits applies them: a line for
    a user name beats a group line, which beats C(*), and among lines of the same kind the one read last
    (limits.conf first, then limits.d in lexical order) wins. A line elsewhere that would override the
    drop-in with a different value (for example C(* hard core 0) in a later file, or C(alice hard core 0)
    anywhere) is a finding with the file and line to change."
  - Reports whether any PAM service in C(/etc/pam.d) loads C(pam_limits.so), since limits.d is applied
    only by it. Processes started by systemd units or a batch daemon get their limits elsewhere
    (C(LimitCORE=), the daemon's own propagation) and are not covered by this file.
  - Findings never fail the task; they are returned in RV(checks).
version_added: "1.0.0"
author: Cluster preflight maintainers
options:
  path:
    description:
      - The drop-in. It must end in C(.conf) and live in O(limits_dir); any other content is replaced.
    type: path
    default: /etc/security/limits.d/90-preflight-core.conf
  domains:
    description:
      - Domains to set, as in limits.conf(5) (C(*), a user name, C(@group), a uid range C(min:max)).
      - Keep C(root) next to C(*) when root's processes should get the limit too.
    type: list
    elements: str
    default: ["*", root]
  types:
    description: Limit types to set, each one of C(soft), C(hard), C(-) (both).
    type: list
    elements: str
    default: [soft, hard]
  item:
    description: The limits.conf(5) item (C(core), C(nofile), C(memlock), ...).
    type: str
    default: core
  value:
    description:
      - An integer, or C(unlimited) (also spelled C(infinity) or C(-1)). C(nice) and C(priority) take
        -20 to 19.
    type: str
    default: unlimited
  state:
    description: V(present) writes the drop-in; V(audit) only reads and reports.
    type: str
    choices: [present, audit]
    default: present
  limits_conf:
    description: The main pam_limits file, read for conflicting lines.
    type: path
    default: /etc/security/limits.conf
  limits_dir:
    description: The pam_limits drop-in directory.
    type: path
    default: /etc/security/limits.d
  pam_dir:
    description: PAM service directory searched for C(pam_limits.so).
    type: path
    default: /etc/pam.d
  root:
    description: Prefix for every path above; tests point it at a sandbox tree. Reported paths stay logical.
    type: path
    default: /
  backup:
    description: Keep a timestamped copy of an existing drop-in before replacing it.
    type: bool
    default: false
  policy:
    description: Status of a finding (drift in check mode or audit, a conflicting line that wins, no pam_limits).
    type: str
    choices: [warn, fail]
    default: fail
  check_name:
    description: Prefix of the names in RV(checks); defaults to C(<item>_limits).
    type: str
  comment:
    description: Extra comment lines for the drop-in header.
    type: str
    default: ""
attributes:
  check_mode:
    support: full
    description: Reports what would change and the resulting drift findings; writes nothing.
  diff_mode:
    support: full
    description: Before/after of the drop-in.
seealso:
  - name: limits.conf(5)
    description: Syntax, items and precedence.
    link: https://man7.org/linux/man-pages/man5/limits.conf.5.html
"""

EXAMPLES = r"""
- name: Ensure every job user, and root, may write core files of any size.
  limits_dropin:
    path: /etc/security/limits.d/90-preflight-core.conf
    domains: ["*", root]
    types: [soft, hard]
    item: core
    value: unlimited

- name: Audit the core limits without changing anything.
  limits_dropin:
    state: audit
    policy: warn
  register: core_limits_audit
"""

RETURN = r"""
changed:
  description: Whether the drop-in was (or in check mode would be) changed.
  returned: always
  type: bool
checks:
  description:
    - "C(<check_name>) for the drop-in content, C(<check_name>_conflicts) for lines elsewhere that win
      over it, C(<check_name>_pam) for pam_limits being loaded by a PAM service."
  returned: always
  type: dict
entries:
  description: The lines the drop-in holds (domain, type, item, value).
  returned: always
  type: list
  elements: dict
conflicts:
  description: Lines in other files that override the drop-in for some users, with file, line and who they apply to.
  returned: always
  type: list
  elements: dict
  sample:
    - {file: /etc/security/limits.conf, line: 12, domain: "*", type: hard, value: "0", applies_to: every user but root}
pam_services:
  description: PAM service files that load pam_limits.so.
  returned: always
  type: list
  elements: str
backup_file:
  description: Path of the backup copy.
  returned: when a backup was made
  type: str
diff:
  description: Before/after of the drop-in.
  returned: diff mode, state=present
  type: dict
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_checks import check, not_applicable, passed
from ansible.module_utils.preflight_sysctl import read_text, rooted, write_dropin

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


def normalize_value(value):
    value = str(value).strip().lower()
    return "unlimited" if value in UNLIMITED else value


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


def read_order(root, limits_conf, limits_dir, dropin):
    """Files in the order pam_limits reads them (limits.conf, then limits.d/*.conf sorted)."""
    files = [limits_conf]
    names = set()
    full_dir = rooted(root, limits_dir)
    if os.path.isdir(full_dir):
        names.update(name for name in os.listdir(full_dir) if name.endswith(".conf"))
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


def conflicts_for(lines, ours, item, entries):
    """Lines (from every file, in read order, ours included) that override
    ours for some users with a different value."""
    found = []
    positions = [index for index, line in enumerate(lines) if line["file"] == ours]
    last_ours = positions[-1] if positions else -1
    for entry in entries:
        want = normalize_value(entry["value"])
        wanted_types = ("soft", "hard") if entry["type"] == "-" else (entry["type"],)
        for index, line in enumerate(lines):
            if line["file"] == ours or line["item"] != item:
                continue
            if not any(line["type"] in ("-", wanted) for wanted in wanted_types):
                continue
            if normalize_value(line["value"]) == want:
                continue
            if not _beats(entry["domain"], line["domain"], index > last_ours):
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
    for name in sorted(os.listdir(full)):
        text = read_text(root, os.path.join(pam_dir, name))
        if text is None:
            continue
        for raw in text.splitlines():
            line = raw.split("#", 1)[0]
            if "pam_limits.so" in line:
                services.append(os.path.join(pam_dir, name))
                break
    return services


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", default="/etc/security/limits.d/90-preflight-core.conf"),
            domains=dict(type="list", elements="str", default=["*", "root"]),
            types=dict(type="list", elements="str", default=["soft", "hard"]),
            item=dict(type="str", default="core"),
            value=dict(type="str", default="unlimited"),
            state=dict(type="str", default="present", choices=["present", "audit"]),
            limits_conf=dict(type="path", default="/etc/security/limits.conf"),
            limits_dir=dict(type="path", default="/etc/security/limits.d"),
            pam_dir=dict(type="path", default="/etc/pam.d"),
            root=dict(type="path", default="/"),
            backup=dict(type="bool", default=False),
            policy=dict(type="str", default="fail", choices=["warn", "fail"]),
            check_name=dict(type="str"),
            comment=dict(type="str", default=""),
        ),
        supports_check_mode=True,
    )
    params = module.params
    item = params["item"].strip().lower()
    types = [str(limit_type).strip().lower() for limit_type in params["types"]]
    domains = [str(domain).strip() for domain in params["domains"]]
    value = str(params["value"]).strip().lower()
    errors = validate(domains, types, item, value)
    path = os.path.normpath(params["path"])
    limits_dir = os.path.normpath(params["limits_dir"])
    limits_conf = os.path.normpath(params["limits_conf"])
    if not path.endswith(".conf") or os.path.dirname(path) != limits_dir or path == limits_conf:
        errors.append("path %s must be a *.conf file of its own in %s, otherwise pam_limits never reads it (%s)"
                      % (path, limits_dir, MAN))
    if errors:
        module.fail_json(msg="Invalid limits: " + "; ".join(errors), errors=errors)

    root = params["root"]
    policy = params["policy"]
    short = params["check_name"] or "%s_limits" % item
    present = params["state"] == "present"
    entries = [{"domain": domain, "type": limit_type, "item": item, "value": value}
               for domain in domains for limit_type in types]

    before = read_text(root, path)
    desired_text = render(item, entries, params["comment"])
    after = desired_text if present else before
    changed = present and before != desired_text
    result = dict(changed=changed, entries=entries, path=path)
    if changed and not module.check_mode:
        backup_file = write_dropin(module, rooted(root, path), desired_text, params["backup"])
        if backup_file:
            result["backup_file"] = backup_file

    checks = {}
    expected = "; ".join("%s %s %s %s" % (e["domain"], e["type"], e["item"], e["value"]) for e in entries)
    now = desired_text if (changed and not module.check_mode) else before
    if now == desired_text:
        checks[short] = passed("%s holds %s" % (path, expected), "%s in %s" % (expected, path))
    else:
        ours = [(d, t, i, v) for _n, d, t, i, v in parse(now)]
        missing = [e for e in entries
                   if (e["domain"], e["type"], e["item"], e["value"]) not in ours]
        found = ("%s does not exist" % path if now is None else
                 "%s lacks %s" % (path, "; ".join("%s %s %s %s" % (e["domain"], e["type"], e["item"], e["value"])
                                                 for e in missing)) if missing else
                 "%s holds other lines besides the managed ones" % path)
        checks[short] = check(policy, found, "%s in %s" % (expected, path),
                              "run the node bring-up (it writes %s) or write those lines there by hand" % path)

    lines = []
    for name in read_order(root, limits_conf, limits_dir, path):
        text = desired_text if (name == path and present) else read_text(root, name)
        for lineno, domain, limit_type, line_item, line_value in parse(text):
            lines.append({"file": name, "lineno": lineno, "domain": domain, "type": limit_type,
                          "item": line_item, "value": line_value})
    conflicts = conflicts_for(lines, path, item, entries)
    if conflicts:
        checks[short + "_conflicts"] = check(
            policy,
            "; ".join("'%s %s %s %s' at %s:%s overrides %s from %s for %s" % (
                c["domain"], c["type"], c["item"], c["value"], c["file"], c["line"], c["overrides"], path,
                c["applies_to"]) for c in conflicts),
            "no other line sets %s for these users to anything but %s" % (item, value),
            "remove or change %s (a user line beats a group line beats '*'; among equals the file read last "
            "wins; %s)" % (", ".join("%s:%s" % (c["file"], c["line"]) for c in conflicts), MAN))
    else:
        checks[short + "_conflicts"] = passed(
            "no line in %s or %s overrides %s" % (limits_conf, limits_dir, path),
            "no other line sets %s for these users to anything but %s" % (item, value))

    services = pam_services(root, params["pam_dir"])
    if services is None:
        checks[short + "_pam"] = not_applicable("no PAM directory %s: limits.d is not read here" % params["pam_dir"],
                                                "pam_limits.so in a PAM session stack")
    elif services:
        checks[short + "_pam"] = passed("pam_limits.so in %s" % ", ".join(services),
                                        "pam_limits.so in a PAM session stack")
    else:
        checks[short + "_pam"] = check(
            policy, "no service in %s loads pam_limits.so, so %s is never applied" % (params["pam_dir"], path),
            "pam_limits.so in a PAM session stack",
            "add 'session required pam_limits.so' to the session stack (e.g. %s/common-session)" % params["pam_dir"])

    result.update(checks=checks, conflicts=conflicts, pam_services=services or [])
    if present and module._diff:
        result["diff"] = dict(before_header=path, after_header=path, before=before or "", after=after)
    result["msg"] = "%s: %s" % (path, "would change" if changed and module.check_mode else
                                ("changed" if changed else "unchanged"))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
