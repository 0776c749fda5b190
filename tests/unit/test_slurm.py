"""cluster_preflight/slurm/drain.py: the drain reason, the prefix rule, what scontrol and sinfo print
(recorded from Slurm 22.05.8 here), the plan that applies a verdict, and scripts/slurm-drain against a
recording stand-in for scontrol and sinfo."""

import json
import os
import pwd
import subprocess
import sys

import pytest

from cluster_preflight.slurm import drain as ps
from cluster_preflight.slurm import local as psl
from verdict_helpers import verdict_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Recorded: `scontrol show node sltn1` after
# `scontrol update nodename=sltn1 state=drain "reason=preflight: allreduce.python: ... | pipe"`.
SHOW_DRAINED = """NodeName=sltn1 Arch=x86_64 CoresPerSocket=1 
   CPUAlloc=0 CPUEfctv=1 CPUTot=1 CPULoad=3.61
   AvailableFeatures=(null)
   ActiveFeatures=(null)
   Gres=(null)
   NodeAddr=127.0.0.1 NodeHostName=sltn1 Version=22.05.8
   OS=Linux 6.18.44-fc-v657 #1 SMP PREEMPT_DYNAMIC @0 
   RealMemory=1 AllocMem=0 FreeMem=20645 Sockets=1 Boards=1
   State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=debug 
   BootTime=2026-11-23T11:09:41 SlurmdStartTime=2026-11-23T15:23:29
   LastBusyTime=2026-11-23T15:23:35
   CfgTRES=cpu=1,mem=1M,billing=1
   AllocTRES=
   CapWatts=n/a
   CurrentWatts=0 AveWatts=0
   ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
   Reason=preflight: allreduce.python: training Python /x cannot run | pipe [root@2026-11-23T15:23:35]

"""
# Recorded: the same node idle (no Reason line), and a second node drained by an admin.
SHOW_TWO = """NodeName=sltn1 Arch=x86_64 CoresPerSocket=1 
   CPUAlloc=0 CPUEfctv=1 CPUTot=1 CPULoad=0.51
   NodeAddr=127.0.0.1 NodeHostName=sltn1 Version=22.05.8
   State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=debug 

NodeName=sltn2 Arch=x86_64 CoresPerSocket=1 
   NodeAddr=127.0.0.2 NodeHostName=sltn2 Version=22.05.8
   State=MIXED+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Reason=admin: disk [slurm@2026-11-23T15:23:40]

"""
# Recorded: `sinfo -h -N -o '%N|%T|%E'` (a node appears once per partition).
SINFO = """sltn1|drained|preflight: allreduce.python: training Python /x cannot run | pipe
sltn2|idle*|none
sltn3|draining|admin: disk
sltn3|draining|admin: disk
sltn4|mixed|none
"""


# The checks every node of a test verdict holds, and those a failed node adds.
PASSING = {"nic_discovery.link": {"status": "pass", "found": "eth0 up", "expected": "", "fix": ""}}
FAILING = {"allreduce.python": {"status": "fail", "found": "training Python /opt/x cannot run as nobody",
                                "expected": "an executable Python", "fix": "install it"},
           "kernel_debug.ptrace_scope": {"status": "fail", "found": "3", "expected": "0", "fix": "reboot"}}


def verdict(**statuses):
    """A report: node -> status; a failed node fails allreduce.python and kernel_debug.ptrace_scope."""
    return verdict_report(statuses, PASSING, FAILING)


# -- the reason -----------------------------------------------------------------------------------

def test_reason_names_the_tool_the_check_and_what_was_found():
    assert ps.drain_reason("allreduce.python", "no /opt/x") == "preflight: allreduce.python: no /opt/x"


def test_reason_is_one_line_and_counts_the_other_failures():
    reason = ps.drain_reason("core_dumps.core_probe", "no core\n\tafter  SIGSEGV", more=2)
    assert reason == "preflight: core_dumps.core_probe: no core after SIGSEGV (+2 more)"


@pytest.mark.parametrize("limit", [60, 80, 120])
def test_a_long_finding_is_cut_but_the_prefix_check_and_count_stay(limit):
    reason = ps.drain_reason("allreduce.python", "x" * 500, more=3, limit=limit)
    assert len(reason) <= limit
    assert reason.startswith("preflight: allreduce.python: xxx") and reason.endswith("... (+3 more)")


