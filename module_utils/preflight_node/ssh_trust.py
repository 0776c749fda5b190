# -*- coding: utf-8 -*-
"""Capability ``ssh_trust``: node-to-node ssh with host-key checking on.

The faces of ``cluster_preflight/capabilities/__init__.py``:

* :func:`validate` - inputs the argument spec cannot judge (ranges, file names, paths).
* :func:`read_args` / :func:`read` - on the node: its host keys (from the files the RUNNING sshd
  serves: the process listening on ssh_trust_port, its -f/-h/-o and ``sshd -T``; never a network
  scan), its self-reported names, the managed block of the cluster known-hosts file, the ssh
  client's Include of ``ssh_config.d`` and the drop-in, and each cluster key user's home, ~/.ssh,
  own pair (never its private content) and authorized cluster key lines.  A node without sshd or
  its configuration reads fine: that is a fact.
* :func:`plan` - on the controller, over every node: the known-hosts entries every node should
  hold under its inventory names only (what the writer ``known_hosts_block`` writes and the audit
  compares with), names two nodes share, each node's mesh peers, the client drop-in, the cluster
  key users and addresses, and which nodes' keys changed.
* :func:`probe_args` / :func:`probe` - on the node: ssh to every peer with BatchMode and
  StrictHostKeyChecking=yes, in parallel and bounded, ``ssh -G`` per peer, ``ssh-keyscan`` of
  each peer (the keys its sshd serves, compared with its files), pdsh when installed.
* :func:`decide` - on the controller, pure: facts, plan and probes into checks.

The check builders for one peer (:func:`peer_host_key_check`, :func:`peer_login_check`), the
client configuration, pdsh, the known-hosts block and the host keys are shared with the
modules ``ssh_mesh``, ``known_hosts_block``, ``ssh_host_keys`` and ``ssh_cluster_key`` (which
judges ~/.ssh with the same ``ssh_dir_refusal``), so the audit and bring-up judge alike.
"""

from __future__ import annotations

import os
import pwd
import re
import socket

from .checks import (check, failed, not_applicable, passed, skipped, warned,
                                                   worst)
from .privilege import BECOME_FIX, assumed, denied, needs_root, privileged
from .ssh import (KNOWN_HOSTS, MARKER, SSHD_CONFIG, SshTrustError, _NAME,
                                                host_key_sources, host_key_verified, host_token, included,
                                                is_managed_line, listening_inodes, markers, normalize_entries,
                                                UnsafeDirectory, open_ssh_dir, parse_authorized_line,
                                                parse_public_key, plan_block, private_key_state, read_file,
                                                read_host_keys, read_in_dir, rooted, run_mesh, safe_fingerprint,
                                                split_block, split_lines, ssh_config_includes, ssh_dir_refusal,
                                                user_ssh_state)

CAPABILITY = "ssh_trust"

# The role's defaults (roles/ssh_trust/defaults/main.yml; a unit test keeps them equal), used
# when a setting is absent.  ssh_trust_login_policy's default depends on ssh_trust_cluster_key.
DEFAULTS = {
    "ssh_trust_sshd_config": "",
    "ssh_trust_host_key_files": [],
    "ssh_trust_port": 22,
    "ssh_trust_extra_names": [],
    "ssh_trust_known_hosts_file": KNOWN_HOSTS,
    "ssh_trust_known_hosts_backup": False,
    "ssh_trust_accept_changed": [],
    "ssh_trust_drift_policy": "warn",
    "ssh_trust_cluster_key": False,
    "ssh_trust_cluster_key_users": ["root"],
    "ssh_trust_cluster_key_name": "id_ed25519_cluster",
    "ssh_trust_cluster_key_comment": "preflight-ssh-trust-cluster-key",
    "ssh_trust_cluster_key_restrict_from": False,
    "ssh_trust_ssh_config": "/etc/ssh/ssh_config",
    "ssh_trust_ssh_config_dropin": "/etc/ssh/ssh_config.d/60-preflight-cluster.conf",
    "ssh_trust_strict_host_key_checking_no": False,
    "ssh_trust_mesh": True,
    "ssh_trust_mesh_user": "",
    "ssh_trust_mesh_connect_timeout": 5,
    "ssh_trust_mesh_timeout": 20,
    "ssh_trust_mesh_parallel": 32,
    "ssh_trust_pdsh": "auto",
    "ssh_trust_unknown_key_policy": "warn",
    "ssh_trust_task_timeout": 120,
}
POLICIES = ("warn", "fail")
BRINGUP = "run bringup.yml (role ssh_trust)"
# Names that mean "this machine" wherever they are used: never a name of one cluster node.
LOCAL_NAME = re.compile(r"^(localhost(\..*)?|127\..*|::1|ip6-.*)$", re.IGNORECASE)
KEY_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
DROPIN = re.compile(r"^/.*/ssh_config\.d/[^/]+\.conf$")
USER_NAME = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]*\$?$")
COMMENT = re.compile(r"^[A-Za-z0-9_.@:+=-]+$")
# How many peers a found text names before it summarises.
LIST_LIMIT = 8


# --------------------------------------------------------------------------
# Settings


def setting(settings, key):
    """``settings["ssh_trust_" + key]``, the role default when absent."""
    name = "ssh_trust_" + key
    if settings and name in settings and settings[name] is not None:
        return settings[name]
    if name == "ssh_trust_login_policy":
        return "fail" if as_bool(setting(settings, "cluster_key")) else "warn"
    return DEFAULTS[name]


