"""The verdict, continued from test_verdict.py: what the run directory may show and to whom,
task errors reduced to their message, the preflight_verdict action end to end, a results
directory that cannot take the run, and a node module that could not even start
(cluster_preflight/verdict/accounting.py, cluster_preflight/verdict/file.py, cluster_preflight/outputs/finish.py)."""

import errno
import json
import os
import stat
import subprocess

import pytest

from cluster_preflight import capabilities
from cluster_preflight.plays import stage_results
from cluster_preflight.verdict import accounting as pv
from capability_helpers import saved_umask
from verdict_build_helpers import UNREACHABLE, build, gate, passing_verdict, records, run_action

# -- what the run directory may show, and to whom ------------------------------------------------------

SECRET = "hunter2-s3cr3t-TOKEN"


def modes(root):
    """Mode of every directory and file under root (root included), symlinks left out."""
    found = {str(root): stat.S_IMODE(os.stat(str(root)).st_mode)}
    for directory, dirs, files in os.walk(str(root)):
        for name in dirs + files:
            full = os.path.join(directory, name)
            if not os.path.islink(full):
                found[full] = stat.S_IMODE(os.lstat(full).st_mode)
    return found


umask = pytest.fixture(saved_umask)


LOGS = {"n1": {"log": "[n1:0]: hello\n", "rank_logs": [{"rank": 0, "name": "rank0.stderr.log", "text": "r0"}],
               "ranks": [{"rank": 0, "pid": 7, "stack": "Thread 1 (idle)"}]}}


@pytest.mark.parametrize("mask", [0o000, 0o022, 0o077])
def test_the_run_directory_is_0750_and_its_files_0640_whatever_the_umask(tmp_path, umask, mask):
    umask(mask)
    results = tmp_path / "results"
    notes = pv.write_run_dir(passing_verdict(str(results / "r1")), LOGS, str(results), str(results / "r1"))
    pv.write_run_dir(passing_verdict(str(results / "r2")), {}, str(results), str(results / "r2"),
                     filename="bringup.json")
    assert notes == []
    found = modes(results)
    assert found.pop(str(results)) == 0o750, "a results directory the tool creates is 0750"
    assert {path: mode for path, mode in found.items() if os.path.isdir(path)} == {
        str(results / "r1"): 0o750, str(results / "r2"): 0o750}
    files = {os.path.relpath(path, str(results)): mode for path, mode in found.items() if not os.path.isdir(path)}
    assert files == {"r1/n1.log": 0o640, "r1/n1.rank0.stderr.log": 0o640, "r1/n1.stacks.txt": 0o640,
                     "r1/verdict.json": 0o640, "r2/bringup.json": 0o640}
    assert not any(mode & 0o007 for mode in modes(results).values()), "nothing under results/ for other users"


def test_the_same_run_id_again_is_tightened_too(tmp_path, umask):
    umask(0o000)
    (tmp_path / "r1").mkdir(mode=0o777)
    (tmp_path / "r1" / "n1.log").write_text("old")
    (tmp_path / "r1" / "n1.log").chmod(0o666)
    pv.write_run_dir(passing_verdict(str(tmp_path / "r1")), LOGS, str(tmp_path), str(tmp_path / "r1"))
    assert stat.S_IMODE((tmp_path / "r1").stat().st_mode) == 0o750
    assert stat.S_IMODE((tmp_path / "r1" / "n1.log").stat().st_mode) == 0o640


def test_a_symlink_in_place_of_the_run_directory_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "results").mkdir()
    os.symlink(str(elsewhere), str(tmp_path / "results" / "r1"))
    with pytest.raises(OSError, match="is a symlink"):
        pv.write_run_dir(passing_verdict("r1"), {}, str(tmp_path / "results"), str(tmp_path / "results" / "r1"))
    assert os.listdir(str(elsewhere)) == []


