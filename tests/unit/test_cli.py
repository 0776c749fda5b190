"""cluster_preflight without a real run: argument parsing, the exit code of every kind of verdict
(a missing and a truncated one too), the mapping of a run's events to its Result, and the progress
rendering fed synthetic ansible-runner events.

Verdicts are built from ``fixtures/verdicts/mixed.json`` (gpu01 pass, gpu02 warn, gpu03 unverified,
gpu04 unreachable, gpu05 no torch).
"""

import copy
import io
import json
import os

import pytest

import cluster_preflight
from cluster_preflight.cli import main as cli, playbooks
from cluster_preflight.cli.progress import Progress

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "verdicts", "mixed.json")


def mixed():
    with open(FIXTURE, encoding="utf-8") as handle:
        return json.load(handle)


def only(hosts, status="pass"):
    """The fixture cut down to ``hosts`` (a consistent verdict of that status)."""
    raw = mixed()
    raw["hosts"] = list(hosts)
    raw["nodes"] = {host: raw["nodes"][host] for host in hosts}
    for key in ("healthy_hosts", "failed_hosts", "unverified_hosts", "warn_hosts", "unreachable_hosts"):
        raw[key] = [host for host in raw[key] if host in hosts]
    raw["status"] = status
    return raw


def write(tmp_path, raw, name="verdict.json"):
    run_dir = tmp_path / "20261123T150000Z"
    run_dir.mkdir(exist_ok=True)
    path = run_dir / name
    path.write_text(raw if isinstance(raw, str) else json.dumps(raw))
    return str(path)


# --- argument parsing -------------------------------------------------------------------------------


def test_gate_defaults():
    args, passthrough = cli.parse_args(["gate"])
    assert args.command == "gate" and args.inventory is None and args.limit is None
    assert args.extravars == {} and passthrough == [] and not args.quiet and args.results_dir is None


def test_gate_options_and_passthrough():
    args, passthrough = cli.parse_args([
        "gate", "-i", "inv.yml", "--limit", "node1,node2", "-e", "allreduce_timeout=20", "-e",
        "debug_tools_enabled=false preflight_master_port=6001", "--results-dir", "/tmp/r", "-q", "-v",
        "--forks", "8", "-e", "@vars.yml", "--extra-vars", '{"a": 1}'])
    assert args.inventory == "inv.yml" and args.limit == "node1,node2" and args.quiet
    assert args.results_dir == "/tmp/r"
    # As ansible-playbook's -e key=value: strings ("false" stays the string, the playbooks use | bool).
    assert args.extravars == {"allreduce_timeout": "20", "debug_tools_enabled": "false",
                              "preflight_master_port": "6001"}
    # What it does not know, and -e @file / JSON, go to ansible-playbook in order.
    assert passthrough == ["-v", "--forks", "8", "-e", "@vars.yml", "-e", '{"a": 1}']


def test_short_limit_and_several_inventories():
    args, _ = cli.parse_args(["healthcheck", "-l", "gpu01", "-i", "a.yml", "--inventory", "b.yml"])
    assert args.limit == "gpu01" and args.inventory == ["a.yml", "b.yml"]


def test_no_abbreviations_reach_our_options():
    # --lim is not --limit: ansible-playbook gets it (and refuses it), nothing is guessed here.
    args, passthrough = cli.parse_args(["gate", "--lim", "x"])
    assert args.limit is None and passthrough == ["--lim", "x"]


@pytest.mark.parametrize("argv", [[], ["nonsense"], ["gate", "-e", "novalue"], ["gate", "-e", "=x"],
                                  ["verdict", "a", "b"], ["verdict", "--drain-list", "--nhc"],
                                  ["gate", "--timeout", "soon"]])
def test_usage_errors_exit_4(argv, capsys):
    assert cli.main(argv) == cluster_preflight.EXIT_USAGE
    assert "usage" in capsys.readouterr().err


def test_help_exits_0(capsys):
    assert cli.main(["--help"]) == 0
    assert "gate" in capsys.readouterr().out


# --- exit codes from verdicts -------------------------------------------------------------------------


