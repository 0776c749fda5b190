# -*- coding: utf-8 -*-
"""The node-to-node ssh mesh: ssh from this node to every peer with host-key checking on, ``ssh -G``,
ssh-keyscan and pdsh, each call bounded, and the classification of what ssh printed.

Node layer (``module_utils/preflight_node/ssh/mesh.py``, shipped in module calls): the probe of
``module_utils/preflight_node/capabilities/ssh_trust.py`` runs :func:`run_mesh`.
Commands run through an ``ops`` object (``module_utils/preflight_node/host/ops.py``) as argv lists;
rows are classified here, judged by the check builders (``module_utils/preflight_node/ssh/checks.py``).
"""

from __future__ import annotations

import concurrent.futures
import re
import time

from .primitives import parse_known_hosts_line, read_file, rooted, safe_fingerprint, split_lines


# --------------------------------------------------------------------------
# ssh mesh classification

SSH_STATUSES = ("ok", "host_key_unknown", "host_key_changed", "auth_denied", "refused", "timeout", "dns",
                "unreachable", "error")
_NEW_FP = re.compile(r"The fingerprint for the (\S+) key sent by the remote host is\s*(SHA256:[A-Za-z0-9+/]+)")
_OFFENDING = re.compile(r"Offending (\S+) key in (\S+):(\d+)")


def classify_ssh(rc, stderr, timed_out=False):
    """``(status, detail)`` of one ``ssh -o BatchMode=yes -o StrictHostKeyChecking=yes PEER true``.

    detail holds what stderr tells: ``new_fingerprint``, ``key_type``, ``offending_file``,
    ``offending_line`` for a changed key."""
    text = stderr or ""
    detail = {}
    match = _NEW_FP.search(text)
    if match:
        detail["key_type"] = match.group(1)
        detail["new_fingerprint"] = match.group(2)
    match = _OFFENDING.search(text)
    if match:
        detail["offending_file"] = match.group(2)
        detail["offending_line"] = int(match.group(3))
    if ("REMOTE HOST IDENTIFICATION HAS CHANGED" in text or re.search(r"Host key for \S+ has changed", text)
            or "POSSIBLE DNS SPOOFING DETECTED" in text):
        return "host_key_changed", detail
    if "Host key verification failed" in text or re.search(r"No \S+ host key is known for", text):
        return "host_key_unknown", detail
    if rc == 0 and not timed_out:
        return "ok", detail
    if "Permission denied" in text or "Too many authentication failures" in text:
        return "auth_denied", detail
    if "Could not resolve hostname" in text or "Name or service not known" in text \
            or "Temporary failure in name resolution" in text:
        return "dns", detail
    if "Connection refused" in text:
        return "refused", detail
    if timed_out or "timed out" in text or "Operation timed out" in text:
        return "timeout", detail
    if "No route to host" in text or "Network is unreachable" in text:
        return "unreachable", detail
    return "error", detail


def host_key_verified(status):
    """Whether ssh got past host-key verification (a login failure after it still counts)."""
    return status in ("ok", "auth_denied")


# --------------------------------------------------------------------------
# The ssh mesh: ssh from this node to every peer, all at once, each call bounded

TIMEOUT_RCS = (124, 128 + 9)
# Seconds before an ssh that timed out is tried once more (preflight_retest_ssh).
RETRY_PAUSE = 1.0
def _client_args(port, user, extra):
    argv = []
    for option in extra or []:
        argv += ["-o", option]
    if int(port or 22) != 22:
        argv += ["-p", str(port)]
    if user:
        argv += ["-l", user]
    return argv


def ssh_argv(ssh_bin, target, port=22, user="", connect_timeout=5, extra=()):
    """One ``ssh ... TARGET true`` with host-key checking on that writes no known_hosts file."""
    return ([ssh_bin, "-n", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
             "-o", "ConnectTimeout=%d" % int(connect_timeout), "-o", "UpdateHostKeys=no",
             "-o", "ControlMaster=no", "-o", "ControlPath=none"]
            + _client_args(port, user, extra) + ["--", target, "true"])


