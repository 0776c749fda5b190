"""Slurm integration against real daemons: munged, slurmctld and one slurmd per namespace node
(tests/slurm_bed.py), one cluster shared by the whole file.

* scripts/slurm-drain drains a failed node with the ``preflight:`` reason, changes nothing when applied
  again, and resumes the node once it passes; a node an admin drained (``admin: disk``) is never
  resumed and its reason never overwritten.
* scripts/slurm-healthcheck (HealthCheckProgram) run inside a node as slurmd runs it: a failing node
  drains itself with the reason; once it passes, it resumes itself; an admin's drain stays.
* scripts/slurm-prolog: a failing node exits 1 with exactly one line on stderr, and never calls
  scontrol (the node is not drained by it); a passing node prints nothing; with a max age, a pass younger
  than that lets the next prolog exit 0 without running the checks, an older one runs them again.
* the health check records its runs in the node's run history, and its drain reason says since when.
* inside a ``salloc -N2`` allocation, SLURM_JOB_NODELIST names the allocation's nodes, srun runs on
  them, and ``-i inventory/slurm.yml`` (the seeds' recipe) has exactly them in ``cluster``.

A node is made to fail the way a site would break it: its preflight variables file
(/etc/preflight/node.yml, in the node's own /etc) names a training Python that does not exist.
"""

import json
import os
import re
import time

import pytest

from cluster_preflight.slurm import drain as preflight_slurm
from cluster_preflight.slurm import local as preflight_slurm_local
from preflight_node.host.proc import all_pids, cmdline_of
from slurm_bed import ROOT, slurm_fixture
from testbed import testbed_fixture
from verdict_helpers import verdict_report

pytestmark = pytest.mark.timeout(600)

NODES = 2
SCRIPTS = os.path.join(ROOT, "scripts")
LINE = re.compile(r"^preflight: (?P<node>\S+): (?P<check>[a-z_]+\.[a-z_0-9]+): (?P<found>.+) -- fix: (?P<fix>.+)$")
BAD_VARS = "preflight_training_python: /opt/no-such-venv/bin/python\n"
# Wall time of each script run, printed at the end (pytest -s): measured, never asserted.
TIMES = []


@pytest.fixture(scope="module")
def bed(request):
    return testbed_fixture(request, nodes=NODES)


@pytest.fixture(scope="module")
def slurm(request, bed):
    cluster = slurm_fixture(request, bed)
    yield cluster
    for name, seconds, rc in TIMES:
        print("slurm script wall time: %-40s %5.1f s (rc %d)" % (name, seconds, rc))


@pytest.fixture
def idle(slurm, bed):
    """Every node idle with no reason before and after the test (the test's drains are undone)."""
    yield slurm
    for node in bed.nodes:
        set_vars(bed, node, None)
        if slurm.node_state(node.name)["state"] != "IDLE":
            slurm.scontrol("update", "nodename=%s" % node.name, "state=resume")
        slurm.wait_state(node.name, lambda state: state["state"] == "IDLE")


def set_vars(bed, node, text):
    """Write (or remove, text None) the node's /etc/preflight/node.yml inside the node's own /etc."""
    if text is None:
        bed.run(node, ["rm", "-f", "/etc/preflight/node.yml"], check=True)
        return
    bed.run(node, ["mkdir", "-p", "/etc/preflight"], check=True)
    bed.run(node, ["tee", "/etc/preflight/node.yml"], input=text, check=True)


def node_script(slurm, node, script, tmp_path, extra_env=None):
    """Run scripts/<script> inside ``node`` the way slurmd does (SLURMD_NODENAME set, as root)."""
    env = slurm.env()
    env.update(SLURMD_NODENAME=node.name, PREFLIGHT_SLURM_RESULTS=str(tmp_path / ("results-" + node.name)))
    env.update(extra_env or {})
    started = time.monotonic()
    done = slurm.bed.run(node, [os.path.join(SCRIPTS, script)], timeout=90, env=env)
    TIMES.append(("%s on %s" % (script, node.name), time.monotonic() - started, done.returncode))
    return done


# The checks every node of a test verdict holds, and those a failed node adds.
PASSING = {"nic_discovery.link": {"status": "pass", "found": "eth0 is up", "expected": "up", "fix": ""}}
FAILING = {"allreduce.python": {"status": "fail", "found": "training Python /opt/x does not exist",
                                "expected": "an executable Python", "fix": "install the venv"}}


