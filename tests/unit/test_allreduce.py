"""Capability allreduce: the torch reader, readiness, the one launch plan, and the GPUs the reader
lists (the outcome from every node's ranks is in test_allreduce_outcome.py)."""

import os
import socket
import stat

import pytest

from cluster_preflight.capabilities import allreduce as ar
from preflight_node.capabilities import allreduce as node_ar
from fake_ops import LocalOps
from allreduce_helpers import VENV_PYTHON, facts_of, plan_for, settings


def fake_python(tmp_path, version="2.0.1", cuda="11.8"):
    """An executable that answers the probe like a Python with the given torch would."""
    script = tmp_path / "python"
    payload = ('{"python": "3.10.0", "executable": "%s", "torch": {"path": "/x/torch", "version": "%s", '
               '"cuda": %s, "hip": null}}' % (script, version, '"%s"' % cuda if cuda else "null"))
    script.write_text("#!/bin/sh\necho '%s'\n" % payload)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def read(tmp_path, python=VENV_PYTHON, port=None, **overrides):
    args = ar.read_args(settings(allreduce_python=python, **overrides), {"name": "n1"})
    args.update(dev_root=str(tmp_path), sysfs_root=str(tmp_path))
    if port:
        args["master_port"] = port
    return node_ar.read(args, LocalOps())


# -- settings -----------------------------------------------------------------

@pytest.mark.parametrize("overrides, name", [
    ({"allreduce_master_port": 70000}, "allreduce_master_port"),
    ({"allreduce_timeout": 200.0}, "allreduce_timeout"),
    ({"allreduce_sizes": []}, "allreduce_sizes"),
    ({"allreduce_iters": 0}, "allreduce_iters"),
    ({"allreduce_python": ""}, "allreduce_python"),
    ({"allreduce_env": {"NCCL DEBUG": "INFO"}}, "allreduce_env"),
    ({"allreduce_stack_budget": 0.0}, "allreduce_stack_budget"),
    ({"allreduce_floor_busbw_gbps_gloo": -1.0}, "allreduce_floor_busbw_gbps_gloo"),
    ({"allreduce_floor_relative": 1.5}, "allreduce_floor_relative"),
])
def test_validate_names_the_bad_setting_with_a_fix(overrides, name):
    problems = ar.validate(settings(**overrides))
    assert [item["name"] for item in problems] == [name]
    assert problems[0]["fix"] and problems[0]["expected"]


def test_validate_accepts_the_defaults():
    assert ar.validate(settings()) == []


# -- reader and readiness -------------------------------------------------------

def test_venv_python_with_torch_is_ready(tmp_path):
    facts = read(tmp_path)
    assert facts["torch"]["version"].startswith("2.13")
    assert facts["backend"] == "gloo" and facts["nproc_per_node"] == 2
    checks, ready = ar.readiness("n1", facts, settings())
    assert ready and {name: c["status"] for name, c in checks.items()} == {
        "job_user": "pass", "python": "pass", "torch": "pass", "accelerator_build": "pass"}


