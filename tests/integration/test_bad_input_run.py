"""Bad input on localhost, one real run: a typo'd variable and a NaN floor on the command line stop the gate before
any node is touched (exit 4, the verdict's ``stopped``), and no consumer drains on that verdict."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*argv, timeout=240):
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    return subprocess.run(list(argv), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def test_a_typo_and_a_nan_floor_on_the_command_line_stop_the_run_and_drain_nothing(tmp_path):
    results = str(tmp_path / "results")
    done = run(sys.executable, "-m", "cluster_preflight", "gate", "--quiet", "--results-dir", results,
               "-e", "allreduce_floor_busbw_gbps_ncll=300", "-e", "allreduce_floor_busbw_gbps_gloo=nan")
    assert done.returncode == 4, done.stdout[-3000:] + done.stderr[-3000:]
    path = done.stdout.strip().rsplit(" ", 1)[1]
    with open(path, encoding="utf-8") as handle:
        verdict = json.load(handle)
    assert verdict["stopped"] == "invalid settings on localhost"
    checks = verdict["nodes"]["localhost"]["checks"]
    assert "did you mean allreduce_floor_busbw_gbps_nccl?" in checks["preflight.inputs"]["fix"]
    assert "allreduce_floor_busbw_gbps_gloo" in checks["allreduce.inputs"]["found"]
    # Nothing ran on the node: no facts, no all-reduce.
    assert not any(name.startswith(("nic_discovery.", "kernel_debug.")) for name in checks)
    assert verdict["allreduce"]["status"] == "skipped"
    drain = run(sys.executable, os.path.join(ROOT, "scripts", "verdict"), "--drain-list", path)
    assert drain.stdout == "" and "STOPPED" in drain.stderr
    slurm = run(sys.executable, os.path.join(ROOT, "scripts", "slurm-drain"), "--dry-run", path)
    assert slurm.returncode == 3 and slurm.stdout == "" and "nothing drained" in slurm.stderr
