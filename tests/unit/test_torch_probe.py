"""torch_probe: the training Python, torch build, accelerators and the rendezvous port."""

import os
import socket
import stat
import sys

import torch_probe

VENV_PYTHON = sys.executable


def fake_python(tmp_path, version="2.0.1", cuda="11.8"):
    """An executable that answers the probe like a Python with the given torch would."""
    script = tmp_path / "python"
    payload = ('{"python": "3.10.0", "executable": "%s", "torch": {"path": "/x/torch", "version": "%s", '
               '"cuda": %s, "hip": null}}' % (script, version, '"%s"' % cuda if cuda else "null"))
    script.write_text("#!/bin/sh\necho '%s'\n" % payload)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_venv_python_with_torch_passes(run_module, tmp_path):
    result, failed = run_module(torch_probe, {"python": VENV_PYTHON, "dev_root": str(tmp_path),
                                              "sysfs_root": str(tmp_path)})
    assert not failed and result["ok"]
    assert result["torch"]["version"].startswith("2.13")
    assert result["backend"] == "gloo" and result["nproc_per_node"] == 2
    assert result["checks"]["master_port"]["status"] == "not_applicable"


def test_python_without_torch_fails_with_fix(run_module, tmp_path):
    result, failed = run_module(torch_probe, {"python": "/usr/bin/python3", "dev_root": str(tmp_path),
                                              "sysfs_root": str(tmp_path)})
    assert not failed and not result["ok"]
    check = result["checks"]["torch_import"]
    assert check["status"] == "fail" and "no torch module in /usr/bin/python3" in check["found"]
    assert "preflight_training_python" in check["fix"]


def test_missing_python_fails(run_module, tmp_path):
    result, _ = run_module(torch_probe, {"python": str(tmp_path / "nope"), "dev_root": str(tmp_path),
                                         "sysfs_root": str(tmp_path)})
    assert result["checks"]["torch_python"]["status"] == "fail" and not result["ok"]


def test_port_in_use_names_holder(run_module, tmp_path):
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        result, _ = run_module(torch_probe, {"python": VENV_PYTHON, "is_master": True, "master_port": port,
                                             "dev_root": str(tmp_path), "sysfs_root": str(tmp_path)})
    check = result["checks"]["master_port"]
    assert check["status"] == "fail" and not result["ok"]
    assert "port %d" % port in check["found"] and "pid %d" % os.getpid() in check["found"]
    assert "preflight_master_port" in check["fix"]


def test_gpus_with_cpu_torch_fail_and_gpu_build_picks_nccl(run_module, tmp_path):
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        (tmp_path / name).write_text("")
    result, _ = run_module(torch_probe, {"python": VENV_PYTHON, "dev_root": str(tmp_path),
                                         "sysfs_root": str(tmp_path)})
    assert result["accelerators"]["nvidia"] == 2
    assert result["checks"]["torch_accelerator_build"]["status"] == "fail"
    result, _ = run_module(torch_probe, {"python": fake_python(tmp_path, "2.3.0", "12.1"),
                                         "dev_root": str(tmp_path), "sysfs_root": str(tmp_path)})
    assert result["ok"] and result["backend"] == "nccl" and result["nproc_per_node"] == 2


def test_amd_gpus_counted_from_kfd_topology(run_module, tmp_path):
    nodes = tmp_path / "class/kfd/kfd/topology/nodes"
    for index, simd in enumerate((0, 304, 304)):  # node 0 is the CPU
        (nodes / str(index)).mkdir(parents=True)
        (nodes / str(index) / "properties").write_text("cpu_cores_count 0\nsimd_count %d\n" % simd)
    result, _ = run_module(torch_probe, {"python": VENV_PYTHON, "dev_root": str(tmp_path),
                                         "sysfs_root": str(tmp_path)})
    assert result["accelerators"]["amd"] == 2


def test_cuda_launch_blocking_known_hang(run_module, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    result, _ = run_module(torch_probe, {"python": fake_python(tmp_path, "1.13.1", "11.7"),
                                         "dev_root": str(tmp_path), "sysfs_root": str(tmp_path)})
    check = result["checks"]["torch_cuda_launch_blocking"]
    assert check["status"] == "fail" and "issue 750" in check["fix"]
    result, _ = run_module(torch_probe, {"python": fake_python(tmp_path, "2.1.0", "12.1"),
                                         "dev_root": str(tmp_path), "sysfs_root": str(tmp_path)})
    assert "torch_cuda_launch_blocking" not in result["checks"]