def as_bool(value):
    """A switch as users type it: ``-e ssh_trust_mesh=false`` must mean false."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on", "y", "t")
    return bool(value)


def as_list(value):
    """A list input that may come as a comma-separated string (``-e ssh_trust_accept_changed=a,b``)."""
    if value is None:
        return []
    if isinstance(value, str):
        value = value.split(",")
    return [str(item).strip() for item in value if str(item).strip()]


def policy(settings, key):
    """A warn/fail policy; an invalid value (validate reports it) falls back to the default."""
    value = setting(settings, key)
    if value in POLICIES:
        return value
    return setting({"ssh_trust_cluster_key": setting(settings, "cluster_key")}, key)


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def validate(settings):
    """Input problems beyond types and choices: ``[{name, found, expected, fix}]``."""
    problems = []

    def problem(key, found, expected, fix):
        problems.append({"name": "ssh_trust_" + key, "found": str(found), "expected": expected, "fix": fix})

    port = setting(settings, "port")
    if not _is_int(port) or not 1 <= port <= 65535:
        problem("port", "ssh_trust_port is %r" % (port,), "a TCP port 1..65535: the port the other nodes reach "
                "this node's sshd on", "set ssh_trust_port to the port sshd listens on (usually 22)")
    for key, what in (("mesh_connect_timeout", "ssh ConnectTimeout of the mesh audit"),
                      ("mesh_timeout", "bound of one mesh ssh and of the pdsh run"),
                      ("task_timeout", "bound of each bring-up task")):
        value = setting(settings, key)
        if not _is_int(value) or value < 1:
            problem(key, "ssh_trust_%s is %r" % (key, value), "a whole number of seconds >= 1 (%s)" % what,
                    "set ssh_trust_%s to a positive number of seconds" % key)
    connect, bound = setting(settings, "mesh_connect_timeout"), setting(settings, "mesh_timeout")
    if _is_int(connect) and _is_int(bound) and 1 <= connect and 1 <= bound and connect >= bound:
        problem("mesh_connect_timeout", "ssh_trust_mesh_connect_timeout is %d, ssh_trust_mesh_timeout %d"
                % (connect, bound), "the connect timeout below the bound of the whole ssh call (default 5 < 20)",
                "lower ssh_trust_mesh_connect_timeout or raise ssh_trust_mesh_timeout")
    parallel = setting(settings, "mesh_parallel")
    if not _is_int(parallel) or parallel < 1:
        problem("mesh_parallel", "ssh_trust_mesh_parallel is %r" % (parallel,), "at least 1 ssh at once",
                "set ssh_trust_mesh_parallel to 1 or more (default 32)")
    name = setting(settings, "cluster_key_name")
    if not isinstance(name, str) or not KEY_NAME.match(name) or name in (".", ".."):
        problem("cluster_key_name", "ssh_trust_cluster_key_name is %r" % (name,),
                "a file name inside ~/.ssh such as id_ed25519_cluster", "drop any path, space or other character "
                "outside A-Z a-z 0-9 _ . - from it")
    comment = setting(settings, "cluster_key_comment")
    if not isinstance(comment, str) or not COMMENT.match(comment):
        problem("cluster_key_comment", "ssh_trust_cluster_key_comment is %r" % (comment,),
                "one word (the cluster key's authorized_keys line is found by it)",
                "use a single word such as preflight-ssh-trust-cluster-key")
    dropin = setting(settings, "ssh_config_dropin")
    if not isinstance(dropin, str) or not DROPIN.match(dropin):
        problem("ssh_config_dropin", "ssh_trust_ssh_config_dropin is %r" % (dropin,),
                "a *.conf file in an ssh_config.d directory, which ssh_config's Include reads",
                "use /etc/ssh/ssh_config.d/60-preflight-cluster.conf")
    users = as_list(setting(settings, "cluster_key_users"))
    if as_bool(setting(settings, "cluster_key")) and not users:
        problem("cluster_key_users", "ssh_trust_cluster_key is true but ssh_trust_cluster_key_users is empty",
                "at least one user to hold the cluster key", "set ssh_trust_cluster_key_users (default [root]) "
                "or ssh_trust_cluster_key: false")
    bad_users = [user for user in users if not USER_NAME.match(user)]
    if bad_users:
        problem("cluster_key_users", "ssh_trust_cluster_key_users holds %s" % ", ".join(repr(u) for u in bad_users),
                "user names", "list the users by name")
    user = setting(settings, "mesh_user")
    if not isinstance(user, str) or (user and not USER_NAME.match(user)):
        problem("mesh_user", "ssh_trust_mesh_user is %r" % (user,), "a user name, or empty for the connecting user",
                "set ssh_trust_mesh_user to a user name or ''")
    for key in ("drift_policy", "unknown_key_policy", "login_policy"):
        value = settings.get("ssh_trust_" + key, "warn" if key != "login_policy" else "fail")
        if value not in POLICIES:
            problem(key, "ssh_trust_%s is %r" % (key, value), "warn or fail", "set ssh_trust_%s to warn or fail" % key)
    pdsh = setting(settings, "pdsh")
    if pdsh not in ("auto", "never"):
        problem("pdsh", "ssh_trust_pdsh is %r" % (pdsh,), "auto or never", "set ssh_trust_pdsh to auto or never")
    for key in ("sshd_config", "known_hosts_file", "ssh_config"):
        value = setting(settings, key)
        if key == "sshd_config" and value == "":
            continue  # empty: the configuration of the sshd listening on ssh_trust_port
        if not isinstance(value, str) or not value.startswith("/"):
            problem(key, "ssh_trust_%s is %r" % (key, value), "an absolute path%s" % (
                " or empty (the configuration of the sshd listening on ssh_trust_port)" if key == "sshd_config" else ""),
                    "set ssh_trust_%s to an absolute path (default %s)" % (key, DEFAULTS["ssh_trust_" + key] or "''"))
    files = setting(settings, "host_key_files")
    relative = [path for path in as_list(files) if not path.startswith("/")]
    if relative or not isinstance(files, (list, tuple)):
        problem("host_key_files", "ssh_trust_host_key_files is %r" % (files,), "a list of absolute paths of host keys",
                "list the key files sshd serves, for example /etc/ssh/ssh_host_ed25519_key")
    names = setting(settings, "extra_names")
    bad_names = [n for n in as_list(names) if not _NAME.match(n)] if isinstance(names, (list, tuple)) else [names]
    if bad_names:
        problem("extra_names", "ssh_trust_extra_names holds %s" % ", ".join(repr(n) for n in bad_names),
                "host names or addresses", "list plain names and addresses, no ports or spaces")
    return problems


# --------------------------------------------------------------------------
# Reader


def read_args(settings, node):
    """What :func:`read` needs on ``node``; ssh_trust is never switched off as a whole."""
    return {
        "node": node["name"],
        "sshd_config": setting(settings, "sshd_config") or "",
        "host_key_files": as_list(setting(settings, "host_key_files")),
        "port": _port(settings),
        "known_hosts_file": setting(settings, "known_hosts_file"),
        "marker": MARKER,
        "ssh_config": setting(settings, "ssh_config"),
        "ssh_config_dropin": setting(settings, "ssh_config_dropin"),
        "cluster_key": as_bool(setting(settings, "cluster_key")),
        "cluster_key_users": as_list(setting(settings, "cluster_key_users")),
        "cluster_key_name": setting(settings, "cluster_key_name"),
        "cluster_key_comment": setting(settings, "cluster_key_comment"),
        "root": "/",
    }


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
    """Per user: home and ~/.ssh (:func:`preflight_ssh.user_ssh_state`), the private key's
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
    and ``needs_root`` say what a reader without root could not read (see preflight_privilege)."""
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


# --------------------------------------------------------------------------
# Cluster plan


def _node(cluster, host):
    node = dict((cluster.get("nodes") or {}).get(host) or {})
    node.setdefault("name", host)
    node["ansible_host"] = str(node.get("ansible_host") or host)
    node["node_addr"] = str(node.get("node_addr") or node["ansible_host"])
    return node


def _settings(cluster, host):
    return (cluster.get("settings") or {}).get(host) or {}


def _facts(cluster, host):
    return (cluster.get("facts") or {}).get(host)


def _port(settings):
    port = setting(settings, "port")
    return port if _is_int(port) and 1 <= port <= 65535 else 22


def _usable(name):
    name = str(name or "").strip()
    return name if name and _NAME.match(name) and not LOCAL_NAME.match(name) else ""


def _named(node, settings):
    """``[(name, source)]``: the names a node has in the inventory, each with where it comes from."""
    named = [(node["name"], "inventory name"), (node.get("node_addr"), "preflight_node_addr"),
             (node.get("ansible_host"), "ansible_host")]
    named += [(name, "ssh_trust_extra_names") for name in as_list(setting(settings, "extra_names"))]
    found = {}
    for name, source in named:
        name = _usable(name)
        if name and name not in found:
            found[name] = source
    return list(found.items())


def inventory_names(node, settings):
    """The names a node is known by: its inventory name, ``preflight_node_addr``, ``ansible_host``
    and ``ssh_trust_extra_names``.  Only these are ever trusted; what a node reports about itself
    (hostname, FQDN) is compared with them (check ``hostname``), never added."""
    return [name for name, _source in _named(node, settings)]


def reported_names(facts):
    """The names a node reports for itself: ``[(what, name)]`` for its hostname and FQDN."""
    if not facts:
        return []
    found = []
    for what, name in (("hostname", facts.get("hostname")), ("FQDN", facts.get("fqdn"))):
        name = _usable(name)
        if name and name not in [n for _w, n in found]:
            found.append((what, name))
    return found


def _claims(cluster, hosts):
    """``(names, duplicates, owners)`` over the inventory alone.

    ``names``: per node the names it keeps.  A name (with the node's ssh port, as known_hosts
    holds it) that two nodes list belongs to neither, except that a node's own inventory name
    stays its own.  ``duplicates``: per node ``[{name, source, others: {node: source}}]``, on every
    node involved and no other.  ``owners``: lower-cased name -> ``{node: source}``."""
    owners, listed = {}, {}
    for host in hosts:
        port = _port(_settings(cluster, host))
        listed[host] = [(name, source, host_token(name, port).lower())
                        for name, source in _named(_node(cluster, host), _settings(cluster, host))]
        for name, source, token in listed[host]:
            owners.setdefault(token, {}).setdefault(host, source)
    names, duplicates, by_name = {}, {}, {}
    for host in hosts:
        keep = []
        for name, source, token in listed[host]:
            by_name.setdefault(name.lower(), {}).setdefault(host, source)
            others = {h: src for h, src in owners[token].items() if h != host}
            if not others:
                keep.append(name)
                continue
            if source == "inventory name" and "inventory name" not in others.values():
                keep.append(name)
            duplicates.setdefault(host, []).append({"name": name, "source": source, "others": others})
        names[host] = keep
    return names, duplicates, by_name


def render_dropin(names, cluster_key, key_name, relaxed):
    """The ssh client drop-in: settings for the cluster's own names only, never ``Host *``."""
    lines = ["# Managed by the cluster preflight (role ssh_trust); local edits are overwritten.",
             "# Applies only to the cluster's names and addresses below, never to other hosts."]
    for start in range(0, len(names), 16):
        lines.append("Host " + " ".join(names[start:start + 16]))
        if cluster_key:
            lines.append("    IdentityFile ~/.ssh/%s" % key_name)
        if relaxed:
            lines += ["    # SECURITY: host keys of these peers are NOT verified "
                      "(ssh_trust_strict_host_key_checking_no: true);",
                      "    # a spoofed or reinstalled node is not detected.", "    StrictHostKeyChecking no"]
    return "\n".join(lines) + "\n"


def mesh_targets(name, node):
    """What a peer is reached by in the mesh: its inter-node address and its inventory name."""
    node = node or {}
    targets = [t for t in dict.fromkeys([_usable(node.get("node_addr") or node.get("ansible_host")),
                                         _usable(name)]) if t]
    return targets or [name]


def mesh_peers(host, hosts, nodes, port_of):
    """The peers ``host`` sshes to: every other targeted node, by :func:`mesh_targets`
    (``port_of(peer)`` is the peer's sshd port)."""
    return [{"node": peer, "targets": mesh_targets(peer, nodes.get(peer)), "port": port_of(peer)}
            for peer in hosts if peer != host]


def _cluster_key_plan(cluster, hosts, all_hosts):
    """``(public, keys, holders)``: the plan's ``cluster_key`` (``{enabled, users, from}``), every
    user's public cluster key per node (``{user: {node: (public_key, fingerprint)}}``) and who holds
    each key (``{fingerprint: [(node, user)]}``).  Each node generates its own pair per user; the
    controller only ever sees public keys."""
    enabled = [h for h in hosts if as_bool(setting(_settings(cluster, h), "cluster_key"))]
    public = {"enabled": bool(enabled), "users": [], "from": []}
    keys, holders = {}, {}
    if not enabled:
        return public, keys, holders
    addresses = []
    for host in all_hosts:
        node = _node(cluster, host)
        addresses += [node.get("node_addr"), node.get("ansible_host")]
    public["from"] = [a for a in dict.fromkeys(_usable(a) for a in addresses) if a]
    users = []
    for host in enabled:
        users += as_list(setting(_settings(cluster, host), "cluster_key_users"))
        state = ((_facts(cluster, host) or {}).get("cluster_key") or {}).get("users") or {}
        for user, entry in state.items():
            if entry.get("exists") and entry.get("fingerprint"):
                keys.setdefault(user, {})[host] = (entry["public_key"], entry["fingerprint"])
                holders.setdefault(entry["fingerprint"], []).append((host, user))
    public["users"] = list(dict.fromkeys(users))
    return public, keys, holders


