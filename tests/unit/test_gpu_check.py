"""scripts/gpu-check on this machine (no GPU): a clear "no GPU" in seconds; with the test bed's fake nvidia-smi the
capture and the readers run and their outputs land where docs/gpu-check.md says, then torch (CPU) stops the run;
a hung or empty nvidia-smi is bounded; NCCL's transport line is found in a run directory; the wheels the script
carries are the versions the project pins."""

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import time

import pytest

import fake_gpu_tools
from capability_helpers import ROOT
from cluster_preflight.cli import gpu_check, gpu_check_capture
from gpu_health_helpers import FIXTURES

SCRIPT = os.path.join(ROOT, "scripts", "gpu-check")
WHEELS = os.path.join(ROOT, "scripts", "gpu-check-wheels")


def run_script(tmp_path, path, *args):
    """``(rc, stdout, seconds, summary)`` of scripts/gpu-check with ``path`` as PATH and this venv's Python."""
    env = dict(os.environ, PATH=path, GPU_CHECK_PYTHON=sys.executable)
    start = time.monotonic()
    proc = subprocess.run([SCRIPT, "--out", str(tmp_path / "out")] + list(args), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=120, check=False)
    with open(tmp_path / "out" / "summary.json") as handle:
        summary = json.load(handle)
    return proc.returncode, proc.stdout.decode(), time.monotonic() - start, summary


def test_no_nvidia_smi_is_no_gpu_in_seconds(tmp_path):
    rc, out, seconds, summary = run_script(tmp_path, "/usr/bin:/bin")
    assert rc == 2 and seconds < 10
    assert out.startswith("gpu-check: NO GPU: nvidia-smi is not installed")
    assert summary["exit"] == 2 and [row["step"] for row in summary["steps"]] == ["gpus"]
    assert sorted(os.listdir(tmp_path / "out")) == ["summary.json", "summary.txt"]


def test_with_fake_tools_the_readers_run_and_torch_without_cuda_stops_the_run(tmp_path):
    fake_gpu_tools.install(tmp_path / "bin", nvidia_xml=os.path.join(FIXTURES, "nvidia_smi_h100_healthy.xml"),
                           kernel_log=os.path.join(FIXTURES, "kernel_log_xid79.txt"),
                           dcgm_json=os.path.join(FIXTURES, "dcgmi_diag_r1_pass.json"))
    rc, out, seconds, summary = run_script(tmp_path, "%s:/usr/bin:/bin" % (tmp_path / "bin"))
    assert rc == 2 and seconds < 60, out
    assert "NO CUDA DEVICE for torch" in out
    assert [(row["step"], row["status"]) for row in summary["steps"]] == [
        ("gpus", "ok"), ("capture", "ok"), ("readers", "ok"), ("torch", "failed")]
    out_dir = tmp_path / "out"
    raw = sorted(os.listdir(out_dir / "raw"))
    for name in ("nvidia-smi-q.xml", "nvidia-smi-nvlink-s.txt", "nvidia-smi-query-gpu.csv", "kernel-log-journalctl.txt",
                 "dcgmi-diag-r1.json", "manifest.json"):
        assert name in raw, raw
    with open(os.path.join(FIXTURES, "nvidia_smi_h100_healthy.xml")) as handle:
        assert (out_dir / "raw" / "nvidia-smi-q.xml").read_text() == handle.read()
    manifest = json.loads((out_dir / "raw" / "manifest.json").read_text())
    assert {row["file"]: row["rc"] for row in manifest}["nvidia-smi-q.txt"] == 2  # the fake knows no -q alone
    facts = json.loads((out_dir / "readers.json").read_text())
    assert len(facts["gpu_health"]["nvidia"]["gpus"]) == 8
    checks = json.loads((out_dir / "checks.json").read_text())
    assert checks["gpu_health"]["xid"]["status"] == "fail" and "Xid 79" in checks["gpu_health"]["xid"]["found"]
    assert "gpu_health.xid fail" in (out_dir / "checks.txt").read_text()
    # The log's "fallen off the bus" line beside the Xid: gpu_lost names the same loss.
    assert summary["steps"][2]["failed_checks"] == ["xid", "gpu_lost"]