@pytest.mark.parametrize("raw, run_code, verdict_code", [
    (only(["gpu01"]), 0, 0),                        # every node pass
    (only(["gpu01", "gpu02"]), 0, 1),               # a warn node: a run passes, `verdict` says 1 (scripts/verdict)
    (mixed(), 2, 2),                                # failed, unverified and unreachable nodes
    (only(["gpu05"], "fail"), 2, 2),                # one failed node
    (only(["gpu03"], "fail"), 2, 2),                # only an unverified node: not a pass
])
def test_exit_code_of_verdicts(tmp_path, capsys, raw, run_code, verdict_code):
    verdict = cluster_preflight.verdict_from_dict(raw, "v.json")
    assert cluster_preflight.exit_code(verdict) == run_code
    assert cluster_preflight.exit_code(verdict, warnings=True) == verdict_code
    assert cli.main(["verdict", write(tmp_path, raw)]) == verdict_code
    assert capsys.readouterr().out.startswith("PREFLIGHT %s: " % raw["status"].upper())


def test_stopped_verdict_is_a_usage_error(tmp_path, capsys):
    raw = only(["gpu05"], "fail")
    raw["stopped"] = "invalid settings on gpu05"
    assert cluster_preflight.exit_code(cluster_preflight.verdict_from_dict(raw)) == cluster_preflight.EXIT_USAGE
    assert cli.main(["verdict", write(tmp_path, raw)]) == 4
    assert "stopped: invalid settings on gpu05" in capsys.readouterr().out


def test_missing_verdict_exits_3(tmp_path, capsys):
    assert cluster_preflight.exit_code(None) == cluster_preflight.EXIT_UNKNOWN
    assert cli.main(["verdict", str(tmp_path / "nothing")]) == 3
    err = capsys.readouterr().err
    assert err.startswith("UNKNOWN: no verdict at ") and "Traceback" not in err


