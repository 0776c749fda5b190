# -*- coding: utf-8 -*-
"""Capability ``ssh_trust``, the controller half: node-to-node ssh with host-key checking on.

Controller layer (``cluster_preflight/capabilities/ssh_trust/``, never shipped).  The faces of
``cluster_preflight/capabilities/__init__.py``:

* :func:`validate` - inputs the argument spec cannot judge (ranges, file names, paths).
* :func:`read_args` - what the reader (``read`` in ``module_utils/preflight_node/capabilities/ssh_trust.py``, the
  node half) needs on a node.
* :func:`plan` - over every node: the known-hosts entries every node should hold under its
  inventory names only (what the writer ``known_hosts_block`` writes and the audit compares with),
  names two nodes share, each node's mesh peers, the client drop-in, the cluster key users and
  addresses, and which nodes' keys changed (``ssh_trust_plan.py``).
* :func:`probe_args` - what the probe (``probe`` of the node half) needs: the peers to ssh to.
* :func:`decide` - pure: facts, plan and probes into checks (``ssh_trust_checks.py``,
  ``ssh_trust_mesh.py``; the builders shared with the modules are
  ``module_utils/preflight_node/ssh/checks.py``).

The settings and their role defaults are ``ssh_trust_settings.py`` (all beside this file).
"""

from __future__ import annotations

from typing import Optional

from preflight_node.checks import not_applicable
from preflight_node.ssh.known_hosts_plan import _NAME
from preflight_node.ssh.primitives import MARKER
from preflight_node.ssh.checks import host_keys_check
from preflight_node.capabilities import ssh_trust as node_half

from .checks import (_client_dropin_check, _cluster_key_check, _host_key_unchanged_check, _hostname_check,
                     _known_hosts_decision, _names_check, _served_check, _ssh_dirs_check)
from .mesh import _inbound_check, _mesh_checks
from .cluster_plan import _analysis, mesh_peers
from .settings import (COMMENT, DEFAULTS, DROPIN, KEY_NAME, POLICIES, USER_NAME, _is_int, _port, as_bool, as_list,
                       setting)
from ..common import Args, Checks, Facts, Node, Problems, Settings

CAPABILITY = node_half.CAPABILITY  # the registry reads it here


# --------------------------------------------------------------------------
# Settings


def validate(settings: Settings) -> Problems:
    """Input problems beyond types and choices: ``[{name, found, expected, fix}]``."""
    problems = []

    def problem(key, found, expected, fix):
        problems.append({"name": "ssh_trust_" + key, "found": str(found), "expected": expected, "fix": fix})

    _validate_numbers(settings, problem)
    _validate_names(settings, problem)
    _validate_choices_and_paths(settings, problem)
    return problems


def _validate_numbers(settings, problem):
    """The port, the timeouts and the parallelism, through ``problem(key, found, expected, fix)``."""
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


def _validate_names(settings, problem):
    """The cluster key's file name and comment, the drop-in, the user names."""
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


def _validate_choices_and_paths(settings, problem):
    """The policies, pdsh, the paths, the host key files and the extra names."""
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


# --------------------------------------------------------------------------
# Reader


def read_args(settings: Settings, node: Node) -> Args:
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


# --------------------------------------------------------------------------
# Cluster plan


def plan(cluster):
    """The cluster-wide view of ssh trust, from every node's facts.

    Returns ``{entries, keep_nodes, names, peers, dropin, cluster_key, unreadable, unread,
    changed_keys, duplicate_names}``:

    ``entries``
        ``[{node, names, keys, port}]``, one per targeted node whose host keys were read:
        the input of ``known_hosts_block`` (role variable ``ssh_trust_known_hosts_entries``).
        ``names`` come from the inventory only (``plan._named``).
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


def probe_args(settings: Settings, node: Node, plan: dict) -> Args:  # pylint: disable=redefined-outer-name
    """ssh from ``node`` to every other targeted node; None when there is no peer.

    ``plan`` is ``{hosts, nodes}``; with ``settings`` (host -> settings) as well, each peer's
    own ``ssh_trust_port`` is used, else this node's; with ``peers`` (host -> the peers it
    checks, ``cluster_preflight/capabilities/port_mesh/peers.py``) only those."""
    # Read, not copied: probe_args runs once per node over the same plan (a copy each grew with the square).
    hosts, nodes = plan.get("hosts") or [], plan.get("nodes") or {}
    others = plan.get("settings") or {}
    chosen = (plan.get("peers") or {}).get(node["name"])
    if chosen is not None:
        hosts = chosen

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


# --------------------------------------------------------------------------
# Decider


def decide(host: str, facts: Facts, settings: Settings, probe: Optional[dict] = None,
           cluster: Optional[dict] = None) -> Checks:  # pylint: disable=redefined-outer-name
    """``{name: check}`` for ``host``: host_keys, host_keys_served, names, hostname, known_hosts,
    host_key_unchanged, ssh_dirs, cluster_key, client_dropin, client_config, mesh, login, inbound,
    pdsh; or ``peers``
    (not applicable) when ``host`` has no targeted peer.  ``{}`` when ``host`` was not read."""
    # Not copied: decide runs once per node over the same view, a copy per node would grow with the square.
    hosts = (cluster or {}).get("hosts") or [host]
    if not any(h != host for h in hosts) and ((facts or {}).get("sshd") or {}).get("impostor"):
        # Alone, nothing is trusted over ssh; another account's listener on the ssh port is still said.
        return {"host_keys": host_keys_check(host, facts.get("keys") or [], facts.get("problems") or [],
                                             facts["sshd"])}
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
