# -*- coding: utf-8 -*-
"""Capability ``ssh_trust``, the node half's reader: node-to-node ssh with host-key checking on.

Node layer (``module_utils/preflight_node/capabilities/ssh_trust.py``, the reader, shipped in the ``preflight_facts``
call):

* :func:`read` - on the node: its host keys (from the files the RUNNING sshd serves: the process
  listening on ssh_trust_port, its -f/-h/-o and ``sshd -T``; never a network scan), its
  self-reported names, the managed block of the cluster known-hosts file, the ssh client's Include
  of ``ssh_config.d`` and the drop-in, and each cluster key user's home, ~/.ssh, own pair (never its
  private content) and authorized cluster key lines.  A node without sshd or its configuration
  reads fine: that is a fact.
* ``probe`` - in ``module_utils/preflight_node/capabilities/ssh_trust_probe.py`` (shipped in the ``preflight_probes``
  call), on the node: ssh to every peer with BatchMode and StrictHostKeyChecking=yes, in parallel and
  bounded, ``ssh -G`` per peer, ``ssh-keyscan`` of each peer (the keys its sshd serves, compared with its
  files), pdsh when installed (``module_utils/preflight_node/ssh/mesh.py``).

The primitives are in ``ssh.py`` (keys, known_hosts, the managed block), ``sshd.py`` (the running
sshd), ``ssh_mesh.py`` (the mesh runner) and ``ssh_keys.py`` (a user's ~/.ssh); the check builders
shared with the modules in ``ssh_checks.py`` (all in ``module_utils/preflight_node/``).  The
controller half (``validate``, ``read_args``, ``plan``, ``probe_args``, ``decide``) is
``cluster_preflight/capabilities/ssh_trust/``.
"""

from __future__ import annotations

import os
import pwd
import socket

from ..privilege import denied, privileged
from ..ssh.primitives import (MARKER, SshTrustError, markers, parse_public_key, read_file, rooted, split_block,
                              split_lines)
from ..ssh.keys import (UnsafeDirectory, is_managed_line, open_ssh_dir, parse_authorized_line, private_key_state,
                        read_in_dir, user_ssh_state)
from ..ssh.sshd import host_key_sources, included, listening_inodes, read_host_keys, ssh_config_includes

CAPABILITY = "ssh_trust"


# --------------------------------------------------------------------------
# Reader


def passwd_entry(root, user, ops):
    """``({home, uid, gid}, problem)`` of ``user``: getent (NSS, so directory users too), else the passwd file."""
    def entry(fields):
        try:
            return {"home": fields[5], "uid": int(fields[2]), "gid": int(fields[3])}
        except (IndexError, ValueError):
            return None
    getent = ops.which("getent")
    if getent:
        rc, out, err = ops.run([getent, "passwd", user], timeout=10)
        if rc == 0 and out.strip():
            found = entry(out.strip().splitlines()[0].split(":"))
            if found and found["home"]:
                return found, None
        if rc == 2 or (rc == 0 and not out.strip()):
            return None, "no user %s" % user
        return None, "getent passwd %s failed (rc %s): %s" % (user, rc, (err or "").strip()[:200])
    if root in ("", "/"):
        try:
            record = pwd.getpwnam(user)
        except KeyError:
            return None, "no user %s" % user
        return {"home": record.pw_dir, "uid": record.pw_uid, "gid": record.pw_gid}, None
    text, problem = read_file(rooted(root, "/etc/passwd"))
    for line in split_lines(text or ""):
        fields = line.rstrip("\n").split(":")
        if fields[0] == user and entry(fields):
            return entry(fields), None
    return None, problem or "no user %s" % user


def _read_user_ssh(entry, root, name, comment):
    """The pair's state and the authorized_keys lines of one user, read through a descriptor of
    ~/.ssh opened without following links (a user cannot make root read another file here)."""
    try:
        dir_fd = open_ssh_dir(root, entry["home"])
    except (UnsafeDirectory, OSError) as exc:
        entry["problem"] = str(exc)
        return
    problems = []
    try:
        key = private_key_state(dir_fd, name)
        entry.update(private=key.get("kind") == "file", private_mode=key.get("mode"), private_uid=key.get("uid"))
        try:
            text = read_in_dir(dir_fd, name + ".pub", entry["uid"])
        except UnsafeDirectory as exc:
            text = None
            problems.append("%s.pub: %s" % (entry["path"], exc))
        if text is not None:
            try:
                parsed = parse_public_key(text)
                entry["public_key"] = "%s %s" % (parsed["type"], parsed["blob"])
                entry["fingerprint"] = parsed["fingerprint"]
            except SshTrustError:  # its message would quote the file
                problems.append("%s.pub is not an ssh public key" % entry["path"])
        try:
            text = read_in_dir(dir_fd, "authorized_keys", entry["uid"])
        except UnsafeDirectory as exc:
            text = None
            problems.append("%s/authorized_keys: %s" % (entry["ssh"]["ssh_dir"], exc))
        for line in split_lines(text or ""):
            if is_managed_line(line, comment):
                entry["authorized"].append(parse_authorized_line(line) or {
                    "options": "", "type": "", "public_key": "", "fingerprint": "(unreadable key)",
                    "comment": comment, "node": ""})
    finally:
        os.close(dir_fd)
    entry["problem"] = "; ".join(problems)


