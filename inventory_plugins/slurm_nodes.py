# -*- coding: utf-8 -*-
"""Inventory plugin: the nodes of a Slurm allocation or partition as the preflight's ``cluster`` group."""

from __future__ import annotations

DOCUMENTATION = r"""
name: slurm_nodes
short_description: Slurm nodes (the job's allocation, or sinfo) as an inventory group
description:
  - Puts Slurm nodes into one group (C(cluster), the group the preflight playbooks target).
  - "The nodes come from the first source that gives any, in this order: the O(nodelist) option;
    E(SLURM_JOB_NODELIST), then E(SLURM_NODELIST) (set by Slurm inside an allocation, a prolog, an
    sbatch script); else C(sinfo -h -N -o %N), filtered by O(partitions) and O(states), when
    C(sinfo) is installed."
  - Node lists are expanded with the python-hostlist library, the same syntax Slurm uses
    (C(gpu[01-03]), C(node-[1-4,8]), C(gpu[01-03],cpu[1-2]), C(rack[1-2]-n[01-02])).
  - With no source at all (no option, no Slurm variable, no sinfo) the plugin adds nothing and says
    nothing, so a configuration file can sit in the default inventory directory.
  - It also adds nothing when another source parsed before it already put hosts in O(group) and
    O(merge) is false, so the embedded default inventory (localhost) is never mixed with the nodes of
    a Slurm allocation the controller happens to run in. Use C(-i inventory/slurm.yml) alone.
  - The configuration file must be named C(slurm.yml) or C(slurm.yaml), or end in C(.slurm.yml) or
    C(.slurm.yaml).
  - Node names are the Slurm node names; set C(ansible_host) or the preflight's variables with
    O(compose) when they are not what the controller connects to.
requirements:
  - python-hostlist (PyPI C(python-hostlist))
extends_documentation_fragment:
  - constructed
options:
  plugin:
    description: Marks the file as a configuration of this plugin.
    type: str
    required: true
    choices: [slurm_nodes]
  nodelist:
    description:
      - A Slurm node list to use instead of the environment or sinfo (C(gpu[01-16])).
    type: str
  group:
    description: The group the nodes are put in (a child of C(all)).
    type: str
    default: cluster
  merge:
    description:
      - Add the nodes even when O(group) already has hosts from a source parsed before this file.
      - False keeps the default inventory directory (localhost) unchanged inside an allocation or on
        a login node where sinfo works.
    type: bool
    default: false
  partitions:
    description: Only nodes of these partitions (C(sinfo -p)); used only when sinfo is the source.
    type: list
    elements: str
    default: []
  states:
    description:
      - Only nodes in these states (C(sinfo -t), for example C(idle), C(mix)); used only when sinfo is
        the source. Empty takes every state, drained nodes included, so the preflight can clear them.
    type: list
    elements: str
    default: []
  sinfo_path:
    description: The sinfo program; a bare name is looked up on the search path.
    type: str
    default: sinfo
  sinfo_timeout:
    description:
      - Seconds sinfo may take. sinfo retries for a long time when slurmctld does not answer; an
        inventory that hangs would hang every playbook.
    type: int
    default: 10
"""

EXAMPLES = r"""
# inventory/slurm.yml: the nodes of the current allocation, or every node sinfo lists.
#   SLURM_JOB_NODELIST='gpu[01-03]' ansible-inventory -i inventory/slurm.yml --graph
plugin: slurm_nodes

# Idle and mixed nodes of two partitions, with the preflight's variables for every node.
plugin: slurm_nodes
partitions: [a100, h100]
states: [idle, mix]
compose:
  preflight_training_python: "'/opt/train/venv/bin/python'"
keyed_groups:
  - key: inventory_hostname[:5]
    prefix: rack
"""

import os
import shutil
import subprocess

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin, Constructable
from ansible.utils.display import Display

try:
    import hostlist
except ImportError:  # reported by parse(), so a default run without the library still works
    hostlist = None

display = Display()

