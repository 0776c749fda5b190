"""Worker math and correctness logic (no process group needed: a fake all-reduce sums real tensors)."""

import importlib.util
import os

import pytest
import torch

WORKER = os.path.join(os.path.dirname(__file__), "..", "..", "roles", "allreduce", "files", "allreduce_worker.py")
spec = importlib.util.spec_from_file_location("allreduce_worker", WORKER)
worker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(worker)


@pytest.mark.parametrize("world_size", [1, 2, 3, 8, 16, 1024])
def test_expected_value_is_the_sum_of_rank_values(world_size):
    for index in (0, 1, 12, 13, 99):
        assert worker.expected_value(index, world_size) == sum(
            worker.rank_value(index, rank) for rank in range(world_size))


def test_expected_value_differs_per_element_and_world_size():
    assert worker.expected_value(0, 2) != worker.expected_value(1, 2)
    assert worker.expected_value(0, 2) != worker.expected_value(0, 3)


def test_busbw_uses_nccl_tests_formula():
    # 1 GB in 1 s is algbw 1 GB/s; busbw = algbw * 2(n-1)/n.
    assert worker.algbw_gbps(1e9, 1.0) == pytest.approx(1.0)
    assert worker.busbw_gbps(1e9, 1.0, 2) == pytest.approx(1.0)
    assert worker.busbw_gbps(1e9, 1.0, 8) == pytest.approx(1.75)
    assert worker.busbw_gbps(1e9, 0.5, 4) == pytest.approx(3.0)
    assert worker.busbw_gbps(1e9, 1.0, 1) == pytest.approx(1.0)
    assert worker.algbw_gbps(1e9, 0) == 0.0


class FakeDist:
    """all_reduce that sums what every simulated rank contributes at the same call."""

    def __init__(self, world_size, corrupt_rank=None):
        self.world_size = world_size
        self.corrupt_rank = corrupt_rank

    def all_reduce(self, tensor):
        index = torch.arange(tensor.numel())
        pattern = (index % worker.PATTERN_PERIOD + 1).to(torch.float32)
        total = sum(pattern * float(rank + 1) for rank in range(self.world_size))
        if self.corrupt_rank is not None:
            total[7] += 1.0
        tensor.copy_(total)


def test_check_correctness_passes_on_exact_sum():
    wrong, first = worker.check_correctness(torch, FakeDist(4), torch.device("cpu"), 4, 0, 1000)
    assert (wrong, first) == (0, None)


def test_check_correctness_counts_and_locates_a_wrong_element():
    wrong, first = worker.check_correctness(torch, FakeDist(4, corrupt_rank=2), torch.device("cpu"), 4, 0, 1000)
    assert wrong == 1
    assert first["index"] == 7
    assert first["got"] == first["expected"] + 1


def test_recorder_writes_stage_atomically(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    rec = worker.Recorder(str(tmp_path), 5)
    rec.stage("init")
    import json
    data = json.loads((tmp_path / "rank5.json").read_text())
    assert data["rank"] == 5 and data["local_rank"] == 1 and data["stage"] == "init"
    assert not list(tmp_path.glob("*.tmp"))


def test_worker_runs_single_rank_for_real(tmp_path, monkeypatch):
    """A world of one through the real gloo path: init, correctness, barrier, bandwidth."""
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    rc = worker.main(["--out", str(tmp_path), "--sizes", "4096", "--iters", "1", "--warmup", "0",
                      "--check-elements", "1000", "--timeout", "20"])
    import json
    data = json.loads((tmp_path / "rank0.json").read_text())
    assert rc == 0
    assert data["stage"] == "done" and data["status"] == "ok" and data["correct"] is True
    assert data["bandwidth"][0]["size_bytes"] == 4096
    assert data["versions"]["torch"].startswith("2.")


def test_a_collective_late_against_the_floor_ends_the_stage_before_the_whole_sweep_would():
    # Seven 4 MiB collectives at the floor take 7 s; 3 s of grace: the whole deadline is 10 s.
    progress = worker.Progress(2, [4 << 20] * 7)
    # The first collective in flight may take its share at the floor (1 s) plus the grace.
    assert worker.late(progress, 10.0, 3.0, 3.9) is None
    assert worker.late(progress, 10.0, 3.0, 4.1) == pytest.approx(4.0)
    # Four done: the fifth is due by 3 + 5 s.
    for _ in range(4):
        progress.step(4 << 20)
    assert worker.late(progress, 10.0, 3.0, 7.9) is None and worker.late(progress, 10.0, 3.0, 8.1) == pytest.approx(8.0)
    # Without a grace, only the whole deadline ends it (as before the per-collective deadlines).
    assert worker.late(progress, 10.0, -1, 9.9) is None and worker.late(progress, 10.0, -1, 10.0) == 10.0
    assert worker.late(worker.Progress(2, [4 << 20] * 7), 10.0, None, 4.1) is None


def test_the_worker_takes_a_grace_and_without_one_keeps_the_whole_deadline():
    assert worker.parse_args(["--bandwidth-deadline", "10", "--bandwidth-grace", "3"]).bandwidth_grace == 3.0
    assert worker.parse_args([]).bandwidth_grace < 0


def test_rank_0_s_store_listens_on_the_master_address_only_and_keeps_its_keys_under_the_run_s_secret(tmp_path):
    """Started by Slurm (no torchrun), rank 0 holds the rendezvous store: on MASTER_ADDR, never on every address
    (its keys go under the run's secret, PREFLIGHT_STORE_TOKEN)."""
    import json
    import socket
    import subprocess
    import sys
    import time
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               PREFLIGHT_STORE_TOKEN="0123456789abcdef", PYTHONWARNINGS="ignore")
    env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    argv = [sys.executable, WORKER, "--out", str(tmp_path), "--sizes", "4096", "--iters", "1", "--warmup", "0",
            "--check-elements", "100", "--timeout", "30"]
    first = subprocess.Popen(argv, env=dict(env, RANK="0", LOCAL_RANK="0"))
    try:
        listening = ""
        for _ in range(200):
            listening = subprocess.run(["ss", "-Hltn", "sport = :%d" % port], capture_output=True, text=True).stdout
            if listening.strip():
                break
            time.sleep(0.1)
        assert "127.0.0.1:%d" % port in listening and "*:%d" % port not in listening and \
            "0.0.0.0:%d" % port not in listening, listening
        second = subprocess.run(argv, env=dict(env, RANK="1", LOCAL_RANK="0"), timeout=120)
        assert second.returncode == 0 and first.wait(120) == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert json.loads((tmp_path / "rank1.json").read_text())["status"] == "ok"
