# -*- coding: utf-8 -*-
"""Signatures of the node's GPUs as a job meets them: the NVSwitch fabric, two ranks on one GPU, a GPU that needs a
reset, and a driver that does not match the job's CUDA."""

from __future__ import annotations

from cluster_preflight.capabilities.allreduce.signature_table import sig


def _nvls_cause(facts):
    err = facts.get("err")
    return ("NCCL's NVLink SHARP (NVLS) setup on the NVSwitches failed with a CUDA error%s in transport/nvls.cc: "
            "usually the fabric manager was restarted while processes held GPU resources (the multicast objects are "
            "stale) or is in an error state; a driver older than the CUDA runtime's multicast support, or a virtual "
            "machine without multicast, fail the same way. The fabric manager's status and log (restarted? an error?) "
            "and the driver against the CUDA version tell them apart; NCCL_NVLS_ENABLE=0 gets the job past it without "
            "NVLS" % (" ('%s')" % err.strip() if err else ""))


def _dup_cause(facts):
    first, second, bus = facts.get("rank_a"), facts.get("rank_b"), facts.get("busid")
    who = "ranks %s and %s" % (first, second) if first and second else "two ranks"
    return ("%s of one node opened the same GPU%s: the job's code chooses the device - a device fixed in the code, a "
            "launcher that gives every rank the same CUDA_VISIBLE_DEVICES, or more ranks on the node than GPUs; "
            "every rank must select its own GPU (torch.cuda.set_device(LOCAL_RANK)) before NCCL starts" % (
                who, " (bus id %s)" % bus if bus else ""))


ROWS = (
    sig("fabric_not_initialized", (
        r"system not yet initialized|cudaErrorSystemNotReady|CUDA_ERROR_SYSTEM_NOT_READY",
        r"(?:[Cc]uda|CUDA)[^\n]*?\b(?:error|code)\s*[=(]?\s*802\b"),
        "CUDA reports the system not yet initialized (cudaErrorSystemNotReady, 802): on an NVSwitch system (HGX/DGX "
        "A100, H100, H200, B200) the fabric manager (nvidia-fabricmanager) is not running or has not finished "
        "configuring the NVSwitch fabric, so no CUDA context can be made; on a system without NVSwitches the driver "
        "is still initialising (a GPU being reset)",
        "start and enable nvidia-fabricmanager (the same version as the driver) and wait until every GPU's fabric "
        "state is Completed (nvidia-smi -q, Fabric section); gpu_health.fabric_manager and gpu_health.gpu_fabric "
        "check the service and every GPU's fabric state before the job", "fail", "nvswitch", level="cause"),
    sig("nvls_failure", (
        r"nvls\.cc:\d+ NCCL WARN Cuda failure (?:\d+ )?'(?P<err>[^'\n]*)",
        r"nvls\.cc:\d+ NCCL WARN (?P<err>[^\n]*)"),
        _nvls_cause,
        "reset the GPUs after a fabric-manager restart (stop nvidia-fabricmanager, nvidia-smi -r, start it again) "
        "or reboot the node; keep the driver, the fabric manager and the CUDA runtime at supported versions; "
        "gpu_health.fabric_manager and gpu_health.gpu_fabric check the service and the fabric state before the job",
        "fail", "nvswitch", level="cause"),
    sig("duplicate_gpu",
        r"Duplicate GPU detected\s*:\s*rank (?P<rank_a>\d+) and rank (?P<rank_b>\d+) both on CUDA device "
        r"(?P<busid>[0-9a-fA-F]+)",
        _dup_cause,
        "fix the job: select the device from LOCAL_RANK in the training script (not a fixed cuda:N), check each rank's "
        "CUDA_VISIBLE_DEVICES and that ranks per node do not exceed GPUs per node; job_env.visible_devices checks "
        "the CUDA_VISIBLE_DEVICES of preflight_job_env before the job, the script's own choice no node check can "
        "see", "fail", "duplicate_gpu", level="cause"),
    sig("gpu_unavailable", (
        r"(?P<what>busy or unavailable|cudaErrorDevicesUnavailable)",
        # nvidia-smi -q prints the field on every GPU ("Reset Required : No"): only a value other than No / N/A counts.
        r"(?P<what>[Rr]eset [Rr]equired(?!\s*:\s*(?:No|N/A)\b)|requires? (?:a )?reset|NV_ERR_RESET_REQUIRED|GPU is lost|"
        r"fallen off the bus)",
        r"(?P<what>uncorrectable ECC error encountered|cudaErrorECCUncorrectable)"),
        lambda facts: ("a GPU of this node is unusable ('%s'): in a reset-required state after an unrecoverable error "
                       "(NV_ERR_RESET_REQUIRED, Xid 79 / 74 / 48 / 94 / 95), fallen off the bus, or - for 'busy or "
                       "unavailable' - held by another process while in exclusive-process compute mode; nvidia-smi -q "
                       "(GPU Reset Status / Recovery Action) and dmesg's NVRM lines tell them apart"
                       % facts.get("what", "")),
        "drain the node, stop what holds the GPU, reset it (`nvidia-smi -r -i <gpu>`) or reboot, and read dmesg "
        "for the Xid; gpu_health.reset_required, gpu_health.gpu_lost and gpu_health.xid check the GPUs before the job",
        "fail", "gpu_reset", level="cause"),
    sig("cuda_driver_too_old", (
        r"CUDA driver version is insufficient for CUDA runtime version|cudaErrorInsufficientDriver",
        r"NVIDIA driver on your system is too old",
        r"forward compatibility was attempted on non supported HW"),
        "the NVIDIA driver on this node is older than the CUDA runtime the job uses (torch's CUDA build, or the CUDA "
        "in the job's container): CUDA cannot start",
        "upgrade the driver (nvidia-smi's 'CUDA Version' must be at least torch.version.cuda) or run a torch built for "
        "the driver's CUDA; allreduce.versions compares torch / CUDA / NCCL across the nodes before the job",
        "fail", "versions", level="cause"),
    sig("driver_library_mismatch",
        r"Driver/library version mismatch|API mismatch: the NVIDIA kernel module has version",
        "the NVIDIA kernel module loaded on this node and the user-space driver library differ (the driver was "
        "upgraded and the node not rebooted, or a container brings its own libcuda / NVML)",
        "reboot the node (or unload and reload the nvidia modules) after a driver upgrade, and let the container "
        "runtime inject the host's driver libraries; gpu_health reads nvidia-smi before the job and fails when it "
        "cannot", "fail", "versions", level="cause", checks=("gpu_health.count", "allreduce.versions")),
)