def _fake_nvidia_smi(tmp_path, body):
    path = tmp_path / "bin" / "nvidia-smi"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n%s\n" % body)
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("body, words", [
    ("exec sleep 30", "did not answer within 1 s"),
    ("echo 'No devices were found'; exit 6", "exited 6: No devices were found"),
    ("echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"; exit 9",
     "couldn't communicate with the NVIDIA driver"),
    ("exit 0", "sees no GPU"),
])
def test_an_nvidia_smi_that_hangs_fails_or_sees_nothing_is_no_gpu_within_its_bound(tmp_path, body, words):
    program = _fake_nvidia_smi(tmp_path, body)
    start = time.monotonic()
    gpus, why = gpu_check_capture.find_gpus(program, timeout=1)
    assert gpus == [] and words in why and time.monotonic() - start < 10


def test_the_nccl_transport_line_is_read_from_the_ranks_logs(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "localhost.rank0.stdout.log").write_text(
        "gpu0:1:1 [0] NCCL INFO NCCL version 2.27.7+cuda13.0\n"
        "gpu0:1:1 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so.\n"
        "gpu0:1:1 [0] NCCL INFO NET/IB : No device found.\n"
        # NCCL 2.28 without an RDMA device still prints a NET/IB "Using" line: it is not the transport.
        "gpu0:1:1 [0] NCCL INFO NET/IB : Using [RO]; OOB lo:127.0.0.1<0>\n"
        "gpu0:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:198.18.0.5<0>\n"
        "gpu0:1:1 [0] NCCL INFO Using network Socket\n"
        "gpu0:1:1 [0] NCCL INFO comm 0x55 rank 0 nranks 1 cudaDev 0 nvmlDev 0 busId 18000 - Init COMPLETE\n"
        "preflight: all_reduce 16777216 bytes\n")

    class Verdict(object):
        pass
    verdict = Verdict()
    verdict.run_dir = str(run_dir)
    steps = gpu_check.Steps(str(tmp_path), 60)
    args = type("Args", (), {"out": str(tmp_path), "backend": "nccl"})()
    gpu_check.nccl_step(steps, args, verdict)
    assert steps.rows[-1]["status"] == "ok"
    assert steps.rows[-1]["found"] == "gpu0:1:1 [0] NCCL INFO Using network Socket"
    assert len((tmp_path / "nccl.txt").read_text().splitlines()) == 7  # every NCCL line, not the worker's own
    # No transport line: a failure with peers to connect to, nothing to say of the machine with one rank.
    (run_dir / "localhost.rank0.stdout.log").write_text("gpu0:1:1 [0] NCCL INFO NCCL version 2.27.7+cuda13.0\n")
    for world, status in ((2, "failed"), (1, "skipped")):
        verdict.raw = {"allreduce": {"world_size": world}}
        gpu_check.nccl_step(steps, args, verdict)
        assert steps.rows[-1]["status"] == status and "no NCCL transport line" in steps.rows[-1]["found"]


def test_a_shim_runs_ansible_playbook_with_this_python_when_it_is_not_on_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    folder = gpu_check._ansible_playbook(str(tmp_path))  # pylint: disable=protected-access
    assert folder == str(tmp_path / "bin")
    proc = subprocess.run([str(tmp_path / "bin" / "ansible-playbook"), "--version"], stdout=subprocess.PIPE,
                          timeout=60, check=False)
    assert proc.returncode == 0 and b"ansible-playbook [core 2.19" in proc.stdout


def test_bad_arguments_exit_4():
    assert gpu_check.main(["--budget", "5"]) == 4


def test_an_output_folder_others_can_write_or_a_link_is_refused(tmp_path, capsys):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert gpu_check.main(["--out", str(shared)]) == 4
    assert "only it can write" in capsys.readouterr().err and os.listdir(shared) == []
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    assert gpu_check.main(["--out", str(tmp_path / "link")]) == 4
    assert os.listdir(tmp_path / "elsewhere") == []


def test_the_wheels_are_the_versions_the_project_pins():
    with open(os.path.join(ROOT, "requirements.txt")) as handle:
        pinned = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", handle.read(), re.M))
    with open(WHEELS) as handle:
        text = handle.read()
    direct = re.search(r"for name in ([a-z0-9 -]+); do", text).group(1).split()
    assert set(direct) <= set(pinned) and "torch" not in direct
    for name, version in re.findall(r"\b([a-z][a-z0-9-]+)==([0-9][0-9.]*)", text):
        assert importlib.metadata.version(name) == version, name
