# -*- coding: utf-8 -*-
"""``scripts/gpu-check``: this machine's NVIDIA GPUs checked end to end, in one bounded command, every output under
one folder (docs/gpu-check.md).

Steps, each bounded, each recorded in ``summary.json`` / ``summary.txt``:

1. ``gpus``: ``nvidia-smi --query-gpu`` lists the GPUs; none (no driver, no GPU, a hung driver) ends the run at
   once with exit status 2.
2. ``capture``: the raw outputs of nvidia-smi (``-q -x``, ``-q``, ``nvlink -s``, ``topo -m``), the kernel log's GPU
   lines, ``dcgmi diag -r 1 -j``, the RDMA sysfs tree, under ``raw/`` with a manifest (for a corpus of real
   outputs).
3. ``readers``: the ``gpu_health`` and ``fabric`` readers as a node call runs them (``readers.json``), then their
   deciders (``checks.json``, ``checks.txt``).
4. ``torch``: the training Python's torch sees CUDA devices (else exit 2: nothing for NCCL to run on).
5. ``gate``: the embedded gate (``preflight.yml`` through ansible-runner) on this machine alone with
   ``allreduce_backend=nccl``, one rank per GPU (world size 1 on a one-GPU machine: its bandwidth is a copy on one
   GPU, reported, never a failure for lack of peers); its run directory is ``gate/``.
6. ``nccl``: the NCCL lines of the ranks' logs that say which transport NCCL chose (``nccl.txt``).

Exit status: 0 every step ran and the gate passed; 1 a step failed or the gate did not pass; 2 no GPU (or torch
sees none); 3 the machine lacks what the run needs (Ansible's wheels, ``--budget`` spent); 4 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

from . import gpu_check_capture as capture

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NODE = {"name": "localhost", "ansible_host": "127.0.0.1", "node_addr": "127.0.0.1", "user": "root", "ssh_port": 22}
EXIT_PASS, EXIT_STEP, EXIT_NO_GPU, EXIT_MISSING, EXIT_USAGE = 0, 1, 2, 3, 4
TORCH_PROBE = ("import json, torch\n"
               "cuda = torch.cuda.is_available()\n"
               "count = torch.cuda.device_count() if cuda else 0\n"
               "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'available': cuda,\n"
               "    'count': count, 'names': [torch.cuda.get_device_name(i) for i in range(count)],\n"
               "    'nccl': '.'.join(map(str, torch.cuda.nccl.version())) if cuda else None}))\n")
NCCL_LINE = re.compile(r"NCCL INFO .*(Using network|NET/|via P2P|via SHM|via NET|P2P/|Init COMPLETE|NCCL version"
                       r"|Channel \d+/\d+ :|Connected all|nranks \d+)")
NCCL_LINES_MAX = 400


class Steps(object):
    """The record of the run: each step's status, seconds and what it found."""

    def __init__(self, out, budget):
        self.out, self.start, self.budget, self.rows = out, time.monotonic(), budget, []

    def left(self):
        return self.budget - (time.monotonic() - self.start)

    def record(self, name, status, found, started, **details):
        row = dict({"step": name, "status": status, "found": found,
                    "seconds": round(time.monotonic() - started, 1)}, **details)
        self.rows.append(row)
        sys.stderr.write("gpu-check: %-8s %-7s %s\n" % (name, status, found))
        sys.stderr.flush()
        return row

    def finish(self, code, headline):
        summary = {"exit": code, "headline": headline, "seconds": round(time.monotonic() - self.start, 1),
                   "out": self.out, "steps": self.rows}
        with open(os.path.join(self.out, "summary.json"), "w") as handle:
            json.dump(summary, handle, indent=1)
        lines = ["gpu-check: %s (exit %d, %.1f s)" % (headline, code, summary["seconds"])]
        lines += ["  %-8s %-7s %5.1f s  %s" % (row["step"], row["status"], row["seconds"], row["found"])
                  for row in self.rows]
        with open(os.path.join(self.out, "summary.txt"), "w") as handle:
            handle.write("\n".join(lines) + "\n")
        print("\n".join(lines))
        return code


def role_defaults(role):
    import yaml  # pylint: disable=import-outside-toplevel  (PyYAML comes with every Python the project runs on)
    with open(os.path.join(ROOT, "roles", role, "defaults", "main.yml")) as handle:
        return yaml.safe_load(handle)


def _write_json(path, value):
    with open(path, "w") as handle:
        json.dump(value, handle, indent=1, sort_keys=True)
        handle.write("\n")