_MEMO = {}


def _analysis(cluster):
    """Everything :func:`plan` and :func:`decide` derive from the cluster view, computed once.

    Memoised on the identity of the view's mappings (``decide`` runs once per node over the
    same view): pass new mappings after changing facts or settings."""
    hosts = list(cluster.get("hosts") or [])
    all_hosts = list(cluster.get("all_hosts") or hosts)
    facts_map, settings_map = cluster.get("facts") or {}, cluster.get("settings") or {}
    # O(1) per call: the mappings' identities and sizes (decide runs once per node over one view).
    key = (id(facts_map), id(settings_map), id(cluster.get("nodes")), len(hosts), len(all_hosts),
           len(facts_map), len(settings_map))
    hit = _MEMO.get("last")
    if hit and hit[0] == key:
        return hit[2]
    result = _analyse(cluster, hosts, all_hosts)
    # The view is kept alive with its result so that the ids in the key cannot be reused.
    _MEMO["last"] = (key, (facts_map, settings_map, cluster.get("nodes")), result)
    return result


def _analyse(cluster, hosts, all_hosts):
    targeted = sorted(hosts)
    keep_nodes = sorted(set(all_hosts) | set(hosts))
    names, duplicates, owners = _claims(cluster, keep_nodes)
    entries, unreadable, unread, fingerprints = [], {}, [], {}
    for host in targeted:
        facts = _facts(cluster, host)
        if facts is None:
            unread.append(host)
            continue
        keys = []
        for key in facts.get("keys") or []:
            try:
                parsed = parse_public_key(key.get("public_key"))
            except (SshTrustError, AttributeError):
                continue
            keys.append("%s %s" % (parsed["type"], parsed["blob"]))
            fingerprints.setdefault(host, []).append(parsed["fingerprint"])
        if not keys:
            unreadable[host] = "; ".join(facts.get("problems") or []) or "no host key named"
            continue
        if not names[host]:
            unreadable[host] = "%s has no name of its own in the inventory (each is another node's too, or means " \
                               "'this machine')" % host
            continue
        entries.append({"node": host, "names": names[host], "keys": keys, "port": _port(_settings(cluster, host))})
    desired = normalize_entries(entries)

    blocks, changes = {}, {}
    # The block every node holds once bring-up ran; a node whose block is exactly that needs no parsing.
    fresh = plan_block("", None, keep_nodes, (), MARKER, desired=desired)
    canonical = fresh["block"]
    begin, end = markers(MARKER)
    for host in targeted:
        facts = _facts(cluster, host)
        known = (facts or {}).get("known_hosts")
        if not known or known.get("error"):
            continue
        block = list(known.get("block") or [])
        if known.get("present") and block == canonical:
            blocks[host] = {"block": canonical, "old_block": block, "present": True, "changed_keys": [],
                            "missing": [], "dropped": []}
            continue
        if not block:  # what the writer does to a file without a block: add every entry
            blocks[host] = dict(fresh, old_block=[], present=bool(known.get("present")))
            continue
        text = begin + "\n" + "".join(line + "\n" for line in block) + end + "\n" if known.get("present") else ""
        settings = _settings(cluster, host)
        result = plan_block(text, None, keep_nodes, as_list(setting(settings, "accept_changed")), MARKER,
                            known.get("path") or KNOWN_HOSTS, desired=desired)
        blocks[host] = result
        for change in result["changed_keys"]:
            record = changes.setdefault((change["node"], change["key_type"], change["old_fingerprint"],
                                         change["new_fingerprint"]),
                                        dict(change, seen_on=[], names=list(change["names"]), accepted=True))
            record["seen_on"].append(host)
            record["accepted"] = record["accepted"] and change["accepted"]
            record["names"] += [n for n in change["names"] if n not in record["names"]]
    changed_keys = [changes[k] for k in sorted(changes)]

    dropin_names = []
    for host in keep_nodes:
        dropin_names += names.get(host) or []
    dropin_names = list(dict.fromkeys(dropin_names))
    dropin, rendered = {}, {}
    for host in targeted:
        facts, settings = _facts(cluster, host), _settings(cluster, host)
        wanted = as_bool(setting(settings, "cluster_key")) or as_bool(setting(settings, "strict_host_key_checking_no"))
        variant = (as_bool(setting(settings, "cluster_key")), setting(settings, "cluster_key_name"),
                   as_bool(setting(settings, "strict_host_key_checking_no")))
        if variant not in rendered:
            rendered[variant] = render_dropin(dropin_names, *variant)
        content = rendered[variant]
        if facts is None:
            state = "unknown"
        elif not wanted:
            state = "absent"
        elif (facts.get("client") or {}).get("dropin_included"):
            state = "present"
        else:
            state = "unsupported"
        dropin[host] = {"state": state, "content": content if state == "present" else ""}

    peers = {h: {"targets": mesh_targets(h, _node(cluster, h)), "port": _port(_settings(cluster, h))}
             for h in targeted}
    suspects = {}
    for host in unread:
        suspects[host] = ("no ssh_trust facts were read from %s (see its ssh_trust.error or preflight.reachable)"
                          % host)
    for host in unreadable:
        if host in fingerprints:  # keys read, but it has no name of its own
            suspects[host] = "%s has no name of its own (see ssh_trust.names on %s)" % (host, host)
        else:
            suspects[host] = "%s's host keys could not be read (see ssh_trust.host_keys on %s)" % (host, host)
    for change in changed_keys:
        if not change["accepted"]:
            suspects.setdefault(change["node"], "%s's host key changed (see ssh_trust.host_key_unchanged on %s)"
                                % (change["node"], change["node"]))
    cluster_key, user_keys, key_holders = _cluster_key_plan(cluster, targeted, keep_nodes)
    guessed = {h: assumption((_facts(cluster, h) or {}).get("sshd")) for h in targeted if h in fingerprints}
    public = {"entries": entries, "keep_nodes": keep_nodes, "names": dropin_names, "peers": peers, "dropin": dropin,
              "cluster_key": cluster_key, "unreadable": unreadable, "unread": unread, "changed_keys": changed_keys,
              "duplicate_names": duplicates}
    return {"plan": public, "desired": desired, "blocks": blocks, "fingerprints": fingerprints, "suspects": suspects,
            "names": names, "owners": owners, "user_keys": user_keys, "key_holders": key_holders,
            "assumed": {h: text for h, text in guessed.items() if text}}


def plan(cluster):
    """The cluster-wide view of ssh trust, from every node's facts.

    Returns ``{entries, keep_nodes, names, peers, dropin, cluster_key, unreadable, unread,
    changed_keys, duplicate_names}``:

    ``entries``
        ``[{node, names, keys, port}]``, one per targeted node whose host keys were read:
        the input of ``known_hosts_block`` (role variable ``ssh_trust_known_hosts_entries``).
        ``names`` come from the inventory only (:func:`inventory_names`).
    ``keep_nodes``
        every node of the inventory group: its lines stay in a block when it has no entry
        this run (``ssh_trust_known_hosts_keep_nodes``).
    ``names``
        every cluster name and address, the ``Host`` lines of the client drop-in.
    ``peers``
        per targeted node ``{targets, port}``: what the mesh sshes to (inter-node address and
        inventory name) on which port.  A node's peers are every other targeted node (kept
        O(n), not a list per node).
    ``dropin``
        per targeted node ``{state, content}``: ``present`` (write ``content``), ``absent``
        (remove the file), ``unsupported`` (ssh_config has no Include of ssh_config.d) or
        ``unknown`` (no facts; leave it) (``ssh_trust_client_dropin``).
    ``cluster_key``
        ``{enabled, users, from}``: whether any node wants the cluster key, the users named,
        and the addresses for ``from=``.  Each node generates its own pair per user (nothing
        is copied between nodes); bring-up authorizes the public halves it collects.
    ``unreadable`` / ``unread``
        nodes whose host keys could not be read (with why) / nodes with no facts.
    ``changed_keys``
        ``[{node, key_type, old_fingerprint, new_fingerprint, names, seen_on, accepted, fix}]``:
        a node presents another key than the one some node's block holds for it.
    ``duplicate_names``
        per node, ``[{name, source, others}]``: a name of its inventory entry that another
        node's entry lists too (left out of known_hosts, except a node's own inventory name).
    """
    return _analysis(cluster)["plan"]


# --------------------------------------------------------------------------
# Probe


def probe_args(settings, node, plan):  # pylint: disable=redefined-outer-name
    """ssh from ``node`` to every other targeted node; None when there is no peer.

    ``plan`` is ``{hosts, nodes}``; with ``settings`` (host -> settings) as well, each peer's
    own ``ssh_trust_port`` is used, else this node's; with ``peers`` (host -> the peers it
    checks, ``cluster_preflight/pairs.py``) only those."""
    hosts, nodes = list(plan.get("hosts") or []), plan.get("nodes") or {}
    others = plan.get("settings") or {}
    chosen = (plan.get("peers") or {}).get(node["name"])
    if chosen is not None:
        hosts = list(chosen)

    def port_of(peer):
        return _port(others.get(peer) or settings)

    peers = mesh_peers(node["name"], hosts, nodes, port_of)
    if not peers:
        return None
    return {
        "source": node["name"],
        "peers": peers,
        "user": setting(settings, "mesh_user") or "",
        "connect_timeout": setting(settings, "mesh_connect_timeout"),
        "timeout": setting(settings, "mesh_timeout"),
        "parallel": setting(settings, "mesh_parallel"),
        "connect": as_bool(setting(settings, "mesh")),
        "pdsh": setting(settings, "pdsh"),
        "pdsh_hosts": [peer["targets"][-1] for peer in peers],
        "ssh_bin": "ssh",
        "pdsh_bin": "pdsh",
        "keyscan": True,
        "keyscan_bin": "ssh-keyscan",
        "root": "/",
    }


