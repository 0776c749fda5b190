"""Localisation over the GPUs of one node in pair rounds (cluster_preflight/capabilities/allreduce/gpu_pairs.py).

A fake node answers every planned slot from the ``allreduce`` arguments alone (the GPUs in the slot's
``CUDA_VISIBLE_DEVICES``) under a fault model: a bad GPU makes its rank fail (and its partner's abort), a slow
GPU completes at a low busbw, a lost slot gives no result.  The rounds are driven the way a caller would:
plan, run each slot in turn, record, until nothing is ambiguous or three rounds ran, then conclude."""

import itertools
import os

import pytest

from cluster_preflight.capabilities.allreduce import gpu_pairs as gp
from preflight_node.gpu import nvidia_gpus as nvsmi
from cluster_preflight.capabilities.allreduce import localize as loc
from preflight_node.checks import node_status, normalize

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "nvidia_smi")
GOOD_BW, SLOW_BW = 180.0, 40.0
PORT = 29500
NODE = "dgx-h100-07"
FLOOR = {"absolute": 1.0, "relative": 0.7}
H100_BUS = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0",
            "00000000:9A:00.0", "00000000:AB:00.0", "00000000:BA:00.0", "00000000:DB:00.0"]


def fixture(name):
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as handle:
        return handle.read()


def node_gpus(count=8):
    """The first ``count`` GPUs of the recorded 8-GPU H100 node."""
    return nvsmi.parse_query_gpu(fixture("query_gpu_8.csv"))[:count]


def base_args():
    return {"python": "/opt/train/venv/bin/python", "nnodes": 4, "node_rank": 2, "nproc_per_node": 8,
            "master_addr": "198.18.0.1", "master_port": PORT, "backend": "nccl", "timeout": 30, "hard_timeout": 120,
            "stack_budget": 20, "sizes": [16777216], "iters": 5, "warmup": 2, "bandwidth_deadline": 0, "bandwidth_grace": 10.0,
            "check_elements": 0, "min_busbw_gbps": 50,
            "socket_ifname": "ib0", "role": NODE, "run_as": "", "env": {"NCCL_IB_HCA": "mlx5"},
            "keep_scratch": False, "selftest_fault": "none", "selftest_rank": -1}


def ok_rank(rank, busbw):
    return {"rank": rank, "status": "ok", "stage": "done", "correct": True,
            "bandwidth": [{"size_bytes": 16777216, "busbw_gbps": busbw, "algbw_gbps": busbw}]}


def run_slot(args, fault):
    """The ``allreduce`` result of one slot on the fake node, from its arguments only."""
    visible = [int(index) for index in args["env"]["CUDA_VISIBLE_DEVICES"].split(",")]
    if fault.get("lost_port") == args["master_port"]:
        return "unreachable while running the all-reduce: ssh timed out"
    bad = [index for index in visible if index in fault.get("bad", ())]
    if bad:
        broken = visible.index(bad[0])
        return {"ranks": [
            {"rank": rank, "status": "error", "stage": "correctness", "correct": False,
             "error": ("NCCL error: unhandled cuda error (Xid 79: GPU has fallen off the bus)" if rank == broken
                       else "NCCL communicator was aborted on rank %d" % rank)} for rank in (0, 1)]}
    busbw = SLOW_BW if fault.get("slow") in visible else GOOD_BW
    return {"ranks": [ok_rank(0, busbw), ok_rank(1, busbw)]}


def localise(gpus, fault, floor=None):
    """Drive up to three rounds; ``(summary, check, planned rounds)``."""
    floor = floor or FLOOR
    rounds, plans = [], []
    for round_no in range(1, loc.MAX_ROUNDS + 1):
        if round_no > 1 and not gp.ambiguous(gpus, rounds, floor):
            break
        planned = gp.plan_round(round_no, gpus, rounds, base_args(), PORT, floor)
        if not planned["launches"]:
            break
        plans.append(planned)
        rounds.append(gp.record(planned, [run_slot(args, fault) for args in planned["slots"]]))
    summary, check = gp.conclude(NODE, gpus, rounds, floor, "the node's all-reduce over lo failed")
    assert normalize(check, "%s / allreduce.gpu_pairs" % NODE) == check, "the check breaks the contract"
    return summary, check, plans