def test_an_existing_world_readable_results_dir_of_ours_loses_only_the_bits_for_others(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    results.chmod(0o775)  # shared with a group: that stays
    notes = pv.write_run_dir(passing_verdict("r1"), {}, str(results), str(results / "r1"))
    assert stat.S_IMODE(results.stat().st_mode) == 0o770
    assert len(notes) == 1 and "0775" in notes[0] and "0770" in notes[0]
    assert pv.write_run_dir(passing_verdict("r2"), {}, str(results), str(results / "r2")) == [], "said once"
    results.chmod(0o700)
    assert pv.write_run_dir(passing_verdict("r3"), {}, str(results), str(results / "r3")) == []
    assert stat.S_IMODE(results.stat().st_mode) == 0o700, "a tighter directory is left as it is"


def test_a_world_readable_results_dir_of_another_user_is_reported_not_changed(tmp_path, monkeypatch):
    results = tmp_path / "results"
    results.mkdir()
    results.chmod(0o755)
    monkeypatch.setattr(pv.os, "geteuid", lambda: os.stat(str(results)).st_uid + 4242)
    notes = pv.write_run_dir(passing_verdict("r1"), {}, str(results), str(results / "r1"))
    assert stat.S_IMODE(results.stat().st_mode) == 0o755
    assert len(notes) == 1 and "not by this user" in notes[0] and "chmod o-rwx" in notes[0]
    assert stat.S_IMODE((results / "r1").stat().st_mode) == 0o750


# -- task errors: the message, never the arguments -----------------------------------------------------

FAILED_WITH_SECRETS = {
    "failed": True, "rc": 2, "msg": "The task timed out after 60 seconds",
    "invocation": {"module_args": {"password": SECRET, "capabilities": {"x": SECRET}}},
    "env": {"API_TOKEN": SECRET}, "environment": {"API_TOKEN": SECRET},
    "stdout": "token=%s" % SECRET, "stdout_lines": [SECRET], "stderr": SECRET,
    "module_stdout": SECRET, "module_stderr": "Traceback ... %s" % SECRET,
}


def test_a_failed_task_is_reduced_to_its_message_rc_and_stage():
    verdict = build(["n1"], {"n1": records(facts=FAILED_WITH_SECRETS)}, [{"checks_by_host": {}}, gate("skipped")])
    text = json.dumps(verdict)
    assert SECRET not in text
    for name in ("invocation", "module_args", "API_TOKEN", "Traceback"):
        assert name not in text
    check = verdict["nodes"]["n1"]["checks"]["preflight.facts"]
    assert "while reading its facts" in check["found"] and "timed out after 60 seconds (rc 2)" in check["found"]


def test_a_failed_task_without_a_message_never_falls_back_to_its_output():
    result = {k: v for k, v in FAILED_WITH_SECRETS.items() if k != "msg"}
    verdict = build(["n1"], {"n1": records(probes=result)}, [{"checks_by_host": {}}, gate("skipped")])
    assert SECRET not in json.dumps(verdict)
    assert "failed (no message: see the play output) (rc 2)" in \
        verdict["nodes"]["n1"]["checks"]["preflight.probes"]["found"]


def test_a_censored_or_unreachable_result_gives_only_what_it_may():
    censored = {"failed": True, "censored": "the output has been hidden due to the fact that 'no_log: true' was "
                                            "specified for this result", "msg": SECRET}
    lost = dict(UNREACHABLE, invocation={"module_args": {"key": SECRET}})
    verdict = build(["n1", "n2"], {"n1": records(facts=censored), "n2": records(port_mesh=lost)},
                    [{"checks_by_host": {}}, gate("skipped")])
    assert SECRET not in json.dumps(verdict)
    assert "its output is hidden (no_log)" in verdict["nodes"]["n1"]["checks"]["preflight.facts"]["found"]
    assert "Connection timed out" in verdict["nodes"]["n2"]["checks"]["preflight.reachable"]["found"]


@pytest.mark.parametrize("record", [
    # A rescue that recorded the failed task's result itself.
    dict(FAILED_WITH_SECRETS, msg="No package matching 'pdsh' (no mirror)"),
    # A rescue whose message carries the task's result dumped whole (msg | default(ansible_failed_result)).
    "task 'Install': Found: the install failed: {'changed': False, 'msg': 'No package matching pdsh (no mirror)', "
    "'invocation': {'module_args': {'name': ['pdsh'], 'password': '%s'}}, 'env': {'T': '%s'}}" % (SECRET, SECRET),
    '{"stdout": "%s", "msg": "no mirror"}' % SECRET,
])
def test_a_bringup_record_keeps_the_message_and_drops_a_dumped_result(record):
    data = records()
    data["preflight_apply"] = {"debug_tools": record}
    verdict = pv.build_verdict(["n1"], {"n1": data}, [{"checks_by_host": {}}], capabilities.BRINGUP_NAMES,
                               ("settings", "facts", "apply"), "r", "/tmp/r", gate=False)
    assert SECRET not in json.dumps(verdict)
    found = verdict["nodes"]["n1"]["checks"]["debug_tools.error"]["found"]
    assert found.startswith("debug_tools could not be applied on n1: ")
    assert "no mirror" in found or "left out of the verdict" in found


# -- the action end to end: hostvars in, a private run directory without secrets out -------------------

def test_the_action_writes_a_private_bringup_report_without_secrets(tmp_path, umask):
    umask(0o000)
    hostvars = {"n1": records(facts=FAILED_WITH_SECRETS), "n2": records()}
    hostvars["n2"]["preflight_apply"] = {"iommu": dict(FAILED_WITH_SECRETS, msg="grub: Read-only file system")}
    result = run_action({"kind": "bringup", "results_dir": str(tmp_path / "results"), "run_id": "r1"}, hostvars)
    assert result["failed"] and result["verdict_file"] == str(tmp_path / "results" / "r1" / "bringup.json")
    text = open(result["verdict_file"]).read()
    assert SECRET not in text and SECRET not in json.dumps(result)
    assert "Read-only file system" in text and "timed out after 60 seconds" in text
    assert stat.S_IMODE(os.stat(result["verdict_file"]).st_mode) == 0o640
    assert stat.S_IMODE(os.stat(result["run_dir"]).st_mode) == 0o750
    assert stat.S_IMODE(os.stat(str(tmp_path / "results")).st_mode) == 0o750


@pytest.mark.parametrize("run_id", ["../elsewhere", "latest", ".hidden", "a/b"])
def test_the_action_refuses_a_run_id_that_is_not_a_directory_of_its_own(tmp_path, run_id):
    result = run_action({"kind": "bringup", "results_dir": str(tmp_path / "results"), "run_id": run_id},
                        {"n1": records()})
    assert result["failed"] and "Found run_id" in result["msg"] and "Fix:" in result["msg"]
    assert not (tmp_path / "results").exists() and not (tmp_path / "elsewhere").exists()


def test_the_action_reports_a_results_dir_it_cannot_write(tmp_path, monkeypatch):
    def refuse(*_args, **_kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(pv.os, "mkdir", refuse)
    result = run_action({"kind": "bringup", "results_dir": str(tmp_path / "results"), "run_id": "r1"},
                        {"n1": records()})
    assert result["failed"] and "could not be written" in result["msg"] and "Permission denied" in result["msg"]
    assert "Fix:" in result["msg"]


def test_cli_says_why_a_private_verdict_cannot_be_read(tmp_path, monkeypatch):
    from cluster_preflight.verdict import file as vf
    pv.write_run_dir(passing_verdict("r1"), {}, str(tmp_path), str(tmp_path / "r1"))

    def refuse(*_args, **_kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(vf, "open", refuse, raising=False)
    with pytest.raises(vf.VerdictError, match="0640: read it as the user that ran the preflight"):
        vf.load(str(tmp_path / "r1"))


def test_the_bound_counts_the_localisation_rounds_the_confirmation_run_and_every_gpu_pair_launch():
    from cluster_preflight.stages import bounds
    from cluster_preflight.stages.view import ClusterView
    view = ClusterView({"ansible_play_hosts_all": ["n1"], "hostvars": {"n1": {"preflight_settings": {
        "facts_timeout": 60, "probes_timeout": 120}}}})
    launch = {"gate": {"args_by_host": {"n1": {"wait_timeout": 200}}}}
    plain = bounds.run_bound(view, {}, launch)
    rounds = bounds.run_bound(view, {}, launch, {"needed": True, "localize": {}})
    per_launch = 200 + bounds.CONNECT_BOUND
    # Three rounds of two steps, and the confirmation run over the nodes left.
    assert rounds - plain == (bounds.MAX_ROUNDS * 2 + 1) * per_launch
    gpus = {"needed": True, "localize": {"gpus": {"n1": {"rounds": [{"launches": [{}] * 4}, {"launches": [{}] * 3}]},
                                                  "n2": {"rounds": [{"launches": [{}] * 2}]}}}}
    assert bounds.run_bound(view, {}, launch, gpus) - rounds == 7 * per_launch
    # The single-node runs before the all-node run: every node's at once, the longest counts.
    single = {"single": {"args_by_host": {"n1": {"wait_timeout": 90}, "n2": {"wait_timeout": 150}}}}
    assert bounds.run_bound(view, single, launch) - plain == 150 + bounds.CONNECT_BOUND


# -- a results directory that cannot take the run: the reason, and nothing half-written -----------------

@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 64 KiB tmpfs of its own (root only): a real full disk, and a real read-only one."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (%s): the errno tests below inject it instead" % done.stderr.strip())
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def earlier_run(results):
    """results/r0 written, latest -> r0: what a failed run must leave as it was."""
    pv.write_run_dir(passing_verdict(str(results / "r0")), {}, str(results), str(results / "r0"))
    assert os.readlink(str(results / "latest")) == "r0"
    return sorted(os.listdir(str(results)))


def fill(mount):
    with open(str(mount / "filler"), "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    assert os.statvfs(str(mount)).f_bavail == 0


def test_a_full_disk_says_so_and_leaves_no_run_directory_and_latest_where_it_was(tiny_tmpfs):
    results = tiny_tmpfs / "results"
    before = earlier_run(results)
    fill(tiny_tmpfs)
    with pytest.raises(OSError) as raised:
        pv.write_run_dir(passing_verdict(str(results / "r1")), LOGS, str(results), str(results / "r1"))
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(results / "r1" / "n1.log")
    assert sorted(os.listdir(str(results))) == before and os.readlink(str(results / "latest")) == "r0"

    hostvars = {"n1": records(), "n2": records()}
    result = run_action({"kind": "preflight", "results_dir": str(results), "run_id": "r2"}, hostvars)
    assert result["failed"] and result["verdict_status"] == "fail"
    assert "no space left on the device holding %s" % (results / "r2") not in result["msg"]
    assert "no space left on the device holding %s" % results in result["msg"]
    assert "preflight_results_dir" in result["fix"] and "df -h" in result["fix"] and "make" not in result["fix"]
    assert "verdict.json" not in result["msg"] and "verdict not written" in result["msg"]
    assert "nothing of this run was kept" in result["found"] and "verdict_file" not in result
    assert sorted(os.listdir(str(results))) == before and os.readlink(str(results / "latest")) == "r0"


def test_a_read_only_results_directory_says_read_only_and_changes_nothing(tiny_tmpfs):
    results = tiny_tmpfs / "results"
    before = earlier_run(results)
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_tmpfs)], check=True)
    result = run_action({"kind": "preflight", "results_dir": str(results), "run_id": "r1"},
                        {"n1": records(), "n2": records()})
    assert result["failed"] and "read-only file system (mounted at %s)" % tiny_tmpfs in result["found"]
    assert "writable file system" in result["fix"] and "verdict.json" not in result["msg"]
    assert sorted(os.listdir(str(results))) == before and os.readlink(str(results / "latest")) == "r0"