def config_argv(ssh_bin, target, port=22, user="", extra=()):
    """``ssh -G TARGET``: the client's effective configuration for a target, without connecting."""
    return [ssh_bin, "-G"] + _client_args(port, user, extra) + ["--", target]


def parse_ssh_g(text):
    """The settings of ``ssh -G`` output the client-configuration check reads."""
    config = {"stricthostkeychecking": "", "globalknownhostsfile": [], "userknownhostsfile": [], "identityfile": []}
    for line in (text or "").splitlines():
        fields = line.split()
        if not fields:
            continue
        key = fields[0].lower()
        if key == "stricthostkeychecking" and len(fields) > 1:
            config[key] = fields[1].lower()
        elif key in ("globalknownhostsfile", "userknownhostsfile"):
            config[key].extend(fields[1:])
        elif key == "identityfile" and len(fields) > 1:
            config[key].append(" ".join(fields[1:]))
    return config


def parse_pdsh(hosts, out, err):
    """``(ok_hosts, {host: stderr lines})`` from pdsh's ``host: line`` output."""
    ok = []
    for line in (out or "").splitlines():
        host = line.split(":", 1)[0].strip()
        if host in hosts and host not in ok:
            ok.append(host)
    errors = {}
    for line in (err or "").splitlines():
        text = line
        if text.startswith("pdsh@"):
            text = text.split(":", 1)[1].strip() if ":" in text else text
        host = text.split(":", 1)[0].strip()
        if host in hosts:
            errors.setdefault(host, []).append(text.split(":", 1)[1].strip() if ":" in text else text)
            continue
        match = re.search(r'gethostbyname\("([^"]+)"\) failed', text)
        if match and match.group(1) in hosts:
            errors.setdefault(match.group(1), []).append("Could not resolve hostname %s (pdsh: %s)"
                                                         % (match.group(1), text))
    return ok, errors


def short_stderr(text, limit=600):
    """stderr without ssh's ``@@@`` banner, cut to its last ``limit`` characters."""
    text = (text or "").strip()
    text = "\n".join(line for line in text.splitlines() if not line.startswith("@"))
    return text if len(text) <= limit else "..." + text[-limit:]


def offending_fingerprint(root, detail):
    """Fingerprint of the known_hosts line ssh named as offending, or ``None``."""
    path, number = detail.get("offending_file"), detail.get("offending_line")
    if not path:
        return None
    text, _problem = read_file(rooted(root, path))
    lines = split_lines(text or "")
    if not 0 < number <= len(lines):
        return None
    entry = parse_known_hosts_line(lines[number - 1])
    return safe_fingerprint(entry["blob"]) if entry else None


def _ssh_once(ops, argv, timeout):
    rc, _out, err = ops.run(argv, timeout=timeout)
    timed_out = rc in TIMEOUT_RCS
    status, detail = classify_ssh(rc, err, timed_out)
    text = short_stderr(err)
    if timed_out and status == "timeout":
        text = (text + "\n" if text else "") + "killed after %ss" % timeout
    return rc, status, detail, text


def _ssh_row(ops, argv, timeout, root, row, retry=False):
    rc, status, detail, text = _ssh_once(ops, argv, timeout)
    if retry and status == "timeout":
        # A timeout can be transient (a lost SYN, an sshd busy with its MaxStartups): once more after a pause.
        # Refused, denied, unknown keys and DNS never are, and are never retried.
        first = {"status": status, "rc": rc, "stderr": text}
        time.sleep(RETRY_PAUSE)
        rc, status, detail, text = _ssh_once(ops, argv, timeout)
        row["retried"] = first
        text = (text + "\n" if text else "") + ("timed out, retried once after %g s: timed out again" % RETRY_PAUSE
                                                 if status == "timeout" else "timed out, retried once after %g s: %s"
                                                 % (RETRY_PAUSE, status))
    row.update(status=status, rc=rc, stderr=text)
    for key in ("key_type", "new_fingerprint"):
        if key in detail:
            row[key] = detail[key]
    if "offending_file" in detail:
        row["offending"] = "%s:%d" % (detail["offending_file"], detail["offending_line"])
        old = offending_fingerprint(root, detail)
        if old:
            row["old_fingerprint"] = old
    return row


