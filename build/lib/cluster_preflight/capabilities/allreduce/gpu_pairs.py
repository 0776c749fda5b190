# -*- coding: utf-8 -*-
"""Localisation over the GPUs inside one node: which GPU is bad, by index and PCI bus id.

Pure (planning, naming and parsing; unit-tested).  When a node of a
multi-GPU (``nccl``) cluster is suspected of a node-level fault, the same
pair rounds :mod:`preflight_localize` runs over nodes are run over the GPUs of
that node.  Every launch is the ``allreduce`` module as a single-node run over
``lo`` with two ranks (``nnodes=1``, ``nproc_per_node=2``) restricted to two
GPUs by ``CUDA_VISIBLE_DEVICES=i,j`` (with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so
that ``i`` and ``j`` are the indices ``nvidia-smi`` prints, which
:data:`preflight_node.gpu.nvidia_gpus.QUERY_ARGV` reads along with each GPU's PCI bus id, UUID and name).
Local rank 0 runs on GPU ``i`` and local rank 1 on GPU ``j``.

GPUs are labelled ``gpu<index>`` and a launch record has the node rounds'
shape (``kind: "pair"``, ``hosts: ["gpu0", "gpu1"]``, ``master_port``,
status, busbw...), so :func:`preflight_localize.graded` and
:func:`preflight_localize.judge` grade them and decide each GPU's state
unchanged:

* **round 1**: disjoint GPU pairs in index order (0+1, 2+3, ...); with an odd
  count the GPU left over is not tested yet.
* **round 2**: every suspect GPU (in a pair that failed or was slow) and every
  GPU not yet tested is paired with a GPU proven good (a pair of its passed)
  that it was never paired with: the least used in the round first, then the
  nearest by index (GPUs under one PCIe switch or NUMA node usually have
  neighbouring indices, so the retest compares like with like).  A GPU left
  without a good partner (none proven yet, or all tried) is paired with
  another such GPU it was never paired with: first disjoint pairs, then each
  GPU still without a launch with one that already has one.
* **round 3**: only if still ambiguous, the same rule again.

One node runs one ``allreduce`` call at a time, so the launches of a round are
laid out as sequential **slots** (one launch per slot, each with its own
master port): a GPU may take part in several launches of one round, never in
two at once.

Coverage.  A pair that passes proves both its GPUs good; a GPU is named bad
only when it fails (or is slow) with a GPU proven good in an earlier round, or
with two different GPUs proven good: a single suspect pair never names a GPU.
Round 1 tests every GPU but an odd last one.  With one bad GPU among three or
more, every round-1 pair without it passes, and round 2 retests both GPUs of
the failed pair (and the odd one) against GPUs proven good, which names the
bad one and proves its partner: two rounds.  With three GPUs and the bad one
in the first pair nothing is proven in round 1, so round 2 pairs anew (0+2,
1+2): 1+2 passes and GPU 0, failing with both, is named by the
two-good-partners rule, still in two rounds.  Two bad GPUs are named in two
rounds when some round-1 pair passes (always with six GPUs or more), else
round 2 pairs the suspects anew and round 3 retests them (four or five GPUs).
Simulated exhaustively (``tests/unit/test_gpu_pairs.py``): every set of bad
GPUs ends with no healthy GPU named and no bad GPU passed.  With exactly two
GPUs there is no third GPU to prove either against: a failing pair is
reported as "cannot tell which of the two" (blocked), never a guess.  GPUs
that end neither good nor bad are **unproven** (blocked, never silently
passed); when no pair passes at all, the finding points at the whole node
(driver, NCCL, NVSwitch / fabric manager) rather than at a GPU.  A launch
that gives no result at all (the node or the module stopped answering) ends
the localisation; that is the node's fault, not a GPU's.

Floors are the node rounds' (per backend run): the absolute minimum busbw
(``allreduce_floor_busbw_gbps_nccl``) on every pair and the relative floor
(``allreduce_floor_relative`` x the median busbw of the pairs that
completed).  Either turns a working but slow GPU (a degraded NVLink or PCIe
link, a throttled GPU) into a named GPU.

Off (not applicable, with the reason) on CPU nodes, with backend ``gloo`` and
on nodes with fewer than two GPUs: :func:`applies` and :func:`inapplicable`.
"""

