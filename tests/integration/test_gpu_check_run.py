"""scripts/gpu-check's whole path on this machine, the GPU run aside: the test bed's fake nvidia-smi, dcgmi and
journalctl first on PATH, ansible-playbook not on PATH (the script's shim runs it), the gate's ranks on CPU
(--backend gloo).  A fake GPU node whose kernel log has an Xid 79 fails the gate on exactly that check."""

import glob
import json
import os
import subprocess
import sys

import pytest

import fake_gpu_tools
from capability_helpers import ROOT
from gpu_health_helpers import FIXTURES

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def gpu_check(tmp_path, kernel_log):
    fake_gpu_tools.install(tmp_path / "bin", nvidia_xml=os.path.join(FIXTURES, "nvidia_smi_h100_healthy.xml"),
                           kernel_log=os.path.join(FIXTURES, kernel_log),
                           dcgm_json=os.path.join(FIXTURES, "dcgmi_diag_r1_pass.json"))
    env = dict(os.environ, PATH="%s:/usr/bin:/bin" % (tmp_path / "bin"), GPU_CHECK_PYTHON=sys.executable)
    out = tmp_path / "out"
    proc = subprocess.run([os.path.join(ROOT, "scripts", "gpu-check"), "--out", str(out), "--backend", "gloo",
                           "--budget", "240"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=280,
                          check=False)
    summary = json.loads((out / "summary.json").read_text())
    verdicts = glob.glob(str(out / "gate" / "results" / "2*" / "verdict.json"))
    return proc, summary, json.loads(open(verdicts[0]).read()) if verdicts else None


def test_a_healthy_fake_gpu_node_passes_every_step_through_the_shim(tmp_path):
    proc, summary, verdict = gpu_check(tmp_path, "kernel_log_clean.txt")
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()[-3000:]
    assert [(row["step"], row["status"]) for row in summary["steps"]] == [
        ("gpus", "ok"), ("capture", "ok"), ("readers", "ok"), ("gate", "ok"), ("nccl", "skipped")]
    assert os.access(str(tmp_path / "out" / "bin" / "ansible-playbook"), os.X_OK)
    assert verdict["status"] == "pass" and verdict["allreduce"]["backend"] == "gloo"
    checks = verdict["nodes"]["localhost"]["checks"]
    assert checks["gpu_health.count"]["status"] == "pass" and checks["gpu_health.nvlink"]["status"] == "pass"
    assert checks["allreduce.job_user"]["status"] == "warn" and "root" in checks["allreduce.job_user"]["found"]
    assert "verdict pass" in summary["steps"][3]["found"]


def test_an_xid_79_fails_the_gate_on_that_check(tmp_path):
    proc, summary, verdict = gpu_check(tmp_path, "kernel_log_xid79.txt")
    assert proc.returncode == 1, proc.stdout.decode()
    assert summary["steps"][3]["status"] == "failed" and "gpu_health.xid fail" in summary["steps"][3]["found"]
    assert verdict["failed_hosts"] == ["localhost"]