def read_cluster_key(root, users, name, comment, ops):
    """Per user: home and ~/.ssh (:func:`.ssh_keys.user_ssh_state`), the private key's
    existence, mode and owner (never its content), the public key, and the authorized_keys
    lines that end in the cluster key's comment."""
    state = {}
    for user in users:
        found, problem = passwd_entry(root, user, ops)
        if not found:
            state[user] = {"exists": False, "problem": problem}
            continue
        ssh = user_ssh_state(root, found["home"])
        entry = {"exists": True, "uid": found["uid"], "gid": found["gid"], "home": found["home"],
                 "path": os.path.join(ssh["ssh_dir"], name), "ssh": ssh, "private": False, "private_mode": None,
                 "private_uid": None, "public_key": "", "fingerprint": "", "problem": "", "authorized": []}
        # Nothing is read through a ~/.ssh that is a link or not a directory: ssh_dirs reports it.
        if ssh["ssh_dir_state"].get("kind") == "dir":
            _read_user_ssh(entry, root, name, comment)
        state[user] = entry
    return {"users": state}


def _needs_root(root, port, sshd, problems, cluster_key):
    """What this reader, running without root, could not read and why (``[]`` as root); marks
    ``sshd`` and each cluster key user it concerns with ``needs_root``."""
    if privileged():
        return []
    found = []
    if sshd.get("source") == "default" and listening_inodes(root, port):
        sshd["needs_root"] = ("the process listening on port %d (the running sshd) could not be found: the "
                              "descriptors of root's processes (/proc/<pid>/fd) are readable only by root" % port)
        found.append(sshd["needs_root"])
    found += ["host key: %s" % problem for problem in problems if denied(problem)]
    for user, entry in sorted(((cluster_key or {}).get("users") or {}).items()):
        ssh = entry.get("ssh") or {}
        errors = [(ssh.get(key) or {}).get("error") for key in ("home_state", "ssh_dir_state")]
        if any(denied(text) for text in errors + [entry.get("problem")]):
            entry["needs_root"] = "%s's home or ~/.ssh cannot be read without root (%s)" % (user, "; ".join(
                text for text in errors + [entry.get("problem")] if denied(text)))
            found.append(entry["needs_root"])
    return found


def read(args, ops):
    """This node's ssh trust facts; what the node lacks is a fact, never an exception.  ``privileged``
    and ``needs_root`` say what a reader without root could not read (see privilege.py)."""
    root = args.get("root") or "/"
    paths, problem, sshd = host_key_sources(root, args.get("sshd_config") or "", args.get("host_key_files") or [],
                                            ops, args.get("port") or 22)
    keys, problems = read_host_keys(root, paths, ops)
    if problem:
        problems.insert(0, problem)
    sshd["privileged"] = privileged()
    hostname = socket.gethostname()
    fqdn = socket.getfqdn() or hostname

    path = args["known_hosts_file"]
    text, error = read_file(rooted(root, path))
    block, present = [], False
    if text is not None:
        try:
            _before, block, _after, present = split_block(text, *markers(args.get("marker") or MARKER))
        except SshTrustError as exc:
            error = str(exc)
    known_hosts = {"path": path, "exists": text is not None, "present": present, "block": block, "error": error}

    dropin = args["ssh_config_dropin"]
    config_text, config_problem = read_file(rooted(root, args["ssh_config"]))
    includes = ssh_config_includes(root, args["ssh_config"])
    dropin_text, dropin_problem = read_file(rooted(root, dropin))
    client = {"ssh_config": args["ssh_config"], "ssh_config_exists": config_text is not None, "includes": includes,
              "dropin": dropin, "dropin_included": included(includes, dropin), "dropin_text": dropin_text,
              "problem": config_problem or dropin_problem}

    cluster_key = None
    if args.get("cluster_key"):
        cluster_key = read_cluster_key(root, args.get("cluster_key_users") or [], args["cluster_key_name"],
                                       args["cluster_key_comment"], ops)
    config = sshd.get("config") or ""
    lacking = _needs_root(root, args.get("port") or 22, sshd, problems, cluster_key)
    return {"hostname": hostname, "fqdn": fqdn, "short_name": hostname.split(".")[0],
            "privileged": sshd["privileged"], "needs_root": lacking, "sshd": sshd,
            "sshd_config": {"path": config, "exists": bool(config) and os.path.exists(rooted(root, config))},
            "host_key_files": [p[:-4] if p.endswith(".pub") else p for p in paths],
            "keys": keys, "problems": problems, "known_hosts": known_hosts, "client": client,
            "cluster_key": cluster_key}
