"""The engine choice (cluster_preflight/engine) and the srun engine's calls (cluster_preflight/engine/srun.py,
ranks.py): refused outside an allocation or for a node it does not hold; one register for every node read per
node; each call's nodes, arguments and step; a node's all-reduce result from its ranks' records; both engines'
playbooks covering the same node calls.  The steps run through a recording runner here; tests/multinode/
test_srun_engine_multinode.py runs them on the bed's real Slurm."""

import glob
import json
import os
import sys
import zlib

import pytest
import yaml

from cluster_preflight import engine
from cluster_preflight.plays import stage_results
from cluster_preflight.stages.view import ClusterView
from cluster_preflight.engine import allocation, archive, ranks, srun, step
from preflight_node.allreduce_run.gate_run import ARGUMENT_SPEC
from preflight_node.srun_task import node_args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ALLOC = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "gpu[01-03]"}
SRUN = {"preflight_engine": "srun", "preflight_srun_dir": "/run/cluster-preflight", "preflight_srun_archive": "",
        "preflight_srun_python": "/usr/bin/python3", "preflight_srun_args": []}


def test_srun_outside_an_allocation_is_refused_with_found_expected_and_fix():
    [problem] = engine.problems(SRUN, "gpu01", "srun", {})
    assert problem["name"] == "preflight_engine" and "outside a Slurm allocation" in problem["found"]
    assert "salloc" in problem["fix"] and "--engine srun" in problem["fix"] and "preflight_engine: ssh" in problem["fix"]


def test_srun_for_a_node_the_allocation_does_not_hold_is_refused_naming_it():
    assert engine.problems(SRUN, "gpu02", "srun", ALLOC) == []
    [problem] = engine.problems(SRUN, "gpu07", "srun", ALLOC)
    assert "gpu07 is not a node of allocation 42 (its nodes: gpu[01-03])" in problem["found"]
    assert allocation.allocation(ALLOC)["nodes"] == ["gpu01", "gpu02", "gpu03"]
    assert allocation.allocation({"SLURM_NODELIST": "a,b", "SLURM_JOB_ID": "1"})["nodes"] == ["a", "b"]


def test_one_engine_per_run_and_srun_settings_that_leave_the_steps_to_the_engine():
    assert engine.problems({"preflight_engine": "ssh"}, "n1", "ssh", {}) == []
    [mixed] = engine.problems({"preflight_engine": "ssh"}, "n2", "srun", {})
    assert mixed["found"] == "ssh on n2, srun on the first node of the run"
    bad = engine.problems(dict(SRUN, preflight_srun_args=["--nodelist=x", "--gpus-per-node=8", "oops"],
                               preflight_srun_python="python3"), "gpu01", "srun", ALLOC)
    assert sorted(item["found"] for item in bad) == ["--nodelist=x", "oops", "python3"]


@pytest.mark.parametrize("option", [
    "--exp=ALL", "--export=ALL", "--export-file=/tmp/env", "-lK", "--label", "-oout", "--output=/tmp/o", "-e/tmp/e",
    "--input=0", "-u", "-w", "n1", "-wn1", "--nodelist=n1", "-n4", "--ntasks=4", "--task-prolog=/tmp/x",
    "--task-epilog=/tmp/x", "--prolog=/tmp/x", "--chdir=/tmp", "--propagate=ALL", "--bcast", "--get-user-env",
    "--uid=0", "--container=/tmp/c", "--distribution=cyclic", "--quiet", "--verbose", "--gpus-per-node 8"])
def test_srun_args_that_would_change_the_protocol_the_tasks_or_their_environment_are_refused(option):
    """Only options that choose resources pass (each --name=value, or a flag of the list): anything else could
    export the controller's environment to root on every node, run a program of the controller's choosing there,
    or break how a line is bound to its task (abbreviations and bundled short options included)."""
    [bad] = engine.problems(dict(SRUN, preflight_srun_args=[option]), "gpu01", "srun", ALLOC)
    assert bad["name"] == "preflight_srun_args" and bad["found"] == option, bad
    assert "--gpus-per-node" in bad["expected"] and option in bad["fix"], bad


