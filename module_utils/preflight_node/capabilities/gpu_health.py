# -*- coding: utf-8 -*-
"""Capability ``gpu_health``, the node half: what the GPUs of a node say about their own health.

``read`` runs, each once and bounded: ``nvidia-smi -q -x`` (ECC, row remapping, clock event reasons,
PCIe link, the NVSwitch fabric state, the reset status; and the GPUs it says it cannot reach), ``amd-smi static`` +
``amd-smi metric`` (or rocm-smi), the kernel log since boot (Xid and SXid lines, and the messages of a GPU lost
without one) and, when asked, ``dcgmi diag``; it also counts the GPUs on the PCI bus (sysfs, the scan of ``iommu``)
so the controller can tell a GPU the driver lost, and lists the NVSwitches there with the fabric manager's state
(``gpu/nvswitch.py``).  A missing tool is a fact (``present: False``); a tool that fails, times out or prints what
cannot be parsed is an ``error`` text naming the command; nothing raises.  The parsers are ``nvidia_smi_xml``,
``amd_smi``, ``xid_log`` and ``dcgm``; the decisions are in ``cluster_preflight/capabilities/gpu_health/``.
"""

from __future__ import annotations

from ..gpu import amd_smi, dcgm, xid_log as kernel_log, nvidia_smi_xml, nvlink, nvswitch
from .iommu import read_pci
from ..privilege import denied, privileged

CAPABILITY = "gpu_health"

ROCM_SMI = "rocm-smi"
JOURNALCTL = ["journalctl", "-k", "-b", "--no-pager", "-o", "short-monotonic"]
DMESG = ["dmesg"]
KERNEL_LOG_SOURCES = ("auto", "journalctl", "dmesg", "none")
OUTPUT_LIMIT = 300
NO_DEVICES = "no devices were found"
# journalctl without the systemd-journal or adm group shows the user's own entries and says so on stderr.
_JOURNAL_HIDDEN = ("not seeing messages from other users", "no journal files were found")


def _trim(text):
    text = " ".join(str(text or "").split())
    return text if len(text) <= OUTPUT_LIMIT else text[:OUTPUT_LIMIT] + "..."


def run_tool(ops, argv, timeout):
    """``(rc, out, err, error)`` of one command; ``error`` is None when it exited 0, else a text naming the
    argv, the exit status and what it printed."""
    rc, out, err = ops.run(argv, timeout=timeout)
    if rc == 0:
        return rc, out, err, None
    why = "timed out after %s s" % timeout if rc == 124 else "exited %s" % rc
    return rc, out, err, "%s %s: %s" % (" ".join(argv), why, _trim(err or out) or "no output")


def read_nvidia(args, ops):
    """``{present, program, error, driver_version, cuda_version, gpus, unavailable}`` from one ``nvidia-smi -q -x``;
    ``unavailable``: the GPUs nvidia-smi could not reach, with its reason (lost, needs a reset)."""
    facts = {"present": False, "program": None, "error": None, "driver_version": None, "cuda_version": None,
             "gpus": [], "unavailable": []}
    program = ops.which(args.get("nvidia_smi") or "nvidia-smi")
    if not program:
        return facts
    facts.update(present=True, program=program)
    argv = [program, "-q", "-x"]
    rc, out, err, error = run_tool(ops, argv, args["tool_timeout"])
    out, facts["unavailable"] = nvidia_smi_xml.unavailable_gpus(out)
    err, more = nvidia_smi_xml.unavailable_gpus(err)
    facts["unavailable"] += [entry for entry in more if entry not in facts["unavailable"]]
    if error and NO_DEVICES in (out + err).lower():
        return facts  # the driver runs and sees no GPU: the count check compares with the PCI bus
    # A GPU nvidia-smi cannot reach makes it exit non-zero after the document of the others: they still count.
    if error and not (facts["unavailable"] and rc != 124 and "<nvidia_smi_log" in out):
        facts["error"] = error
        return facts
    try:
        facts.update(nvidia_smi_xml.parse(out))
    except ValueError as exc:
        facts["error"] = "%s printed what is not nvidia-smi's XML: %s; output starts %r" % (
            " ".join(argv), exc, out[:120])
        return facts
    if len(facts["gpus"]) >= 2:
        facts["nvlink_error"] = read_nvlink(program, facts["gpus"], ops, args["tool_timeout"])
    return facts


def read_nvlink(program, gpus, ops, timeout):
    """Each GPU's ``nvlink`` (``{active, inactive, gbps, note}``, None when not listed) from ``nvidia-smi nvlink -s``;
    returns an error text, or None."""
    argv = [program] + nvlink.ARGV
    rc, out, _err, error = run_tool(ops, argv, timeout)
    try:
        listed = nvlink.parse(out)
    except ValueError as exc:
        return error or "%s: %s" % (" ".join(argv), exc)
    # Some drivers exit non-zero where they answer a GPU with a sentence (MIG, no NVLink): the answer counts.
    if error and (rc == 124 or not listed):
        return error
    found = nvlink.match(gpus, listed)
    for gpu in gpus:
        entry = found.get(gpu.get("index"))
        gpu["nvlink"] = None if entry is None else {key: entry[key] for key in nvlink.FIELDS}
    return None


