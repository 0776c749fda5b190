# -*- coding: utf-8 -*-
"""Which resource limits pam_limits gives a login session: the reading half (node layer).

pam_limits reads ``/etc/security/limits.conf`` first, then every
``limits.d/*.conf`` in lexical order.  A line for a user name (or a uid range)
beats a group line, which beats ``*``; among lines of the same kind the one
read last wins; ``*`` and group lines never apply to root (limits.conf(5)).

:func:`read_limits` reads a node (JSON-safe facts); this file is all a node's
facts call ships.  ``decide_limits`` (in ``module_utils/preflight_node/limits/write.py``)
turns the facts and the wanted lines into checks.  ``library/limits_dropin.py`` (the
bring-up writer) and the core_dumps capability (the audit: read in
``module_utils/preflight_node/capabilities/core_dumps.py``, decided in
``cluster_preflight/capabilities/core_dumps/``) use exactly these, so they can
never disagree.  Paths are logical and joined to ``root`` only for
file-system access, so tests run on a sandbox tree.
"""

from __future__ import annotations

import os

from ..sysctl.values import read_text, rooted

LIMITS_CONF = "/etc/security/limits.conf"
LIMITS_DIR = "/etc/security/limits.d"
PAM_DIR = "/etc/pam.d"


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