def test_truncated_verdict_exits_3(tmp_path, capsys):
    text = json.dumps(mixed())
    path = write(tmp_path, text[:len(text) // 2])
    with pytest.raises(cluster_preflight.VerdictError, match="not a complete verdict"):
        cluster_preflight.load_verdict(path)
    assert cli.main(["verdict", os.path.dirname(path)]) == 3
    assert "is not a complete verdict" in capsys.readouterr().err


@pytest.mark.parametrize("change, message", [
    (lambda raw: raw.pop("nodes"), "nodes is missing"),
    (lambda raw: raw.update(status="pass"), "status pass contradicts"),
    (lambda raw: raw.update(status="maybe"), "status is 'maybe'"),
])
def test_invalid_verdict_exits_3(tmp_path, capsys, change, message):
    raw = mixed()
    change(raw)
    with pytest.raises(cluster_preflight.VerdictError, match=message):
        cluster_preflight.verdict_from_dict(raw)
    assert cli.main(["verdict", write(tmp_path, raw)]) == 3
    assert message in capsys.readouterr().err


def test_verdict_is_typed(tmp_path):
    path = write(tmp_path, mixed())
    (tmp_path / "20261123T150000Z" / "junit.xml").write_text("<testsuites/>")
    (tmp_path / "20261123T150000Z" / "report.html").write_text("<!doctype html>")
    verdict = cluster_preflight.load_verdict(os.path.dirname(path))
    assert verdict.status == "fail" and not verdict.passed and verdict.path == path
    assert verdict.failed_hosts == ("gpu04", "gpu05") and verdict.unverified_hosts == ("gpu03",)
    assert verdict.unreachable_hosts == ("gpu04",) and verdict.healthy_hosts == ("gpu01", "gpu02")
    assert verdict.outputs == {name: str(tmp_path / "20261123T150000Z" / name) for name in ("junit.xml", "report.html")}
    assert verdict.raw == mixed()
    by_key = {(item.host, item.check): item for item in verdict.findings}
    assert by_key[("gpu02", "core_dumps.core_pattern")].status == "warn"
    assert by_key[("gpu03", "ssh_trust.peers")].status == "unverified"
    torch = by_key[("gpu05", "allreduce.torch")]
    assert torch.status == "fail" and torch.fix and torch.expected and torch.found
    host, check, status, found, expected, fix = torch  # a plain tuple too
    assert (host, check) == ("gpu05", "allreduce.torch")
    # Passing and not-applicable checks are not findings.
    assert ("gpu01", "iommu.grub") not in by_key and not [item for item in verdict.findings if item.host == "gpu01"]


def test_verdict_drain_list_and_nhc(tmp_path, capsys):
    path = write(tmp_path, mixed())
    assert cli.main(["verdict", path, "--drain-list"]) == 2
    assert capsys.readouterr().out.split() == ["gpu04", "gpu05"]
    assert cli.main(["verdict", path, "--nhc"]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(" ERROR: nhc: Health check failed: preflight " in line for line in lines)
    assert any(line.startswith("gpu05 ") and "allreduce.torch" in line for line in lines)


# --- a run's events -> Result (ansible_runner.run replaced: no real run) -----------------------------


class FakeRun:
    def __init__(self, rc, status):
        self.rc, self.status = rc, status


@pytest.fixture
def fake_runner(monkeypatch):
    """``fake_runner(events, rc, status)``: ansible_runner.run feeds ``events`` to the handler."""
    import ansible_runner

    calls = []

    def _install(events, rc=0, status="successful"):
        def _run(**kwargs):
            calls.append(kwargs)
            for event in events:
                assert kwargs["event_handler"](event) is False
            return FakeRun(rc, status)

        monkeypatch.setattr(ansible_runner, "run", _run)
        return calls

    return _install


def verdict_events(path, failed=False):
    res = {"verdict_file": path, "outputs": {"junit.xml": "/x/junit.xml"}, "msg": "PREFLIGHT ..."}
    return [
        {"event": "playbook_on_play_start", "event_data": {"name": "Audit", "pattern": "cluster"}},
        {"event": "playbook_on_task_start", "event_data": {"task": "Write the verdict."}},
        {"event": "runner_on_failed" if failed else "runner_on_ok",
         "event_data": {"host": "gpu01", "task": "Write the verdict.", "task_action": "preflight_verdict",
                        "res": res}},
        {"event": "playbook_on_stats", "event_data": {"ok": {"gpu01": 3}, "failures": {}},
         "stdout": "PLAY RECAP *****\ngpu01 : ok=3"},
        {"event": "verbose", "stdout": "\x1b[0;32mPREFLIGHT SUMMARY: PASS, 1/1 nodes healthy\x1b[0m\nnode   status"},
    ]


def test_run_passes_settings_to_ansible_runner(tmp_path, fake_runner):
    path = write(tmp_path, only(["gpu01"]))
    calls = fake_runner(verdict_events(path))
    seen = []
    result = cluster_preflight.gate(inventory=str(tmp_path), limit="gpu01", extravars={"a": "1"},
                                    results_dir=str(tmp_path / "r"), cmdline=["-v", "-e", "@x.yml"],
                                    progress=seen.append)
    assert result.exit_code == 0 and result.passed and result.rc == 0 and result.error == ""
    assert result.verdict.path == path and result.verdict.outputs == {"junit.xml": "/x/junit.xml"}
    # The callback's block from its title on, colours as they came (none unless asked for).
    assert result.summary == ["\x1b[0;32mPREFLIGHT SUMMARY: PASS, 1/1 nodes healthy\x1b[0m", "node   status"]
    assert result.stats["ok"] == {"gpu01": 3} and len(seen) == 5
    kwargs = calls[0]
    assert kwargs["playbook"] == os.path.join(playbooks.ROOT, "preflight.yml")
    assert kwargs["project_dir"] == playbooks.ROOT and kwargs["inventory"] == str(tmp_path)
    assert kwargs["limit"] == "gpu01" and kwargs["cmdline"] == "-v -e @x.yml"
    assert kwargs["extravars"] == {"a": "1", "preflight_results_dir": str(tmp_path / "r")}
    env = kwargs["envvars"]
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    assert env["ANSIBLE_CONFIG"] == os.path.join(playbooks.ROOT, "ansible.cfg")
    assert env["ANSIBLE_CALLBACK_PLUGINS"] == os.path.join(playbooks.ROOT, "callback_plugins")
    assert "preflight_summary" in env["ANSIBLE_CALLBACKS_ENABLED"].split(",")
    # runner's private directory is gone with the run
    assert not os.path.exists(kwargs["private_data_dir"])


@pytest.mark.parametrize("raw, failed, rc, status, code, typed", [
    (only(["gpu01", "gpu02"]), False, 0, "successful", 0, True),     # pass with a warn node
    (mixed(), True, 2, "failed", 2, True),                           # fail
    (only(["gpu01"]), False, 2, "failed", 3, True),                  # a pass the run contradicts: kept, not trusted
    ("{\"status\": \"pa", False, 0, "successful", 3, False),         # truncated
])
def test_result_exit_codes(tmp_path, fake_runner, raw, failed, rc, status, code, typed):
    path = write(tmp_path, raw)
    fake_runner(verdict_events(path, failed), rc, status)
    result = cluster_preflight.healthcheck()
    assert result.exit_code == code
    assert (result.verdict is not None) == typed
    assert bool(result.error) == (code == 3)


def test_no_verdict_written_exits_3(fake_runner):
    fake_runner([
        {"event": "playbook_on_play_start", "event_data": {"name": "Check"}},
        {"event": "runner_on_failed", "event_data": {"host": "localhost", "task": "Stop if the group has no node.",
                                                     "res": {"msg": "Found: no node in the inventory group"}}},
    ], rc=2, status="failed")
    result = cluster_preflight.gate()
    assert result.exit_code == 3 and result.verdict is None
    assert "wrote no verdict" in result.error and "Found: no node" in result.error


def test_refused_before_any_play_is_usage(fake_runner, capsys):
    fake_runner([{"event": "verbose", "stdout": "ERROR! Specified --limit does not match any hosts"}], rc=1,
                status="failed")
    result = cluster_preflight.gate(limit="nosuchnode")
    assert result.exit_code == 4 and "does not match any hosts" in result.error
    fake_runner([{"event": "verbose", "stdout": "ansible-playbook: error: unrecognized arguments: --bogus"}], rc=2,
                status="failed")
    assert cli.main(["gate", "--bogus", "-q"]) == 4
    assert capsys.readouterr().err.startswith("USAGE: ansible-playbook refused to start preflight.yml (rc 2): "
                                              "ansible-playbook: error: unrecognized arguments: --bogus")


def test_cancelled_run_exits_130(fake_runner):
    fake_runner([], rc=254, status="canceled")
    assert cluster_preflight.gate(cancel=lambda: True).exit_code == 130


def test_report_instead_of_verdict(monkeypatch, fake_runner):
    monkeypatch.setattr(playbooks, "diagnose_available", lambda: True)
    fake_runner([{"event": "playbook_on_play_start", "event_data": {"name": "Diagnose"}},
                 {"event": "runner_on_ok", "event_data": {"host": "gpu01", "task_action": "preflight_diagnose", "res": {
                     "report_file": "/r/diagnose.json", "lines": ["DIAGNOSIS: rank 3 on gpu02 is the suspect"]}}}])
    result = cluster_preflight.diagnose()
    assert result.exit_code == 0 and result.report_file == "/r/diagnose.json"
    assert result.summary == ["DIAGNOSIS: rank 3 on gpu02 is the suspect"]


def test_usage_errors_of_the_api(tmp_path, monkeypatch):
    with pytest.raises(cluster_preflight.UsageError, match="no inventory at"):
        cluster_preflight.gate(inventory=str(tmp_path / "absent.yml"))
    monkeypatch.setattr(playbooks, "diagnose_available", lambda: False)
    with pytest.raises(cluster_preflight.UsageError, match="no diagnose.yml"):
        cluster_preflight.diagnose()


def test_cli_diagnose_without_playbook_exits_4(monkeypatch, capsys):
    monkeypatch.setattr(playbooks, "diagnose_available", lambda: False)
    assert cli.main(["diagnose", "-q"]) == 4
    assert "no diagnose.yml" in capsys.readouterr().err


def test_cli_run_prints_summary_findings_and_headline(tmp_path, fake_runner, capsys):
    path = write(tmp_path, mixed())
    fake_runner(verdict_events(path, failed=True), rc=2, status="failed")
    assert cli.main(["gate", "-e", "a=1"]) == 2
    out, err = capsys.readouterr()
    assert "PREFLIGHT SUMMARY: PASS" in out  # the callback's block, as it came
    assert "  gpu05 allreduce.torch [fail]: " in out and "    fix: " in out
    assert out.splitlines()[-1] == ("PREFLIGHT FAIL: 2/5 nodes healthy; failed: gpu04, gpu05; unverified: gpu03; "
                                    "verdict %s" % path)
    assert "1/1 nodes (1 failed) done" in err and err.endswith("exit 2 (fail)\n")
    # quiet: the headline only
    fake_runner(verdict_events(path, failed=True), rc=2, status="failed")
    assert cli.main(["gate", "--quiet"]) == 2
    out, err = capsys.readouterr()
    assert out.splitlines() == [out.splitlines()[-1]] and out.startswith("PREFLIGHT FAIL") and err == ""


# --- progress ---------------------------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def events(kind, task=None, hosts=()):
    if kind in ("playbook_on_play_start",):
        return [{"event": kind, "event_data": {"name": task, "pattern": "cluster"}}]
    if kind == "playbook_on_task_start":
        return [{"event": kind, "event_data": {"task": task}}]
    return [{"event": kind, "event_data": {"host": host, "task": task}} for host in hosts]


def feed(progress, clock, script):
    for step in script:
        if isinstance(step, (int, float)):
            clock.now += step
        else:
            for event in events(*step):
                progress(event)


GATE = [
    ("playbook_on_play_start", "Audit every node and gate the cluster."),
    ("playbook_on_task_start", "Read facts."),
    ("runner_on_start", "Read facts.", ["n1", "n2", "n3"]),
    1.5,
    ("runner_on_ok", "Read facts.", ["n1", "n2"]),
    0.5,
    ("runner_on_unreachable", "Read facts.", ["n3"]),
    ("playbook_on_task_start", "Plan."),
    ("runner_on_start", "Plan.", ["n1"]),  # run_once
    0.2,
    ("runner_on_ok", "Plan.", ["n1"]),
    ("playbook_on_task_start", "Probes."),
    ("runner_on_start", "Probes.", ["n1", "n2", "n3"]),
    3.0,
    ("runner_on_failed", "Probes.", ["n2"]),
    ("runner_on_ok", "Probes.", ["n1"]),
    ("runner_on_skipped", "Probes.", ["n3"]),
    ("playbook_on_stats",),
]


def test_progress_plain_lines_per_play_and_stage():
    clock, stream = Clock(), io.StringIO()
    progress = Progress(stream, tty=False, clock=clock)
    feed(progress, clock, GATE)
    progress.close()
    assert stream.getvalue().splitlines() == [
        "[   0.0s] play: Audit every node and gate the cluster.",
        "[   2.0s] 3/3 nodes (1 unreachable) done in 2.0s: Read facts.",
        "[   2.2s] 1/1 nodes done in 0.2s: Plan.",
        "[   5.2s] 3/3 nodes (1 failed) done in 3.0s: Probes.",
    ]
    assert "\r" not in stream.getvalue()


def test_progress_tty_single_updating_line():
    clock, stream = Clock(), io.StringIO()
    progress = Progress(stream, tty=True, width=60, clock=clock)
    feed(progress, clock, GATE[:5])
    text = stream.getvalue()
    assert "\n" not in text and text.startswith("\r\x1b[K")
    frames = text.split("\r\x1b[K")[1:]
    assert frames[-1] == "[   1.5s] 2/3 nodes for 1.5s: Read facts."
    assert all(len(frame) < 60 for frame in frames)
    clock.now += 2
    progress.tick()  # the seconds move while a stage waits
    assert stream.getvalue().split("\r\x1b[K")[-1] == "[   3.5s] 2/3 nodes for 3.5s: Read facts."
    progress(events("playbook_on_task_start", "A task whose name is much longer than the terminal is wide, by far.")[0])
    assert stream.getvalue().split("\r\x1b[K")[-1].endswith("…")
    progress.close()
    assert stream.getvalue().endswith("\r\x1b[K") and "\n" not in stream.getvalue()


def test_progress_total_before_any_host_started():
    clock, stream = Clock(), io.StringIO()
    progress = Progress(stream, tty=True, clock=clock)
    feed(progress, clock, GATE[:2])
    assert stream.getvalue().split("\r\x1b[K")[-1] == "[   0.0s] 0/? nodes for 0.0s: Read facts."
    feed(progress, clock, GATE[:3] + [("playbook_on_task_start", "Next.")])
    assert stream.getvalue().split("\r\x1b[K")[-1] == "[   0.0s] 0/3 nodes for 0.0s: Next."


def test_cancel_flag_in_cli_is_restored(monkeypatch, fake_runner):
    import signal

    before = signal.getsignal(signal.SIGINT)
    fake_runner([], rc=254, status="canceled")
    assert cli.main(["gate", "-q"]) == 130
    assert signal.getsignal(signal.SIGINT) is before


def test_library_never_exits():
    for name in ("verdict/value.py", "cli/playbooks.py", "cli/progress.py", "cli/main.py", "__init__.py"):
        with open(os.path.join(playbooks.ROOT, "cluster_preflight", name), encoding="utf-8") as handle:
            assert "sys.exit" not in handle.read(), name


def test_findings_are_copied_not_shared():
    raw = mixed()
    verdict = cluster_preflight.verdict_from_dict(copy.deepcopy(raw))
    assert verdict.raw == raw and isinstance(verdict.findings, tuple)


def test_version_says_the_checkout_ansible_and_python(capsys):
    assert cli.main(["--version"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("cluster-preflight ") and "ansible-core 2." in line and "; Python 3." in line
    assert "\n" not in line


def test_bringup_help_shows_check_and_diff_and_they_reach_ansible_playbook(capsys):
    assert cli.main(["bringup", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--check" in text and "--diff" in text and "write nothing on a node" in text
    args, passthrough = cli.parse_args(["bringup", "-i", "x.yml", "--check", "--diff", "-v"])
    assert passthrough == ["-v", "--check", "--diff"] and args.command == "bringup"
