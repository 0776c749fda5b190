# -*- coding: utf-8 -*-
"""Capability ``ssh_trust``, controller half: its settings (role defaults, typed reads, policies) and the
text helpers the deciders share.

Controller layer (``cluster_preflight/capabilities/ssh_trust/settings.py``, never shipped); used by
``ssh_trust.py``, ``ssh_trust_plan.py``, ``ssh_trust_checks.py`` and ``ssh_trust_mesh.py`` beside it.
"""

from __future__ import annotations

import re

from preflight_node.ssh.known_hosts_plan import KNOWN_HOSTS
from preflight_node.ssh.checks import LIST_LIMIT

# The role's defaults (roles/ssh_trust/defaults/main.yml; a unit test keeps them equal), used
# when a setting is absent.  ssh_trust_login_policy's default depends on ssh_trust_cluster_key.
DEFAULTS = {
    "ssh_trust_sshd_config": "",
    "ssh_trust_host_key_files": [],
    "ssh_trust_port": 22,
    "ssh_trust_extra_names": [],
    "ssh_trust_known_hosts_file": KNOWN_HOSTS,
    "ssh_trust_known_hosts_backup": True,
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
# Names that mean "this machine" wherever they are used: never a name of one cluster node.
LOCAL_NAME = re.compile(r"^(localhost(\..*)?|127\..*|::1|ip6-.*)$", re.IGNORECASE)
KEY_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
DROPIN = re.compile(r"^/.*/ssh_config\.d/[^/]+\.conf$")
USER_NAME = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]*\$?$")
COMMENT = re.compile(r"^[A-Za-z0-9_.@:+=-]+$")


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


def _port(settings):
    port = setting(settings, "port")
    return port if _is_int(port) and 1 <= port <= 65535 else 22


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