@pytest.mark.parametrize("job, status, ready, words", [
    ({"name": "alice", "uid": 1001, "run_as": "alice", "how": "named", "note": ""}, "pass", True, "alice (uid 1001)"),
    ({"name": "bob", "uid": 1002, "run_as": None, "how": "connecting", "note": ""}, "pass", True, "connecting user"),
    ({"name": "nobody", "uid": 65534, "run_as": "nobody", "how": "auto", "note": ""}, "warn", True,
     "no job user named"),
    # Root runs job code only when asked: with no account for it, nothing ran (the gate's setting: unverified).
    ({"name": "root", "uid": 0, "run_as": None, "how": "unavailable", "note": "nobody cannot use the training Python"},
     "skipped", False, "no job user named for n1"),
    ({"name": "root", "uid": 0, "run_as": None, "how": "named", "note": ""}, "warn", True,
     "as preflight_job_user: root asks"),
    ({"name": "carol", "uid": None, "run_as": None, "how": "missing", "note": "no account"}, "fail", False,
     "does not exist"),
    # Switching users needs root: a requirement of the check, never a fault of the node (blocked, unverified).
    ({"name": "dave", "uid": 1003, "run_as": None, "how": "cannot_switch", "note": "no root"}, "skipped", True,
     "needs root: job user dave wanted on n1"),
    (None, "fail", False, "did not say"),
])
def test_the_job_user_check_says_who_ran_job_side_code_and_warns_when_nobody_named_one(tmp_path, job, status,
                                                                                      ready, words):
    facts = dict(read(tmp_path), job_user=job)
    checks, is_ready = ar.readiness("n1", facts, settings())
    assert checks["job_user"]["status"] == status and words in checks["job_user"]["found"]
    assert is_ready is ready
    if status != "pass":
        fix = checks["job_user"]["fix"]
        assert "preflight_job_user" in fix or "n1" in fix or "preflight_become" in fix


def test_the_ranks_of_a_node_run_as_its_job_user():
    facts = {"nproc_per_node": 2, "backend": "gloo", "port": {"free": True, "detail": "free"},
             "job_user": {"name": "alice", "uid": 1001, "run_as": "alice", "how": "named"}}
    nodes = {"n1": {"name": "n1", "node_addr": "198.18.0.1"}}
    plan = ar.launch_plan(["n1"], ["n1"], {}, {"n1": facts}, {"n1": settings()}, nodes, {})
    assert plan["args_by_host"]["n1"]["run_as"] == "alice"


def test_python_without_torch_is_not_ready_and_says_how_to_fix(tmp_path):
    facts = read(tmp_path, python="/usr/bin/python3")
    checks, ready = ar.readiness("n1", facts, settings())
    assert not ready
    assert checks["torch"]["status"] == "fail" and "no torch module in /usr/bin/python3 on n1" in checks["torch"]["found"]
    assert "preflight_training_python" in checks["torch"]["fix"]


def test_missing_python_is_a_finding_not_an_exception(tmp_path):
    facts = read(tmp_path, python=str(tmp_path / "nope"))
    checks, ready = ar.readiness("n1", facts, settings())
    assert not ready and checks["python"]["status"] == "fail" and "n1" in checks["python"]["found"]


def test_port_holder_is_named(tmp_path):
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        facts = read(tmp_path, port=port)
    assert facts["port"]["free"] is False
    assert "port %d" % port in facts["port"]["detail"] and "pid %d" % os.getpid() in facts["port"]["detail"]


def test_a_port_held_by_another_preflight_runs_store_says_so(tmp_path):
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel
    from preflight_node.host.lock import RUN_ENV  # pylint: disable=import-outside-toplevel
    code = ("import socket, sys, time\ns = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen(1)\n"
            "print(s.getsockname()[1], flush=True)\ntime.sleep(30)\n")
    store = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, **{RUN_ENV: "ctl:4242:77"}))
    try:
        port = int(store.stdout.readline())
        facts = read(tmp_path, port=port)
    finally:
        store.kill()
        store.wait()
    assert facts["port"]["free"] is False and facts["port"]["holder"]["run_id"] == "ctl:4242:77"
    assert "the rendezvous store of another preflight run (ctl:4242:77)" in facts["port"]["detail"]


def test_gpus_with_cpu_torch_fail_and_gpu_build_picks_nccl(tmp_path):
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        (tmp_path / name).write_text("")
    facts = read(tmp_path)
    assert facts["accelerators"]["nvidia"] == 2
    checks, ready = ar.readiness("n1", facts, settings())
    assert not ready and checks["accelerator_build"]["status"] == "fail"
    facts = read(tmp_path, python=fake_python(tmp_path, "2.3.0", "12.1"))
    checks, ready = ar.readiness("n1", facts, settings())
    assert ready and facts["backend"] == "nccl" and facts["nproc_per_node"] == 2


