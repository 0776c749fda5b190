# -*- coding: utf-8 -*-
"""Capability ``ssh_trust``, the node half's probe (``module_utils/preflight_node/capabilities/ssh_trust_probe.py``,
shipped in
the ``preflight_probes`` call): ssh from this node to every peer with BatchMode and StrictHostKeyChecking=yes,
in parallel and bounded, ``ssh -G`` per peer, ``ssh-keyscan`` of each peer (the keys its sshd serves, compared
with its files), pdsh when installed - the mesh runner is ``module_utils/preflight_node/ssh/mesh.py``.

The reader (``read``: host keys, names, known hosts, the client configuration, the cluster key) is
``module_utils/preflight_node/capabilities/ssh_trust.py``; the controller half (``probe_args``, ``decide``, the mesh
checks)
is ``cluster_preflight/capabilities/ssh_trust/``.
"""

from __future__ import annotations

from ..ssh.mesh import run_mesh

CAPABILITY = "ssh_trust"


def probe(args, ops):
    """Run the mesh from this node (see ``ssh_mesh.run_mesh``); rows are classified, not judged."""
    return run_mesh(ops, args["source"], args.get("peers") or [], user=args.get("user") or "",
                    connect_timeout=args.get("connect_timeout", 5), timeout=args.get("timeout", 20),
                    parallel=args.get("parallel", 32), ssh_options=args.get("ssh_options") or [],
                    connect=args.get("connect", True), pdsh=args.get("pdsh", "auto"),
                    pdsh_hosts=args.get("pdsh_hosts") or [], ssh_bin=args.get("ssh_bin") or "ssh",
                    pdsh_bin=args.get("pdsh_bin") or "pdsh", root=args.get("root") or "/",
                    keyscan=args.get("keyscan", True), keyscan_bin=args.get("keyscan_bin") or "ssh-keyscan",
                    retry_timeouts=bool(args.get("retry_timeouts", False)))
