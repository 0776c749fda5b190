"""bench/nccl_logs.py: a folder of failure logs through the gate's log diagnosis, judged per file (the logs here are
the project's own lines; the real ones are measured by running the command on ../shared/nccl-logs)."""

import importlib.util
import json
import os
import sys

import pytest

from cluster_preflight.capabilities.allreduce import signatures as sig

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, BENCH)
    try:
        spec = importlib.util.spec_from_file_location("nccl_logs_bench", os.path.join(BENCH, "nccl_logs.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(BENCH)


def test_every_expectation_names_a_row_of_its_category(bench):
    assert len(bench.EXPECTED) == 19
    for name, expectation in bench.EXPECTED.items():
        category, cause = expectation.split("/")
        assert sig.BY_ID[cause].category == category, name


def test_each_file_is_right_wrong_nothing_or_healthy_and_only_all_right_exits_zero(bench, tmp_path, capsys):
    logs = {
        "shm.log": "n1:5:9 [0] misc/shmutils.cc:88 NCCL WARN Error: failed to extend /dev/shm/nccl-z to 99 bytes",
        "port.log": "RuntimeError: Address already in use",
        "quiet.log": "nothing a row knows",
        "healthy.log": "n1:5:5 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:198.18.1.1<0>",
        "stray.txt": "no expectation for this one",
    }
    for name, text in logs.items():
        (tmp_path / name).write_text(text + "\n")
    expected = {"shm.log": "shm/shm_too_small", "port.log": "shm/shm_too_small", "quiet.log": "port/store_port_in_use",
                "healthy.log": "healthy"}
    path = tmp_path / "expected.json"
    path.write_text(json.dumps(expected))
    assert bench.main([str(tmp_path), "--expected", str(path)]) == 1
    out = capsys.readouterr().out
    assert "RIGHT          shm.log" in out and "WRONG          port.log" in out and "named port/store_port_in_use" in out
    assert "NOTHING        quiet.log" in out and "RIGHT          healthy.log" in out
    assert "NO-EXPECTATION stray.txt" in out
    assert "SUMMARY logs 5, right 2, wrong 1, nothing 1, no expectation 1" in out
    for name in ("port.log", "quiet.log", "stray.txt"):
        (tmp_path / name).unlink()
    assert bench.main([str(tmp_path), "--expected", str(path)]) == 0


def test_a_bad_expectations_file_stops_with_a_clear_error(bench, tmp_path):
    path = tmp_path / "expected.json"
    path.write_text(json.dumps({"a.log": "no category"}))
    with pytest.raises(SystemExit) as stopped:
        bench.main([str(tmp_path), "--expected", str(path)])
    assert "category" in str(stopped.value)