def test_a_check_name_too_long_for_the_limit_still_starts_with_the_prefix():
    reason = ps.drain_reason("a" * 200, "found", limit=50)
    assert len(reason) <= 50 and ps.owns(reason)


def test_the_reason_of_a_node_names_run_level_findings_first():
    result = verdict(n1="fail")["nodes"]["n1"]
    result["checks"]["preflight.reachable"] = {"status": "fail", "found": "n1 stopped answering over SSH",
                                               "expected": "", "fix": "check n1"}
    assert ps.node_reason(result) == "preflight: preflight.reachable: n1 stopped answering over SSH (+2 more)"


@pytest.mark.parametrize("reason, ours", [
    ("preflight: allreduce.python: no python", True),
    ("preflight:x", True),
    ("  preflight: leading blanks", True),
    ("admin: disk", False),
    ("Prolog error", False),
    ("Not responding", False),
    ("NHC: preflight: failed", False),
    ("Preflight: capitalised by a person", False),
    ("preflight failed (an admin's words)", False),
    ("", False),
    (None, False),
])
def test_only_reasons_with_the_prefix_are_the_tools(reason, ours):
    assert ps.owns(reason) is ours


@pytest.mark.parametrize("state, drained", [
    ("IDLE+DRAIN", True), ("MIXED+DRAIN", True), ("ALLOCATED+DRAIN", True), ("DOWN+DRAIN", True),
    ("drained", True), ("draining", True), ("drain", True), ("drained*", True), ("down*", True), ("DOWN", True),
    ("IDLE", False), ("idle*", False), ("mixed", False), ("allocated", False), ("", False), (None, False),
])
def test_drained_states(state, drained):
    assert ps.is_drained(state) is drained


# -- what Slurm prints ------------------------------------------------------------------------------

def test_scontrol_show_node_drained_reason_without_user_and_time():
    nodes = ps.parse_scontrol_nodes(SHOW_DRAINED)
    assert nodes == {"sltn1": {"state": "IDLE+DRAIN", "reason_user": "root",
                               "reason": "preflight: allreduce.python: training Python /x cannot run | pipe"}}


def test_scontrol_show_node_several_nodes_idle_has_no_reason():
    nodes = ps.parse_scontrol_nodes(SHOW_TWO)
    assert nodes["sltn1"] == {"state": "IDLE", "reason": "", "reason_user": ""}
    assert nodes["sltn2"] == {"state": "MIXED+DRAIN", "reason": "admin: disk", "reason_user": "slurm"}


def test_scontrol_reason_with_brackets_of_its_own():
    # Recorded: a reason cut inside "[Errno 2]" by the 120-character limit.
    text = ("NodeName=pfn1 Arch=x86_64 CoresPerSocket=1 \n   State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0\n"
            "   Reason=preflight: allreduce.python: training Python /opt/x on pfn1 cannot run as root: [Errn... "
            "(+1 more) [root@2026-11-23T15:44:02]\n")
    assert ps.parse_scontrol_nodes(text)["pfn1"] == {
        "state": "IDLE+DRAIN", "reason_user": "root",
        "reason": "preflight: allreduce.python: training Python /opt/x on pfn1 cannot run as root: [Errn... (+1 more)"}
    text = text.replace("[Errn... (+1 more) [root@2026-11-23T15:44:02]", "[Errno 2] no file [slurm@2026-11-23T15:44:02]")
    assert ps.parse_scontrol_nodes(text)["pfn1"]["reason"].endswith("[Errno 2] no file")


def test_scontrol_not_found_is_no_node():
    assert ps.parse_scontrol_nodes("Node nosuch not found\n") == {}


def test_sinfo_one_entry_per_node_reason_kept_whole():
    nodes = ps.parse_sinfo(SINFO)
    assert nodes == {
        "sltn1": {"state": "drained", "reason": "preflight: allreduce.python: training Python /x cannot run | pipe"},
        "sltn2": {"state": "idle*", "reason": ""},
        "sltn3": {"state": "draining", "reason": "admin: disk"},
        "sltn4": {"state": "mixed", "reason": ""},
    }