def test_srun_args_that_choose_resources_pass():
    good = ["--gpus-per-node=8", "--gres=gpu:8", "--partition=gpu", "--account=ops", "--qos=high",
            "--reservation=maint", "--constraint=h100", "--mem=0", "--cpus-per-task=4", "--exclusive",
            "--network=sn_all", "--switches=1", "--gpu-bind=closest", "--mem-per-gpu=8G", "--comment=preflight"]
    assert engine.problems(dict(SRUN, preflight_srun_args=good), "gpu01", "srun", ALLOC) == []


def test_a_register_of_every_node_is_read_once_per_node_and_each_node_gets_its_own():
    reads = []

    class Vars(dict):
        def get(self, key, default=None):
            reads.append(key)
            return dict.get(self, key, default)

    value = engine.by_node("facts", {"n1": {"facts": {"x": 1}}, "n2": {"unreachable": True, "msg": "gone"}})
    hostvars = {host: Vars({stage_results.FACTS: value}) for host in ("n1", "n2", "n3")}
    view = ClusterView({"ansible_play_hosts_all": ["n1", "n2", "n3"], "hostvars": hostvars})
    assert view.result("n1", stage_results.FACTS) == {"facts": {"x": 1}}
    assert view.outcome("n2", stage_results.FACTS) == ("unreachable", "gone")
    assert view.outcome("n3", stage_results.FACTS)[0] == "skipped"
    assert view.result("n1", stage_results.FACTS) == {"facts": {"x": 1}}
    # Each node's own part, read in place: one lookup per node, never the whole register copied for each.
    assert reads.count(stage_results.FACTS) == 3
    assert view.registered("n1", stage_results.FACTS) is value[engine.BY_NODE]["n1"]
    assert view.lost(["facts"]) == {"n2": "unreachable while reading its facts: gone"}


def _allreduce_module_keys():
    with open(os.path.join(ROOT, "roles", "allreduce", "vars", "main.yml"), encoding="utf-8") as handle:
        return set(yaml.safe_load(handle)["allreduce_module_args"])


def test_a_launch_plan_becomes_the_same_allreduce_options_as_the_ssh_engine_s():
    # ``job`` is the node's own settings (preflight_settings.job), not the launch plan's: both engines add it.
    assert set(srun.ALLREDUCE_KEYS) | {"worker_source", "job"} == _allreduce_module_keys()
    assert set(srun.ALLREDUCE_KEYS) <= set(ARGUMENT_SPEC) | {"lock"}
    params = srun.allreduce_params({"python": "/p", "nnodes": 2, "run_as": "alice", "socket_ifname": "eth0",
                                    "run_id": "", "wait_timeout": 9, "poll": 0.1}, "WORKER")
    assert params == {"python": "/p", "nnodes": 2, "socket_ifname": "eth0", "lock": {}, "worker_source": "WORKER",
                      "run_as": "alice"}


def _tasks(path):
    with open(path, encoding="utf-8") as handle:
        for item in yaml.safe_load(handle) or []:
            yield item
            yield from item.get("block") or []


def _registers(paths):
    return {task["register"] for path in paths for task in _tasks(path) if "register" in task}


def test_both_engines_register_every_node_call_and_srun_s_calls_are_the_playbook_s():
    ssh = _registers([os.path.join(ROOT, "playbooks", "tasks", "gate_ssh.yml")] +
                     glob.glob(os.path.join(ROOT, "roles", "*", "tasks", "*.yml")))
    srun_files = [os.path.join(ROOT, "playbooks", "tasks", name) for name in ("gate_srun.yml", "gate_srun_round.yml")]
    calls = {call.register for call in engine.NODE_CALLS}
    assert calls <= ssh
    # The srun engine collects the all-node run with the probes (one call): no register of its own for the launch.
    assert calls - {stage_results.ALLREDUCE_JOB} <= _registers(srun_files)
    pairs = {(task["preflight_srun"]["call"], task["register"]) for path in srun_files for task in _tasks(path)
             if "preflight_srun" in task}
    assert pairs == {(call.name, call.register) for call in engine.NODE_CALLS}
    assert set(srun.CALLS) == set(engine.BY_NAME)
    for path in srun_files:
        for task in _tasks(path):
            if "preflight_srun" in task:
                assert task.get("run_once") is True, task["name"]