def probe(args, ops):
    """Run the mesh from this node (see ``preflight_ssh.run_mesh``); rows are classified, not judged."""
    return run_mesh(ops, args["source"], args.get("peers") or [], user=args.get("user") or "",
                    connect_timeout=args.get("connect_timeout", 5), timeout=args.get("timeout", 20),
                    parallel=args.get("parallel", 32), ssh_options=args.get("ssh_options") or [],
                    connect=args.get("connect", True), pdsh=args.get("pdsh", "auto"),
                    pdsh_hosts=args.get("pdsh_hosts") or [], ssh_bin=args.get("ssh_bin") or "ssh",
                    pdsh_bin=args.get("pdsh_bin") or "pdsh", root=args.get("root") or "/",
                    keyscan=args.get("keyscan", True), keyscan_bin=args.get("keyscan_bin") or "ssh-keyscan")


# --------------------------------------------------------------------------
# Check builders shared with the modules


def describe_sshd(sshd):
    """Where the host key files came from, in words (the ``sshd`` fact of :func:`read`)."""
    sshd = sshd or {}
    source = sshd.get("source")
    how = (" (%s)" % sshd["how"]) if sshd.get("how") else ""
    if source == "ssh_trust_host_key_files":
        return "the files of ssh_trust_host_key_files"
    if source == "ssh_trust_sshd_config":
        return "the HostKeys of ssh_trust_sshd_config %s%s" % (sshd.get("config"), how)
    if source == "listener":
        return "the HostKeys of the sshd listening on port %s (pid %s: %s)%s" % (
            sshd.get("port"), sshd.get("pid"), " ".join(sshd.get("argv") or []), how)
    if source == "default":
        return "the HostKeys of %s, assumed because %s%s" % (sshd.get("config"), sshd.get("discovery"), how)
    return "the node's sshd configuration"


ASSUMED_FIX = (BECOME_FIX + " so the sshd listening on ssh_trust_port is found, or point ssh_trust_sshd_config (or "
               "ssh_trust_host_key_files) at the configuration it runs with")


def assumption(sshd):
    """What a comparison with the key files in ``sshd`` (the reader's fact) assumes, or "" when they are
    the running sshd's (found, or named by the inventory)."""
    sshd = sshd or {}
    if sshd.get("source") != "default" or not sshd.get("discovery"):
        return ""
    return "compared with the key files of %s, assumed because the running sshd could not be found%s: %s" % (
        sshd.get("config"), " without root" if sshd.get("needs_root") else "", sshd.get("discovery"))


def host_keys_check(node, keys, problems, sshd=None):
    """Whether host keys were read on ``node`` and from the sshd that really runs there."""
    sshd = sshd if isinstance(sshd, dict) else {"source": "ssh_trust_sshd_config", "config": sshd or SSHD_CONFIG}
    expected = "at least one readable host public key on %s, from the sshd that listens on its ssh port" % node
    fix = ("point ssh_trust_sshd_config at the configuration %s's running sshd uses (see its command line: "
           "ps -o args= -C sshd; empty finds it from the process listening on ssh_trust_port) or list its key "
           "files in ssh_trust_host_key_files; a node without openssh-server needs it installed (ssh-keygen -A "
           "creates the default keys)" % node)
    where = describe_sshd(sshd)
    if keys and sshd.get("source") == "default" and sshd.get("discovery"):
        return warned("%d host key(s) on %s: %s, read from %s; the running sshd was not found, so they may not be "
                      "the keys it serves (ssh_trust.host_keys_served compares them with ssh-keyscan)" % (
                          len(keys), node, ", ".join("%s %s" % (k["type"], k["fingerprint"]) for k in keys), where),
                      expected, "run the preflight as root (preflight_become: true) so the sshd listening on "
                      "ssh_trust_port is found, set ssh_trust_port to its port, or " + fix)
    if keys:
        return passed("%d host key(s) on %s: %s, read from %s" % (len(keys), node, ", ".join(
            "%s %s" % (k["type"], k["fingerprint"]) for k in keys), where), expected)
    if sshd.get("privileged") is False and problems and all(denied(problem) for problem in problems):
        return needs_root("no host public key on %s could be read without root (%s; looked at %s)" % (
            node, "; ".join(problems), where), expected)
    return failed("no readable host public key on %s (%s; looked at %s)" % (
        node, "; ".join(problems) or "none named", where), expected, fix)


def served_keys_check(source, node, keys, row):
    """Whether the keys ``node``'s sshd presented to ``source``'s ssh-keyscan (``row``: ``{target,
    keys, error}``) are among ``keys``, the ones read from ``node``'s own files (``TYPE BASE64``)."""
    expected = "the sshd of %s presents only host keys read from its own key files" % node
    if not row:
        return skipped("%s did not scan %s's sshd" % (source, node), expected)
    if not row.get("keys"):
        return skipped("ssh-keyscan from %s to %s (%s) got no key: %s" % (source, node, row.get("target"),
                                                                          row.get("error") or "no answer"), expected)
    read = {text.split()[1] for text in keys or [] if len(text.split()) >= 2}
    unknown = [text for text in row["keys"] if text.split()[1] not in read]
    if unknown:
        return failed("the sshd of %s (%s, scanned from %s) serves %s, which none of the key files read on %s holds"
                      % (node, row.get("target"), source, ", ".join("%s %s" % (text.split()[0], safe_fingerprint(
                          text.split()[1])) for text in unknown), node), expected,
                      "find the configuration the sshd on %s runs with (ps -o args= -C sshd: its -f and -h) and read "
                      "the keys from there (ssh_trust_sshd_config / ssh_trust_host_key_files empty finds it)" % node)
    return passed("the sshd of %s serves %s, read from its files too" % (node, ", ".join(
        "%s %s" % (text.split()[0], safe_fingerprint(text.split()[1])) for text in row["keys"])), expected)


def _describe_missing(missing):
    shown = ["%s (%s)" % (item["node"], ", ".join(item["names"])) for item in missing[:LIST_LIMIT]]
    more = len(missing) - len(shown)
    return "; ".join(shown) + ("; and %d more" % more if more > 0 else "")


def known_hosts_check(node, path, result, drift_policy, applied=False, held_back=(), changed=None):
    """The ``known_hosts`` check from a :func:`preflight_ssh.plan_block` result.

    ``changed``: whether the file differs from what it should be (default: the block does);
    ``applied``: the writer has just written it (bring-up), so a difference is done, not drift."""
    where = " on %s" % node if node else ""
    expected = "%s%s holds the current host keys of every node in its managed block" % (path, where)
    if changed is None:
        changed = result["block"] != result.get("old_block")
    held = set(held_back)
    missing = [m for m in result["missing"] if m["node"] not in held]
    note = ""
    if held_back:
        note = "; old lines of %s kept: their host key changed and is not accepted" % ", ".join(held_back)
    if not changed:
        return passed("%s%s is up to date (%d line(s) in the block)%s" % (path, where, len(result["block"]), note),
                      expected)
    if applied:
        return passed("%s%s updated: %s%s" % (path, where, _describe_missing(missing) or "block rewritten", note),
                      expected)
    parts = []
    if missing:
        parts.append("lacks the current key for " + _describe_missing(missing))
    if result["dropped"]:
        parts.append("still lists nodes no longer in the inventory: " + ", ".join(result["dropped"]))
    if not parts:
        parts.append("its managed block differs from the cluster's host keys")
    return check(drift_policy, "%s%s %s%s" % (path, where, "; ".join(parts), note), expected,
                 "%s to rewrite the managed block; nothing outside its markers is touched" % BRINGUP)


def peer_host_key_check(source, node, rows, unknown_policy="fail", own_fingerprints=None):
    """Whether ``source`` verified ``node``'s host key on every target (rows of the mesh)."""
    expected = "every target of %s presents the host key %s's known_hosts holds for it" % (node, source)
    changed = [r for r in rows if r["status"] == "host_key_changed"]
    unknown = [r for r in rows if r["status"] == "host_key_unknown"]
    verified = [r for r in rows if host_key_verified(r["status"])]
    if changed:
        parts = []
        for row in changed:
            parts.append("%s presented %s key %s where %s holds %s" % (
                row["target"], row.get("key_type", "its"), row.get("new_fingerprint", "(new key)"),
                row.get("offending", "known_hosts"), row.get("old_fingerprint", "(old key)")))
        first = changed[0]
        offending_file = first.get("offending", "/etc/ssh/ssh_known_hosts:").split(":")[0]
        found = "REMOTE HOST IDENTIFICATION HAS CHANGED from %s to %s: %s" % (source, node, "; ".join(parts))
        if own_fingerprints is not None and first.get("new_fingerprint"):
            if first["new_fingerprint"] in own_fingerprints:
                found += (" (the key presented is %s's own, read from %s itself: the stale line is in %s on %s)"
                          % (node, node, offending_file, source))
            else:
                found += (" (the key presented is none of the host keys read from %s itself: something else "
                          "answers at %s)" % (node, first["target"]))
        fix = ("find out why %s's host key changed (reinstall, or something worse); once "
               "%s is verified on its console (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), run "
               "`ansible-playbook bringup.yml -e ssh_trust_accept_changed=%s` "
               "(or by hand on %s: ssh-keygen -R %s -f %s)"
               % (node, first.get("new_fingerprint", "the new key"), node, source, first["target"], offending_file))
        return failed(found, expected, fix, old_fingerprint=first.get("old_fingerprint", ""),
                      new_fingerprint=first.get("new_fingerprint", ""))
    if unknown:
        return check(unknown_policy, "%s does not know %s's host key for %s (Host key verification failed)"
                     % (source, node, ", ".join(r["target"] for r in unknown)),
                     expected, "%s so the known-hosts file on %s lists %s under every name; never turn "
                     "StrictHostKeyChecking off for it" % (BRINGUP, source, node))
    if verified:
        return passed("%s verified %s's host key for %s" % (source, node, ", ".join(r["target"] for r in verified)),
                      expected)
    return skipped("%s never reached %s's host key: %s" % (
        source, node, "; ".join("%s %s" % (r["target"], r["status"]) for r in rows) or "no target"), expected)


