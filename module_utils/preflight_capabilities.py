# -*- coding: utf-8 -*-
"""Every capability the preflight checks, and the interface each one implements.

A capability is one role (``roles/<name>``: its variables, prefixed ``<name>_``,
in ``defaults/main.yml`` mirrored by ``meta/argument_specs.yml``; its
bring-up writers in ``tasks/``), one file ``module_utils/preflight_<name>.py``
and one test file ``tests/unit/test_<name>.py``.  The file provides:

``CAPABILITY``
    its name: the role name, the variables' prefix, the check namespace.
``validate(settings) -> [problem]``  (controller)
    what ``meta/argument_specs.yml`` cannot say (ranges, paths, combinations);
    ``settings`` maps the role's variable names to typed values.  A problem is
    ``{"name": variable, "found": ..., "expected": ..., "fix": ...}``.
``read_args(settings, node) -> dict or None``  (controller)
    the JSON-safe arguments ``read`` needs on ``node`` (see :func:`node_info`);
    None when the capability is switched off.
``read(args, ops) -> facts``  (node, inside ``library/preflight_facts.py``)
    pure reads, commands only through ``ops`` (``module_utils/preflight_node.py``).
    What a node may lack (no sshd config, no Yama, no torch) is a fact, never
    an exception; an exception is recorded as ``<name>.error``.
``probe_args(settings, node, plan) -> dict or None`` and ``probe(args, ops)``  (optional)
    a check that has to act (crash a child, ssh to the peers); runs in
    ``library/preflight_probes.py`` while the all-reduce runs.
``decide(host, facts, settings, probe=None, cluster=None) -> {name: check}``  (controller, pure)
    ``facts``/``probe`` are this capability's reader/probe results on
    ``host`` (None when it did not read); ``cluster`` is the view of every
    targeted node for decisions that need peers (``hosts``, ``nodes``,
    ``facts``, ``settings``, ``probes``: each mapping host -> this
    capability's data).

The cluster-wide steps of the gate (interface choice, port mesh, all-reduce)
also expose ``plan``/``report`` functions used by ``action_plugins/preflight_decide.py``.
"""

from __future__ import annotations

from ansible.module_utils import preflight_allreduce
from ansible.module_utils import preflight_core_dumps
from ansible.module_utils import preflight_debug_tools
from ansible.module_utils import preflight_iommu
from ansible.module_utils import preflight_kernel_debug
from ansible.module_utils import preflight_nic_discovery
from ansible.module_utils import preflight_port_mesh
from ansible.module_utils import preflight_ssh_trust

# The order of the verdict and of the audit: the gate's inputs first.
ORDER = (
    preflight_nic_discovery,
    preflight_port_mesh,
    preflight_allreduce,
    preflight_kernel_debug,
    preflight_core_dumps,
    preflight_iommu,
    preflight_debug_tools,
    preflight_ssh_trust,
)
BY_NAME = {module.CAPABILITY: module for module in ORDER}
NAMES = tuple(module.CAPABILITY for module in ORDER)


def get(name):
    """The capability module called ``name``; KeyError names the known ones."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError("unknown capability %r; known: %s" % (name, ", ".join(NAMES)))


def node_info(inventory_hostname, host_vars):
    """What the controller knows of a node from the inventory alone."""
    address = host_vars.get("ansible_host") or inventory_hostname
    return {
        "name": inventory_hostname,
        "ansible_host": str(address),
        "node_addr": str(host_vars.get("preflight_node_addr") or address),
        "user": str(host_vars.get("ansible_user") or ""),
        "ssh_port": int(host_vars.get("ansible_port") or 22),
    }