ENVIRONMENT = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
FILE_NAMES = ("slurm.yml", "slurm.yaml")
FILE_SUFFIXES = (".slurm.yml", ".slurm.yaml")


def expand(nodelist):
    """Node names of a Slurm node list, in order, each once; ``ValueError`` names a bad list."""
    try:
        names = hostlist.expand_hostlist(nodelist.strip())
    except hostlist.BadHostlist as exc:
        raise ValueError("%r is not a Slurm node list: %s" % (nodelist, exc)) from exc
    return list(dict.fromkeys(name for name in names if name))


def sinfo_argv(sinfo, partitions=(), states=()):
    """``sinfo`` printing one node name per line, no header (``-N``: a line per node and partition)."""
    argv = [sinfo, "-h", "-N", "-o", "%N"]
    if partitions:
        argv += ["-p", ",".join(partitions)]
    if states:
        argv += ["-t", ",".join(states)]
    return argv


class InventoryModule(BaseInventoryPlugin, Constructable):
    """Slurm nodes into one group; see DOCUMENTATION."""

    NAME = "slurm_nodes"

    def verify_file(self, path):
        """Only files named for this plugin, so every other YAML of an inventory directory is left alone."""
        name = os.path.basename(path)
        return super().verify_file(path) and (name in FILE_NAMES or name.endswith(FILE_SUFFIXES))

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        group = self.get_option("group")
        if not self.get_option("merge") and self._group_has_hosts(group):
            display.vvv("%s: group %s already has hosts from another source; not adding Slurm nodes (merge: false)"
                        % (path, group))
            return
        source, nodelist = self._nodelist()
        if nodelist is None:
            return
        if hostlist is None:
            raise AnsibleParserError("%s: expanding %s needs the python-hostlist library: "
                                     "pip install -r requirements.txt" % (path, source))
        try:
            nodes = expand(nodelist)
        except ValueError as exc:
            raise AnsibleParserError("%s: %s (from %s)" % (path, exc, source)) from exc
        display.vvv("%s: %d Slurm node(s) from %s into group %s" % (path, len(nodes), source, group))
        if not nodes:
            return
        self.inventory.add_group(group)
        strict = self.get_option("strict")
        for node in nodes:
            self.inventory.add_host(node, group=group)
            variables = self.inventory.get_host(node).get_vars()
            self._set_composite_vars(self.get_option("compose"), variables, node, strict=strict)
            self._add_host_to_composed_groups(self.get_option("groups"), variables, node, strict=strict)
            self._add_host_to_keyed_groups(self.get_option("keyed_groups"), variables, node, strict=strict)

    def _group_has_hosts(self, group):
        found = self.inventory.groups.get(group)
        return bool(found and found.get_hosts())

    def _nodelist(self):
        """``(source, node list text)`` of the first source that has one, or ``(None, None)``."""
        if self.get_option("nodelist"):
            return "the nodelist option", self.get_option("nodelist")
        for name in ENVIRONMENT:
            if os.environ.get(name, "").strip():
                return name, os.environ[name]
        sinfo = shutil.which(self.get_option("sinfo_path"))
        if not sinfo:
            return None, None
        argv = sinfo_argv(sinfo, self.get_option("partitions"), self.get_option("states"))
        try:
            # LANG=C: sinfo's errors are matched by people searching for them, in English.
            done = subprocess.run(argv, capture_output=True, text=True, check=False,
                                  timeout=self.get_option("sinfo_timeout"), env=dict(os.environ, LANG="C"))
        except subprocess.TimeoutExpired as exc:
            raise AnsibleParserError("%s took more than %d s (is slurmctld answering? try scontrol ping)"
                                     % (" ".join(argv), self.get_option("sinfo_timeout"))) from exc
        if done.returncode != 0:
            raise AnsibleParserError("%s failed with rc %d: %s" % (" ".join(argv), done.returncode,
                                                                   done.stderr.strip()[:500]))
        lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
        return " ".join(argv), ",".join(lines)