@pytest.mark.parametrize("code, found, fix", [
    (errno.ENOSPC, "no space left on the device holding", "free space on the file system mounted at"),
    (errno.EDQUOT, "disk quota", "quota -s"),
    (errno.EROFS, "read-only file system", "writable file system"),
    (errno.EACCES, "may not write", "writable by"),
    (errno.EPERM, "may not write", "writable by"),
    (errno.EIO, "could not be written: Input/output error", "fix what the error names"),
])
def test_each_write_error_gets_its_own_reason_and_removes_the_run_directory(tmp_path, monkeypatch, code, found, fix):
    results = tmp_path / "results"
    before = earlier_run(results)
    real_fsync = os.fsync

    def fail_on_the_verdict(fd):
        if os.readlink("/proc/self/fd/%d" % fd).startswith(str(results / "r1")):
            raise OSError(code, os.strerror(code))
        return real_fsync(fd)
    monkeypatch.setattr(pv.os, "fsync", fail_on_the_verdict)
    result = run_action({"kind": "preflight", "results_dir": str(results), "run_id": "r1"},
                        {"n1": records(), "n2": records()})
    assert result["failed"] and found in result["found"] and fix in result["fix"], result["msg"]
    assert result["expected"] and "preflight_results_dir" in result["fix"]
    assert "Found:" in result["msg"] and "Expected:" in result["msg"] and "Fix:" in result["msg"]
    assert "verdict.json" not in result["msg"]
    assert sorted(os.listdir(str(results))) == before and os.readlink(str(results / "latest")) == "r0"


