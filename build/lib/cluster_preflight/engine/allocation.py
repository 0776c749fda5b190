# -*- coding: utf-8 -*-
"""The Slurm allocation the controller runs in, and whether the srun engine may use it for a node.

The srun engine runs every node call as a step of the allocation this controller was started in (``salloc`` or
``sbatch``: ``SLURM_JOB_ID`` and ``SLURM_JOB_NODELIST`` in its environment).  Outside one, or for an inventory
node the allocation does not hold, nothing may run: :func:`refusals` says so per node, as the settings' input
problems (found / expected / fix), so the run stops before any node is touched (``stopped``, exit 4).
"""

from __future__ import annotations

try:
    import hostlist
except ImportError:  # reported by refusals(), so the ssh engine runs without the library
    hostlist = None

JOB_ID = "SLURM_JOB_ID"
NODELIST = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
# How to start the gate inside an allocation of the inventory's nodes (docs/scale.md).
RECIPE = ("salloc -N <nodes> --exclusive --no-kill python -m cluster_preflight gate --engine srun "
          "-i inventory/slurm.yml (or the same line in an sbatch script)")


def allocation(environ):
    """``{job_id, nodelist, nodes}`` of the allocation in ``environ``, or None outside one."""
    job_id = str(environ.get(JOB_ID) or "").strip()
    if not job_id:
        return None
    nodelist = next((str(environ[name]).strip() for name in NODELIST if str(environ.get(name) or "").strip()), "")
    nodes = []
    if nodelist and hostlist is not None:
        try:
            nodes = hostlist.expand_hostlist(nodelist)
        except hostlist.BadHostlist:
            nodes = []
    return {"job_id": job_id, "nodelist": nodelist, "nodes": nodes}


def refusals(host, environ):
    """Why the srun engine may not run node calls on the inventory node ``host`` from this controller: a list of
    ``{name, found, expected, fix}`` (empty when it may)."""
    found = allocation(environ)
    if found is None:
        return [{"name": "preflight_engine", "found": "srun, but this controller runs outside a Slurm allocation "
                 "(%s is not set)" % JOB_ID,
                 "expected": "the gate started inside an allocation of the inventory's nodes",
                 "fix": "start it inside one: %s; or set preflight_engine: ssh" % RECIPE}]
    if hostlist is None:
        return [{"name": "preflight_engine", "found": "srun, but python-hostlist is not installed on the controller",
                 "expected": "python-hostlist to read the allocation's node list",
                 "fix": "pip install -r requirements.txt in the controller's venv"}]
    if host not in found["nodes"]:
        return [{"name": "preflight_engine", "found": "srun, but %s is not a node of allocation %s (its nodes: %s)" % (
                 host, found["job_id"], found["nodelist"] or "none listed"),
                 "expected": "every inventory node a node of the allocation, by its Slurm name",
                 "fix": "allocate %s too, or gate exactly the allocation (-i inventory/slurm.yml, --limit)" % host}]
    return []