def _launch_args(node_rank, nnodes=2, nproc=2):
    return {"python": "/venv/bin/python", "nnodes": nnodes, "node_rank": node_rank, "nproc_per_node": nproc,
            "master_addr": "198.18.0.1", "master_port": 6000, "backend": "gloo", "timeout": 30, "hard_timeout": 120,
            "stack_budget": 20, "sizes": [1024], "iters": 1, "warmup": 0, "min_busbw_gbps": 0, "role": "n%d" % node_rank,
            "env": {}, "keep_scratch": False, "selftest_fault": "none", "selftest_rank": -1, "wait_timeout": 200}


def _record(rank, local, status="ok", rc=0):
    entry = {"rank": rank, "local_rank": local, "stage": "done" if status == "ok" else "init", "status": status,
             "correct": status == "ok", "correctness": None,
             "bandwidth": [{"size_bytes": 1024, "busbw_gbps": 1.5, "algbw_gbps": 1.0, "time_us": 1.0}],
             "versions": {"torch": "2.13.0"}, "error": None if status == "ok" else "RuntimeError: peer gone",
             "exitcode": rc, "pid": 10 + rank, "uid": 0}
    return {"rank": entry, "rank_log": {"rank": rank, "local_rank": local, "stream": "stdout", "attempt": 0,
                                        "name": "rank%d.stdout.log" % rank, "bytes": 3, "truncated": False,
                                        "text": "hi\n"},
            "log": "hi\nthere\n", "rc": rc, "timed_out": False, "elapsed": 2.5, "stack_seconds": 0.0, "world_size": 4,
            "hostname": "n1", "argv": ["/venv/bin/python", "w.py"], "py_spy_refused": [], "py_spy": None,
            "run_as": {"name": "root", "uid": 0}}


def test_a_node_s_all_reduce_result_is_built_from_its_ranks_records_as_the_module_s():
    result = ranks.node_result("n1", _launch_args(1), {0: _record(2, 0), 1: _record(3, 1)})
    assert [entry["rank"] for entry in result["ranks"]] == [2, 3]
    assert result["checks"]["ranks"]["status"] == "pass" and result["checks"]["bandwidth"]["status"] == "pass"
    assert result["log"].splitlines() == ["[n1:0]:hi", "[n1:0]:there", "[n1:1]:hi", "[n1:1]:there"]
    assert [item["name"] for item in result["rank_logs"]] == ["rank2.stdout.log", "rank3.stdout.log"]
    assert result["launcher"] == ranks.LAUNCHER and result["torchrun_rc"] == 0


def test_a_rank_without_a_record_is_missing_and_a_node_whose_ranks_all_were_lost_is_unreachable():
    lost = {"unreachable": True, "msg": "n1: no word from its task for 21 s"}
    result = ranks.node_result("n1", _launch_args(0), {0: _record(0, 0), 1: lost})
    missing = result["ranks"][1]
    assert missing["status"] == "missing" and "no word" in missing["error"] and "unreachable" in missing["error"]
    assert result["checks"]["ranks"]["status"] == "fail" and "srun (Slurm's tasks) exited" in \
        result["checks"]["ranks"]["found"]
    assert ranks.node_result("n1", _launch_args(0), {0: lost, 1: lost}) == dict(lost, changed=False)
    assert ranks.node_result("n1", _launch_args(0), {})["via"] == "to Slurm"
    refused = {"failed": True, "msg": "run_as bob: no such user on this node"}
    assert ranks.node_result("n1", _launch_args(0), {0: refused, 1: refused})["failed"]