def test_sinfo_unexpected_line_is_named():
    with pytest.raises(ValueError, match="unexpected sinfo line"):
        ps.parse_sinfo("sltn1 idle\n")


def test_sinfo_argv_compresses_the_nodes_with_hostlist():
    assert ps.sinfo_argv(["gpu01", "gpu02", "gpu03", "cpu1"]) == [
        "sinfo", "-h", "-N", "-n", "cpu1,gpu[01-03]", "-o", "%N|%T|%E"]
    assert ps.expand_nodelist("gpu[01-02],cpu1") == ["gpu01", "gpu02", "cpu1"]


def test_scontrol_argv_are_lists_with_the_reason_one_argument():
    assert ps.drain_argv("gpu01", "preflight: a.b: x y") == [
        "scontrol", "update", "nodename=gpu01", "state=drain", "reason=preflight: a.b: x y"]
    assert ps.resume_argv("gpu01") == ["scontrol", "update", "nodename=gpu01", "state=resume"]


# -- the plan ----------------------------------------------------------------------------------------

def actions_of(report, current):
    return {item["node"]: item["action"] for item in ps.plan(report, current)}


def test_plan_drains_failed_resumes_own_keeps_admin_and_unverified():
    report = verdict(n1="fail", n2="pass", n3="pass", n4="warn", n5="unverified", n6="fail", n7="pass")
    current = {"n1": {"state": "idle", "reason": ""},
               "n2": {"state": "drained", "reason": "preflight: allreduce.python: old"},
               "n3": {"state": "drained", "reason": "admin: disk"},
               "n4": {"state": "IDLE+DRAIN", "reason": "preflight: core_dumps.core_probe: x"},
               "n5": {"state": "drained", "reason": "preflight: x.y: z"},
               "n6": {"state": "draining", "reason": "admin: disk"},
               "n7": {"state": "idle", "reason": ""}}
    assert actions_of(report, current) == {"n1": "drain", "n2": "resume", "n3": "keep", "n4": "resume",
                                           "n5": "keep", "n6": "keep", "n7": "keep"}


def test_plan_is_idempotent_and_updates_its_own_stale_reason():
    report = verdict(n1="fail")
    wanted = ps.node_reason(report["nodes"]["n1"])
    assert actions_of(report, {"n1": {"state": "drained", "reason": wanted}}) == {"n1": "keep"}
    assert actions_of(report, {"n1": {"state": "drained", "reason": "preflight: old: reason"}}) == {"n1": "drain"}


def test_plan_never_touches_a_node_slurm_does_not_know():
    items = ps.plan(verdict(ghost="fail"), {})
    assert items[0]["action"] == "keep" and "not a Slurm node" in items[0]["why"]


def test_reconcile_reads_slurm_then_runs_only_the_needed_updates():
    calls = []

    def runner(argv):
        calls.append(argv)
        if argv[0] == "sinfo":
            return 0, "n1|idle|none\nn2|drained|preflight: allreduce.python: old\nn3|drained|admin: disk\n", ""
        return 0, "", ""

    ps.reconcile(verdict(n1="fail", n2="pass", n3="pass"), runner=runner)
    assert calls[0][:5] == ["sinfo", "-h", "-N", "-n", "n[1-3]"]
    assert calls[1:] == [
        ["scontrol", "update", "nodename=n1", "state=drain",
         "reason=preflight: allreduce.python: training Python /opt/x cannot run as nobody (+1 more)"],
        ["scontrol", "update", "nodename=n2", "state=resume"]]


def test_one_node_is_read_with_scontrol_show_node():
    calls = []

    def runner(argv):
        calls.append(argv)
        return (0, SHOW_DRAINED, "") if argv[1] == "show" else (0, "", "")

    ps.reconcile(verdict(sltn1="pass"), runner=runner)
    assert calls == [["scontrol", "show", "node", "sltn1"], ["scontrol", "update", "nodename=sltn1", "state=resume"]]


def test_slurm_that_does_not_answer_is_an_error_naming_it():
    with pytest.raises(RuntimeError, match="sinfo failed"):
        ps.read_states(["a", "b"], runner=lambda argv: (1, "", "Unable to contact slurm controller"))