def test_the_same_run_id_again_keeps_its_directory_when_the_write_fails(tmp_path, monkeypatch):
    results = tmp_path / "results"
    earlier_run(results)

    def full(_fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(pv.os, "fsync", full)
    with pytest.raises(OSError):
        pv.write_run_dir(passing_verdict(str(results / "r0")), {}, str(results), str(results / "r0"))
    assert json.loads((results / "r0" / "verdict.json").read_text())["status"] == "pass"
    assert not [name for name in os.listdir(str(results / "r0")) if name.startswith(".tmp-")]


def test_a_results_directory_created_for_a_failed_write_goes_too(tmp_path, monkeypatch):
    def full(_fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(pv.os, "fsync", full)
    with pytest.raises(OSError):
        pv.write_run_dir(passing_verdict("r1"), LOGS, str(tmp_path / "results"), str(tmp_path / "results" / "r1"))
    assert os.listdir(str(tmp_path)) == []


# -- a node module that could not even start: the node's own words and the fix for them ----------------

NOT_STARTED = {"failed": True, "rc": 126, "_ansible_parsed": False,
               "msg": "Module result deserialization failed: No start of json char found",
               "module_stdout": "", "module_stderr": "/bin/sh: 1: /root/.pyenv/versions/3.11.7/bin/python3.11: "
                                                     "Permission denied\n"}


def login_records(user="pfuser", **given):
    data = records(**given)
    data[stage_results.STAGE_REGISTERS["settings"]] = {"ok": True, "errors": [], "node": {"name": "n1", "user": user}}
    return data


def test_a_module_the_login_cannot_execute_says_permission_denied_and_names_the_interpreter():
    verdict = build(["n1"], {"n1": login_records(facts=NOT_STARTED)}, [{"checks_by_host": {}}, gate("skipped")])
    check = verdict["nodes"]["n1"]["checks"]["preflight.facts"]
    assert check["status"] == "fail" and "(rc 126); the node said: /bin/sh: 1: " in check["found"]
    assert "Permission denied" in check["found"]
    assert check["fix"].startswith("the login user pfuser cannot execute the interpreter "
                                   "/root/.pyenv/versions/3.11.7/bin/python3.11 on n1")
    assert "ansible_python_interpreter" in check["fix"] and "preflight_become" in check["fix"]
    assert "timeout" not in check["fix"]


@pytest.mark.parametrize("result, words", [
    (dict(NOT_STARTED, rc=127, module_stderr="/bin/sh: 1: /opt/py/bin/python: not found\n"),
     "no such interpreter /opt/py/bin/python on n1"),
    ({"failed": True, "msg": "The module interpreter '/usr/bin/python9' was not found.", "rc": 127,
      "module_stdout": "", "module_stderr": "/bin/sh: /usr/bin/python9: No such file or directory\n"},
     "no such interpreter /usr/bin/python9 on n1"),
    # No JSON for another reason (a crash): the existing fix.
    (dict(NOT_STARTED, rc=1, module_stderr="Traceback (most recent call last):\n  ...\nMemoryError\n"),
     "a timeout means the node is overloaded"),
])
def test_each_cause_of_a_module_that_never_started_gets_its_own_fix(result, words):
    verdict = build(["n1"], {"n1": login_records(facts=result)}, [{"checks_by_host": {}}, gate("skipped")])
    check = verdict["nodes"]["n1"]["checks"]["preflight.facts"]
    assert words in check["fix"], check
    assert "the node said: " in check["found"]


def test_what_the_node_said_is_bounded_and_stdout_stands_in_for_an_empty_stderr():
    long = dict(NOT_STARTED, module_stderr="x" * 5000 + " the end")
    assert pv.task_message(long).endswith("x the end") and len(pv.task_message(long)) < 450
    quiet = dict(NOT_STARTED, module_stderr="", module_stdout="sh: python: Permission denied")
    assert pv.task_message(quiet).endswith("the node said: sh: python: Permission denied")
    # A module that started and failed keeps only its message: its output is never kept.
    assert "said" not in pv.task_message(FAILED_WITH_SECRETS)


def test_a_censored_module_that_never_started_says_nothing_of_its_output():
    censored = dict(NOT_STARTED, censored="the output has been hidden due to the fact that 'no_log: true' was "
                                          "specified for this result", module_stderr=SECRET)
    verdict = build(["n1"], {"n1": login_records(facts=censored)}, [{"checks_by_host": {}}, gate("skipped")])
    assert SECRET not in json.dumps(verdict)
    assert verdict["nodes"]["n1"]["checks"]["preflight.facts"]["found"].endswith(pv.HIDDEN)
    no_log = dict(NOT_STARTED, _ansible_no_log=True, module_stderr=SECRET)
    assert SECRET not in pv.task_message(no_log)