LOGIN_FIX = {
    "auth_denied": "the host key is fine; give %(source)s's user a key %(node)s accepts (ssh_trust_cluster_key: true "
                   "distributes one) or fix the user's authorized_keys on %(node)s",
    "refused": "start sshd on %(node)s or open port %(port)s to it from %(source)s (if sshd listens elsewhere, set "
               "ssh_trust_port for %(node)s)",
    "timeout": "check the route and firewall from %(source)s to %(node)s (%(targets)s); is %(node)s up?",
    "unreachable": "check the route from %(source)s to %(node)s (%(targets)s)",
    "dns": "make %(targets)s resolvable on %(source)s (/etc/hosts or DNS)",
    "error": "run the ssh command of this result by hand on %(source)s and read its error",
}
NOT_LOGIN = ("ok", "host_key_unknown", "host_key_changed")


def _last_line(row):
    return row["stderr"].splitlines()[-1] if row.get("stderr") else "rc %s" % row.get("rc")


def peer_login_check(source, node, rows, policy_name, port):
    """Whether ``source`` logged in to ``node`` on every target, host-key problems aside."""
    expected = "%s logs in to %s on every target without a prompt" % (source, node)
    bad = [r for r in rows if r["status"] not in NOT_LOGIN]
    if not bad:
        logged_in = [r["target"] for r in rows if r["status"] == "ok"]
        if logged_in:
            return passed("%s logged in to %s on %s" % (source, node, ", ".join(logged_in)), expected)
        return skipped("%s -> %s not tried past the host key check (%s)" % (source, node, ", ".join(
            "%s %s" % (r["target"], r["status"]) for r in rows) or "no target"), expected)
    kinds = list(dict.fromkeys(r["status"] for r in bad))
    found = "%s -> %s: %s" % (source, node, "; ".join(
        "%s %s (%s)" % (r["target"], r["status"], _last_line(r)) for r in bad))
    fix = "; ".join(LOGIN_FIX.get(k, LOGIN_FIX["error"]) % {
        "source": source, "node": node, "port": port, "targets": ", ".join(r["target"] for r in bad)} for k in kinds)
    return check(policy_name, found, expected, fix)


def client_config_check(source, configs, known_hosts_file, identity_file="", relaxed=False):
    """Whether ``ssh -G`` on ``source`` keeps host-key checking on for every peer target."""
    expected = ("StrictHostKeyChecking yes or ask for every cluster peer, %s read as a known-hosts file%s"
                % (known_hosts_file, ", identity %s offered" % identity_file if identity_file else ""))
    problems, warnings, fixes = [], [], []
    off = [t for t, c in configs.items() if c.get("stricthostkeychecking") in ("false", "no", "off")]
    accept_new = [t for t, c in configs.items() if c.get("stricthostkeychecking") == "accept-new"]
    errors = ["%s (%s)" % (t, c["error"]) for t, c in configs.items() if "error" in c]
    unread = [t for t, c in configs.items() if "error" not in c
              and known_hosts_file not in c["globalknownhostsfile"] + c["userknownhostsfile"]]
    no_identity = [t for t, c in configs.items() if identity_file and "error" not in c
                   and identity_file not in c["identityfile"]]
    if off and relaxed:
        warnings.append("StrictHostKeyChecking no for %s (ssh_trust_strict_host_key_checking_no: true): a spoofed "
                        "or reinstalled peer is not detected by pdsh, mpirun or ssh" % ", ".join(off))
        fixes.append("set ssh_trust_strict_host_key_checking_no: false and re-run bringup.yml; the cluster "
                     "known-hosts block makes the relaxation unnecessary")
    elif off:
        problems.append("StrictHostKeyChecking no applies to %s, set outside the ssh_trust role" % ", ".join(off))
        fixes.append("remove that line (find it with: ssh -G %s | grep -i stricthostkeychecking; grep -ri "
                     "StrictHostKeyChecking ~/.ssh/config /etc/ssh/ssh_config /etc/ssh/ssh_config.d); the cluster "
                     "known-hosts block makes it unnecessary" % off[0])
    if accept_new:
        warnings.append("StrictHostKeyChecking accept-new for %s: an unknown key is trusted on first use"
                        % ", ".join(accept_new))
        fixes.append("remove StrictHostKeyChecking accept-new for cluster peers; their keys are known in advance")
    if unread:
        problems.append("%s is not read for %s (GlobalKnownHostsFile/UserKnownHostsFile point elsewhere)"
                        % (known_hosts_file, ", ".join(unread)))
        fixes.append("remove the GlobalKnownHostsFile/UserKnownHostsFile override that leaves out %s"
                     % known_hosts_file)
    if no_identity:
        problems.append("the cluster key %s is not offered to %s" % (identity_file, ", ".join(no_identity)))
        fixes.append("re-run bringup.yml so the ssh_config.d drop-in names %s for every cluster name" % identity_file)
    if errors:
        problems.append("ssh -G failed for %s" % "; ".join(errors))
        fixes.append("fix the ssh client configuration on %s (ssh -G prints the error)" % source)
    if problems:
        return failed("%s: %s" % (source, "; ".join(problems + warnings)), expected, "; ".join(fixes))
    if warnings:
        return warned("%s: %s" % (source, "; ".join(warnings)), expected, "; ".join(fixes))
    if not configs:
        return skipped("%s has no peers" % source, expected)
    return passed("%s: host-key checking on for every peer (%s), %s read" % (
        source, ", ".join(sorted({c["stricthostkeychecking"] for c in configs.values()})), known_hosts_file),
        expected)


def pdsh_check(source, report, hosts, unknown_policy="fail", login_policy="fail", collateral=None,
               off_reason="pdsh check switched off (ssh_trust_pdsh: never)"):
    """The seeds' ``PDSH_RCMD_TYPE=ssh pdsh -w HOSTS date`` from ``source``.

    ``collateral`` maps a host to why its failure is its own (its peers are not blamed)."""
    collateral = collateral or {}
    expected = "PDSH_RCMD_TYPE=ssh pdsh -w %s date answers from every host" % ",".join(hosts)
    state = (report or {}).get("state")
    if state == "off":
        return skipped(off_reason, expected)
    if state == "no_ssh":
        return skipped("no ssh client on %s (see the mesh check)" % source, expected)
    if state == "not_installed":
        return not_applicable("pdsh is not installed on %s" % source, expected)
    if state == "no_hosts" or (state == "ran" and not hosts):
        return skipped("%s has no peers to pdsh to" % source, expected)
    if state != "ran":
        return skipped("pdsh did not run on %s" % source, expected)
    failed_hosts = report.get("failed") or {}
    ok = report.get("ok") or []
    if not failed_hosts and report.get("rc") == 0:
        return passed("pdsh from %s reached %s" % (source, ", ".join(ok)), expected)
    if not failed_hosts:
        return check(login_policy, "pdsh from %s exited %s: %s" % (source, report.get("rc"), report.get("stderr")),
                     expected, "run the pdsh command by hand on %s and read its error" % source)
    found = "pdsh from %s failed for %s" % (source, "; ".join(
        "%s %s (%s)" % (h, r["status"], (r["stderr"].splitlines() or [""])[-1]) for h, r in failed_hosts.items()))
    fix = "see the host-key and login checks of %s for each host; pdsh uses the same ssh client" % source
    statuses = [r["status"] for h, r in failed_hosts.items() if h not in collateral]
    if not statuses:
        return warned(found + " (collateral: %s)" % "; ".join(collateral[h] for h in failed_hosts), expected,
                      "fix %s first (named in their own checks)" % ", ".join(failed_hosts))
    # A changed key always fails; an unknown one (not brought up yet) follows unknown_policy.
    if "host_key_changed" in statuses:
        status = "fail"
    elif any(s == "host_key_unknown" for s in statuses):
        status = worst([unknown_policy] + [login_policy for s in statuses if s != "host_key_unknown"])
    else:
        status = login_policy
    return check(status, found, expected, fix)


# --------------------------------------------------------------------------
# Decider


def _summary(items):
    items = list(items)
    if len(items) <= LIST_LIMIT:
        return "; ".join(items)
    return "; ".join(items[:LIST_LIMIT]) + "; and %d more" % (len(items) - LIST_LIMIT)