def _ssh_config(ops, argv, timeout):
    rc, out, err = ops.run(argv, timeout=timeout)
    if rc != 0:
        return {"error": short_stderr(err) or "ssh -G exited %s" % rc}
    return parse_ssh_g(out)


def _pdsh(ops, pdsh_bin, hosts, user, connect_timeout, timeout):
    argv = [pdsh_bin, "-t", str(int(connect_timeout)), "-u", str(max(int(timeout) - 2, 1))]
    if user:
        argv += ["-l", user]
    argv += ["-w", ",".join(hosts), "date"]
    # Host keys checked as for every other ssh of the audit: a command-line option beats any ssh_config, so an
    # ssh_config (the user's or the site's) that switches host-key checking off never makes the pdsh leg trust on
    # first use.
    env = {"PDSH_RCMD_TYPE": "ssh",
           "PDSH_SSH_ARGS_APPEND": "-o BatchMode=yes -o StrictHostKeyChecking=yes -o ConnectTimeout=%d "
                                   "-o UpdateHostKeys=no" % int(connect_timeout)}
    rc, out, err = ops.run(argv, timeout=timeout, env=env)
    ok, errors = parse_pdsh(hosts, out, err)
    timed_out = rc in TIMEOUT_RCS
    failed = {}
    for host in hosts:
        if host in ok:
            continue
        text = "\n".join(errors.get(host, [])) or ("pdsh killed after %ss" % timeout if timed_out else "no output")
        status, _detail = classify_ssh(255, text, timed_out)
        failed[host] = {"status": status, "stderr": text}
    return {"state": "ran", "hosts": list(hosts), "argv": argv, "rc": rc, "ok": ok, "failed": failed,
            "stderr": short_stderr(err)}


KEYSCAN_TYPES = "rsa,ecdsa,ed25519"


def keyscan_argv(keyscan_bin, target, port=22, timeout=5):
    """``ssh-keyscan``: the host keys a peer's sshd presents (compared with its key files, never trusted)."""
    return [keyscan_bin, "-T", str(int(timeout)), "-p", str(int(port or 22)), "-t", KEYSCAN_TYPES, "--", target]


def parse_keyscan(out):
    """``TYPE BASE64`` of every key ``ssh-keyscan`` printed, one per type, in order."""
    keys, types = [], set()
    for line in (out or "").splitlines():
        fields = line.split()
        if len(fields) < 3 or line.startswith("#"):
            continue
        if fields[1] not in types:
            types.add(fields[1])
            keys.append("%s %s" % (fields[1], fields[2]))
    return keys


def _keyscan(ops, argv, timeout, target):
    rc, out, err = ops.run(argv, timeout=timeout)
    keys = parse_keyscan(out)
    row = {"target": target, "keys": keys, "error": ""}
    if not keys:
        row["error"] = short_stderr(err, 300) or ("ssh-keyscan exited %s with no key" % rc)
    return row