def status(check):
    return node_status({"allreduce.gpu_pairs": check})


# --------------------------------------------------------------------------
# nvidia-smi


def test_query_argv():
    assert nvsmi.QUERY_ARGV == ["nvidia-smi", "--query-gpu=index,pci.bus_id,uuid,name", "--format=csv,noheader"]


def test_parse_the_8_gpu_h100_node():
    gpus = nvsmi.parse_query_gpu(fixture("query_gpu_8.csv"))
    assert [gpu["index"] for gpu in gpus] == list(range(8))
    assert [gpu["bus_id"] for gpu in gpus] == H100_BUS
    assert {gpu["name"] for gpu in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert gpus[3]["uuid"] == "GPU-b37523a5-3b4a-4ee2-8463-513755ac0ecd"
    assert len({gpu["uuid"] for gpu in gpus}) == 8


def test_parse_the_4_and_1_gpu_nodes():
    four = nvsmi.parse_query_gpu(fixture("query_gpu_4.csv"))  # ends with a blank line
    assert [(gpu["index"], gpu["bus_id"]) for gpu in four] == [
        (0, "00000000:01:00.0"), (1, "00000000:41:00.0"), (2, "00000000:81:00.0"), (3, "00000000:C1:00.0")]
    assert four[0]["name"] == "NVIDIA A100-SXM4-40GB"
    one = nvsmi.parse_query_gpu(fixture("query_gpu_1.csv"))
    assert one == [{"index": 0, "bus_id": "00000000:00:1E.0", "uuid": "GPU-699f071a-5fd8-4665-a9df-dec6baecde5b",
                    "name": "Tesla T4"}]


def test_parse_tolerates_blank_lines_spaces_and_bus_id_forms():
    text = ("\n  1 ,0000:2a:00.0 ,  GPU-5d96cf7f-265b-4da9-8f0c-26ef4243ed52 , NVIDIA H100 80GB HBM3  \n\n"
            "0,18:00.0,GPU-566bf9d7-c55a-45f8-91a6-e55e9b9b1325,NVIDIA H100 80GB HBM3\n   \n")
    gpus = nvsmi.parse_query_gpu(text)
    assert [(gpu["index"], gpu["bus_id"], gpu["name"]) for gpu in gpus] == [
        (0, "00000000:18:00.0", "NVIDIA H100 80GB HBM3"), (1, "00000000:2A:00.0", "NVIDIA H100 80GB HBM3")]
    assert nvsmi.sysfs_address("00000000:2A:00.0") == "0000:2a:00.0"


def test_parse_no_devices_is_no_gpu():
    assert nvsmi.parse_query_gpu(fixture("query_gpu_none.txt")) == []
    assert nvsmi.parse_query_gpu("") == []


@pytest.mark.parametrize("text,line,why", [
    (fixture("query_gpu_no_driver.txt"), 1, "a message from nvidia-smi, not a GPU"),
    (fixture("query_gpu_truncated.csv"), 6, "2 fields instead of 4"),
    ("index, pci.bus_id, uuid, name\n0, 00000000:18:00.0, GPU-566bf9d7-c55a-45f8-91a6-e55e9b9b1325, NVIDIA H100",
     1, "--format=csv,noheader"),
    ("\nx, 00000000:18:00.0, GPU-566bf9d7-c55a-45f8-91a6-e55e9b9b1325, NVIDIA H100", 2, "index 'x' is not a number"),
    ("0, 00000000:18:00, GPU-566bf9d7-c55a-45f8-91a6-e55e9b9b1325, NVIDIA H100", 1, "not a PCI bus id"),
    ("0, 00000000:18:00.0, [N/A], NVIDIA H100", 1, "not a GPU UUID"),
    ("0, 00000000:18:00.0, GPU-566bf9d7-c55a-45f8-91a6-e55e9b9b1325, [N/A]", 1, "no GPU name"),
    ("0, 00000000:18:00.0, GPU-566bf9d7-c55a-45f8-91a6-e55e9b9b1325, NVIDIA H100\n"
     "0, 00000000:2A:00.0, GPU-5d96cf7f-265b-4da9-8f0c-26ef4243ed52, NVIDIA H100", 2, "index 0 already on line 1"),
    ("0, 00000000:18:00.0, GPU-566bf9d7-c55a-45f8-91a6-e55e9b9b1325, NVIDIA H100\n"
     "1, 0000:18:00.0, GPU-5d96cf7f-265b-4da9-8f0c-26ef4243ed52, NVIDIA H100", 2,
     "bus id 00000000:18:00.0 already on line 1"),
])
def test_parse_errors_name_the_line_and_the_problem(text, line, why):
    with pytest.raises(ValueError) as caught:
        nvsmi.parse_query_gpu(text)
    message = str(caught.value)
    assert "line %d is malformed" % line in message and why in message
    assert "index, pci.bus_id, uuid, name" in message


# --------------------------------------------------------------------------
# Off on CPU nodes, gloo and fewer than two GPUs


@pytest.mark.parametrize("backend,gpus,why", [
    ("gloo", node_gpus(8), "backend gloo"),
    (None, node_gpus(8), "backend unset"),
    ("nccl", [], "CPU node"),
    ("nccl", nvsmi.parse_query_gpu(fixture("query_gpu_none.txt")), "CPU node"),
    ("gloo", 0, "backend gloo"),
    ("nccl", nvsmi.parse_query_gpu(fixture("query_gpu_1.csv")), "only one GPU"),
    ("nccl", 1, "only one GPU"),
])
def test_off_with_a_reason(backend, gpus, why):
    applies, reason = gp.applies(backend, gpus)
    assert applies is False and why in reason
    summary, check = gp.inapplicable(NODE, reason)
    assert check["status"] == "not_applicable" and why in check["found"] and NODE in check["found"]
    assert summary["applies"] is False and summary["rounds_run"] == 0


@pytest.mark.parametrize("gpus", [node_gpus(2), node_gpus(8), 4])
def test_on_with_nccl_and_two_gpus_or_more(gpus):
    assert gp.applies("nccl", gpus)[0] is True


def test_fewer_than_two_gpus_plan_nothing_and_conclude_not_applicable():
    one = nvsmi.parse_query_gpu(fixture("query_gpu_1.csv"))
    assert gp.plan_round(1, one, [], base_args(), PORT, FLOOR) == {"round": 1, "launches": [], "slots": []}
    summary, check = gp.conclude(NODE, one, [], FLOOR, "test")
    assert check["status"] == "not_applicable" and "only one GPU" in check["found"] and summary["applies"] is False


# --------------------------------------------------------------------------
# One bad GPU among 8 (and 3-7), named by index and bus id within three rounds


@pytest.mark.parametrize("bad", range(8))
def test_one_bad_gpu_among_8_is_named_with_index_and_bus_id(bad):
    gpus = node_gpus(8)
    summary, check, plans = localise(gpus, {"bad": {bad}})
    assert summary["bad"] == [bad] and summary["bad_gpus"] == [gpus[bad]]
    assert summary["good"] == [index for index in range(8) if index != bad] and summary["unproven"] == []
    assert len(plans) <= 3 and summary["rounds_run"] == len(plans) == 2
    assert check["status"] == "fail" and status(check) == "fail"
    found = check["found"]
    assert "GPU %d (PCI %s, NVIDIA H100 80GB HBM3, %s)" % (bad, H100_BUS[bad], gpus[bad]["uuid"]) in found
    # What each of its launches measured, with the failing rank put on its GPU.
    assert "failed: rank" in found and "rank %d on GPU %d" % (0 if bad % 2 == 0 else 1, bad) in found
    assert "in round 2" in found and "Xid 79" in found
    fix = check["fix"]
    assert fix.startswith("drain %s" % NODE) and "nvidia-smi -q -i %s" % H100_BUS[bad] in fix
    assert "xid" in fix.lower() and "reseat/replace" in fix
    others = ",".join(str(index) for index in range(8) if index != bad)
    assert "CUDA_VISIBLE_DEVICES=%s" % others in fix and summary["cuda_visible_devices_without_bad"] == others
    assert check["expected"] == gp.EXPECTED
    assert [item["round"] for item in summary["rounds"]] == [1, 2]


@pytest.mark.parametrize("count,bad", [(count, bad) for count in (3, 4, 5, 6, 7) for bad in range(count)])
def test_one_bad_gpu_among_3_to_7_is_named_in_at_most_three_rounds(count, bad):
    gpus = node_gpus(count)
    summary, check, plans = localise(gpus, {"bad": {bad}})
    assert summary["bad"] == [bad] and len(plans) <= 3
    assert summary["good"] == [index for index in range(count) if index != bad]
    assert "GPU %d (PCI %s" % (bad, H100_BUS[bad]) in check["found"]


def test_one_bad_gpu_on_the_recorded_4_gpu_node():
    gpus = nvsmi.parse_query_gpu(fixture("query_gpu_4.csv"))
    summary, check, _plans = localise(gpus, {"bad": {2}})
    assert summary["bad"] == [2]
    assert "GPU 2 (PCI 00000000:81:00.0, NVIDIA A100-SXM4-40GB, GPU-d1784030-35c9-48c4-a68d-c8f46a423cf9)" \
        in check["found"]


def test_round_two_retests_each_suspect_with_a_good_gpu_it_was_not_paired_with():
    gpus = node_gpus(8)
    _summary, _check, plans = localise(gpus, {"bad": {5}})
    assert [launch["gpus"] for launch in plans[0]["launches"]] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    second = [launch["gpus"] for launch in plans[1]["launches"]]
    # 4 and 5 are the suspects; each with a GPU proven good in round 1, the nearest by index, a different one.
    assert second == [[3, 4], [6, 5]]
    first_pairs = {frozenset(pair) for pair in ([0, 1], [2, 3], [4, 5], [6, 7])}
    assert not {frozenset(pair) for pair in second} & first_pairs


def test_an_odd_gpu_is_tested_in_round_two():
    gpus = node_gpus(5)
    summary, _check, plans = localise(gpus, {})
    assert [launch["gpus"] for launch in plans[0]["launches"]] == [[0, 1], [2, 3]]
    assert [launch["gpus"] for launch in plans[1]["launches"]] == [[3, 4]]
    assert summary["good"] == [0, 1, 2, 3, 4] and len(plans) == 2


def test_three_gpus_with_the_first_bad_name_it_by_two_good_partners():
    # Round 1: 0+1 fails, 2 untested; no GPU is proven yet, so round 2 pairs them anew: 0+2 fails, 1+2 passes.
    summary, check, plans = localise(node_gpus(3), {"bad": {0}})
    assert [launch["gpus"] for launch in plans[1]["launches"]] == [[0, 2], [1, 2]]
    assert summary["bad"] == [0] and summary["good"] == [1, 2] and len(plans) == 2
    assert check["status"] == "fail"


# --------------------------------------------------------------------------
# Slow GPUs and floors


@pytest.mark.parametrize("slow", [0, 3, 6, 7])
def test_slow_gpu_is_named_by_the_relative_floor(slow):
    summary, check, plans = localise(node_gpus(8), {"slow": slow}, floor={"absolute": 0, "relative": 0.7})
    assert summary["bad"] == [slow] and summary["slow"] == [slow] and len(plans) <= 3
    found = check["found"]
    assert "GPU %d (PCI %s" % (slow, H100_BUS[slow]) in found and "is slow" in found
    assert "median pair" in found and "40.0000 GB/s" in found
    assert "nvidia-smi nvlink -s -i %s" % H100_BUS[slow] in check["fix"]


def test_slow_gpu_is_named_by_the_absolute_floor():
    summary, check, _plans = localise(node_gpus(4), {"slow": 1}, floor={"absolute": 100.0, "relative": 0})
    assert summary["bad"] == [1]
    assert "below the floor 100.0000 GB/s" in check["found"]


def test_floors_disabled_pass_a_slow_gpu():
    summary, check, plans = localise(node_gpus(8), {"slow": 2}, floor={"absolute": 0, "relative": 0})
    assert summary["bad"] == [] and summary["good"] == list(range(8)) and len(plans) == 1
    assert check["status"] == "pass"


# --------------------------------------------------------------------------
# Two bad GPUs, a whole bad node, soundness


@pytest.mark.parametrize("bad", list(itertools.combinations(range(8), 2)))
def test_two_bad_gpus_among_8_are_both_named(bad):
    gpus = node_gpus(8)
    summary, check, plans = localise(gpus, {"bad": set(bad)})
    assert summary["bad"] == list(bad) and len(plans) <= 3
    assert summary["good"] == [index for index in range(8) if index not in bad]
    for index in bad:
        assert "GPU %d (PCI %s" % (index, H100_BUS[index]) in check["found"]
        assert "nvidia-smi -q -i %s" % H100_BUS[index] in check["fix"]
    assert "CUDA_VISIBLE_DEVICES=%s" % ",".join(str(i) for i in range(8) if i not in bad) in check["fix"]


@pytest.mark.parametrize("bad", list(itertools.combinations(range(4), 2)))
def test_two_bad_gpus_among_4_are_named_in_at_most_three_rounds(bad):
    # Both round-1 pairs may fail (0+2 bad): round 2 pairs the suspects anew, round 3 retests them.
    summary, _check, plans = localise(node_gpus(4), {"bad": set(bad)})
    assert summary["bad"] == list(bad) and len(plans) <= 3
    assert summary["good"] == [index for index in range(4) if index not in bad]


def test_every_gpu_failing_names_none_and_blames_the_node():
    summary, check, plans = localise(node_gpus(8), {"bad": set(range(8))})
    assert summary["bad"] == [] and summary["good"] == [] and summary["unproven"] == list(range(8))
    assert check["status"] == "skipped" and status(check) == "unverified"
    assert "no pair of GPUs of %s passed" % NODE in check["found"] and "fabric manager" in check["found"]
    assert len(plans) == 3


@pytest.mark.parametrize("count", [4, 6, 8])
def test_no_guess_for_any_set_of_bad_gpus(count):
    """Over every set of bad GPUs: a GPU named bad is bad, a GPU proven good is good, the rest is blocked."""
    for size in range(count + 1):
        for bad in itertools.combinations(range(count), size):
            summary, check, plans = localise(node_gpus(count), {"bad": set(bad)})
            assert set(summary["bad"]) <= set(bad), bad
            assert not set(summary["good"]) & set(bad), bad
            assert sorted(summary["bad"] + summary["good"] + summary["unproven"]) == list(range(count))
            assert len(plans) <= 3
            if summary["bad"]:
                assert check["status"] == "fail"
            elif summary["unproven"]:
                assert status(check) == "unverified"
            else:
                assert check["status"] == "pass" and not bad


# --------------------------------------------------------------------------
# Two GPUs: a failing pair is blocked, never a guess


@pytest.mark.parametrize("fault,floor", [({"bad": {0}}, FLOOR), ({"bad": {1}}, FLOOR),
                                         ({"slow": 1}, {"absolute": 100.0, "relative": 0.7})])
def test_two_gpu_node_failing_cannot_tell_which(fault, floor):
    gpus = node_gpus(2)
    summary, check, plans = localise(gpus, fault, floor=floor)
    assert summary["bad"] == [] and summary["good"] == [] and summary["unproven"] == [0, 1]
    assert check["status"] == "skipped" and status(check) == "unverified" and not check["fix"]
    assert "cannot tell which of the two GPUs of %s is bad" % NODE in check["found"]
    assert H100_BUS[0] in check["found"] and H100_BUS[1] in check["found"]
    # Round 2 has nothing left to test: the only pair was tried.
    assert len(plans) == 1
    assert gp.plan_round(2, gpus, [gp.record(plans[0], [run_slot(a, fault) for a in plans[0]["slots"]])],
                         base_args(), PORT, floor)["launches"] == []


def test_two_gpu_node_healthy_passes():
    summary, check, plans = localise(node_gpus(2), {})
    assert check["status"] == "pass" and summary["good"] == [0, 1] and len(plans) == 1
    assert H100_BUS[0] in check["found"] and H100_BUS[1] in check["found"]


def test_healthy_node_ends_after_round_one():
    summary, check, plans = localise(node_gpus(8), {})
    assert len(plans) == 1 and summary["good"] == list(range(8)) and summary["bad"] == []
    assert check["status"] == "pass" and all(bus in check["found"] for bus in H100_BUS)


# --------------------------------------------------------------------------
# Slots: one 2-GPU launch each, its own port, the allreduce arguments


SCENARIOS = [{}, {"bad": {3}}, {"bad": {0, 5}}, {"slow": 6}, {"bad": set(range(8))}, {"bad": {1, 2, 7}}]


@pytest.mark.parametrize("fault", SCENARIOS)
@pytest.mark.parametrize("count", [2, 3, 5, 8])
def test_every_slot_is_one_two_gpu_launch_with_its_own_port(fault, count):
    _summary, _check, plans = localise(node_gpus(count), fault)
    ports = []
    for planned in plans:
        assert len(planned["slots"]) == len(planned["launches"]) > 0
        round_ports = [args["master_port"] for args in planned["slots"]]
        assert len(round_ports) == len(set(round_ports)), "two launches of a round on one port"
        ports.extend(round_ports)
        for slot, (launch, args) in enumerate(zip(planned["launches"], planned["slots"])):
            visible = [int(index) for index in args["env"]["CUDA_VISIBLE_DEVICES"].split(",")]
            assert len(visible) == 2 and len(set(visible)) == 2 and set(visible) <= set(range(count))
            assert visible == launch["gpus"] and launch["hosts"] == ["gpu%d" % index for index in visible]
            assert launch["slot"] == slot and launch["kind"] == "pair"
            assert launch["master_port"] == args["master_port"] != PORT
    assert len(ports) == len(set(ports)), "a port reused across rounds"


def test_slot_arguments_are_a_single_node_run_over_lo():
    base = base_args()
    planned = gp.plan_round(1, node_gpus(8), [], base, PORT, FLOOR)
    assert base == base_args(), "the node's arguments were changed in place"
    args = planned["slots"][1]
    assert set(args) == set(base)
    assert (args["nnodes"], args["node_rank"], args["nproc_per_node"]) == (1, 0, 2)
    assert (args["master_addr"], args["socket_ifname"], args["backend"]) == ("127.0.0.1", "lo", "nccl")
    assert (args["min_busbw_gbps"], args["selftest_fault"], args["selftest_rank"]) == (0, "none", -1)
    assert args["env"] == {"NCCL_IB_HCA": "mlx5", "CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                           "NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}
    assert args["python"] == base["python"] and args["hard_timeout"] == base["hard_timeout"]


def test_at_most_three_rounds():
    gpus = node_gpus(8)
    assert gp.plan_round(loc.MAX_ROUNDS + 1, gpus, [], base_args(), PORT, FLOOR)["launches"] == []


# --------------------------------------------------------------------------
# A slot without a result stops the localisation; it is the node's, not a GPU's


def test_a_slot_without_result_ends_the_rounds_and_blames_no_gpu():
    gpus = node_gpus(8)
    # GPU 4 is bad; the node stops answering in round 2's second slot.
    summary, check, plans = localise(gpus, {"bad": {4}, "lost_port": PORT + 1 + 5})
    assert len(plans) == 2 and summary["lost"] is True
    assert summary["bad"] == [4] and 5 in summary["unproven"]
    assert check["status"] == "fail" and "gave no result (node: unreachable while running" in check["found"]
    assert not gp.ambiguous(gpus, [gp.record(plans[0], [run_slot(a, {"bad": {4}}) for a in plans[0]["slots"]]),
                                   gp.record(plans[1], {})], FLOOR)


def test_record_takes_a_dict_by_slot_and_a_module_failure():
    planned = gp.plan_round(1, node_gpus(4), [], base_args(), PORT, FLOOR)
    recorded = gp.record(planned, {0: {"failed": True, "msg": "python: torch not importable"}})
    first, second = recorded["launches"]
    assert first["status"] == "lost" and "torch not importable" in first["reason"]
    assert second["status"] == "lost" and "no result came back" in second["reason"]
    ok = gp.record(planned, [run_slot(args, {}) for args in planned["slots"]])
    assert [launch["status"] for launch in ok["launches"]] == ["done", "done"]
    assert ok["launches"][0]["busbw_gbps"] == GOOD_BW and ok["launches"][0]["gpus"] == [0, 1]
