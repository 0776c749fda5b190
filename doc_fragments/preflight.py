# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation fragments shared by the modules in library/ (read by ansible-doc and ansible-test only;
never shipped to a node, never imported by the controller code).

ansible.cfg points doc_fragment_plugins here. A module names them in its DOCUMENTATION:
``extends_documentation_fragment: [preflight, preflight.<name>, ...]``, where ``preflight`` is DOCUMENTATION
below and ``preflight.<name>`` the upper-case attribute NAME. ansible-core merges a fragment's options and
attributes into the module's key by key, the module's own keys winning, and adds the author.
scripts/sanity copies this file to plugins/doc_fragments/ of its throwaway collection and renames the
fragments to cluster_preflight.preflight.preflight[.<name>].
"""

from __future__ import annotations


class ModuleDocFragment(object):

    # Every module: its author. (ansible-core wants options or attributes in a fragment; this one adds none.)
    DOCUMENTATION = r"""
options: {}
author:
  - Cluster preflight contributors (@cluster-preflight)
"""

    # Node modules that only read or probe and change nothing: diagnose_stacks, pci_gpus, port_probe.
    NO_CHANGE = r"""
attributes:
  diff_mode:
    support: none
    description: Nothing is changed, so there is nothing to diff.
"""

    # Node modules that touch only the gate's own run-time state (scratch directories, result files, the run
    # lock's lease), never configuration: allreduce, job_wait, preflight_facts, preflight_local, preflight_lock,
    # preflight_probes.
    RUN_STATE = r"""
attributes:
  diff_mode:
    support: none
    description: Nothing is configured, so there is nothing to diff.
"""

    # Node modules that act in check mode as in a normal run, on the gate's run-time state only (each says how
    # in its check_mode details): job_wait, preflight_lock.
    ACTS_IN_CHECK_MODE = r"""
attributes:
  check_mode:
    support: partial
    description: Runs in check mode, and acts there as in a normal run.
"""

    # The documentation modules of the action plugins in action_plugins/ (preflight_decide, preflight_diagnose,
    # preflight_localize, preflight_settings, preflight_verdict): they run on the controller, never on a node.
    CONTROLLER = r"""
attributes:
  diff_mode:
    support: none
    description: Nothing on a node is changed, so there is nothing to diff.
"""

    # Controller modules that write a run directory of results: preflight_diagnose, preflight_verdict.
    RESULTS = r"""
attributes:
  check_mode:
    support: full
    description: Runs the same in check mode; writes only the run directory on the controller, never on a node.
"""

    # The options the node calls share (NODE_CALL_SPEC in module_utils/preflight_node/calls.py):
    # preflight_facts, preflight_probes, preflight_local.
    NODE_CALL = r"""
options:
  job:
    description:
      - The job user wanted on the node, C({user, named, python}) from C(preflight_settings). Job-side commands of
        the readers and probes (the training Python, the core crash, the ptrace attach) run as that account with a
        minimal environment; with none wanted and root, as C(nobody) when it can use the training Python.
    type: dict
    default: {}
"""

    # Writers of a drop-in file of their own that audit it like the preflight does: limits_dropin, sysctl_setting.
    DROPIN = r"""
options:
  backup:
    description: Keep a timestamped copy of an existing drop-in before replacing it.
    type: bool
    default: false
  comment:
    description: Extra comment lines for the drop-in header (why the value is what it is).
    type: str
    default: ""
attributes:
  check_mode:
    support: full
    description: Reports what would change and the resulting drift findings; writes nothing.
"""