def run_mesh(ops, source, peers, user="", connect_timeout=5, timeout=20, parallel=32, ssh_options=(),
             connect=True, pdsh="auto", pdsh_hosts=(), ssh_bin="ssh", pdsh_bin="pdsh", root="/",
             keyscan=True, keyscan_bin="ssh-keyscan", retry_timeouts=False):
    """ssh from this node to every target of every peer, at most ``parallel`` at once.

    ``peers`` is ``[{node, targets, port}]``.  Every target gets ``ssh -G`` (the client's
    effective configuration, no connection); with ``connect`` also one ssh with
    BatchMode and StrictHostKeyChecking=yes, and pdsh to ``pdsh_hosts`` when installed and
    ``pdsh`` is ``auto``.  Each command is killed after ``timeout`` seconds, so the whole
    run takes at most about ``ceil((targets * 2 + 1) / parallel) * (timeout + 2)`` seconds; with
    ``retry_timeouts`` an ssh that timed out is tried once more after ``RETRY_PAUSE`` seconds (its row
    has ``retried``, the first attempt), so at most ``2 * timeout + RETRY_PAUSE`` for such a wave.

    With ``connect`` and ``keyscan``, also ``ssh-keyscan`` of each peer's first target: the
    host keys its sshd really presents, so the controller can compare them with the key files
    read on that peer (``served``; never written anywhere, never trusted).

    Returns ``{source, ssh, connect, peers, results, client_config, pdsh, served, keyscan,
    problem}``: ``peers`` the nodes it was given; ``results``
    one row per (peer, target) with the classified ``status``; ``client_config`` per
    target; ``pdsh`` with ``state`` ``ran``/``off``/``no_hosts``/``not_installed``/``no_ssh``.
    A missing ssh client is ``problem``, not an exception."""
    report = {"source": source, "ssh": None, "connect": bool(connect), "results": [], "client_config": {},
              "peers": [{"node": peer["node"]} for peer in peers or []],
              "pdsh": {"state": "off" if (not connect or pdsh == "never") else "no_hosts"}, "problem": "",
              "served": {}, "keyscan": "off" if not (connect and keyscan) else "no_peers"}
    ssh = ops.which(ssh_bin)
    if not ssh:
        report["problem"] = "no ssh client (%s) on %s; install openssh-client" % (ssh_bin, source)
        if report["pdsh"]["state"] == "no_hosts":
            report["pdsh"] = {"state": "no_ssh"}
        return report
    report["ssh"] = ssh
    jobs, config_jobs = [], {}
    for peer in peers or []:
        port = int(peer.get("port") or 22)
        for target in dict.fromkeys(t for t in peer.get("targets") or [] if t):
            if connect:
                row = {"source": source, "destination": peer["node"], "target": target}
                jobs.append((ssh_argv(ssh, target, port, user, connect_timeout, ssh_options), row))
            if target not in config_jobs:
                config_jobs[target] = config_argv(ssh, target, port, user, ssh_options)
    hosts = [h for h in pdsh_hosts or [] if h]
    pdsh_path = None
    if connect and pdsh != "never" and hosts:
        pdsh_path = ops.which(pdsh_bin)
        if not pdsh_path:
            report["pdsh"] = {"state": "not_installed", "program": pdsh_bin, "hosts": hosts}
    scans = {}
    if connect and keyscan and peers:
        keyscan_path = ops.which(keyscan_bin)
        if not keyscan_path:
            report["keyscan"] = "not_installed"
        else:
            report["keyscan"] = "ran"
            for peer in peers:
                targets = [t for t in peer.get("targets") or [] if t]
                if targets:
                    scans[peer["node"]] = (keyscan_argv(keyscan_path, targets[0], peer.get("port") or 22,
                                                        connect_timeout), targets[0])
    count = len(jobs) + len(config_jobs) + len(scans) + (1 if pdsh_path else 0)
    if not count:
        return report
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(int(parallel), count))) as pool:
        pdsh_future = pool.submit(_pdsh, ops, pdsh_path, hosts, user, connect_timeout, timeout) if pdsh_path else None
        scan_futures = {node: pool.submit(_keyscan, ops, argv, timeout, target)
                        for node, (argv, target) in scans.items()}
        config_futures = {target: pool.submit(_ssh_config, ops, argv, timeout) for target, argv in config_jobs.items()}
        futures = [pool.submit(_ssh_row, ops, argv, timeout, root, row, bool(retry_timeouts)) for argv, row in jobs]
        report["results"] = [future.result() for future in futures]
        report["client_config"] = {target: future.result() for target, future in config_futures.items()}
        report["served"] = {node: future.result() for node, future in scan_futures.items()}
        if pdsh_future is not None:
            report["pdsh"] = pdsh_future.result()
    return report
