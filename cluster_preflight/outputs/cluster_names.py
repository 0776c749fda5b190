# -*- coding: utf-8 -*-
"""Which cluster an inventory is (controller layer): the name the run history, ``history``, the report's recent runs
and ``baseline`` file its runs under, worked out from the command line the same way the verdict action works it
out inside a run (``cluster_preflight/outputs/finish.py``): ``preflight_cluster`` when the inventory (or ``-e``)
sets it, else the inventory's absolute path(s)."""

from __future__ import annotations

import os

from cluster_preflight.outputs.history import cluster_key

CLUSTER_VAR = "preflight_cluster"
GROUP = "cluster"


def sources_of(inventory):
    """The inventory sources (a path or a list of paths) as the absolute, resolved paths a run records."""
    items = inventory if isinstance(inventory, (list, tuple)) else [inventory]
    return [os.path.realpath(str(item)) for item in items if item]


def load_inventory(inventory):
    """``(InventoryManager, VariableManager)`` of ``inventory`` through Ansible's own loader."""
    from ansible.inventory.manager import InventoryManager  # pylint: disable=import-outside-toplevel
    from ansible.parsing.dataloader import DataLoader  # pylint: disable=import-outside-toplevel
    from ansible.plugins.loader import init_plugin_loader  # pylint: disable=import-outside-toplevel
    from ansible.utils.collection_loader import AnsibleCollectionConfig  # pylint: disable=import-outside-toplevel
    from ansible.vars.manager import VariableManager  # pylint: disable=import-outside-toplevel

    if AnsibleCollectionConfig.collection_finder is None:
        # As ansible's own commands do once: without it no vars plugin runs, and group_vars/ would go unread.
        init_plugin_loader()
    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=sources_of(inventory))
    return manager, VariableManager(loader=loader, inventory=manager)


def inventory_cluster(inventory, extravars=None, group=GROUP):
    """``{name, inventory}`` of the cluster ``inventory`` describes (as a verdict's ``cluster``): the name is
    ``-e preflight_cluster`` (``extravars``), else the value the group's first node gets from the inventory and its
    group_vars, else empty (the cluster is then its inventory)."""
    name = str((extravars or {}).get(CLUSTER_VAR) or "")
    if not name:
        manager, variables = load_inventory(inventory)
        hosts = manager.get_hosts(group) or manager.get_hosts("all")
        if hosts:
            name = str(variables.get_vars(host=hosts[0]).get(CLUSTER_VAR) or "")
    return {"name": name, "inventory": sources_of(inventory)}


def inventory_key(inventory, extravars=None):
    """The history's key of the cluster ``inventory`` describes
    (:func:`cluster_preflight.outputs.history.cluster_key`)."""
    return cluster_key(inventory_cluster(inventory, extravars))
