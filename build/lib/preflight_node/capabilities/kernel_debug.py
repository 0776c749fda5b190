# -*- coding: utf-8 -*-
"""Capability ``kernel_debug``, the node half's reader (``module_utils/preflight_node/capabilities/kernel_debug.py``,
shipped in
the ``preflight_facts`` and ``preflight_local`` calls): the kernel settings that let debuggers attach to a hung rank.

``read`` reads ``kernel.yama.ptrace_scope`` and any ``kernel_debug_extra_sysctls``, each now
(``/proc/sys``), in a sysctl.d drop-in of its own and at the next boot, with the same reader the bring-up
writer ``library/sysctl_setting.py`` uses (``module_utils/preflight_node/sysctl/values.py``).  The ptrace attach
probe (``probe``, as the job user) is ``module_utils/preflight_node/capabilities/kernel_debug_probe.py``.  What the
controller decides from them (validate, read_args, probe_args, decide, the ``ptrace_attach`` check) is in
``cluster_preflight/capabilities/kernel_debug/``.

Facts (``read``)::

    {"settings": {<check name>: sysctl.read_setting(...) facts, ...}}

keyed by check name (``ptrace_scope`` and each extra sysctl's ``check_name``).
"""

from __future__ import annotations

from ..sysctl import values as sysctl
from ..privilege import file_errors, privileged, refused

CAPABILITY = "kernel_debug"


def read(args, ops):
    """Each setting's running value, drop-in and boot order (pure reads); ``privileged`` and ``needs_root``
    (the files a reader without root was refused, see ``module_utils/preflight_node/privilege.py``)."""
    found = {item["check_name"]: sysctl.read_setting(args["root"], args["proc_root"], item["key"], item["dropin"],
                                                     args["sysctl_dirs"])
             for item in args["settings"]}
    root = privileged()
    return {"settings": found, "privileged": root,
            "needs_root": refused([pair for facts in found.values() for pair in file_errors(facts)], root)}
