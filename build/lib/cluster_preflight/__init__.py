# -*- coding: utf-8 -*-
"""cluster_preflight: the preflight as operators call it, from a shell or from Python.

Command line (from the repository root, with the project's venv: ``.venv/bin/python``)::

    python -m cluster_preflight gate -i INVENTORY [--limit HOSTS] [-e KEY=VALUE ...] [--results-dir DIR]
    python -m cluster_preflight bringup | healthcheck | diagnose   (same options)
    python -m cluster_preflight verdict [RUN_DIR_OR_FILE] [--drain-list | --nhc]

The run commands play ``preflight.yml``, ``bringup.yml``, ``healthcheck.yml`` or ``diagnose.yml``
(when the checkout has it) through ansible-runner, show each stage's nodes done / total on stderr
(``--quiet``: none), then the summary matrix, the findings and the verdict's path. Options they do
not know go to ansible-playbook as they are (``-v``, ``--forks 8``, ``-e @vars.yml``).

API::

    import cluster_preflight
    result = cluster_preflight.gate(inventory="clusters/mycluster/hosts.yml", limit="node1,node2",
                                    extravars={"allreduce_timeout": 20})
    result.exit_code, result.verdict.status, result.verdict.failed_hosts, result.verdict.findings

Exit codes (``Result.exit_code``, and the process's). 0, 2 and 3 mean what they mean for
``scripts/verdict`` (gcm's OK / CRITICAL / UNKNOWN), so a script reading either reads both:

====  =====================================================================================
0     pass: every targeted node passed or only warned (the verdict's ``status`` is ``pass``)
1     ``verdict`` only, as ``scripts/verdict``: pass with warnings (``warn_hosts`` not empty);
      a run that passes with warnings exits 0, as ``ansible-playbook`` does
2     fail: a node failed, is unverified or unreachable, or the all-reduce failed
      (``diagnose``, which writes a report and no verdict: its playbook failed)
3     unknown: no verdict, or one that is truncated, lacks a key or contradicts itself (or
      says pass while ansible-playbook failed); never trusted
4     usage: bad arguments, no such inventory or playbook (``diagnose`` without
      ``diagnose.yml``), ansible-playbook refused its options or ``--limit`` before any
      play, or invalid settings (the verdict's ``stopped``: nothing ran on any node;
      ``scripts/verdict`` counts such a verdict as 2)
130   interrupted (Ctrl-C): the run was stopped
====  =====================================================================================

Only ``__main__`` exits the process; the library returns :class:`Result` or raises
:class:`UsageError` / :class:`VerdictError`.

Controller modules (``cluster_preflight.stages.decisions``, ``.capabilities``, ``.accounting`` ...) are imported by the
action plugins on every run, so the API below is loaded on first use only (the run commands pull in
ansible-runner).
"""

import importlib

_API = {
    "cli.playbooks": ("PLAYBOOKS", "Result", "UsageError", "bringup", "diagnose", "gate", "healthcheck",
                      "run_playbook"),
    "verdict.value": ("EXIT_FAIL", "EXIT_INTERRUPTED", "EXIT_MEANING", "EXIT_PASS", "EXIT_UNKNOWN", "EXIT_USAGE",
                      "EXIT_WARN", "Finding", "Verdict", "VerdictError", "exit_code", "load_verdict", "verdict_from_dict"),
}
_OWNER = {name: module for module, names in _API.items() for name in names}

__all__ = sorted(_OWNER)


def __getattr__(name):
    if name not in _OWNER:
        raise AttributeError("module 'cluster_preflight' has no attribute %r" % name)
    return getattr(importlib.import_module("." + _OWNER[name], __name__), name)