def _nodes(items):
    """A comma list of node names, cut after LIST_LIMIT."""
    items = list(items)
    return ", ".join(items[:LIST_LIMIT]) + (" and %d more" % (len(items) - LIST_LIMIT) if len(items) > LIST_LIMIT
                                            else "")


def _collateral(result, reason):
    """A peer's failure that its own checks explain: a warn on this node, never a fail."""
    if result["status"] not in ("warn", "fail"):
        return result
    return warned("%s (collateral: %s)" % (result["found"], reason), result["expected"],
                  "fix the peer first: %s" % reason)


def _aggregate(per_peer, expected, what):
    """One check over every peer: the worst status, the peers that are not fine named first."""
    bad = {p: c for p, c in per_peer.items() if c["status"] in ("warn", "fail")}
    if bad:
        fixes = list(dict.fromkeys(c["fix"] for c in bad.values()))
        return check(worst(c["status"] for c in bad.values()), _summary(c["found"] for c in bad.values()), expected,
                     _summary(fixes), peers={p: c["status"] for p, c in sorted(bad.items())})
    fine = [p for p, c in per_peer.items() if c["status"] == "pass"]
    if not fine:
        return skipped(_summary(c["found"] for c in per_peer.values()) or "no peer", expected)
    rest = [c["found"] for c in per_peer.values() if c["status"] != "pass"]
    return passed("%s for %d peer(s): %s%s" % (what, len(fine), ", ".join(sorted(fine)[:LIST_LIMIT])
                                                + (", ..." if len(fine) > LIST_LIMIT else ""),
                                                ("; " + _summary(rest)) if rest else ""), expected)


def _login_outcome(rows):
    statuses = [r["status"] for r in rows]
    if "ok" in statuses:
        return "ok"
    if any(s not in NOT_LOGIN for s in statuses):
        return "fail"
    return "host_key"


def _inbound(cluster, hosts):
    """Per node, the outcome of every peer's login to it: ``{node: {source: (outcome, rows)}}``."""
    inbound = {host: {} for host in hosts}
    for source in hosts:
        result = (cluster.get("probes") or {}).get(source)
        if not result or not result.get("connect"):
            continue
        rows = {}
        for row in result.get("results") or []:
            rows.setdefault(row["destination"], []).append(row)
        for node, node_rows in rows.items():
            if node in inbound:
                inbound[node][source] = (_login_outcome(node_rows), node_rows)
    return inbound


def _refuses(tried):
    """Whether a node's failures are its own: every peer that tried failed to log in to it, and
    either at least two peers tried or every answer was ``Connection refused`` (from the node)."""
    if not tried or any(outcome != "fail" for outcome, _rows in tried.values()):
        return False
    if len(tried) >= 2:
        return True
    return all(r["status"] == "refused" for _outcome, rows in tried.values() for r in rows
               if r["status"] not in NOT_LOGIN)


def _mesh_view(cluster, analysis):
    """Every node's inbound logins and the nodes whose own findings explain their peers' failures,
    computed once per cluster view (memoised like :func:`_analysis`)."""
    hosts = list(cluster["hosts"])
    probes = cluster.get("probes") or {}
    key = (id(analysis), id(cluster.get("probes")), len(hosts), len(probes))
    hit = _MEMO.get("mesh")
    if hit and hit[0] == key:
        return hit[2]
    inbound = _inbound(cluster, hosts)
    suspects = dict(analysis["suspects"])
    for node, tried in inbound.items():
        if node not in suspects and _refuses(tried):
            suspects[node] = "no peer could log in to %s (see ssh_trust.inbound on %s)" % (node, node)
    if probes:
        for node in hosts:
            if node not in suspects and probes.get(node) is None:
                suspects[node] = ("%s gave no ssh_trust probe result (see its ssh_trust.error or preflight.reachable)"
                                  % node)
    # What each node's sshd presented to the peers that scanned it: {node: {source: row}}.
    served = {}
    for source, report in probes.items():
        for node, row in ((report or {}).get("served") or {}).items():
            served.setdefault(node, {})[source] = row
    result = {"inbound": inbound, "suspects": suspects, "served": served}
    _MEMO["mesh"] = (key, (analysis, cluster.get("probes")), result)
    return result


def _mesh_checks(host, settings, probe_result, cluster, analysis):
    mesh_on = as_bool(setting(settings, "mesh"))
    known_hosts_file = setting(settings, "known_hosts_file")
    identity = "~/.ssh/%s" % setting(settings, "cluster_key_name") if as_bool(setting(settings, "cluster_key")) else ""
    relaxed = as_bool(setting(settings, "strict_host_key_checking_no"))
    off = "ssh_trust_mesh is false: ssh from %s to its peers was not tried" % host
    checks = {}
    if probe_result is None:
        reason = ("no ssh mesh result from %s in this run (bring-up does not probe; in preflight.yml see its "
                  "ssh_trust.error or preflight.reachable)" % host)
        checks["client_config"] = skipped(reason)
        for name in ("mesh", "login", "pdsh"):
            checks[name] = skipped(off if not mesh_on else reason)
        return checks
    if probe_result.get("problem"):
        checks["client_config"] = failed(probe_result["problem"], "an ssh client on %s" % host,
                                         "install openssh-client on %s" % host)
        checks["mesh"] = (skipped(off) if not mesh_on else
                          failed(probe_result["problem"], "%s verifies every peer's host key over ssh" % host,
                                 "install openssh-client on %s" % host))
        checks["login"] = skipped(off if not mesh_on else "no ssh client on %s (see ssh_trust.mesh)" % host)
        checks["pdsh"] = skipped(off if not mesh_on else "no ssh client on %s (see ssh_trust.mesh)" % host)
        return checks
    checks["client_config"] = client_config_check(host, probe_result.get("client_config") or {}, known_hosts_file,
                                                  identity, relaxed)
    if not mesh_on or not probe_result.get("connect"):
        checks["mesh"] = skipped(off, "ssh from %s to every peer with StrictHostKeyChecking=yes" % host)
        checks["login"] = skipped(off)
        checks["pdsh"] = skipped(off)
        return checks

    suspects = _mesh_view(cluster, analysis)["suspects"]
    rows = {}
    for row in probe_result.get("results") or []:
        rows.setdefault(row["destination"], []).append(row)
    # The peers this node was given to check (every other node, or its share of a large cluster).
    peers = [peer["node"] for peer in probe_result.get("peers") or [] if peer["node"] != host]
    if not peers:
        peers = [p for p in cluster["hosts"] if p != host]
    unknown_policy = policy(settings, "unknown_key_policy")
    login_policy = policy(settings, "login_policy")
    host_key, login = {}, {}
    for peer in peers:
        peer_rows = rows.get(peer, [])
        port = _port(_settings(cluster, peer))
        # A peer's keys read from a fallback say nothing about what its sshd presents.
        result = peer_host_key_check(host, peer, peer_rows, unknown_policy, None if peer in analysis["assumed"]
                                     else analysis["fingerprints"].get(peer))
        result_login = peer_login_check(host, peer, peer_rows, login_policy, port)
        if peer in suspects:
            result, result_login = _collateral(result, suspects[peer]), _collateral(result_login, suspects[peer])
        host_key[peer], login[peer] = result, result_login
    checks["mesh"] = _aggregate(host_key, "%s verifies the host key of every peer with StrictHostKeyChecking=yes"
                                % host, "%s verified the host key" % host)
    checks["login"] = _aggregate(login, "%s logs in to every peer without a prompt (BatchMode)" % host,
                                 "%s logged in" % host)
    report = probe_result.get("pdsh") or {}
    target_of = {row["target"]: peer for peer in peers for row in rows.get(peer, [])}
    collateral = {target: suspects[peer] for target, peer in target_of.items() if peer in suspects}
    checks["pdsh"] = pdsh_check(host, report, report.get("hosts") or [], unknown_policy, login_policy, collateral)
    return checks


def _inbound_check(host, settings, cluster, analysis):
    expected = "every peer logs in to %s over ssh" % host
    if not as_bool(setting(settings, "mesh")):
        return skipped("ssh_trust_mesh is false: ssh to %s was not tried" % host, expected)
    tried = _mesh_view(cluster, analysis)["inbound"].get(host) or {}
    if not tried:
        return skipped("no peer's ssh_trust probe reached the point of trying %s" % host, expected)
    if _refuses(tried):
        rows = [r for _outcome, source_rows in tried.values() for r in source_rows if r["status"] not in NOT_LOGIN]
        kinds = list(dict.fromkeys(r["status"] for r in rows))
        found = "no peer could log in to %s: %s" % (host, _summary(
            "%s -> %s %s (%s)" % (r["source"], r["target"], r["status"], _last_line(r)) for r in rows))
        fix = "; ".join(LOGIN_FIX.get(k, LOGIN_FIX["error"]) % {
            "source": "its peers", "node": host, "port": _port(settings),
            "targets": ", ".join(dict.fromkeys(r["target"] for r in rows))} for k in kinds)
        return check(policy(settings, "login_policy"), found, expected, fix)
    fine = sorted(s for s, (outcome, _rows) in tried.items() if outcome == "ok")
    others = sorted(s for s in tried if s not in fine)
    return passed("%d of %d peer(s) logged in to %s%s" % (
        len(fine), len(tried), host, "; the others' findings are on them (ssh_trust.mesh, ssh_trust.login): %s"
        % ", ".join(others) if others else ""), expected)


