"""``python -m cluster_preflight explain``: a failed job's log read by the gate's diagnosis at the terminal."""

import io

from cluster_preflight.cli import explain, main

LOOPBACK = "RuntimeError: [/opt/gloo/transport/tcp/pair.cc:799] connect [127.0.1.1]:45511: Connection refused\n"
SHM = ("node7:301:355 [2] misc/shmutils.cc:132 NCCL WARN Error while creating shared memory segment "
       "/dev/shm/nccl-Qx81 (size 9437184)\n")
HEALTHY = "step 10 loss 2.31\nstep 20 loss 2.07\n"


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_log_naming_a_cause_gets_the_line_the_fix_and_the_gate_check_that_catches_it(tmp_path, capsys):
    log = _write(tmp_path, "job.log", "starting\n" + LOOPBACK + "exiting\n")
    assert main.main(["explain", log]) == 2
    out = capsys.readouterr().out
    assert out.startswith("%s: FAIL name_resolution/hostname_loopback" % log), out
    assert "connect [127.0.1.1]:45511" in out and "getent hosts" in out
    assert "caught before the job by: job_env.hostname" in out


def test_each_log_is_explained_on_its_own_and_an_unreadable_one_is_exit_4_after_the_others(tmp_path, capsys):
    shm = _write(tmp_path, "a.log", SHM)
    quiet = _write(tmp_path, "b.log", HEALTHY)
    assert main.main(["explain", shm, str(tmp_path / "missing.log"), quiet]) == 4
    captured = capsys.readouterr()
    assert "%s: FAIL shm/shm_too_small" % shm in captured.out and "job_env.dev_shm" in captured.out
    assert "%s: no known failure in 2 lines" % quiet in captured.out
    assert "missing.log: could not be read: No such file or directory" in captured.err


def test_a_log_without_a_known_failure_is_exit_0(tmp_path, capsys):
    assert main.main(["explain", _write(tmp_path, "ok.log", HEALTHY)]) == 0
    assert "no known failure" in capsys.readouterr().out


def test_standard_input_and_escape_sequences_never_reach_the_terminal():
    text = LOOPBACK.replace("Connection refused", "Connection refused\x1b[2J\x1b]0;PASS\x07")
    read, note = explain.read_log("-", io.BytesIO(text.encode()))
    lines, named = explain.report("standard input", read, note)
    assert named and not any("\x1b" in line or "\x07" in line for line in lines)


def test_a_log_larger_than_the_limit_is_read_from_its_end_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(explain, "READ_LIMIT", 256)
    path = _write(tmp_path, "big.log", "x" * 1000 + "\n" + LOOPBACK)
    text, note = explain.read_log(path)
    assert text.endswith(LOOPBACK) and len(text) == 256
    assert note == "its first %d bytes were not read (the last 256 are)" % (1001 + len(LOOPBACK) - 256)
    assert explain.explain(text)[0]["id"] == "hostname_loopback"


def test_the_fabric_option_makes_nccl_on_sockets_a_fault():
    log = ("node1:12:12 [0] NCCL INFO NET/Socket : Using [0]eth0:198.18.4.5<0>\n"
           "node1:12:12 [0] NCCL INFO Using network Socket\n")
    without, _ = explain.explain(log)
    with_ib, findings = explain.explain(log, fabric="infiniband")
    assert without is None
    assert with_ib is not None and with_ib["status"] in ("warn", "fail"), findings


def test_extra_arguments_are_refused(tmp_path, capsys):
    assert main.main(["explain", "--nodes", "0", _write(tmp_path, "x.log", HEALTHY)]) == 4