def readers_step(steps, args):
    """The readers on this machine, then their deciders; ``(facts, missing)`` (``missing``: what Ansible lacks)."""
    started = time.monotonic()
    gpu_settings = dict(role_defaults("gpu_health"), gpu_health_nvidia_smi=args.nvidia_smi)
    fabric_settings = role_defaults("fabric")
    try:
        from cluster_preflight.capabilities import fabric, gpu_health  # pylint: disable=import-outside-toplevel
    except ImportError as exc:
        steps.record("readers", "failed", "the deciders need ansible-core (%s): install the wheels "
                     "(docs/gpu-check.md)" % exc, started)
        return None, str(exc)
    facts = capture.read_node(gpu_settings, fabric_settings, NODE,
                              {"gpu_health": gpu_health.read_args, "fabric": fabric.read_args})
    _write_json(os.path.join(args.out, "readers.json"), facts)
    checks = {"gpu_health": gpu_health.decide(NODE["name"], facts["gpu_health"], gpu_settings),
              "fabric": fabric.decide(NODE["name"], facts["fabric"], fabric_settings, probe=None,
                                      cluster={"facts": {NODE["name"]: facts["fabric"]},
                                               "settings": {NODE["name"]: fabric_settings}})}
    _write_json(os.path.join(args.out, "checks.json"), checks)
    lines = ["%s.%s %s: %s%s" % (capability, name, check["status"], check["found"],
                                 "\n    fix: %s" % check["fix"] if check.get("fix") else "")
             for capability, found in checks.items() for name, check in sorted(found.items())]
    with open(os.path.join(args.out, "checks.txt"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    worst = [name for capability, found in checks.items() for name, check in found.items()
             if check["status"] == "fail"]
    steps.record("readers", "ok", "%d GPU(s) read, %d RDMA device(s); checks: %s" % (
        len((facts["gpu_health"].get("nvidia") or {}).get("gpus") or []), len(facts["fabric"].get("devices") or {}),
        ", ".join("%s %s" % (name, check["status"]) for name, check in sorted(checks["gpu_health"].items()))),
        started, failed_checks=worst)
    return facts, None


def torch_step(steps, args):
    """The training Python's view of CUDA; the parsed probe, or None when it sees no device."""
    started = time.monotonic()
    try:
        proc = subprocess.run([args.training_python, "-c", TORCH_PROBE], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=min(120, max(steps.left(), 1)), check=False)
    except subprocess.TimeoutExpired:
        steps.record("torch", "failed", "%s did not import torch and answer within 120 s" % args.training_python,
                     started)
        return None
    except OSError as exc:
        steps.record("torch", "failed", "cannot run %s: %s" % (args.training_python, exc), started)
        return None
    try:
        found = json.loads(proc.stdout.decode(errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        error = (proc.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        steps.record("torch", "failed", "%s cannot import torch: %s" % (args.training_python, error[-300:]), started)
        return None
    if not found["count"]:
        steps.record("torch", "failed", "torch %s in %s sees no CUDA device (CUDA %s): NCCL has nothing to run on" % (
            found["torch"], args.training_python, found["cuda"]), started, torch=found)
        return None
    steps.record("torch", "ok", "torch %s, CUDA %s, NCCL %s, %d device(s): %s" % (
        found["torch"], found["cuda"], found["nccl"], found["count"], ", ".join(found["names"])), started, torch=found)
    return found


def _ansible_playbook(out):
    """A folder to put first on PATH so ansible-runner finds ``ansible-playbook``, or None when it is on PATH.
    Wheels installed with ``pip --target`` leave it in ``<target>/bin`` (not on PATH); without it, a shim in
    ``<out>/bin`` runs ansible's own command with this Python."""
    import shutil  # pylint: disable=import-outside-toplevel
    if shutil.which("ansible-playbook"):
        return None
    import ansible  # pylint: disable=import-outside-toplevel
    beside = os.path.join(os.path.dirname(os.path.dirname(ansible.__file__)), "bin")
    if os.access(os.path.join(beside, "ansible-playbook"), os.X_OK):
        return beside
    folder = os.path.join(out, "bin")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    shim = os.path.join(folder, "ansible-playbook")
    with open(shim, "w") as handle:
        handle.write('#!/bin/sh\nexec "%s" -m ansible.cli.playbook "$@"\n' % sys.executable)
    os.chmod(shim, 0o700)
    return folder


def _free_port():
    """A TCP port free on 127.0.0.1 now (the gate's rendezvous port: another service may hold the default)."""
    import socket  # pylint: disable=import-outside-toplevel
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def gate_inventory(args, folder):
    """This machine alone, over the local connection, its ranks on the training Python."""
    import yaml  # pylint: disable=import-outside-toplevel
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            "preflight_training_python": args.training_python, "preflight_node_addr": "127.0.0.1",
            "preflight_socket_ifname": "lo"}
    path = os.path.join(folder, "inventory.yml")
    with open(path, "w") as handle:
        yaml.safe_dump({"all": {"children": {"cluster": {"hosts": {"localhost": host}}}}}, handle)
    return path


def _gate_found(verdict):
    allreduce = verdict.raw.get("allreduce") or {}
    sizes = allreduce.get("sizes") or []
    largest = max(sizes, key=lambda row: row.get("size_bytes", 0)) if sizes else {}
    checks = ((verdict.raw.get("nodes") or {}).get("localhost") or {}).get("checks") or {}
    transport = ((checks.get("allreduce.signatures") or {}).get("details") or {}).get("transport")
    world = allreduce.get("world_size")
    text = "verdict %s; all-reduce %s, backend %s, world size %s" % (
        verdict.status, allreduce.get("status"), allreduce.get("backend"), world)
    if largest and world == 1:
        text += (", algbw %.3f GB/s at %d bytes (world size 1: a copy on one GPU, no link between GPUs measured, "
                 "busbw not measured)" % (largest.get("algbw_gbps", 0), largest.get("size_bytes", 0)))
    elif largest:
        text += ", busbw %.3f GB/s (algbw %.3f GB/s) at %d bytes" % (
            largest.get("busbw_gbps", 0), largest.get("algbw_gbps", 0), largest.get("size_bytes", 0))
    if transport:
        text += "; NCCL transport %s" % transport
    failed = ["%s %s" % (finding.check, finding.status) for finding in verdict.findings if finding.status == "fail"]
    return text + ("; failed: %s" % ", ".join(failed) if failed else "")


def gate_step(steps, args):
    """The embedded gate on this machine; the verdict, or None."""
    started = time.monotonic()
    if steps.left() < 60:
        steps.record("gate", "skipped", "less than 60 s of --budget left", started)
        return None
    try:
        from cluster_preflight.cli import playbooks  # pylint: disable=import-outside-toplevel
        import ansible_runner  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
        extra_path = _ansible_playbook(args.out)
    except ImportError as exc:
        steps.record("gate", "failed", "the gate needs ansible-core and ansible-runner (%s): install the wheels "
                     "(docs/gpu-check.md)" % exc, started)
        return None
    folder = os.path.join(args.out, "gate")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    extravars = {"allreduce_backend": args.backend, "gpu_health_nvidia_smi": args.nvidia_smi,
                 "preflight_master_port": _free_port()}
    if args.job_user:
        extravars["preflight_job_user"] = args.job_user
    if not os.path.isdir("/run"):
        extravars["preflight_lock_dir"] = os.path.join(folder, "lock")
        os.makedirs(extravars["preflight_lock_dir"], mode=0o700, exist_ok=True)
    if extra_path:
        os.environ["PATH"] = os.pathsep.join([extra_path, os.environ.get("PATH", "")])
    try:
        result = playbooks.run_playbook("preflight.yml", inventory=gate_inventory(args, folder), extravars=extravars,
                                        results_dir=os.path.join(folder, "results"),
                                        timeout=int(max(steps.left() - 30, 30)))
    except playbooks.UsageError as exc:
        steps.record("gate", "failed", "the gate could not start: %s" % exc, started)
        return None
    if result.verdict is None:
        steps.record("gate", "failed", "no verdict (exit %d): %s" % (result.exit_code, result.error), started,
                     summary=result.summary[-20:] if isinstance(result.summary, list) else None)
        return None
    steps.record("gate", "ok" if result.verdict.passed else "failed", _gate_found(result.verdict), started,
                 verdict=result.verdict.path, exit=result.exit_code)
    return result.verdict


def nccl_step(steps, args, verdict):
    """NCCL's own INFO lines from the ranks' logs of the gate's run directory (``nccl.txt``)."""
    started = time.monotonic()
    run_dir = verdict.run_dir
    found = []
    for name in sorted(os.listdir(run_dir)):
        if not name.endswith(".log"):
            continue
        with open(os.path.join(run_dir, name), errors="replace") as handle:
            found.extend("%s: %s" % (name, line.rstrip()) for line in handle if NCCL_LINE.search(line))
    with open(os.path.join(args.out, "nccl.txt"), "w") as handle:
        handle.write("".join(line + "\n" for line in found[:NCCL_LINES_MAX]))
    # The channels between ranks say what carried the data; "Using network" what NCCL would use between nodes; a
    # plugin's "NET/IB : Using [RO]" after "No device found" says neither.
    transport = next((line for pattern in (r"via (P2P|SHM|NET)", r"Using network", r"NET/\S+ : Using \[\d")
                      for line in found if re.search(pattern, line)), None)
    if transport is None:
        # One rank has no peer to connect to: NCCL may print no transport at all, which says nothing of the machine.
        alone = ((getattr(verdict, "raw", None) or {}).get("allreduce") or {}).get("world_size") == 1
        steps.record("nccl", "failed" if args.backend == "nccl" and not alone else "skipped",
                     "no NCCL transport line in the ranks' logs of %s (%d NCCL lines%s)" % (
                         run_dir, len(found), "; world size 1: no peer to connect to" if alone else ""), started)
        return
    steps.record("nccl", "ok", transport.split(": ", 1)[1].strip(), started, lines=len(found))


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="output folder (default results/gpu-check-<UTC time>)")
    parser.add_argument("--budget", type=int, default=420, help="seconds for the whole run (default 420)")
    parser.add_argument("--training-python", default=sys.executable,
                        help="the Python whose torch runs the ranks (default: this one, %s)" % sys.executable)
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="nvidia-smi, by name on PATH or its path")
    parser.add_argument("--job-user", default="root",
                        help="the account the ranks run as (default root; '' lets the gate choose)")
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl",
                        help="gloo runs the gate's ranks on CPU: a check of everything but the GPUs' own run")
    args = parser.parse_args(argv)
    if args.budget < 30:
        parser.error("--budget must be 30 seconds or more")
    args.out = os.path.abspath(args.out or os.path.join(
        ROOT, "results", "gpu-check-%s" % time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())))
    return args