def _names_check(host, analysis):
    names = analysis["names"].get(host) or []
    duplicates = analysis["plan"]["duplicate_names"].get(host) or []
    expected = "every name %s has in the inventory belongs to it alone" % host
    if duplicates:
        found = "; ".join("%s is a name of both %s (%s) and %s" % (
            d["name"], host, d["source"], " and ".join("%s (%s)" % (other, source) for other, source in
                                                       sorted(d["others"].items()))) for d in duplicates)
        lost = [d["name"] for d in duplicates if d["name"] not in names]
        nodes = sorted({host} | {other for d in duplicates for other in d["others"]})
        return failed("%s%s; %s is known as %s" % (
            found, "; %s left out of every known_hosts block and of the mesh" % ", ".join(lost) if lost else "",
            host, ", ".join(names)), expected,
            "give each node its own names in the inventory: change ansible_host, preflight_node_addr or "
            "ssh_trust_extra_names of %s so no two nodes share one" % " or ".join(nodes),
            nodes=nodes)
    return passed("%s is known as %s" % (host, ", ".join(names)), expected)


def _hostname_check(host, facts, analysis):
    """A hostname or FQDN the node reports that is not one of its inventory names: a warning, never a
    trusted name (a node cannot put itself under another node's name into anybody's known_hosts)."""
    own = {name.lower() for name in analysis["names"].get(host) or []}
    own |= {d["name"].lower() for d in analysis["plan"]["duplicate_names"].get(host) or []}
    reported = reported_names(facts)
    expected = "the hostname and FQDN %s reports are among its inventory names (only those are trusted)" % host
    if not reported:
        return passed("%s reports no name of its own besides localhost" % host, expected)
    differing = [(what, name) for what, name in reported if name.lower() not in own]
    if not differing:
        return passed("%s calls itself %s" % (host, ", ".join(name for _what, name in reported)), expected)
    parts = []
    for what, name in differing:
        owners = {h: src for h, src in (analysis["owners"].get(name.lower()) or {}).items() if h != host}
        parts.append("%s %s%s" % (what, name, " (%s of %s)" % (" and ".join(
            "the %s" % src for src in dict.fromkeys(owners.values())), ", ".join(sorted(owners))) if owners else ""))
    return warned("%s calls itself %s, not one of its inventory names (%s); a name a node reports is never "
                  "trusted: it is in no known_hosts block" % (host, "; ".join(parts), ", ".join(
                      analysis["names"].get(host) or [])), expected,
                  "if %s really is a name of %s, add it to ssh_trust_extra_names for %s; otherwise give %s its own "
                  "hostname (hostnamectl set-hostname %s)" % (" / ".join(name for _w, name in differing), host, host,
                                                              host, host))


def _served_check(host, facts, settings, cluster, analysis):
    """The host keys peers saw with ssh-keyscan against the key files read on ``host``."""
    expected = "the host keys the sshd on %s serves are the key files read on %s (what known_hosts holds)" % (host,
                                                                                                          host)
    if not as_bool(setting(settings, "mesh")):
        return skipped("ssh_trust_mesh is false: no peer scanned %s's sshd" % host, expected)
    if not facts.get("keys"):
        return skipped("%s's host key files could not be read (see ssh_trust.host_keys)" % host, expected)
    rows = _mesh_view(cluster, analysis)["served"].get(host) or {}
    scanned = {peer: row for peer, row in rows.items() if row.get("keys")}
    if not scanned:
        return skipped("no peer got %s's host keys with ssh-keyscan in this run%s" % (host, (": " + _summary(
            "%s: %s" % (peer, row.get("error") or "no key") for peer, row in sorted(rows.items()))) if rows else
            " (bring-up does not probe; preflight.yml does)"), expected)
    read = {}
    for key in facts.get("keys") or []:
        read[key["public_key"].split()[1] if len(key["public_key"].split()) > 1 else ""] = key
    unknown, seen_types = [], set()
    for peer, row in sorted(scanned.items()):
        for text in row["keys"]:
            key_type, blob = text.split()[:2]
            seen_types.add(key_type)
            if blob not in read:
                unknown.append("%s %s (seen by %s at %s)" % (key_type, safe_fingerprint(blob), peer, row["target"]))
    files = ", ".join("%s %s (%s)" % (k["type"], k["fingerprint"], k.get("path")) for k in facts["keys"])
    sshd = facts.get("sshd") or {}
    where = describe_sshd(sshd)
    fix = ("find the configuration the sshd on %s really runs with (ps -o args= -C sshd: its -f and -h) and point "
           "ssh_trust_sshd_config (or ssh_trust_host_key_files) at it, or leave both empty so the listening sshd is "
           "found; then %s. If no key file on %s holds the served key, something else answers on %s's address"
           % (host, BRINGUP, host, host))
    if unknown and sshd.get("needs_root"):
        return needs_root("%s, so the key files of the sshd on %s, which serves %s, are unknown; the fallback's (%s, "
                          "from %s) do not hold them" % (sshd["needs_root"], host, _summary(dict.fromkeys(unknown)),
                                                         files, where), expected)
    if unknown:
        return failed("the sshd on %s serves %s, which is none of the key files read on %s (%s, from %s): peers "
                      "would find a key that their known_hosts does not hold" % (
                          host, _summary(dict.fromkeys(unknown)), host, files, where), expected, fix)
    unserved = [k for k in facts["keys"] if k["type"] not in seen_types]
    result = _served_result(host, facts, scanned, seen_types, unserved, expected, fix)
    return assumed(result, assumption(sshd), ASSUMED_FIX) if assumption(sshd) else result


def _served_result(host, facts, scanned, seen_types, unserved, expected, fix):
    if unserved:
        return warned("%s's key file(s) %s are not served by its sshd (peers saw only %s): known_hosts lists keys "
                      "no client is shown" % (host, ", ".join("%s %s (%s)" % (k["type"], k["fingerprint"],
                                                                               k.get("path")) for k in unserved),
                                              ", ".join(sorted(seen_types))), expected, fix)
    return passed("the sshd on %s serves the key(s) read from its files (%s), as %s saw with ssh-keyscan" % (
        host, ", ".join(k["fingerprint"] for k in facts["keys"]), ", ".join(sorted(scanned))), expected)


def _host_key_unchanged_check(host, facts, analysis):
    expected = "%s presents the host key every node's known-hosts block already holds for it" % host
    if host in analysis["plan"]["unreadable"]:
        return skipped("%s's host keys could not be read (see ssh_trust.host_keys)" % host, expected)
    changes = [c for c in analysis["plan"]["changed_keys"] if c["node"] == host]
    text = "; ".join("%s %s (known as %s in the blocks of %s) -> %s (read from %s itself)" % (
        c["key_type"], c["old_fingerprint"], ", ".join(c["names"]), ", ".join(c["seen_on"]), c["new_fingerprint"],
        host) for c in changes)
    held = [c for c in changes if not c["accepted"]]
    sshd = facts.get("sshd") or {}
    if held and sshd.get("needs_root"):
        return needs_root("%s, so whether %s's host key changed is unknown: the key files read instead (%s) differ "
                          "from what the known-hosts blocks hold: %s" % (sshd["needs_root"], host, describe_sshd(sshd),
                                                                          text), expected)
    if held:
        return failed("%s's host key changed: %s; the old key stays in the cluster known-hosts block until accepted"
                      % (host, text), expected, held[0]["fix"], old_fingerprint=held[0]["old_fingerprint"],
                      new_fingerprint=held[0]["new_fingerprint"])
    if changes:
        result = passed("%s's changed host key was accepted (ssh_trust_accept_changed): %s" % (host, text), expected)
    else:
        result = passed("%s presents the known host key(s) %s" % (host, ", ".join(
            k["fingerprint"] for k in facts.get("keys") or [])), expected)
    return assumed(result, assumption(sshd), ASSUMED_FIX) if assumption(sshd) else result


def _known_hosts_decision(host, facts, settings, analysis):
    known = facts.get("known_hosts") or {}
    path = known.get("path") or setting(settings, "known_hosts_file")
    expected = "%s on %s holds the current host keys of every node in its managed block" % (path, host)
    if known.get("error"):
        return failed("%s on %s: %s" % (path, host, known["error"]), expected,
                      "edit %s on %s so it holds one BEGIN ... END pair of the managed block (or none), then %s"
                      % (path, host, BRINGUP))
    result = analysis["blocks"].get(host)
    if result is None:
        return skipped("%s on %s was not compared" % (path, host), expected)
    held = sorted({c["node"] for c in result["changed_keys"] if not c["accepted"]})
    checked = known_hosts_check(host, path, result, policy(settings, "drift_policy"), held_back=held)
    guessed = analysis["assumed"]
    if not guessed:
        return checked
    return assumed(checked, "the host keys of %s were read from a fallback (%s)" % (
        _nodes(sorted(guessed)), _summary("%s: %s" % (node, text) for node, text in sorted(guessed.items()))),
        ASSUMED_FIX)


def _cluster_key_users(facts, settings):
    users = as_list(setting(settings, "cluster_key_users"))
    state = (facts.get("cluster_key") or {}).get("users")
    return users, state


