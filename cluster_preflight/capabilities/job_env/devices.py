# -*- coding: utf-8 -*-
"""``job_env.visible_devices``: the GPUs the jobs' environment lets each rank see (``CUDA_VISIBLE_DEVICES``).

CUDA reads the list left to right and stops at the first entry it cannot use (an index the node does not have, a
malformed one): the devices after it are not visible either.  A list naming one GPU twice, or fewer GPUs than the
job starts ranks on the node, puts two ranks on one GPU, and NCCL stops the job with "Duplicate GPU detected" (the
log diagnosis's ``duplicate_gpu``).  Judged on the controller from the run-wide ``preflight_job_env`` and the GPUs
the gate counted on the node; nothing is read on the node for it.
"""

from __future__ import annotations

import re

from preflight_node.checks import failed, not_applicable, passed

VARIABLE = "CUDA_VISIBLE_DEVICES"
# An index, or a GPU / MIG UUID as nvidia-smi -L prints it (a prefix of one is accepted by CUDA too).
_INDEX = re.compile(r"^\d+$")
_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-/]+$")


def visible_check(host, env, gpus):
    """``visible_devices``: ``CUDA_VISIBLE_DEVICES`` of the job environment ``env`` names each GPU of ``host`` at
    most once and only GPUs it has (``gpus``: how many the gate counted there)."""
    value = env.get(VARIABLE)
    expected = "%s in the jobs' environment names each GPU of %s at most once, and only GPUs it has" % (VARIABLE,
                                                                                                        host)
    if value is None:
        return not_applicable("the job environment (preflight_job_env) sets no %s: every rank sees every GPU of %s "
                              "and takes its own by LOCAL_RANK" % (VARIABLE, host), expected)
    if not gpus:
        return not_applicable("%s has no GPU the gate counted: %s=%s selects nothing there" % (host, VARIABLE, value),
                              expected)
    fix = ("set %s in preflight_job_env and the jobs' environment to distinct GPU indices below %d (or GPU UUIDs "
           "from nvidia-smi -L), one per rank a node runs, or leave it unset and let each rank take the GPU of its "
           "LOCAL_RANK" % (VARIABLE, gpus))
    entries = [item.strip() for item in str(value).split(",")]
    found = "%s=%s on %s (%d GPUs)" % (VARIABLE, value, host, gpus)
    if not any(entries):
        return failed("%s: no GPU is visible to the job's ranks (CUDA finds no device)" % found, expected, fix)
    seen = []
    for position, entry in enumerate(entries):
        if not (_INDEX.match(entry) or _UUID.match(entry)):
            return failed("%s: entry %d, %r, is neither a GPU index nor a UUID: CUDA stops reading there, so %s" % (
                found, position + 1, entry, _after(seen)), expected, fix)
        if _INDEX.match(entry) and int(entry) >= gpus:
            return failed("%s: GPU %s does not exist there (indices 0 to %d): CUDA stops reading there, so %s" % (
                found, entry, gpus - 1, _after(seen)), expected, fix)
        if entry in seen:
            return failed("%s: GPU %s is named twice: two ranks on one GPU ('Duplicate GPU detected')" % (
                found, entry), expected, fix)
        seen.append(entry)
    return passed("%s: %d distinct GPUs visible to each rank; a job starts at most %d ranks on the node (more put "
                  "two ranks on one GPU)" % (found, len(seen), len(seen)), expected)


def _after(seen):
    if not seen:
        return "no GPU is visible to the job's ranks"
    return "only %s %s visible (ranks beyond %d share a GPU)" % (", ".join(seen), "is" if len(seen) == 1 else "are",
                                                                len(seen))