def test_failure_line_of_the_prolog_is_one_line_with_node_check_found_fix():
    result = verdict(n1="fail")["nodes"]["n1"]
    result["checks"]["allreduce.python"]["found"] = "training Python /opt/x\ncannot run"
    line = ps.failure_line("n1", result)
    assert "\n" not in line
    assert line == ("preflight: n1: allreduce.python: training Python /opt/x cannot run "
                    "(+1 more failing checks) -- fix: install it")
    assert ps.failure_line("n1", verdict(n1="pass")["nodes"]["n1"]) is None
    long = verdict(n1="fail")["nodes"]["n1"]
    long["checks"]["allreduce.python"].update(found="f" * 2000, fix="x" * 2000)
    assert len(ps.failure_line("n1", long)) <= ps.LINE_MAX


def test_node_inventory_is_this_node_over_the_local_connection():
    inventory = psl.node_inventory("gpu07", "/venv/bin/python", {"preflight_training_python": "/opt/t/python"})
    assert inventory == {"all": {"children": {"cluster": {"hosts": {"gpu07": {
        "ansible_connection": "local", "ansible_python_interpreter": "/venv/bin/python",
        "preflight_training_python": "/opt/t/python"}}}}}}
    # The checkout's own interpreter as the training Python: the hooks' own user is the job user, named.
    own = psl.node_inventory("gpu07", "/venv/bin/python", {"preflight_training_python": "/venv/bin/python"})
    hostvars = own["all"]["children"]["cluster"]["hosts"]["gpu07"]
    assert hostvars["preflight_job_user"] == pwd.getpwuid(os.geteuid()).pw_name
    named = psl.node_inventory("gpu07", "/venv/bin/python", {"preflight_training_python": "/venv/bin/python",
                                                             "preflight_job_user": "trainer"})
    assert named["all"]["children"]["cluster"]["hosts"]["gpu07"]["preflight_job_user"] == "trainer"


def test_node_name_from_slurmd_else_short_hostname():
    assert psl.local_node_name({"SLURMD_NODENAME": "gpu07"}) == "gpu07"
    assert "." not in psl.local_node_name({})


def test_node_vars_file(tmp_path):
    assert psl.load_node_vars(str(tmp_path / "none.yml")) == {}
    good = tmp_path / "node.yml"
    good.write_text("preflight_training_python: /opt/t/python\n")
    assert psl.load_node_vars(str(good)) == {"preflight_training_python": "/opt/t/python"}
    bad = tmp_path / "bad.yml"
    bad.write_text("- a list\n")
    with pytest.raises(ValueError, match="not a mapping"):
        psl.load_node_vars(str(bad))


# -- scripts/slurm-drain with a recording scontrol/sinfo ------------------------------------------