def _ssh_dirs_check(host, facts, settings):
    """Every cluster key user's home and ~/.ssh on ``host``: nothing bring-up would have to write
    through (a link) or that sshd's StrictModes would refuse (writable by others)."""
    users, state = _cluster_key_users(facts, settings)
    expected = ("the home and ~/.ssh of %s on %s are directories of their own (not group- or world-writable, "
                "~/.ssh no symlink)" % (", ".join(users), host))
    if not as_bool(setting(settings, "cluster_key")):
        return skipped("ssh_trust_cluster_key is false: no user's ~/.ssh is written", expected)
    if state is None:
        return skipped("the cluster key users were not read on %s" % host, expected)
    refusals, lacking = [], []
    for user in users:
        entry = state.get(user) or {}
        if entry.get("needs_root"):
            lacking.append(entry["needs_root"])
        elif entry.get("exists") and entry.get("ssh"):
            refusal = ssh_dir_refusal(host, user, entry["uid"], entry["ssh"])
            if refusal:
                refusals.append(refusal)
    if refusals:
        return failed("; ".join(r["found"] for r in refusals), expected, " ".join(r["fix"] for r in refusals),
                      refused=True)
    if lacking:
        return needs_root("; ".join(lacking), expected)
    return passed("the home and ~/.ssh of %s on %s are safe to hold keys" % (
        ", ".join(u for u in users if (state.get(u) or {}).get("exists")) or "no user", host), expected)


def _cluster_key_check(host, facts, settings, cluster, analysis):
    users, state = _cluster_key_users(facts, settings)
    name = setting(settings, "cluster_key_name")
    expected = ("%s on %s each hold a key pair of their own in ~/.ssh/%s (0600, owned by the user) and authorize "
                "their own key from every node" % (", ".join(users), host, name))
    if not as_bool(setting(settings, "cluster_key")):
        return skipped("ssh_trust_cluster_key is false: node-to-node logins use keys the users bring", expected)
    if state is None:
        return skipped("the cluster key was not read on %s" % host, expected)
    missing_users = ["%s (%s)" % (u, (state.get(u) or {}).get("problem") or "no such user") for u in users
                     if not (state.get(u) or {}).get("exists")]
    if missing_users:
        return failed("%s: %s" % (host, "; ".join(missing_users)), expected,
                      "create the user(s) on %s first or change ssh_trust_cluster_key_users" % host)
    known = set(cluster.get("all_hosts") or []) | set(cluster.get("hosts") or [])
    options = ('from="%s"' % ",".join(analysis["plan"]["cluster_key"]["from"])
               if as_bool(setting(settings, "cluster_key_restrict_from")) and analysis["plan"]["cluster_key"]["from"]
               else "")
    fails, drift, fixes, unread = [], [], [], []
    for user in users:
        entry = state[user]
        if entry.get("needs_root"):
            unread.append(entry["needs_root"])
            continue
        if ssh_dir_refusal(host, user, entry["uid"], entry["ssh"]):
            drift.append("%s's ~/.ssh was not examined (see ssh_trust.ssh_dirs)" % user)
            continue
        if not entry.get("private"):
            drift.append("%s has no %s" % (user, entry["path"]))
        elif entry.get("private_mode") != 0o600 or entry.get("private_uid") != entry["uid"]:
            drift.append("%s is mode %04o, owned by uid %s (ssh refuses a private key others can read)" % (
                entry["path"], entry.get("private_mode") or 0, entry.get("private_uid")))
        if not entry.get("fingerprint"):
            drift.append("%s has no %s.pub%s" % (user, entry["path"], " (%s)" % entry["problem"]
                                                 if entry.get("problem") else ""))
        else:
            holders = [h for h in analysis["key_holders"].get(entry["fingerprint"]) or [] if h != (host, user)]
            others = sorted({"%s on %s" % (u, n) for n, u in holders if u != user})
            copies = sorted({n for n, u in holders if u == user})
            if others:
                fails.append("%s's key %s is also the key of %s: one user's key handed to another" % (
                    user, entry["fingerprint"], ", ".join(others)))
                fixes.append("on %s remove %s and %s.pub (never copy another user's key), then %s" % (
                    host, entry["path"], entry["path"], BRINGUP))
            elif copies:
                drift.append("%s's key %s is the same pair as on %s (a copied key: one stolen copy opens every node)"
                             % (user, entry["fingerprint"], _nodes(copies)))
                fixes.append("on %s remove %s and %s.pub so bring-up generates a pair of its own" % (
                    host, entry["path"], entry["path"]))
        wanted = analysis["user_keys"].get(user) or {}
        lines = entry.get("authorized") or []
        held = {(line["node"], line["public_key"]) for line in lines}
        lacking = sorted(node for node, (public_key, _fp) in wanted.items() if (node, public_key) not in held)
        stale = []
        for line in lines:
            node = line["node"]
            if not node or node not in known or (node in wanted and wanted[node][0] != line["public_key"]):
                stale.append("%s%s" % (line["fingerprint"], " (node=%s)" % node if node else " (no node=, the old "
                                                                                            "shared key?)"))
        if lacking:
            drift.append("%s's authorized_keys lacks the key of %s from %s" % (user, user, _nodes(lacking)))
        if stale:
            drift.append("%s's authorized_keys still holds cluster key line(s) no node has: %s" % (
                user, _summary(stale)))
        wrong = [line for line in lines if (line["node"], line["public_key"]) in
                 {(n, k) for n, (k, _f) in wanted.items()} and line["options"] != options]
        if wrong:
            drift.append("%s authorizes the cluster keys with options %r, not %r" % (user, wrong[0]["options"],
                                                                                   options))
    fixes.append("%s with ssh_trust_cluster_key: true" % BRINGUP)
    if fails:
        return failed("%s: %s" % (host, "; ".join(fails + drift)), expected, "; ".join(dict.fromkeys(fixes)))
    if drift:
        return check(policy(settings, "drift_policy"), "%s: %s" % (host, "; ".join(drift)), expected,
                     "; ".join(dict.fromkeys(fixes)))
    if unread:
        return needs_root("; ".join(unread), expected)
    return passed("%s on %s hold their own cluster key (%s) and authorize it from %s" % (
        ", ".join(users), host, ", ".join("%s %s" % (u, state[u]["fingerprint"]) for u in users),
        _nodes(sorted({n for u in users for n in analysis["user_keys"].get(u) or {}}))), expected)


def _client_dropin_check(host, facts, settings, analysis):
    client = facts.get("client") or {}
    wanted = analysis["plan"]["dropin"].get(host) or {"state": "unknown"}
    dropin = client.get("dropin") or setting(settings, "ssh_config_dropin")
    ssh_config = client.get("ssh_config") or setting(settings, "ssh_config")
    drift = policy(settings, "drift_policy")
    if wanted["state"] == "absent":
        expected = "%s absent on %s (neither the cluster key nor the relaxation is on)" % (dropin, host)
        if client.get("dropin_text") is None:
            return passed(expected, expected)
        return check(drift, "%s exists on %s though nothing needs it" % (dropin, host), expected,
                     "%s: it removes the drop-in" % BRINGUP)
    expected = "%s on %s holds the cluster client settings for every cluster name" % (dropin, host)
    if wanted["state"] == "unsupported":
        return warned("%s on %s does not include ssh_config.d (%s): the cluster client settings are not read"
                      % (ssh_config, host, "no such file" if not client.get("ssh_config_exists") else
                         "Include %s" % (", ".join(client.get("includes") or []) or "none")), expected,
                      "add `Include /etc/ssh/ssh_config.d/*.conf` at the top of %s (as Debian 12 ships it), then "
                      "re-run bringup.yml" % ssh_config)
    if client.get("dropin_text") == wanted.get("content"):
        return passed(expected, expected)
    return check(drift, "%s on %s is %s" % (dropin, host, "missing" if client.get("dropin_text") is None
                                             else "out of date"), expected, BRINGUP)


def decide(host, facts, settings, probe=None, cluster=None):  # pylint: disable=redefined-outer-name
    """``{name: check}`` for ``host``: host_keys, host_keys_served, names, hostname, known_hosts,
    host_key_unchanged, ssh_dirs, cluster_key, client_dropin, client_config, mesh, login, inbound,
    pdsh; or ``peers``
    (not applicable) when ``host`` has no targeted peer.  ``{}`` when ``host`` was not read."""
    hosts = list((cluster or {}).get("hosts") or [host])
    if not any(h != host for h in hosts):
        return {"peers": not_applicable(
            "%s is the only targeted node: there is no peer to trust over ssh, so no host key, known-hosts block or "
            "mesh is checked%s" % (host, "" if not facts or facts.get("keys") else
                                   " (and it has no readable host key: %s)" % "; ".join(facts.get("problems") or [])),
            "at least two targeted nodes")}
    if facts is None:
        return {}
    cluster = dict(cluster, hosts=hosts)
    analysis = _analysis(cluster)
    checks = {
        "host_keys": host_keys_check(host, facts.get("keys") or [], facts.get("problems") or [],
                                     facts.get("sshd") or {"source": "ssh_trust_sshd_config",
                                                            "config": setting(settings, "sshd_config")}),
        "host_keys_served": _served_check(host, facts, settings, cluster, analysis),
        "names": _names_check(host, analysis),
        "hostname": _hostname_check(host, facts, analysis),
        "known_hosts": _known_hosts_decision(host, facts, settings, analysis),
        "host_key_unchanged": _host_key_unchanged_check(host, facts, analysis),
        "ssh_dirs": _ssh_dirs_check(host, facts, settings),
        "cluster_key": _cluster_key_check(host, facts, settings, cluster, analysis),
        "client_dropin": _client_dropin_check(host, facts, settings, analysis),
        "inbound": _inbound_check(host, settings, cluster, analysis),
    }
    checks.update(_mesh_checks(host, settings, probe, cluster, analysis))
    return checks