def verdict(path, **statuses):
    """A verdict file for ``statuses`` (node -> pass/fail); a failed node fails allreduce.python."""
    path.write_text(json.dumps(verdict_report(statuses, PASSING, FAILING)))
    return str(path)


def slurm_drain(slurm, path):
    done = slurm.run([os.path.join(SCRIPTS, "slurm-drain"), path], timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_failed_node_is_drained_with_the_tools_reason_and_resumed_after_it_passes(idle, bed, tmp_path):
    slurm, n1, n2 = idle, bed.nodes[0].name, bed.nodes[1].name
    out = slurm_drain(slurm, verdict(tmp_path / "fail.json", **{n1: "fail", n2: "pass"}))
    state = slurm.node_state(n1)
    assert "DRAIN" in state["state"]
    assert state["reason"] == "preflight: allreduce.python: training Python /opt/x does not exist"
    assert out.splitlines() == ["drain %s: %s" % (n1, state["reason"])]
    assert slurm.node_state(n2)["state"] == "IDLE"
    # Applied again: nothing to do, nothing run.
    assert slurm_drain(slurm, verdict(tmp_path / "fail.json", **{n1: "fail", n2: "pass"})) == ""
    out = slurm_drain(slurm, verdict(tmp_path / "pass.json", **{n1: "pass", n2: "pass"}))
    assert out.startswith("resume %s: healthy again" % n1)
    assert slurm.wait_state(n1, lambda s: s["state"] == "IDLE")["reason"] == ""
    assert slurm_drain(slurm, verdict(tmp_path / "pass.json", **{n1: "pass", n2: "pass"})) == ""


def test_an_admin_drained_node_is_never_resumed_nor_its_reason_overwritten(idle, bed, tmp_path):
    slurm, node = idle, bed.nodes[1]
    slurm.scontrol("update", "nodename=%s" % node.name, "state=drain", "reason=admin: disk")
    out = slurm_drain(slurm, verdict(tmp_path / "pass.json", **{node.name: "pass"}))
    assert "keep %s: healthy, but drained by someone else ('admin: disk')" % node.name in out
    out = slurm_drain(slurm, verdict(tmp_path / "fail.json", **{node.name: "fail"}))
    assert "keep %s: failed, but drained by someone else" % node.name in out
    # The health check passes on the node, and still leaves the admin's drain alone.
    done = node_script(slurm, node, "slurm-healthcheck", tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    state = slurm.node_state(node.name)
    assert "DRAIN" in state["state"] and state["reason"] == "admin: disk"


def test_healthcheck_mode_drains_its_node_on_failure_and_resumes_it_after_a_pass(idle, bed, tmp_path):
    slurm, node, other = idle, bed.nodes[0], bed.nodes[1]
    set_vars(bed, node, BAD_VARS)
    done = node_script(slurm, node, "slurm-healthcheck", tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    line = LINE.match(done.stderr.strip())
    assert line and line["node"] == node.name and "/opt/no-such-venv/bin/python" in line["found"], done.stderr
    state = slurm.node_state(node.name)
    assert "DRAIN" in state["state"]
    assert state["reason"].startswith("preflight: %s: " % line["check"]) and len(state["reason"]) <= 120
    assert slurm.node_state(other.name)["state"] == "IDLE", "a node's health check touches that node only"
    results = tmp_path / ("results-" + node.name)
    report = json.loads((results / "last.json").read_text())
    assert report["failed_hosts"] == [node.name]
    # The run is in the node's history, its first failing run: the reason is dated from it.
    assert " since %s" % preflight_slurm.since_text(report["finished"]) in state["reason"], state["reason"]
    # Read back from Slurm, the reason is the tool's own: the same report again changes nothing.
    since = preflight_slurm.history_since(str(results / "history.sqlite"))
    assert [item["action"] for item in preflight_slurm.plan(report, {node.name: state}, since)] == ["keep"]
    set_vars(bed, node, None)
    done = node_script(slurm, node, "slurm-healthcheck", tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert slurm.wait_state(node.name, lambda s: s["state"] == "IDLE")["reason"] == ""
    # Nothing of the runs stays behind but the last report and log, and the history of both (with the -wal
    # and -shm files SQLite leaves after a read-only reader of a WAL database).
    assert sorted(name for name in os.listdir(results) if name not in ("history.sqlite-wal", "history.sqlite-shm")) \
        == ["history.sqlite", "last.json", "last.log"]


def test_prolog_mode_exits_nonzero_with_one_line_and_never_calls_scontrol(idle, bed, tmp_path):
    slurm, node = idle, bed.nodes[1]
    # A scontrol first on PATH that records being called: the prolog must never call it.
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "scontrol").write_text("#!/bin/sh\necho called >> %s\nexit 1\n" % (tmp_path / "scontrol-called"))
    (stub / "scontrol").chmod(0o755)
    env = {"PATH": "%s:%s" % (stub, slurm.env()["PATH"]), "SLURM_JOB_ID": "42", "SLURM_JOB_USER": "root"}
    set_vars(bed, node, BAD_VARS)
    done = node_script(slurm, node, "slurm-prolog", tmp_path, env)
    assert done.returncode == 1 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    line = LINE.match(done.stderr.rstrip("\n"))
    assert line and line["node"] == node.name and line["check"].startswith("allreduce."), done.stderr
    assert not (tmp_path / "scontrol-called").exists()
    assert slurm.node_state(node.name)["state"] == "IDLE", "the prolog leaves draining to Slurm"
    set_vars(bed, node, None)
    done = node_script(slurm, node, "slurm-prolog", tmp_path, env)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    # Broken again, but the pass just now is younger than the max age: exit 0, the checks not run.
    set_vars(bed, node, BAD_VARS)
    done = node_script(slurm, node, "slurm-prolog", tmp_path, dict(env, PREFLIGHT_MAX_AGE="6h"))
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    # Older than the max age: the checks run and find the breakage.
    time.sleep(2)
    done = node_script(slurm, node, "slurm-prolog", tmp_path, dict(env, PREFLIGHT_MAX_AGE="1s"))
    assert done.returncode == 1 and LINE.match(done.stderr.rstrip("\n")), done.stderr
    assert not (tmp_path / "scontrol-called").exists()


def test_inside_an_allocation_the_nodelist_gives_the_inventory(idle, bed):
    slurm = idle
    names = [node.name for node in bed.nodes]
    done = slurm.run(["salloc", "-N2", "-t", "5", "--", "srun", "-N2", "hostname"], timeout=60)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == names
    # The seeds' recipe: inside `salloc -N2`, `-i inventory/slurm.yml` (SLURM_JOB_NODELIST) gives the nodes.
    done = slurm.run(["salloc", "-N2", "-t", "5", "--", "python", "-c",
                      "import json, os, subprocess, sys; "
                      "inv = subprocess.run(['ansible-inventory', '-i', 'inventory/slurm.yml', '--list'], "
                      "capture_output=True, text=True, check=True).stdout; "
                      "print(json.dumps({'nodelist': os.environ['SLURM_JOB_NODELIST'], 'inventory': json.loads(inv)}))"],
                     timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["nodelist"] == "%s[1-2]" % bed.hostname_prefix
    assert found["inventory"]["cluster"]["hosts"] == names


def test_the_gate_runs_on_the_allocation_and_its_verdict_drives_slurm(idle, bed, tmp_path):
    """The seeds' recipe end to end: ``salloc -N2 ansible-playbook preflight.yml -i <dir with slurm.yml>``;
    the verdict covers exactly the allocation, and scripts/slurm-drain then has nothing to change."""
    slurm, names = idle, [node.name for node in bed.nodes]
    inventory = tmp_path / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    hosts = bed.inventory()["all"]["children"]["cluster"]["hosts"]
    common = {key: value for key, value in hosts[names[0]].items() if key not in ("ansible_host", "preflight_node_addr")}
    (inventory / "group_vars" / "cluster.yml").write_text(json.dumps(common))
    # The controller does not resolve the bed's node names: compose their addresses, as the plugin documents.
    address = "%r[inventory_hostname]" % {node.name: node.address for node in bed.nodes}
    (inventory / "slurm.yml").write_text(json.dumps({
        "plugin": "slurm_nodes", "compose": {"ansible_host": address, "preflight_node_addr": address}}))
    results = tmp_path / "results"
    done = slurm.run(["salloc", "-N2", "-t", "15", "--", "ansible-playbook", "preflight.yml", "-i", str(inventory),
                      "-e", "preflight_results_dir=%s" % results], timeout=500, cwd=ROOT)
    verdict_file = results / "latest" / "verdict.json"
    assert verdict_file.exists(), done.stdout[-3000:] + done.stderr[-2000:]
    report = json.loads(verdict_file.read_text())
    assert report["hosts"] == names
    assert done.returncode == 0 and report["status"] == "pass", done.stdout[-3000:]
    assert slurm_drain(slurm, str(results / "latest")) == ""


# -- the slurm.conf of a slurmd started with -f, as Slurm's own clients would look for it ---------------

HEALTH_CHECK_LINES = "HealthCheckProgram=%s\nHealthCheckInterval=60\nHealthCheckNodeState=ANY\n"


def _health_checks_running():
    """Host pids of scripts/slurm-healthcheck runs (slurmd's, in the nodes' PID namespaces too)."""
    script = os.path.join(SCRIPTS, "slurm-healthcheck")
    return [pid for pid in all_pids() if script in cmdline_of(pid)]


def test_run_by_a_slurmd_started_with_f_the_health_check_finds_that_file(idle, bed, tmp_path):
    """slurmd -f <a file that is no default> runs scripts/slurm-healthcheck as HealthCheckProgram, with no
    arguments and no SLURM_CONF (its environment is SLURMD_NODENAME alone): the script takes slurmd's -f,
    drains its failing node, and by hand (no slurmd above it) --slurm-conf is the way to point it there."""
    slurm, node = idle, bed.nodes[0]
    assert slurm.conf not in [path for _source, path in preflight_slurm.CLIENT_DEFAULTS] and os.path.isfile(slurm.conf)
    set_vars(bed, node, BAD_VARS)
    # By hand, as slurmd's environment would be: no SLURM_CONF, no parent slurmd.
    bare = {"SLURMD_NODENAME": node.name, "PREFLIGHT_SLURM_RESULTS": str(tmp_path / "by-hand"),
            "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}
    script = os.path.join(SCRIPTS, "slurm-healthcheck")
    if not any(os.path.exists(path) for _source, path in preflight_slurm.CLIENT_DEFAULTS):
        started = time.monotonic()
        done = bed.run(node, [script], timeout=90, env=bare)
        TIMES.append(("slurm-healthcheck (no conf) on %s" % node.name, time.monotonic() - started, done.returncode))
        assert done.returncode == 2, done.stderr
        print("\nno slurm.conf anywhere: %s" % done.stderr.strip())
        assert "no slurm.conf was found" in done.stderr and preflight_slurm.CONFIGLESS_LINK in done.stderr
        assert "--slurm-conf PATH" in done.stderr
    started = time.monotonic()
    done = bed.run(node, [script, "--slurm-conf", slurm.conf], timeout=90, env=bare)
    TIMES.append(("slurm-healthcheck --slurm-conf on %s" % node.name, time.monotonic() - started, done.returncode))
    assert done.returncode == 1, done.stderr
    print("\n--slurm-conf by hand: %s" % done.stderr.strip())
    assert slurm.node_state(node.name)["reason"].startswith("preflight: "), done.stderr
    assert "/opt/no-such-venv/bin/python" in slurm.node_state(node.name)["reason"], done.stderr
    slurm.scontrol("update", "nodename=%s" % node.name, "state=resume")
    slurm.wait_state(node.name, lambda state: state["state"] == "IDLE")
    # Run by the real slurmd: HealthCheckProgram added to the file slurmd was started with (-f).
    with open(slurm.conf, encoding="utf-8") as handle:
        original = handle.read()
    default_results = not os.path.exists(preflight_slurm_local.RESULTS_BASE)
    try:
        with open(slurm.conf, "a", encoding="utf-8") as handle:
            handle.write(HEALTH_CHECK_LINES % script)
        slurm.scontrol("reconfigure")
        started = time.monotonic()
        state = slurm.wait_state(node.name, lambda state: state["reason"].startswith("preflight: "), timeout=180)
        TIMES.append(("slurm-healthcheck by slurmd -f on %s" % node.name, time.monotonic() - started, 0))
        assert "DRAIN" in state["state"] and "/opt/no-such-venv/bin/python" in state["reason"], state
    finally:
        with open(slurm.conf, "w", encoding="utf-8") as handle:
            handle.write(original)
        slurm.scontrol("reconfigure")
        deadline = time.monotonic() + 90
        while _health_checks_running() and time.monotonic() < deadline:
            time.sleep(1)
        if default_results:
            import shutil
            shutil.rmtree(preflight_slurm_local.RESULTS_BASE, ignore_errors=True)
