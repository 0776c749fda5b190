# -*- coding: utf-8 -*-
"""The capability registry (``module_utils/preflight_node/registry.py``, node layer): every capability and its
traits, declared once, in verdict order.  Everything that lists capabilities is derived from this table:

* the node calls: the readers a call can run (``readers.py``), the probes (``probes.py``), which probe runs after
  the background all-reduce was collected (``calls.py``);
* the controller: the order of the verdict and the audit, what bring-up applies and audits, what the health check
  judges, which gate stages a capability's outcome comes from (``cluster_preflight/capabilities/__init__.py``);
* the playbooks: ``preflight_settings`` gives ``healthcheck.yml`` and ``bringup.yml`` their capabilities and
  ``bringup.yml`` its apply loop (``tests/unit/test_registry.py`` fails on any hand-kept list that disagrees).

It lives in the node layer because both layers read it and the node layer never imports the controller; it
imports nothing, so shipping it costs a node call nothing.

The traits (:func:`_declare`):

``reader``
    ``module_utils/preflight_node/capabilities/<name>.py`` has ``read(args, ops)`` (run by ``preflight_facts``, and
    by ``preflight_local`` when ``local``); the controller half has ``read_args``.
``probe``
    ``module_utils/preflight_node/capabilities/<name>_probe.py`` has ``probe(args, ops)`` (run by
    ``preflight_probes``, and by ``preflight_local`` when ``local``); the controller half has ``probe_args``.
``after_job``
    its probe reads what the all-reduce changed, so it runs once the all-reduce was collected (the fabric's
    error counters).
``local``
    judged on a node alone by the health check (``healthcheck.yml``): no peer, no all-reduce across nodes.
``bringup``
    ``(what, how)``: ``roles/<name>/tasks/main.yml`` writes in bring-up (``bringup.yml`` includes the role in its
    own failure domain, its tasks named by these two sentences); None when it writes nothing.
``stages``
    the gate's node stages its outcome comes from besides settings and facts
    (``cluster_preflight/verdict/accounting.py``
    names the first that did not deliver); a probe adds ``probes``.

What the controller half defines (``validate``, ``decide``, ``profile_fields``, ``plan``) is declared by defining
it there; ``docs/adding-a-capability.md`` walks through a new one.
"""

from __future__ import annotations

import collections

Capability = collections.namedtuple("Capability", "name reader probe after_job local bringup stages")

# The kinds of run and what each runs: the gate (preflight.yml), bring-up (bringup.yml), the health check
# (healthcheck.yml).  The names are the verdict's kinds.
KINDS = ("preflight", "bringup", "healthcheck")


def _declare(name, reader=False, probe=False, after_job=False, local=False, bringup=None, stages=()):
    if after_job and not probe:
        raise ValueError("capability %s: after_job is a trait of a probe; declare probe=True" % name)
    if probe and "probes" not in stages:
        stages = tuple(stages) + ("probes",)
    return Capability(name, bool(reader), bool(probe), bool(after_job), bool(local), bringup, tuple(stages))


# In verdict order: the gate's inputs first.
CAPABILITIES = (
    _declare("nic_discovery", reader=True, local=True),
    _declare("port_mesh", stages=("port_mesh", "port_mesh_wait")),
    _declare("allreduce", reader=True, local=True, stages=("single", "launch", "probes")),
    _declare("gpu_health", reader=True, local=True,
             bringup=("Apply the NVSwitch fabric manager", "Enable and start the fabric manager on NVSwitch nodes")),
    _declare("fabric", reader=True, probe=True, after_job=True, local=True,
             bringup=("Apply the PCIe ACS setting for GPUDirect RDMA",
                      "Clear the ACS redirect between GPUs and NICs at boot (opt-in)")),
    _declare("kernel_debug", reader=True, probe=True, local=True,
             bringup=("Apply the kernel settings for debuggers", "Configure ptrace_scope and the extra sysctls")),
    _declare("core_dumps", reader=True, probe=True, local=True,
             bringup=("Apply core dumps", "Configure core_pattern, the core directory and the core limits")),
    _declare("iommu", reader=True, local=True,
             bringup=("Apply the IOMMU kernel arguments on AMD GPU nodes",
                      "Configure the grub defaults for AMD GPUs")),
    _declare("debug_tools", reader=True, local=True,
             bringup=("Install the debug tools", "Install gdb, strace, pdsh, nmap and py-spy")),
    _declare("ssh_trust", reader=True, probe=True,
             bringup=("Apply node-to-node SSH trust", "Write the cluster's known host keys and the ssh client settings")),
    _declare("profile", stages=("launch", "probes")),
)
BY_NAME = {capability.name: capability for capability in CAPABILITIES}
NAMES = tuple(capability.name for capability in CAPABILITIES)


def get(name):
    """The declaration of capability ``name``; KeyError names the known ones."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError("unknown capability %r; known: %s" % (name, ", ".join(NAMES)))


def _kind(kind):
    if kind not in KINDS:
        raise ValueError("unknown kind of run %r; known: %s" % (kind, ", ".join(KINDS)))
    return kind


def names_for(kind):
    """The capabilities a run of ``kind`` applies, in verdict order: every one for the gate, those that write for
    bring-up, the node-local ones for the health check."""
    if _kind(kind) == "bringup":
        return tuple(item.name for item in CAPABILITIES if item.bringup)
    if kind == "healthcheck":
        return tuple(item.name for item in CAPABILITIES if item.local)
    return NAMES


def readers_for(kind):
    """The capabilities whose ``read`` a run of ``kind`` runs on a node (its facts call; the health check's one
    call), in verdict order."""
    return tuple(name for name in names_for(kind) if BY_NAME[name].reader)


def probes_for(kind):
    """The capabilities whose ``probe`` a run of ``kind`` runs on a node, in verdict order: the gate's probes call,
    the health check's node-local probes (in its one call, after the readers); bring-up runs none."""
    if _kind(kind) == "bringup":
        return ()
    return tuple(name for name in names_for(kind) if BY_NAME[name].probe)


def after_job(name):
    """Whether capability ``name``'s probe runs after the background all-reduce was collected; False for a name
    the registry does not know."""
    capability = BY_NAME.get(name)
    return bool(capability and capability.after_job)


def bringup_steps(names):
    """The apply steps of bring-up for the capabilities ``names`` that write, in verdict order:
    ``[{name, what, how}]``, ``what`` and ``how`` the names of its block and of its role's task."""
    wanted = set(names)
    return [{"name": item.name, "what": "%s (%s)." % (item.bringup[0], item.name), "how": "%s." % item.bringup[1]}
            for item in CAPABILITIES if item.bringup and item.name in wanted]


def bind(names, imported, suffix, where):
    """``{name: module}``: the node module ``<name><suffix>`` of each capability in ``names``, from ``imported`` (the
    names ``where`` imported, its ``globals()``); ImportError naming each one ``where`` does not import by name,
    which Ansible would not ship with the call."""
    missing = [name + suffix for name in names if name + suffix not in imported]
    if missing:
        raise ImportError("module_utils/preflight_node/%s does not import %s: add it to its import line (Ansible "
                          "ships with a node call only the modules it imports by name)" % (where, ", ".join(missing)))
    return {name: imported[name + suffix] for name in names}