def test_amd_gpus_counted_from_kfd_topology(tmp_path):
    nodes = tmp_path / "class/kfd/kfd/topology/nodes"
    for index, simd in enumerate((0, 304, 304)):  # node 0 is the CPU
        (nodes / str(index)).mkdir(parents=True)
        (nodes / str(index) / "properties").write_text("cpu_cores_count 0\nsimd_count %d\n" % simd)
    assert read(tmp_path)["accelerators"]["amd"] == 2


def test_cuda_launch_blocking_known_hang(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    checks, ready = ar.readiness("n1", read(tmp_path, python=fake_python(tmp_path, "1.13.1", "11.7")), settings())
    assert not ready and "issue 750" in checks["cuda_launch_blocking"]["fix"]
    checks, _ = ar.readiness("n1", read(tmp_path, python=fake_python(tmp_path, "2.1.0", "12.1")), settings())
    assert "cuda_launch_blocking" not in checks


# -- the launch plan ----------------------------------------------------------

def test_plan_launches_every_ready_node_on_the_chosen_interface():
    plan = plan_for(["n1", "n2", "n3"])
    assert plan["launch"] and plan["ok"] and plan["world_size"] == 6
    assert plan["master"] == "n1" and plan["master_addr"] == "198.19.0.1"
    assert [plan["args_by_host"][h]["node_rank"] for h in ("n1", "n2", "n3")] == [0, 1, 2]
    assert plan["args_by_host"]["n2"]["socket_ifname"] == "fab0"
    assert plan["checks_by_host"]["n1"]["master_port"]["status"] == "pass"


def test_a_node_lost_before_the_launch_is_left_out_and_the_rest_still_run():
    plan = plan_for(["n1", "n2", "n3"], excluded={"n1": "unreachable while reading its facts"})
    assert plan["launch"] and plan["hosts"] == ["n2", "n3"] and plan["master"] == "n2"
    assert plan["world_size"] == 4 and plan["args_by_host"]["n3"]["nnodes"] == 2
    run = plan["checks_by_host"]["n1"]["run"]
    assert run["status"] == "skipped" and run["details"]["blocked"] and "unreachable" in run["found"]


def test_a_not_ready_node_is_left_out_without_a_run_check_of_its_own():
    plan = plan_for(["n1", "n2"], ready=["n2"])
    assert plan["hosts"] == ["n2"] and "n1" not in plan["checks_by_host"]


@pytest.mark.parametrize("facts, words", [
    ({"n1": facts_of(nproc=2), "n2": facts_of(nproc=1)}, "ranks per node differ"),
    ({"n1": facts_of(backend="gloo"), "n2": facts_of(backend="nccl")}, "backends differ"),
    ({"n1": facts_of(free=False), "n2": facts_of()}, "rendezvous port is taken on the master n1"),
])
def test_cluster_wide_blockers_stop_the_launch_and_block_every_node(facts, words):
    plan = plan_for(["n1", "n2"], facts=facts)
    assert not plan["launch"] and not plan["ok"] and words in plan["skip_reason"]
    for host in ("n1", "n2"):
        assert plan["checks_by_host"][host]["run"]["details"]["blocked"]


def test_earlier_blockers_stop_the_launch():
    plan = plan_for(["n1", "n2"], blockers=["no inter-node interface every node shares"])
    assert not plan["launch"] and "interface" in plan["skip_reason"]


# -- the GPUs the reader lists for the GPU pair rounds ----------------------------

def test_read_gpus_asks_nvidia_smi_only_on_a_node_with_two_nvidia_gpus():
    import os  # pylint: disable=import-outside-toplevel
    from fake_ops import FakeOps  # pylint: disable=import-outside-toplevel
    fixture = os.path.join(os.path.dirname(__file__), "fixtures", "nvidia_smi", "query_gpu_8.csv")
    with open(fixture, encoding="utf-8") as handle:
        listing = handle.read()
    smi = "/usr/bin/nvidia-smi"
    ops = FakeOps(programs={"nvidia-smi": smi}, commands={(smi,): (0, listing, "")})
    gpus, problem = node_ar.read_gpus({"nvidia": 8, "amd": 0}, ops)
    assert problem is None and len(gpus) == 8 and gpus[5]["bus_id"] == "00000000:AB:00.0"
    assert ops.calls == [[smi, "--query-gpu=index,pci.bus_id,uuid,name", "--format=csv,noheader"]]
    # A CPU node (or one GPU): nothing is run.
    cpu = FakeOps(programs={"nvidia-smi": smi}, commands={(smi,): (0, listing, "")})
    assert node_ar.read_gpus({"nvidia": 0, "amd": 0}, cpu) == ([], None) and cpu.calls == []
    # What a node may lack is a fact, never an exception.
    assert node_ar.read_gpus({"nvidia": 2, "amd": 0}, FakeOps()) == ([], "nvidia-smi is not on PATH")
    broken = FakeOps(programs={"nvidia-smi": smi}, commands={(smi,): (9, "", "NVIDIA-SMI has failed")})
    assert node_ar.read_gpus({"nvidia": 2, "amd": 0}, broken)[1] == "nvidia-smi exited 9: NVIDIA-SMI has failed"
    garbled = FakeOps(programs={"nvidia-smi": smi}, commands={(smi,): (0, "not a listing\n", "")})
    assert node_ar.read_gpus({"nvidia": 2, "amd": 0}, garbled)[1].startswith("unreadable nvidia-smi output")


@pytest.mark.parametrize("rc, seconds, earlier", [(124, 20, False), (125, 30.0, True)])
def test_a_hung_training_python_is_one_failure_naming_it_and_the_fix(tmp_path, rc, seconds, earlier):
    from fake_ops import FakeOps

    ops = FakeOps(commands={("/venv/bin/python",): (rc, "", "killed")})
    if earlier:  # it hung as nobody while the job user was chosen, earlier in this node call
        ops.hangs = {"/venv/bin/python": {"program": "/venv/bin/python", "seconds": 30.0, "user": "nobody"}}
    args = ar.read_args(settings(allreduce_python="/venv/bin/python"), {"name": "n1"})
    args.update(dev_root=str(tmp_path), sysfs_root=str(tmp_path))
    facts = node_ar.read(args, ops)
    assert facts["python_hang"] == {"seconds": seconds, "user": "nobody" if earlier else "trainer", "earlier": earlier}
    checks, ready = ar.readiness("n1", facts, settings())
    assert not ready and checks["python"]["status"] == "fail" and "torch" not in checks
    assert "/venv/bin/python on n1 hung: no answer in %g s" % seconds in checks["python"]["found"]
    assert "py-spy dump" in checks["python"]["fix"]


def test_the_launch_carries_one_floor_its_arguments_and_the_localisation_use():
    """The floor is built once, from the master's settings: the launch plan carries it (the localisation rounds read
    it from there), every node's bandwidth deadline and grace come from it."""
    from localize_helpers import RUN_FLOOR  # pylint: disable=import-outside-toplevel
    hosts = ["n1", "n2"]
    plan = plan_for(hosts, settings_by_host={"n1": settings(allreduce_slow_grace=4),
                                             "n2": settings(allreduce_slow_grace=99)})
    assert plan["floor"] == {"absolute": 0.01, "relative": 0.7, "grace": 4.0} == dict(RUN_FLOOR, grace=4.0)
    assert {args["bandwidth_grace"] for args in plan["args_by_host"].values()} == {4.0}
    deadlines = {args["bandwidth_deadline"] for args in plan["args_by_host"].values()}
    assert deadlines == {ar.run_deadline(plan["args_by_host"]["n1"], plan["floor"], plan["world_size"])}