class Recorder(object):
    """A step runner that records each step and answers from ``answer(call, node, local, args)``."""

    def __init__(self, answer):
        self.answer, self.steps = answer, []

    def __call__(self, argv, data, expected, bound, env=None):
        import json
        import zlib
        payload = json.loads(zlib.decompress(data))
        self.steps.append({"argv": argv, "payload": payload, "expected": expected, "bound": bound})
        results = {}
        for node, local in expected:
            args = dict(payload["common"], **payload["nodes"].get(node, {}))
            answer = self.answer(payload["call"], node, local, args)
            if answer is not None:
                results[(node, local)] = answer
        lost = {task: "no word from its task for 21 s" for task in expected if task not in results}
        return {"results": results, "damaged": {}, "lost": lost, "launch_failed": {}, "task_errors": {},
                "overdue": [], "rc": 0, "stderr": [], "other": [], "elapsed": 0.1}


def _view(hosts, **registered):
    settings = {"ok": True, "settings": {"preflight": dict(SRUN, preflight_srun_archive="/shared/node.pyz")},
                "read_args": {"nic_discovery": {}}, "job": {"user": "", "named": False, "python": "/p"},
                "selftest_error": "", "facts_timeout": 60, "probes_timeout": 120}
    hostvars = {host: dict({stage_results.SETTINGS: settings}, **{name: value for name, value in registered.items()})
                for host in hosts}
    return ClusterView({"ansible_play_hosts_all": hosts, "hostvars": hostvars})


def test_the_facts_call_is_one_step_of_every_node_with_its_readers_job_and_lock():
    inputs = {"ok": True, "lock": {"dir": "/run/cluster-preflight", "run_id": "ctl:1:2"}}
    view = _view(["n1", "n2"], **{stage_results.INPUTS: inputs})
    runner = Recorder(lambda call, node, local, args: {"facts": {"node": node}, "errors": {}, "elapsed": {},
                                                       "job_user": {}, "args": args})
    value = srun.run_call("facts", view, environ=ALLOC, runner=runner)
    [one] = runner.steps
    # The operator's archive, run by the bootstrap only with this controller's node code's digest.
    assert one["argv"][-8:] == ["/usr/bin/python3", "-I", "-S", "-c", step.BOOTSTRAP, "/shared/node.pyz",
                                archive.build()[1], "facts"]
    assert one["payload"]["common"]["lock"] == inputs["lock"] and one["payload"]["nodes"] == {}
    assert value[engine.BY_NODE]["n2"]["facts"] == {"node": "n2"} and value["call"] == "facts"
    assert value[engine.BY_NODE]["n1"]["args"]["capabilities"] == {"nic_discovery": {}}