def read_amd(args, ops):
    """``{present, program, error, driver_version, gpus}`` from amd-smi (static + metric), else rocm-smi."""
    facts = {"present": False, "program": None, "error": None, "driver_version": None, "gpus": []}
    program = ops.which(args.get("amd_smi") or "amd-smi")
    rocm = None if program else ops.which(args.get("rocm_smi") or ROCM_SMI)
    if not program and not rocm:
        return facts
    facts.update(present=True, program=program or rocm)
    timeout = args["tool_timeout"]
    try:
        if program:
            _rc, static, _err, error = run_tool(ops, [program, "static", "--json"], timeout)
            if not error:
                _rc, metric, _err, error = run_tool(ops, [program, "metric", "--ecc", "--pcie", "--json"], timeout)
            if not error:
                facts["gpus"] = amd_smi.parse(static, metric)
        else:
            _rc, out, _err, error = run_tool(ops, [rocm, "--showallinfo", "--json"], timeout)
            if not error:
                facts["gpus"] = amd_smi.parse_rocm_smi(out)
    except ValueError as exc:
        error = "%s: %s" % (facts["program"], exc)
    facts["error"] = error
    facts["driver_version"] = next((gpu["driver_version"] for gpu in facts["gpus"] if gpu["driver_version"]), None)
    return facts


def _journal(ops, program, timeout):
    """``(text, error)`` of the kernel log from journalctl; an error when it hid the kernel's entries."""
    rc, out, err, error = run_tool(ops, [program] + JOURNALCTL[1:], timeout)
    if error is None and any(hint in err.lower() for hint in _JOURNAL_HIDDEN):
        error = "%s: %s" % (" ".join([program] + JOURNALCTL[1:]), _trim(err))
    return out, error


def read_kernel_log(args, ops, is_privileged):
    """``{source, error, needs_root, events}``: the Xid/SXid events of the kernel log since boot."""
    wanted = args.get("kernel_log") or "auto"
    facts = {"source": None, "error": None, "needs_root": False, "events": [], "lost": []}
    if wanted == "none":
        facts["source"] = "none"
        return facts
    errors = []
    for name, argv in (("journalctl", JOURNALCTL), ("dmesg", DMESG)):
        if wanted not in ("auto", name):
            continue
        program = ops.which(name)
        if not program:
            errors.append("%s is not installed" % name)
            continue
        if name == "journalctl":
            text, error = _journal(ops, program, args["tool_timeout"])
        else:
            _rc, text, _err, error = run_tool(ops, [program] + argv[1:], args["tool_timeout"])
        if error is None:
            facts.update(source=name, events=kernel_log.events(text), lost=kernel_log.lost(text))
            return facts
        errors.append(error)
    facts["error"] = "; ".join(errors) or "no kernel log source"
    facts["needs_root"] = not is_privileged and any(denied(text) or "not seeing messages" in text
                                                    for text in errors)
    return facts


def read_dcgm(args, ops):
    """``{present, level, error, results}`` of ``dcgmi diag -r <level> -j`` (level 0: not run)."""
    level = int(args.get("dcgm_level") or 0)
    facts = {"present": False, "level": level, "error": None, "results": []}
    program = ops.which(args.get("dcgmi") or "dcgmi") if level > 0 else None
    if not program:
        return facts
    facts["present"] = True
    argv = [program, "diag", "-r", str(level), "-j"]
    rc, out, err, error = run_tool(ops, argv, args["dcgm_timeout"])
    if rc == 124:
        facts["error"] = error
        return facts
    try:
        # dcgmi exits non-zero when a test fails but still prints its JSON: the results are the answer.
        facts["results"] = dcgm.parse(out)
    except ValueError as exc:
        facts["error"] = "%s: %s (exit status %s; %s)" % (" ".join(argv), exc, rc, _trim(err or out) or "no output")
    return facts


def any_gpu(facts):
    """Whether the PCI bus shows a GPU or a GPU tool is installed."""
    pci = facts.get("pci") or {}
    return bool(pci.get("nvidia_gpus") or pci.get("amd_gpus") or pci.get("error")
                or (facts.get("nvidia") or {}).get("present") or (facts.get("amd") or {}).get("present"))


def read(args, ops):
    """``{nvidia, amd, pci, nvswitch, xid, dcgm, privileged, needs_root}`` (see the module docstring)."""
    root = privileged()
    facts = {"pci": read_pci(args.get("sysfs_root") or "/sys"), "nvidia": read_nvidia(args, ops),
             "amd": read_amd(args, ops), "privileged": root, "nvswitch": nvswitch.read(args, ops)}
    if any_gpu(facts):
        facts["xid"], facts["dcgm"] = read_kernel_log(args, ops, root), read_dcgm(args, ops)
    else:
        # A node with no GPU and no GPU tool: no Xid to look for, nothing for DCGM (a big journal costs seconds).
        facts["xid"] = {"source": None, "error": None, "needs_root": False, "events": [], "lost": [],
                        "skipped": "no GPU"}
        facts["dcgm"] = {"present": False, "level": int(args.get("dcgm_level") or 0), "error": None, "results": []}
    # What a reader without root was refused (see privilege.py): here the kernel log, not a file.
    facts["needs_root"] = ([{"path": "kernel log", "error": facts["xid"]["error"]}]
                           if facts["xid"]["needs_root"] else [])
    return facts