def own_folder(path):
    """Create ``path`` (0700) or accept it only when it is a real folder of ours no one else can write: the run
    writes and runs files there, often as root, so a folder another account controls is refused.  Returns why not,
    or None."""
    import stat  # pylint: disable=import-outside-toplevel
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        found = os.lstat(path)
    except OSError as exc:
        return "cannot create %s: %s" % (path, exc.strerror or exc)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid() or found.st_mode & 0o022:
        return ("%s is not a folder of this user that only it can write (owner uid %d, mode %o): choose another "
                "--out" % (path, found.st_uid, stat.S_IMODE(found.st_mode)))
    return None


def main(argv=None):
    try:
        args = parse_args(argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code else EXIT_PASS
    refused = own_folder(args.out)
    if refused:
        sys.stderr.write("gpu-check: %s\n" % refused)
        return EXIT_USAGE
    steps = Steps(args.out, args.budget)
    started = time.monotonic()
    gpus, why = capture.find_gpus(args.nvidia_smi)
    if not gpus:
        steps.record("gpus", "failed", "no GPU: %s" % why, started)
        return steps.finish(EXIT_NO_GPU, "NO GPU: %s" % why)
    steps.record("gpus", "ok", "%d GPU(s): %s" % (len(gpus), ", ".join(
        "%d %s (%s)" % (gpu["index"], gpu["name"], gpu["bus_id"]) for gpu in gpus)), started)
    started = time.monotonic()
    manifest = capture.capture_all(args.out, args.nvidia_smi)
    steps.record("capture", "ok", "%d commands captured under %s (%d exited non-zero)" % (
        len(manifest), os.path.join(args.out, "raw"), sum(1 for row in manifest if row["rc"])), started)
    _facts, missing = readers_step(steps, args)
    if args.backend == "nccl" and torch_step(steps, args) is None:
        return steps.finish(EXIT_NO_GPU, "NO CUDA DEVICE for torch (%s): the gate's NCCL run did not start"
                            % args.training_python)
    if missing:
        return steps.finish(EXIT_MISSING, "MISSING ansible-core/ansible-runner: %s" % missing)
    verdict = gate_step(steps, args)
    if verdict is not None:
        nccl_step(steps, args, verdict)
    failed = [row["step"] for row in steps.rows if row["status"] == "failed"]
    if verdict is not None and verdict.passed and not failed:
        return steps.finish(EXIT_PASS, "PASS: %d GPU(s) checked; outputs in %s" % (len(gpus), args.out))
    if verdict is None and steps.left() < 60:
        return steps.finish(EXIT_MISSING, "OUT OF TIME: --budget %d s spent before the gate" % args.budget)
    return steps.finish(EXIT_STEP, "FAILED steps: %s; outputs in %s" % (", ".join(failed) or "gate", args.out))


if __name__ == "__main__":
    sys.exit(main())