def test_the_all_node_run_starts_in_the_background_and_the_probes_call_collects_it(monkeypatch, tmp_path):
    gate = {"launch": True, "args_by_host": {"n1": _launch_args(0), "n2": _launch_args(1)}}
    launch = {"gate": gate, "reachable": ["n1", "n2"], "probes_lock": {"run_id": "r"}}
    plan = {"probe_args_by_host": {"n1": {"core_dumps": {"a": 1}, "fabric": {"b": 2}}, "n2": {"core_dumps": {"a": 1}}}}
    registered = {stage_results.PLAN: plan, stage_results.LAUNCH: launch,
                  stage_results.FACTS: {"facts": {}, "job_user": {"how": "named"}}}
    started = []

    def start(argv, data, directory, env=None):
        started.append((argv, json.loads(zlib.decompress(data))))
        return {"pid": 1, "start": "1", "dir": directory, "started": 1000.0, "proc": None}

    monkeypatch.setattr(srun.step, "start", start)
    value = srun.run_call("launch", _view(["n1", "n2"], **registered), environ=ALLOC)[engine.BY_NODE]
    [(argv, payload)] = started
    assert "--ntasks-per-node=2" in argv and argv[-1] == "rank" and payload["common"]["worker_source"]
    handle = value["n1"]["step"]
    assert value["n2"]["step"] == handle and handle["deadline"] == 1000.0 + srun.launch_bound(gate["args_by_host"])

    def collect(found_handle, expected, deadline):
        assert found_handle == handle and deadline == handle["deadline"]
        assert sorted(expected) == [("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1)]
        # n2's ranks fell silent: the node is unreachable, as one that stops answering over SSH mid-run.
        return {"results": {("n1", 0): _record(0, 0), ("n1", 1): _record(1, 1)}, "damaged": {},
                "lost": {("n2", 0): "no word", ("n2", 1): "no word"}, "launch_failed": {}, "task_errors": {},
                "overdue": [], "rc": None, "stderr": [], "other": [], "elapsed": 3.0}

    monkeypatch.setattr(srun.step, "collect", collect)
    runner = Recorder(lambda call, node, local, args: {"probes": {name: node for name in args["capabilities"]},
                                                       "errors": {}, "elapsed": {}})
    registered[stage_results.ALLREDUCE_JOB] = engine.by_node("launch", value)
    value = srun.run_call("probes", _view(["n1", "n2"], **registered), environ=ALLOC, runner=runner)[engine.BY_NODE]
    assert [sorted({node for node, _local in item["expected"]}) for item in runner.steps] == [["n1", "n2"], ["n1"]]
    early, late = runner.steps
    assert node_args(early["payload"], "n1")["capabilities"] == {"core_dumps": {"a": 1}}
    assert node_args(late["payload"], "n1")["capabilities"] == {"fabric": {"b": 2}}
    assert early["payload"]["common"]["job"]["resolved"] == {"how": "named"}
    assert value["n1"]["probes"] == {"core_dumps": "n1", "fabric": "n1"}
    assert value["n1"]["job"]["checks"]["ranks"]["status"] == "pass"
    assert value["n2"]["unreachable"] and "no word" in value["n2"]["msg"]


def test_the_confirmation_run_excludes_the_named_nodes_and_gpu_pairs_run_slot_by_slot():
    confirm = {"n1": _launch_args(0), "n3": _launch_args(1)}
    slots = {"n2": [dict(_launch_args(0, 1), env={"CUDA_VISIBLE_DEVICES": "0,1"}),
                    dict(_launch_args(0, 1), env={"CUDA_VISIBLE_DEVICES": "2,3"})]}
    view = _view(["n1", "n2", "n3"], **{stage_results.LOCALIZE: {"confirm_args_by_host": confirm,
                                                              "gpu_slots_by_host": slots}})
    runner = Recorder(lambda call, node, local, args: _record(args["node_rank"] * 2 + local, local))
    srun.run_call("confirm", view, environ=ALLOC, runner=runner)
    assert "--exclude=n2" in runner.steps[0]["argv"] and "--nodelist=n[1,3]" in runner.steps[0]["argv"]
    runner.steps = []
    value = srun.run_call("localize_gpu", view, environ=ALLOC, runner=runner)[engine.BY_NODE]
    assert [item["payload"]["common"]["env"] for item in runner.steps] == [{"CUDA_VISIBLE_DEVICES": "0,1"},
                                                                          {"CUDA_VISIBLE_DEVICES": "2,3"}]
    assert len(value["n2"]["results"]) == 2


@pytest.mark.parametrize("why,kind", [("Communication connection failure", "unreachable"),
                                      ("No such file or directory", "failed")])
def test_a_node_sbcast_cannot_reach_is_unreachable_and_a_missing_directory_is_a_failure(why, kind, monkeypatch):
    view = _view(["n1", "n2"])
    view.settings["n1"]["preflight"]["preflight_srun_archive"] = ""

    class Done(object):
        returncode = 233
        stderr = "sbcast: error: REQUEST_FILE_BCAST(n2): %s\n" % why

    monkeypatch.setattr(srun.subprocess, "run", lambda argv, **kwargs: Done())
    found = srun.Srun(view, environ=ALLOC).send_archive(["n1", "n2"])
    assert list(found) == ["n2"] and found["n2"].get(kind)
    if kind == "failed":
        assert "preflight_srun_dir" in found["n2"]["msg"]


def test_a_node_slurm_could_not_reach_is_accounted_as_one_ssh_could_not_reach_in_slurm_s_words():
    from verdict_build_helpers import UNREACHABLE, build, every_capability_passes, gate, records
    lost = srun.unreachable("Slurm could not start its task on n2: Communication connection failure")
    verdict = build(["n1", "n2", "n3"], {"n1": records(), "n2": records(facts=lost), "n3": records(facts=UNREACHABLE)},
                    [{"checks_by_host": every_capability_passes(["n1"])}, gate()])
    assert verdict["unreachable_hosts"] == ["n2", "n3"] and verdict["failed_hosts"] == ["n2", "n3"]
    by_slurm, by_ssh = (verdict["nodes"][host]["checks"]["preflight.reachable"] for host in ("n2", "n3"))
    assert by_slurm["status"] == by_ssh["status"] == "fail"
    assert by_slurm["found"].startswith("n2 stopped answering to Slurm while reading its facts: Slurm could not")
    assert "slurmd" in by_slurm["fix"] and "scontrol show node n2" in by_slurm["fix"]
    assert by_ssh["found"].startswith("n3 stopped answering over SSH") and "sshd" in by_ssh["fix"]


def _settings_of_every_node(task_vars):
    """The settings pipeline (cluster_preflight/settings/pipeline.py) over every targeted node in one task."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from cluster_preflight.settings import pipeline
    loader = DataLoader()
    return pipeline.load(loader, Templar(loader), task_vars, {}, all_nodes=True)


class HostVars(dict):
    """What ``hostvars`` gives an action: each node's own variables, untemplated (``raw_get``)."""

    def raw_get(self, host):
        return self[host]


def test_settings_of_every_node_in_one_task_are_each_node_s_own(monkeypatch):
    """The srun engine loads every node's settings in one task: each node's own variables (not the first node's),
    one register for all, read per node; the same refusal per node as one task per node gives."""
    monkeypatch.setattr(os, "environ", dict(os.environ, **ALLOC))
    python = sys.executable
    own = {host: {"inventory_hostname": host, "preflight_engine": "srun", "preflight_training_python": python}
           for host in ("gpu01", "gpu02", "gpu07")}
    own["gpu02"]["allreduce_timeout"] = 45
    play = {"ansible_play_hosts_all": list(own), "groups": {"all": list(own), "cluster": list(own)},
            "hostvars": HostVars(own)}
    result = _settings_of_every_node(dict(play, **own["gpu01"]))
    view = ClusterView({"ansible_play_hosts_all": list(own), "hostvars": {host: {stage_results.SETTINGS: result}
                                                                            for host in own}})
    timeouts = {host: view.settings[host]["allreduce"]["allreduce_timeout"] for host in own}
    assert timeouts == {"gpu01": 30, "gpu02": 45, "gpu07": 30}
    assert [host for host in own if (view.result(host, stage_results.SETTINGS) or {}).get("ok")] == ["gpu01", "gpu02"]
    [problem] = view.result("gpu07", stage_results.SETTINGS)["errors"]
    assert "gpu07 is not a node of allocation 42" in problem["found"]


def test_gate_engine_is_the_preflight_engine_setting_and_only_the_gate_takes_it():
    from cluster_preflight.cli import main as cli
    args, passthrough = cli.parse_args(["gate", "--engine", "srun", "-e", "allreduce_timeout=20"])
    assert args.extravars == {"allreduce_timeout": "20", "preflight_engine": "srun"} and passthrough == []
    assert "preflight_engine" not in cli.parse_args(["gate"])[0].extravars
    with pytest.raises(cli.UsageError, match="invalid choice: 'mpi'"):
        cli.parse_args(["gate", "--engine", "mpi"])
    assert "--engine" in cli.parse_args(["healthcheck", "--engine", "srun"])[1]


def test_with_the_srun_engine_a_lease_waits_for_no_fork_batch():
    from cluster_preflight.stages.run_lock import lock_args

    class View(object):
        hosts, forks = ["n%d" % index for index in range(10)], 5
        settings = {host: {"preflight": {"preflight_engine": "srun"}, "allreduce": {}}
                    for host in ["n%d" % index for index in range(10)]}

    assert lock_args(View())["slack"] == 120
    View.settings = {host: {"preflight": {"preflight_engine": "ssh"}, "allreduce": {}} for host in View.hosts}
    assert lock_args(View())["slack"] > 120


def test_settings_of_every_node_are_rendered_and_checked_per_node_though_most_values_are_shared(monkeypatch):
    """Plain values are taken as they are and each distinct set of values is checked once, yet a template renders
    with each node's own variables and a bad value is only its node's error."""
    monkeypatch.setattr(os, "environ", dict(os.environ, **ALLOC))
    python = sys.executable
    own = {host: {"inventory_hostname": host, "preflight_engine": "srun", "preflight_training_python": python}
           for host in ("gpu01", "gpu02", "gpu03")}
    own["gpu01"]["preflight_master_port"] = 29611
    own["gpu03"]["allreduce_iters"] = "many"
    play = {"ansible_play_hosts_all": list(own), "groups": {"all": list(own), "cluster": list(own)},
            "hostvars": HostVars(own)}
    result = _settings_of_every_node(dict(play, **own["gpu01"]))
    view = ClusterView({"ansible_play_hosts_all": list(own), "hostvars": {host: {stage_results.SETTINGS: result}
                                                                            for host in own}})
    ports = {host: view.settings[host]["port_mesh"]["port_mesh_port"] for host in ("gpu01", "gpu02")}
    assert ports == {"gpu01": 29611, "gpu02": 6000}
    assert [host for host in own if view.result(host, stage_results.SETTINGS).get("ok")] == ["gpu01", "gpu02"]
    [problem] = view.result("gpu03", stage_results.SETTINGS)["errors"]
    assert problem["name"] == "allreduce_iters" and "many" in problem["found"]


def test_a_template_is_rendered_once_where_nodes_share_what_it_reads_and_again_where_they_differ():
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template
    from cluster_preflight.settings.pipeline import SettingsPipeline
    loader = DataLoader()
    action = SettingsPipeline(loader, Templar(loader))
    shared = {"groups": {"all": ["gpu01", "gpu02"]}, "names": [trust_as_template("{{ inventory_hostname }}")],
              "port": 6000, "port_text": trust_as_template("{{ port + 1 }}")}
    rendered = {}
    for host in ("gpu01", "gpu02"):
        variables = dict(shared, inventory_hostname=host)
        templar = action._templar.copy_with_new_env(available_variables=variables)
        rendered[host] = [action._rendered(templar, trust_as_template(text), variables) for text in (
            "{{ groups['all'] | length }}", "{{ port_text }}", "{{ inventory_hostname }}", "{{ names }}")]
    assert rendered == {"gpu01": [2, 6001, "gpu01", ["gpu01"]], "gpu02": [2, 6001, "gpu02", ["gpu02"]]}
    # The first two once for both nodes; the host's name once per node; a list that holds a template never kept.
    assert len(action._rendered_memo) == 4


@pytest.mark.parametrize("first, own, chosen, valid", [
    ({}, {}, "ssh", True),                                   # the role's default
    ({"preflight_engine": "srun"}, {}, "srun", True),       # the run's first node's, whichever node runs the task
    ({"preflight_engine": "slurm"}, {}, "ssh", False),      # refused: the run stops at its inputs
])
def test_the_engine_is_read_once_from_the_first_node_or_the_role_s_default(first, own, chosen, valid):
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from cluster_preflight.settings import pipeline
    loader = DataLoader()
    hosts = {"gpu01": dict(first, inventory_hostname="gpu01"), "gpu02": dict(own, inventory_hostname="gpu02")}
    for host in hosts:
        task_vars = dict(hosts[host], ansible_play_hosts_all=list(hosts), hostvars=HostVars(hosts))
        result = pipeline.load(loader, Templar(loader), task_vars, {}, engine_only=True)
        assert (result["engine"], result["valid"]) == (chosen, valid)
    assert engine.engine_of({"preflight_engine": "srun"}) == "srun"