def fake_slurm(tmp_path, sinfo_out):
    """sinfo prints ``sinfo_out``; scontrol appends its argv (one JSON list a line) to calls.jsonl."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "sinfo.out").write_text(sinfo_out)
    record = ("#!%s\nimport json, sys\nopen(%r, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
              % (sys.executable, str(tmp_path / "calls.jsonl")))
    (bin_dir / "scontrol").write_text(record)
    (bin_dir / "sinfo").write_text("#!/bin/sh\ncat %s\n" % (tmp_path / "sinfo.out"))
    for name in ("scontrol", "sinfo"):
        (bin_dir / name).chmod(0o755)
    return str(bin_dir)


def drain_script(tmp_path, report, sinfo_out, *args):
    path = tmp_path / "verdict.json"
    path.write_text(json.dumps(report))
    env = dict(os.environ, PATH=fake_slurm(tmp_path, sinfo_out) + os.pathsep + os.environ["PATH"])
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "slurm-drain"), *args, str(path)],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    calls = tmp_path / "calls.jsonl"
    return done, [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def test_slurm_drain_applies_a_verdict(tmp_path):
    done, calls = drain_script(tmp_path, verdict(n1="fail", n2="pass", n3="pass"),
                               "n1|idle|none\nn2|drained|preflight: x.y: old\nn3|drained|admin: disk\n")
    assert done.returncode == 0, done.stderr
    assert calls == [["update", "nodename=n1", "state=drain",
                      "reason=preflight: allreduce.python: training Python /opt/x cannot run as nobody (+1 more)"],
                     ["update", "nodename=n2", "state=resume"]]
    assert "keep n3: healthy, but drained by someone else ('admin: disk')" in done.stdout


def test_slurm_drain_dry_run_runs_nothing(tmp_path):
    done, calls = drain_script(tmp_path, verdict(n1="fail", n2="pass"), "n1|idle|none\nn2|idle|none\n", "--dry-run")
    assert done.returncode == 0 and calls == []
    assert done.stdout.startswith("scontrol update nodename=n1 state=drain reason=preflight: allreduce.python:")


def test_slurm_drain_refuses_an_untrusted_verdict(tmp_path):
    report = verdict(n1="fail")
    del report["failed_hosts"]
    done, calls = drain_script(tmp_path, report, "n1|idle|none\n")
    assert done.returncode == 3 and calls == [] and done.stderr.startswith("UNKNOWN: ")


# -- which slurm.conf the scripts give scontrol and sinfo ------------------------------------------

def fake_proc(tmp_path, pid, argv, cwd=None):
    """A /proc/<pid> with ``argv`` as its command line (and ``cwd``)."""
    base = tmp_path / "proc" / str(pid)
    base.mkdir(parents=True)
    (base / "cmdline").write_bytes(b"\0".join(part.encode() for part in argv) + b"\0")
    if cwd:
        os.symlink(cwd, str(base / "cwd"))
    return str(tmp_path / "proc")


@pytest.mark.parametrize("argv, conf", [
    (["/usr/sbin/slurmd", "-D", "-f", "/srv/slurm/slurm.conf", "-N", "n1"], "/srv/slurm/slurm.conf"),
    (["slurmd", "-f/srv/a.conf"], "/srv/a.conf"),
    (["slurmd", "-Df", "/srv/b.conf"], "/srv/b.conf"),
    (["slurmd", "-Nfoo"], None),                       # -N takes the argument "foo": no -f in it
    (["slurmd", "-D", "--conf-server", "ctl:6817"], None),  # configless: its cache is looked at later
    (["/bin/bash", "-f", "/srv/c.conf"], None),         # not slurmd
])
def test_the_f_of_the_slurmd_that_started_the_script(tmp_path, argv, conf):
    assert ps.slurmd_conf_of(42, fake_proc(tmp_path, 42, argv)) == conf


def test_a_relative_f_is_slurmds_own_directory(tmp_path):
    assert ps.slurmd_conf_of(7, fake_proc(tmp_path, 7, ["slurmd", "-f", "etc/slurm.conf"], cwd="/srv")) == \
        "/srv/etc/slurm.conf"
    assert ps.slurmd_conf_of(8, str(tmp_path / "proc")) is None, "a process that is gone"


def conf_files(tmp_path, *names):
    paths = {}
    for name in names:
        path = tmp_path / name
        path.write_text("ClusterName=%s\n" % name)
        paths[name] = str(path)
    return paths


def test_the_option_then_slurm_conf_then_slurmds_f_then_slurms_own_places(tmp_path):
    files = conf_files(tmp_path, "option", "env", "slurmd", "default", "link", "spool")
    proc = fake_proc(tmp_path, 5, ["/usr/sbin/slurmd", "-D", "-f", files["slurmd"]])
    defaults = (("default", files["default"]), ("link", files["link"]), ("spool", files["spool"]))

    def where(option=None, env=None, parent=5, gone=()):
        for name in gone:
            os.unlink(files[name])
        found = ps.find_slurm_conf(option, {"SLURM_CONF": env} if env else {}, parent, proc, defaults)
        return found["path"], found["source"], found["error"]
    assert where(files["option"], files["env"]) == (files["option"], "--slurm-conf", None)
    assert where(None, files["env"]) == (files["env"], "SLURM_CONF", None)
    assert where()[0] == files["slurmd"] and "slurmd (pid 5)" in where()[1]
    assert where(parent=6) == (files["default"], "default", None), "a parent that is not slurmd"
    assert where(parent=6, gone=["default"]) == (files["link"], "link", None)
    assert where(parent=6, gone=["link"]) == (files["spool"], "spool", None)
    found = ps.find_slurm_conf(None, {}, 6, proc, defaults=(("default", str(tmp_path / "none")),))
    assert found["path"] is None and found["error"] is None
    words = ps.conf_words(found)
    assert "not set: --slurm-conf, SLURM_CONF, the -f of slurmd" in words and str(tmp_path / "none") in words
    assert "--slurm-conf PATH" in words and "ps -o args= -C slurmd" in words and "wrapper" in words


@pytest.mark.parametrize("option, env", [("missing", None), (None, "missing")])
def test_a_named_file_that_is_not_there_is_an_error_never_another_clusters_file(tmp_path, option, env):
    files = conf_files(tmp_path, "default")
    missing = str(tmp_path / "missing")
    found = ps.find_slurm_conf(missing if option else None, {"SLURM_CONF": missing} if env else {}, 1,
                               str(tmp_path), (("default", files["default"]),))
    assert found["path"] is None and "%s, which is not a file" % missing in found["error"]


def test_the_childs_environment_gets_slurm_conf_and_the_scripts_own_does_not(tmp_path, monkeypatch):
    seen = {}

    def fake_run(argv, timeout=10, env=None):
        seen.update(env)
        return 0, "", ""
    monkeypatch.setattr(ps, "run", fake_run)
    monkeypatch.setenv("SLURM_CONF", "/stale/slurm.conf")
    ps.slurm_runner({"path": "/srv/slurm.conf"})(["scontrol", "ping"])
    assert seen["SLURM_CONF"] == "/srv/slurm.conf" and os.environ["SLURM_CONF"] == "/stale/slurm.conf"
    seen.clear()
    ps.slurm_runner({"path": None})(["scontrol", "ping"])
    assert "SLURM_CONF" not in seen


def drain_with_conf(tmp_path, *args, env=None):
    """scripts/slurm-drain with a sinfo that records the SLURM_CONF it was given."""
    tmp_path = tmp_path / ("run%d" % len(os.listdir(str(tmp_path))))
    tmp_path.mkdir()
    bin_dir = fake_slurm(tmp_path, "n1|idle|none\n")
    (tmp_path / "bin" / "sinfo").write_text("#!/bin/sh\necho \"${SLURM_CONF-unset}\" > %s\ncat %s\n"
                                            % (tmp_path / "conf.seen", tmp_path / "sinfo.out"))
    path = tmp_path / "verdict.json"
    path.write_text(json.dumps(verdict(n1="pass", n2="pass")))
    environ = {key: value for key, value in os.environ.items() if key != "SLURM_CONF"}
    environ.update(env or {}, PATH=bin_dir + os.pathsep + os.environ["PATH"])
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "slurm-drain"), *args, str(path)],
                          capture_output=True, text=True, env=environ, timeout=60, check=False)
    seen = tmp_path / "conf.seen"
    return done, seen.read_text().strip() if seen.exists() else None


def test_slurm_drain_hands_its_slurm_conf_to_sinfo(tmp_path):
    conf = conf_files(tmp_path, "slurm.conf")["slurm.conf"]
    done, seen = drain_with_conf(tmp_path, "--slurm-conf", conf, env={"SLURM_CONF": "/elsewhere/slurm.conf"})
    assert done.returncode == 0 and seen == conf, done.stderr
    done, seen = drain_with_conf(tmp_path, env={"SLURM_CONF": conf})
    assert done.returncode == 0 and seen == conf, done.stderr


def test_slurm_drain_refuses_a_slurm_conf_that_is_not_there(tmp_path):
    done, seen = drain_with_conf(tmp_path, "--slurm-conf", str(tmp_path / "nope.conf"))
    assert done.returncode == 2 and seen is None
    assert "--slurm-conf names %s, which is not a file -- fix: pass --slurm-conf" % (tmp_path / "nope.conf") \
        in done.stderr


def test_the_health_check_stops_before_the_playbook_on_a_slurm_conf_that_is_not_there(tmp_path):
    import io
    err = io.StringIO()
    code = psl.local_main(["--node", "n1", "--vars", str(tmp_path / "none.yml"), "--results-dir", str(tmp_path),
                          "--slurm-conf", str(tmp_path / "nope.conf")], "healthcheck", ROOT, stderr=err)
    assert code == 2
    assert err.getvalue().startswith("preflight: n1: slurm: --slurm-conf names %s" % (tmp_path / "nope.conf"))
    assert os.listdir(str(tmp_path)) == [], "nothing was run"
