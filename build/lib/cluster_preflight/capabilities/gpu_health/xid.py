# -*- coding: utf-8 -*-
"""Controller layer: THE table of NVIDIA Xid and NVSwitch SXid codes -> severity, cause and fix.

The kernel log lines come from the node half (``module_utils/preflight_node/gpu/xid_log.py``);
``cluster_preflight/capabilities/gpu_health/`` judges them through :func:`classify` only.  The causes
and actions follow NVIDIA's Xid catalog (https://docs.nvidia.com/deploy/xid-errors/); a code missing
here is a ``warn`` that names it and points there.  Operators accept codes with ``gpu_health_xid_ignore``
and downgrade them with ``gpu_health_xid_warn_only``.
"""

from __future__ import annotations

CATALOG = "https://docs.nvidia.com/deploy/xid-errors/"
RESET = "drain the node, reset the GPU (nvidia-smi -r -i <index>, or reboot the node)"
RMA = "if it comes back after a reset, open an RMA for the GPU with the nvidia-bug-report.sh output"

# code -> (severity, cause, fix)
XID = {
    13: ("warn", "graphics engine exception (usually the application: out-of-range access, illegal instruction)",
         "check the job that ran on the GPU; if no application fault explains it, run dcgmi diag -r 3 on the GPU"),
    31: ("warn", "GPU memory page fault (usually the application: invalid address)",
         "check the job that ran on the GPU; run compute-sanitizer on it if it repeats"),
    32: ("warn", "invalid or corrupted push buffer stream (driver, application or PCIe corruption)",
         "check the job that ran on the GPU; if it repeats with other jobs, check the PCIe link and reseat"),
    43: ("warn", "GPU stopped processing (the application hit a fault)",
         "check the job that ran on the GPU; nothing to do on the node if the application explains it"),
    45: ("warn", "preemptive cleanup after an earlier error or a killed process",
         "look at the Xid lines before it; on its own it follows a job that was killed"),
    48: ("fail", "double bit (uncorrectable) ECC error in GPU memory", "%s; %s" % (RESET, RMA)),
    61: ("fail", "internal micro-controller breakpoint/warning", "%s; %s" % (RESET, RMA)),
    62: ("fail", "internal micro-controller halt", "%s; %s" % (RESET, RMA)),
    63: ("fail", "ECC page retirement or row remapping recorded: the remap applies at the next GPU reset",
         "%s to apply the remap; if it repeats, %s" % (RESET, RMA.replace("if it comes back after a reset, ", ""))),
    64: ("fail", "ECC page retirement or row remapping could not be recorded",
         "drain the node and open an RMA for the GPU (its memory cannot be repaired in the field)"),
    74: ("fail", "NVLink error",
         "check the NVLink state (nvidia-smi nvlink -s) and the NVSwitch/fabric manager logs, then %s" % RESET),
    79: ("fail", "GPU has fallen off the bus (it stopped answering on PCIe)",
         "drain the node, reboot it, reseat the GPU and check its power and riser; %s" % RMA),
    92: ("fail", "high single-bit ECC error rate", "%s; %s" % (RESET, RMA)),
    94: ("fail", "contained ECC error: the applications on the GPU were stopped",
         "%s so the memory is remapped; %s" % (RESET, RMA)),
    95: ("fail", "uncontained ECC error: every application on the GPU was stopped",
         "%s; %s" % (RESET, RMA)),
    109: ("warn", "context switch timeout (a hung kernel or the application)",
          "check the job that ran on the GPU; if it repeats with other jobs, %s" % RESET),
    119: ("fail", "GSP firmware RPC timeout", "%s; if it repeats, update the driver and %s" % (RESET, RMA)),
    120: ("fail", "GSP firmware error", "%s; if it repeats, update the driver and %s" % (RESET, RMA)),
    121: ("fail", "C2C (chip to chip) link error", "%s; %s" % (RESET, RMA)),
    140: ("fail", "unrecovered ECC error", "%s; %s" % (RESET, RMA)),
    143: ("fail", "GPU initialization failure", "reboot the node; %s" % RMA),
    154: ("fail", "GPU recovery action required (the line names it: reset or node reboot)",
          "do the recovery action the line names (nvidia-smi -q shows it under gpu_recovery_action), then re-run"),
}

# NVSwitch SXid codes seen on HGX systems -> (severity, cause); the line itself says Fatal or Non-fatal.
SXID = {
    12028: ("warn", "NVSwitch egress non-posted PRIV error (non-fatal)"),
    19084: ("fail", "NVSwitch link training failed (fatal)"),
    22013: ("warn", "NVSwitch minion link down (non-fatal)"),
    24007: ("fail", "NVSwitch sourcetrack crumbstore ECC double bit error (fatal)"),
}
SXID_FATAL_FIX = ("drain the node, restart nvidia-fabricmanager and reset the GPUs and NVSwitches (reboot the node); "
                  "if it repeats, open an RMA for the baseboard with the nvidia-bug-report.sh output")
SXID_WARN_FIX = "watch for it to repeat; if it does, check the NVLink cabling/trays and the fabric manager log"


def _sxid(event):
    code = event["code"]
    if code in SXID:
        severity, cause = SXID[code]
    else:
        text = event.get("text", "")
        fatal = ", Fatal," in text
        severity = "fail" if fatal else "warn"
        cause = "NVSwitch %s error" % ("fatal" if fatal else "non-fatal" if "Non-fatal" in text else "")
        cause = " ".join(cause.split())
    return severity, cause, SXID_FATAL_FIX if severity == "fail" else SXID_WARN_FIX


def classify(event, ignore=(), warn_only=()):
    """``{severity, cause, fix}`` of one kernel log event (``{kind, code, text}``): severity ``fail``,
    ``warn`` or ``ignore`` (an operator-accepted code)."""
    code = event["code"]
    if event.get("kind") == "sxid":
        severity, cause, fix = _sxid(event)
    elif code in XID:
        severity, cause, fix = XID[code]
    else:
        severity, cause = "warn", "Xid %d is not in this preflight's table" % code
        fix = "look Xid %d up in NVIDIA's Xid catalog (%s) and add it to gpu_health_xid_ignore if it is harmless" % (
            code, CATALOG)
    if code in ignore:
        severity = "ignore"
    elif code in warn_only and severity == "fail":
        severity = "warn"
    return {"severity": severity, "cause": cause, "fix": fix}
