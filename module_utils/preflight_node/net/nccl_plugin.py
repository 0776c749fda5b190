# -*- coding: utf-8 -*-
"""Node layer: NCCL's network plugin where the fabric needs one (read by the ``fabric`` reader; the decision is in
``cluster_preflight/capabilities/fabric/gpudirect.py``).

NCCL reaches AWS EFA only through a network plugin, aws-ofi-nccl (libfabric's ``efa`` provider); without it NCCL
falls back to TCP sockets (or, with ``NCCL_NET`` naming the plugin, fails with ``NET/OFI`` errors).  NCCL loads the
plugin with ``dlopen``: ``libnccl-net.so`` by default, ``libnccl-net-<name>.so`` (then ``<name>`` itself) when
``NCCL_NET_PLUGIN`` names one, an absolute path as it is.  ``dlopen`` searches ``LD_LIBRARY_PATH``, the directories
of ``/etc/ld.so.conf`` (and the files it includes), then ``/lib`` and ``/usr/lib``.  ``read`` looks where the job's
dlopen would, with the job's environment where the operator named it, and also in the places the plugin is
installed to but that are not searched unless configured (``/opt/amazon/ofi-nccl``), to say so in the fix.
"""

from __future__ import annotations

import glob
import os

DEFAULT_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64")
INSTALL_DIRS = ("/opt/amazon/ofi-nccl/lib", "/opt/amazon/ofi-nccl/lib64", "/opt/aws-ofi-nccl/lib")
LD_SO_CONF = "/etc/ld.so.conf"
MAX_INCLUDES = 64


def _rooted(root, path):
    return os.path.join(root, path.lstrip("/")) if root and root != "/" else path


def _conf_lines(path):
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            return handle.read(65536).splitlines()
    except OSError:
        return []


def ld_so_conf_dirs(root="/"):
    """The directories ``/etc/ld.so.conf`` lists, its ``include`` globs followed (bounded), in order."""
    dirs, pending, seen = [], [LD_SO_CONF], 0
    while pending and seen < MAX_INCLUDES:
        path, seen = pending.pop(0), seen + 1
        for raw in _conf_lines(_rooted(root, path)):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("include "):
                pattern = line.split(None, 1)[1].strip()
                pattern = pattern if pattern.startswith("/") else os.path.join(os.path.dirname(path), pattern)
                matches = sorted(glob.glob(_rooted(root, pattern)))
                pending.extend("/" + os.path.relpath(match, root) if root != "/" else match for match in matches)
            elif line.startswith("/") and line not in dirs:
                dirs.append(line)
    return dirs


def wanted_names(plugin):
    """The file names NCCL tries for ``NCCL_NET_PLUGIN`` (None: the default ``libnccl-net.so``)."""
    if not plugin:
        return ["libnccl-net.so"]
    if "/" in plugin:
        return [plugin]
    return ["libnccl-net-%s.so" % plugin, plugin if plugin.endswith(".so") else "%s.so" % plugin]


def read(args):
    """``{plugin, wanted, searched, found, elsewhere}``: the ``NCCL_NET_PLUGIN`` of the job's environment, the names
    NCCL would load, the directories searched in dlopen's order, the plugin files found there, and plugin files in
    install directories that are not searched."""
    root = args.get("root") or "/"
    job_env = args.get("job_env") or {}
    plugin = (job_env.get("NCCL_NET_PLUGIN") or "").strip() or None
    searched = [entry for entry in (job_env.get("LD_LIBRARY_PATH") or "").split(":") if entry.startswith("/")]
    searched += [entry for entry in ld_so_conf_dirs(root) + list(DEFAULT_DIRS) if entry not in searched]
    wanted = wanted_names(plugin)
    found = []
    if plugin and "/" in plugin:
        found = [plugin] if os.path.isfile(_rooted(root, plugin)) else []
    else:
        for directory in searched:
            found.extend(os.path.join(directory, name) for name in wanted
                         if os.path.isfile(_rooted(root, os.path.join(directory, name))))
    elsewhere = sorted(path for directory in INSTALL_DIRS if directory not in searched
                       for path in glob.glob(_rooted(root, os.path.join(directory, "libnccl-net*.so"))))
    if root != "/":
        elsewhere = ["/" + os.path.relpath(path, root) for path in elsewhere]
    return {"plugin": plugin, "wanted": wanted, "searched": searched, "found": found, "elsewhere": elsewhere,
            "nccl_net": (job_env.get("NCCL_NET") or "").strip() or None}