from __future__ import annotations

from preflight_node.checks import blocked, failed, not_applicable, passed
from preflight_node.gpu.nvidia_gpus import sysfs_address
from cluster_preflight.capabilities.allreduce.localize import (LOOPBACK_ADDR, MAX_ROUNDS, derived_port,
                                                               describe_outcome, graded, judge, loopback_args,
                                                               run_outcome)

CHECK_NAME = "gpu_pairs"
BACKEND = "nccl"
# The key a launch's single module result is filed under for run_outcome: the node, never a GPU label.
NODE_KEY = "node"
EXPECTED = ("every GPU of the node completes a 2-GPU all-reduce (CUDA_VISIBLE_DEVICES=i,j, alone over lo) with a "
            "GPU proven good, with busbw above the floors (absolute per backend, and relative to the median pair)")


# --------------------------------------------------------------------------
# Applicability


def _count(gpus):
    return gpus if isinstance(gpus, int) else len(gpus or [])


def applies(backend, gpus):
    """Whether GPU pair localisation applies: ``(bool, reason)``.

    ``gpus``: the parsed GPUs (:func:`parse_query_gpu`) or their count.  Only
    backend ``nccl`` with two GPUs or more."""
    count = _count(gpus)
    if backend != BACKEND:
        return False, ("backend %s: GPU pair localisation runs 2-GPU NCCL all-reduces, it applies to backend nccl "
                       "only (a gloo all-reduce runs on the CPU)" % (backend or "unset"))
    if count == 0:
        return False, "no GPU on this node (nvidia-smi lists none): a CPU node has no GPUs to localise over"
    if count < 2:
        return False, "only one GPU on this node: no pair of GPUs to run, its fault is the node's"
    return True, "backend nccl with %d GPUs: %d GPU pairs to localise over" % (count, count * (count - 1) // 2)


def inapplicable(node, reason):
    """``(summary, check)`` for a node the localisation does not apply to (``not_applicable`` with ``reason``)."""
    summary = {"node": node, "applies": False, "why": reason, "rounds_run": 0, "rounds": [],
               "bad": [], "good": [], "unproven": [], "lost": False}
    return summary, not_applicable("%s: %s" % (node, reason), EXPECTED)


# --------------------------------------------------------------------------
# Planning


def label(index):
    """The label a GPU goes by in the launch records (``hosts``): ``gpu<index>``."""
    return "gpu%d" % int(index)


def _indices(gpus):
    """GPU indices of ``gpus`` (parsed dicts or plain indices), in the order given."""
    return [int(gpu["index"]) if isinstance(gpu, dict) else int(gpu) for gpu in gpus]


def pair_args(base_args, pair, port):
    """The node's ``allreduce`` arguments for one 2-GPU launch alone over ``lo`` on GPUs ``pair`` (indices)."""
    args = loopback_args(base_args, port)
    args["env"] = dict(args["env"], CUDA_VISIBLE_DEVICES="%d,%d" % tuple(pair), CUDA_DEVICE_ORDER="PCI_BUS_ID",
                       NCCL_SOCKET_IFNAME="lo")
    args.update(backend=BACKEND, nproc_per_node=2)
    return args


def _lost(rounds):
    return [launch for item in rounds for launch in item["launches"] if launch.get("status") == "lost"]


def plan_round(round_no, gpus, rounds_so_far, base_args, master_port, floor):
    """The launches of round ``round_no`` (1-3) over the node's ``gpus`` given the earlier ``rounds_so_far``.

    ``gpus``: parsed GPUs or indices; ``rounds_so_far``: the rounds already
    recorded (:func:`record`); ``base_args``: the node's ``allreduce``
    arguments; ``master_port``: the run's (each launch gets its own, distinct
    over all rounds); ``floor``: ``{absolute, relative}``.  Returns ``{round,
    launches, slots}``: ``launches`` (``{kind: "pair", hosts, gpus, slot,
    master_addr, master_port}``, no outcomes yet) and ``slots``, the
    ``allreduce`` arguments of each launch in the order they run, one at a
    time (``launches[n]`` runs in ``slots[n]``).  No launch: nothing is
    ambiguous, nothing is left to test, or a launch gave no result (the node
    stopped answering); the caller concludes.
    """
    indices = _indices(gpus)
    labels = [label(index) for index in indices]
    by_label = dict(zip(labels, indices))
    serial = sum(len(item["launches"]) for item in rounds_so_far)
    launches = []

    def add(first, second):
        nonlocal serial
        port = derived_port(master_port, serial)
        serial += 1
        launches.append({"kind": "pair", "hosts": [first, second], "gpus": [by_label[first], by_label[second]],
                         "slot": len(launches), "master_addr": LOOPBACK_ADDR, "master_port": port})

    if round_no > MAX_ROUNDS or len(indices) < 2 or _lost(rounds_so_far):
        return {"round": round_no, "launches": [], "slots": []}
    if round_no == 1:
        for position in range(0, len(labels) - 1, 2):
            add(labels[position], labels[position + 1])
    else:
        states = judge(labels, rounds_so_far, floor)[0]
        good = [gpu for gpu in labels if states[gpu] == "good"]
        prove = [gpu for gpu in labels if states[gpu] in ("suspect", "untested")]
        tried = {frozenset(launch["hosts"]) for item in rounds_so_far for launch in item["launches"]}
        uses = dict.fromkeys(labels, 0)

        def pair_with(gpu, candidates):
            fresh = [other for other in candidates if other != gpu and frozenset((gpu, other)) not in tried]
            if not fresh:
                return None
            other = min(fresh, key=lambda peer: (uses[peer], abs(by_label[peer] - by_label[gpu]), by_label[peer]))
            tried.add(frozenset((gpu, other)))
            uses[gpu] += 1
            uses[other] += 1
            return other

        left = []
        for gpu in prove:
            partner = pair_with(gpu, good)
            if partner is None:
                left.append(gpu)
            else:
                add(partner, gpu)
        # No good partner: new pairs among themselves, disjoint first, then one for each GPU still without a launch.
        for gpu in left:
            if not uses[gpu]:
                partner = pair_with(gpu, [other for other in left if not uses[other]])
                if partner is not None:
                    add(gpu, partner)
        for gpu in left:
            if not uses[gpu]:
                partner = pair_with(gpu, left)
                if partner is not None:
                    add(gpu, partner)
    slots = [pair_args(base_args, launch["gpus"], launch["master_port"]) for launch in launches]
    return {"round": round_no, "launches": launches, "slots": slots}


def _module_result(result):
    """A slot's ``allreduce`` result as run_outcome takes it: a dict with ``ranks``, or why there is none."""
    if isinstance(result, dict) and not isinstance(result.get("ranks"), list):
        return str(result.get("msg") or "the allreduce module returned no rank results")[:300]
    return result


def record(planned, results_by_slot):
    """A planned round with each launch's outcome; ``results_by_slot[slot]``: the module result or why none.

    ``results_by_slot``: a list in slot order or a dict slot -> result; a
    missing slot is a launch that gave no result."""
    results = dict(enumerate(results_by_slot)) if isinstance(results_by_slot, (list, tuple)) else results_by_slot
    launches = []
    for launch in planned["launches"]:
        result = _module_result(results.get(launch["slot"]))
        outcome = run_outcome([NODE_KEY], {NODE_KEY: result})
        if outcome["status"] == "fail" and isinstance(result, dict):
            outcome["reason"] = _rank_errors(launch, result) or outcome["reason"]
        launches.append(dict(launch, **outcome))
    return {"round": planned["round"], "launches": launches}


def _rank_errors(launch, result):
    """Every failing rank of a 2-GPU launch with the GPU it ran on (local rank r on the r-th CUDA_VISIBLE_DEVICES).

    A GPU that breaks usually takes its partner's rank down too (an aborted
    communicator), so all of them are kept, not only the first."""
    out = []
    for row in result["ranks"]:
        if row.get("status") == "ok" and row.get("correct", True):
            continue
        rank = row.get("rank")
        gpu = launch["gpus"][rank] if isinstance(rank, int) and 0 <= rank < len(launch["gpus"]) else None
        out.append("rank %s%s %s at stage %s: %s" % (
            rank, "" if gpu is None else " on GPU %d" % gpu, row.get("status", "gave no status"), row.get("stage"),
            str(row.get("error") or "no error recorded")[:160]))
    return "; ".join(out)


def ambiguous(gpus, rounds, floor):
    """Whether another round could still prove or name a GPU."""
    if _lost(rounds):
        return False
    states = judge([label(index) for index in _indices(gpus)], rounds, floor)[0]
    return any(state in ("suspect", "untested") for state in states.values())


# --------------------------------------------------------------------------
# Conclusion


def describe_gpu(gpu):
    """``GPU <index> (PCI <bus_id>, <name>, <uuid>)``."""
    return "GPU %d (PCI %s, %s, %s)" % (gpu["index"], gpu["bus_id"], gpu["name"], gpu["uuid"])


def _describe(launch):
    what = "pair GPU %d+GPU %d in round %d (CUDA_VISIBLE_DEVICES=%d,%d)" % (
        launch["gpus"][0], launch["gpus"][1], launch["round"], launch["gpus"][0], launch["gpus"][1])
    return describe_outcome(what, launch, "gave no result")


def _plain(launches):
    return [{key: launch.get(key) for key in ("round", "slot", "gpus", "master_port", "verdict", "busbw_gbps", "why")}
            for launch in launches]


def _gpu_records(gpus):
    """Parsed GPUs by index; plain indices get placeholders for what nvidia-smi would have said."""
    out = {}
    for gpu in gpus:
        if isinstance(gpu, dict):
            out[int(gpu["index"])] = dict(gpu, index=int(gpu["index"]))
        else:
            out[int(gpu)] = {"index": int(gpu), "bus_id": "unknown", "uuid": "uuid unknown", "name": "name unknown"}
    return out


def _fix(node, bad_gpus, slow, others):
    checks = []
    for gpu in bad_gpus:
        steps = ["nvidia-smi -q -i %s (ECC errors, remapped rows, PCIe link gen/width, clocks and throttle "
                 "reasons)" % gpu["bus_id"]]
        if gpu["index"] in slow:
            steps.append("nvidia-smi nvlink -s -i %s (links down or slow) and nvidia-smi topo -m" % gpu["bus_id"])
        steps.append("Xid errors naming %s or %s in dmesg -T" % (gpu["bus_id"], sysfs_address(gpu["bus_id"])))
        steps.append("if they persist after a reset with the node idle (nvidia-smi -r -i %s), reseat/replace it"
                     % gpu["bus_id"])
        checks.append("GPU %d: %s" % (gpu["index"], "; ".join(steps)))
    return ("drain %s; for each bad GPU, check it: %s. Until it is fixed, jobs on %s can leave it out with "
            "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=%s; then re-run the preflight"
            % (node, " | ".join(checks), node, ",".join(str(index) for index in others) or "(none)"))


def conclude(node, gpus, rounds, floor, trigger):
    """The ``allreduce.gpu_pairs`` check on ``node`` and the localisation summary: ``(summary, check)``.

    ``gpus``: the node's parsed GPUs (:func:`parse_query_gpu`); ``rounds``: the
    recorded rounds; ``trigger``: why the rounds ran.  ``fail`` names every bad
    GPU by index, PCI bus id, name and UUID with what each of its launches
    measured (and a launch that gave no result); ``pass`` when every GPU is
    proven good; otherwise blocked (unverified), saying which GPUs were not
    proven and why ("cannot tell which of the two" with two GPUs)."""
    records = _gpu_records(gpus)
    indices = sorted(records)
    ok, why = applies(BACKEND, indices)
    if not ok:
        return inapplicable(node, why)
    labels = [label(index) for index in indices]
    states, evidence, _kinds, launches = judge(labels, rounds, floor)
    _graded, median = graded(rounds, floor)
    bad = [index for index in indices if states[label(index)] == "bad"]
    good = [index for index in indices if states[label(index)] == "good"]
    unproven = [index for index in indices if states[label(index)] in ("suspect", "untested")]
    lost = [launch for launch in launches if launch["verdict"] == "lost"]
    slow = {index for index in bad
            if any(launch["verdict"] == "slow" for launch in evidence[label(index)])}

    def measured(index):
        return "; ".join(_describe(launch) for launch in evidence[label(index)]) or "no launch included it"

    parts = []
    for index in bad:
        parts.append("%s is bad: it %s in a 2-GPU all-reduce with a GPU proven good. Measured: %s" % (
            describe_gpu(records[index]), "is slow" if index in slow and not any(
                launch["verdict"] == "fail" for launch in evidence[label(index)]) else "fails", measured(index)))
    if lost:
        first = lost[0]
        parts.append("the localisation on %s stopped in round %d: the launch of slot %d (GPUs %d,%d) gave no "
                     "result (%s)" % (node, first["round"], first["slot"], first["gpus"][0], first["gpus"][1],
                                      first["why"]))
    unproven_text = _unproven(node, indices, unproven, good, records, evidence, measured, lost)
    details = {"launches": _plain(launches), "bad": [records[index] for index in bad],
               "unproven": [records[index] for index in unproven]}
    if bad:
        others = [index for index in indices if index not in bad]
        text = " | ".join(parts + ([unproven_text] if unproven_text else []))
        check = failed("%s: %s" % (node, text), EXPECTED, _fix(node, [records[index] for index in bad], slow, others),
                       **details)
    elif lost:
        check = failed("%s: %s%s" % (node, parts[0], " | " + unproven_text if unproven_text else ""), EXPECTED,
                       "check that %s is up and that the allreduce module runs on it (uptime, dmesg, sshd, the "
                       "task's error), then re-run the preflight" % node, **details)
    elif unproven:
        check = blocked("%s: %s" % (node, unproven_text), EXPECTED)
        check["details"].update(details)
    else:
        check = passed("%s: all %d GPUs proven good: %s" % (node, len(indices), "; ".join(
            "GPU %d (PCI %s)" % (index, records[index]["bus_id"]) for index in indices)), EXPECTED,
            launches=_plain(launches))
    summary = {
        "node": node, "applies": True, "trigger": trigger, "floor_busbw_gbps": floor["absolute"],
        "floor_relative": floor["relative"], "median_pair_busbw_gbps": median, "rounds_run": len(rounds),
        "bad": bad, "bad_gpus": [records[index] for index in bad], "slow": sorted(slow), "good": good,
        "unproven": unproven, "lost": bool(lost),
        "cuda_visible_devices_without_bad": ",".join(str(index) for index in indices if index not in bad),
        "rounds": [{"round": item["round"], "launches": [
            {key: launch.get(key) for key in ("kind", "hosts", "gpus", "slot", "master_addr", "master_port",
                                              "verdict", "busbw_gbps", "why")}
            for launch in launches if launch["round"] == item["round"]]} for item in rounds],
    }
    return summary, check


def _unproven(node, indices, unproven, good, records, evidence, measured, lost):
    """Why the GPUs of ``unproven`` are neither good nor bad ("" when none)."""
    if not unproven:
        return ""
    names = ", ".join(describe_gpu(records[index]) for index in unproven)
    if lost:
        return "not proven: %s" % names
    pairs = [launch for index in unproven for launch in evidence[label(index)]]
    if len(indices) == 2 and pairs:
        return ("cannot tell which of the two GPUs of %s is bad: %s; with only two GPUs neither can be tested against "
                "a GPU proven good (%s), so no GPU is named. Check both (nvidia-smi -q -i <bus id>, Xid errors in "
                "dmesg) or test one in another node to tell them apart" % (node, measured(indices[0]), names))
    if not good and pairs:
        seen = sorted({(launch["round"], launch["slot"]): _describe(launch) for launch in pairs}.items())
        return ("no pair of GPUs of %s passed, so no GPU can be proven good and none is named: a fault of the whole "
                "node (driver, NCCL, NVSwitch / fabric manager, PCIe switch) is more likely than one GPU. Not proven: "
                "%s. Measured: %s" % (node, names, "; ".join(text for _key, text in seen)))
    return "not proven within %d rounds (no GPU proven good left to test against): %s. Measured: %s" % (
        MAX_ROUNDS, names, "; ".join("GPU %d: %s" % (index, measured(index)) for index in unproven))
