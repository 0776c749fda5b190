"""What ``bench/real_outputs.py`` expects of each sample of a real-outputs corpus (``../shared/real-outputs``).

One row per sample, keyed by its path under the corpus, written from what the corpus's ``SOURCES.md`` says about
it (in this project's own words; no sample content is kept here):

* ``fault``: the checks the documented fault must trip, each with the statuses that name it (``fail``, or ``warn``
  where the fault is one the operator only watches).  Every other check of the sample must not warn or fail.
* ``unobserved``: checks the sample cannot feed (the tool reports the field as unavailable, or it was not captured):
  they must say so (``not_applicable``), never ``pass``.
* ``mentions``: a word a check's text must carry (a skipped DCGM test is reported, not dropped).
* ``parsed``: facts of the parse that must be read (True) or must stay unread (False): a driver version kept under
  rocm-smi's ``system`` key, a CUDA version the driver printed as "Not Found".

A sample that is not a format the gate reads (``nvidia-smi -q`` text, the plain ``nvidia-smi`` table, ``dcgmi diag``
text tables, ``rocm-smi`` text) is ``REFERENCE``: listed, not judged.  ``ibstat`` / ``ibstatus`` outputs are turned
into the ``/sys/class/infiniband`` tree they describe, which the gate does read.
"""

import collections

Expect = collections.namedtuple("Expect", "note fault unobserved mentions parsed")

FAIL = ("fail",)
WARN = ("warn",)
WARN_OR_FAIL = ("warn", "fail")
REFERENCE = "reference"

ECC, MEMORY, PCIE, PERSISTENCE = "gpu_health.ecc", "gpu_health.memory", "gpu_health.pcie", "gpu_health.persistence"
COUNT, NVLINK, XID, DCGM = "gpu_health.count", "gpu_health.nvlink", "gpu_health.xid", "gpu_health.dcgm"
PORTS, RATE, COUNTERS = "fabric.ports", "fabric.rate", "fabric.counters"
RESET, GPU_FABRIC, GPU_LOST = "gpu_health.reset_required", "gpu_health.gpu_fabric", "gpu_health.gpu_lost"
ROCE_GID = "fabric.roce_gid"
# The samples whose nvidia-smi predates the reset status (gpu_reset_status, gpu_recovery_action): not observed.
NO_RESET_STATUS = ("datakit_v100-pcie_460.39.xml", "netdata_a100-sxm4-mig.xml", "netdata_rtx-2080-win.xml",
                   "netdata_tesla-p100.xml", "pai_2xgtx1070_link-x1.xml", "pai_2xrtx2080ti.xml",
                   "pai_4xk80_ecc-retired.xml", "telegraf_quadro-p2000-v12.xml", "telegraf_quadro-p400.xml",
                   "telegraf_tesla-t4.xml", "telegraf_tesla_t4.xml")


def healthy(note, unobserved=(), mentions=None, parsed=None):
    return Expect(note, {}, tuple(unobserved), dict(mentions or {}), dict(parsed or {}))


def fault(note, checks, unobserved=(), mentions=None, parsed=None):
    return Expect(note, dict(checks), tuple(unobserved), dict(mentions or {}), dict(parsed or {}))


NVIDIA_XML = {
    "nvidia-smi-xml/datakit_v100-pcie_460.39.xml": healthy(
        "V100 PCIe in a pass-through VM under load: ECC on and clean, persistence mode off"),
    "nvidia-smi-xml/netdata_a100-sxm4-mig.xml": healthy(
        "A100 in MIG mode: row remapping and retired pages are not reported", unobserved=[MEMORY]),
    "nvidia-smi-xml/netdata_rtx-2080-win.xml": healthy(
        "consumer card under Windows (WDDM), x8 of x16: ECC, persistence and memory repair not reported",
        unobserved=[ECC, PERSISTENCE, MEMORY]),
    "nvidia-smi-xml/netdata_rtx-4090-driver-535.xml": healthy(
        "idle consumer card (P8) at a lower PCIe generation, ECC switched off", unobserved=[ECC]),
    "nvidia-smi-xml/netdata_tesla-p100.xml": healthy(
        "P100: a few corrected single-bit errors over its life, nothing uncorrectable or pending"),
    "nvidia-smi-xml/pai_2xgtx1070_link-x1.xml": fault(
        "both consumer GPUs trained at x1 of x16; trimmed, so attached_gpus counts more GPUs than are listed",
        {PCIE: FAIL, COUNT: FAIL}, unobserved=[ECC, MEMORY], parsed={"cuda_version": False}),
    "nvidia-smi-xml/pai_2xrtx2080ti.xml": healthy(
        "two idle consumer cards without ECC; one at its software power cap (not a fault)", unobserved=[ECC, MEMORY]),
    "nvidia-smi-xml/pai_4xk80_ecc-retired.xml": fault(
        "two of four K80 GPUs carry uncorrectable errors over their life and retired pages (none pending); the driver "
        "prints the CUDA version as not found", {ECC: WARN}, parsed={"cuda_version": False}),
    "nvidia-smi-xml/telegraf_3090-v13.xml": healthy(
        "idle consumer card on the newest schema, at its software power cap", unobserved=[ECC, MEMORY]),
    "nvidia-smi-xml/telegraf_a100-sxm4-v12.xml": fault(
        "A100 in MIG mode; trimmed, so attached_gpus counts more GPUs than are listed", {COUNT: FAIL},
        unobserved=[MEMORY]),
    "nvidia-smi-xml/telegraf_dual_2080-v13.xml": healthy(
        "two idle consumer cards, both x8 of x16 (a consumer board splitting its lanes), masked identical UUIDs",
        unobserved=[ECC, MEMORY]),
    "nvidia-smi-xml/telegraf_dual_a5000-v13.xml": healthy(
        "two idle workstation cards with ECC switched off", unobserved=[ECC]),
    "nvidia-smi-xml/telegraf_pro-6000-maxq-blackwell-v13.xml": healthy(
        "idle workstation card with ECC switched off, newest tag set", unobserved=[ECC]),
    "nvidia-smi-xml/telegraf_quadro-p2000-v12.xml": healthy(
        "idle workstation card at x8 of x16, no ECC", unobserved=[ECC, MEMORY]),
    "nvidia-smi-xml/telegraf_quadro-p400.xml": healthy(
        "old schema (throttle reasons under their old names), idle, no ECC", unobserved=[ECC, MEMORY]),
    "nvidia-smi-xml/telegraf_rtx-3080-v12.xml": healthy(
        "consumer card under Windows in a pass-through VM: ECC, persistence and memory repair not reported",
        unobserved=[ECC, PERSISTENCE, MEMORY]),
    "nvidia-smi-xml/telegraf_tesla-t4.xml": healthy(
        "T4 in a cloud VM at x8 of x16, the width that platform gives it"),
    "nvidia-smi-xml/telegraf_tesla_t4.xml": healthy(
        "T4 under Windows (WDDM): persistence mode not reported", unobserved=[PERSISTENCE]),
}

NVLINK_TEXT = {
    "nvlink/azhpc-diag_8xv100-sxm2-32gb_nvlink-s_6-inactive.txt": fault(
        "six NVLinks inactive across GPUs 3 to 6 of eight V100s", {NVLINK: FAIL}),
    "nvlink/gpud_a100x8_nvlink-status.txt": healthy("eight A100s with twelve active links each"),
    "nvlink/gpuexp_h100-mig_590.48.01_nvlink-s.txt": healthy(
        "H100 in MIG mode: the driver answers with a sentence, not links", unobserved=[NVLINK]),
    "nvlink/gpuexp_l40s_595.80_nvlink-s.txt": healthy(
        "L40S has no NVLink and the driver says so in a sentence", unobserved=[NVLINK]),
}

KERNEL_LOG = {
    "kmsg-xid/gpud_dmesg-ctime_xid119-gsp-timeout_h100.log": fault(
        "GSP firmware RPC timeout (Xid 119)", {XID: FAIL}, mentions={XID: "119"}),
    "kmsg-xid/gpud_dmesg-decode-iso_xid13-xid43_pci38.log": fault(
        "hundreds of graphics exceptions and a few stopped-processing events on one GPU: the application's faults",
        {XID: WARN}, mentions={XID: "13"}),
    "kmsg-xid/gpud_dmesg-decode-iso_xid13_short.log": fault(
        "the same application faults, a short excerpt", {XID: WARN}, mentions={XID: "13"}),
    "kmsg-xid/gpud_dmesg-iso_xid48-63-94_dbe-row-remap.log": fault(
        "a double-bit error, a row remap waiting for a reset and contained ECC errors", {XID: FAIL},
        mentions={XID: "48"}),
    "kmsg-xid/gpud_sxid-readme_xid79-sxid20034_h100-nvswitch.log": fault(
        "a GPU fallen off the bus (the Xid line and the driver's own line) and fatal NVSwitch link errors",
        {XID: FAIL, GPU_LOST: FAIL}, mentions={XID: "79", GPU_LOST: "fell off the bus"}),
    "kmsg-xid/mleng_xid63_a100_EXCERPT.log": fault(
        "one row remap waiting for a reset", {XID: FAIL}, mentions={XID: "63"}),
}

DCGM_JSON = {
    "dcgmi/virtualclient_DCGMIDiag_r1_results.json": healthy("level 1, every test passes"),
    "dcgmi/virtualclient_DCGMIDiag_r2_results.json": healthy("level 2, every test passes"),
    "dcgmi/virtualclient_DCGMIDiag_r3_results.json": healthy(
        "level 3, every test passes except one that was skipped, which must be reported", mentions={DCGM: "skip"}),
    "dcgmi/virtualclient_DCGMIIncorrectresults.json": fault(
        "deliberately malformed (the document is a list): DCGM's answer cannot be read", {DCGM: WARN_OR_FAIL}),
    "dcgmi/mleng_EXCERPT_table_r2_gpu-memory-fail-thermal.txt": REFERENCE,
    "dcgmi/mleng_EXCERPT_table_row-remap-pending.txt": REFERENCE,
}

AMD = {
    "amd-smi/dme_mi210_amd-smi-static-json.json": healthy(
        "MI210, static answer only (no metric captured): ECC and the link's current state are not observed",
        unobserved=[ECC, PCIE], parsed={"driver_version": True}),
    "rocm-smi/pai_vega20_rocm-smi.json": healthy(
        "two Vega 20 cards on an old rocm-smi", unobserved=[ECC], parsed={"driver_version": True}),
    "rocm-smi/telegraf_mi100_rocm571.json": healthy(
        "six MI100s, no PCIe replay", unobserved=[ECC], parsed={"driver_version": True}),
    "rocm-smi/telegraf_mi100_rocm602.json": healthy(
        "four MI100s, newer key set", unobserved=[ECC], parsed={"driver_version": True}),
    "rocm-smi/telegraf_rx6700xt_rocm612.json": healthy(
        "consumer card, newest key names", unobserved=[ECC], parsed={"driver_version": True}),
    "rocm-smi/telegraf_vega-20-WKS-GL-XE.json": healthy(
        "MI50, trimmed to one card", unobserved=[ECC], parsed={"driver_version": True}),
    "rocm-smi/thamada_mi300x-x4_rocm-smi-a.txt": REFERENCE,
    "rocm-smi/thamada_mi300x-x4_rocm-smi.txt": REFERENCE,
}

NO_COUNTERS = "no counters were captured"
INFINIBAND = {
    "infiniband/azhpc-diag_endure-port": healthy(
        "an ACTIVE port whose physical state the kernel reports as unknown (a VM); " + NO_COUNTERS,
        unobserved=[COUNTERS]),
    "infiniband/node_exporter": healthy(
        "an iWARP adapter at 10 Gb/s whose counters are unavailable, next to a two-port QDR adapter at 40 Gb/s"),
    "infiniband/sys": healthy(
        "three adapter types at three rates (Omni-Path, QDR, one-lane EDR); one physical state file holds an odd word"),
    "infiniband/ibstat/azhpc-diag_ibstatus.out": healthy(
        "an Ethernet and an InfiniBand adapter at different rates, both active; " + NO_COUNTERS,
        unobserved=[COUNTERS]),
    "infiniband/ibstat/gpud_ibstat.39.0.a100.failed.ibpanic.exit-255.0": healthy(
        "eight HDR ports active; ibstat then failed on a device that had gone, which sysfs does not list; "
        + NO_COUNTERS, unobserved=[COUNTERS]),
    "infiniband/ibstat/gpud_ibstat.47.0.a100.all.active.0": healthy(
        "every adapter active; " + NO_COUNTERS, unobserved=[COUNTERS]),
    "infiniband/ibstat/gpud_ibstat.47.0.h100.all.active.1": healthy(
        "NDR InfiniBand and slower Ethernet adapters, all active; " + NO_COUNTERS, unobserved=[COUNTERS]),
    "infiniband/ibstat/gpud_ibstat.47.0.h100.all.active.2": healthy(
        "NDR InfiniBand and a bonded Ethernet adapter, all active; " + NO_COUNTERS, unobserved=[COUNTERS]),
    "infiniband/ibstat/gpud_ibstat.47.0.h100.some.down.with.polling.1": fault(
        "edited: two ports down, one of them polling", {PORTS: FAIL}, unobserved=[COUNTERS]),
    "infiniband/ibstat/gpud_ibstat.47.0.some.down.0": fault(
        "three Ethernet ports down and disabled", {PORTS: FAIL}, unobserved=[COUNTERS]),
    "infiniband/ibstat/gpud_ibstat.47.0.some.down.1": fault(
        "two ports of a RoCE node down and disabled", {PORTS: FAIL}, unobserved=[COUNTERS]),
    "infiniband/ibstat/gpud_ibstatus.39.0.a100.all.active.0": healthy(
        "every HDR port active; " + NO_COUNTERS, unobserved=[COUNTERS]),
}

# No GPU of the XML samples sits behind an NVSwitch fabric (PCIe cards, consumer cards, an A100 that predates the
# field): its fabric state is N/A or absent, never judged; the oldest drivers have no reset status either.
for _key, _expect in NVIDIA_XML.items():
    _extra = (GPU_FABRIC,) + ((RESET,) if _key.split("/", 1)[1] in NO_RESET_STATUS else ())
    NVIDIA_XML[_key] = _expect._replace(unobserved=_expect.unobserved + _extra)

# ibstat / ibstatus carry no GID table: the RoCE ports of those samples are not observed for roce_gid.
for _key in ("infiniband/ibstat/azhpc-diag_ibstatus.out", "infiniband/ibstat/gpud_ibstat.47.0.a100.all.active.0",
             "infiniband/ibstat/gpud_ibstat.47.0.h100.all.active.1",
             "infiniband/ibstat/gpud_ibstat.47.0.h100.all.active.2",
             "infiniband/ibstat/gpud_ibstat.47.0.h100.some.down.with.polling.1",
             "infiniband/ibstat/gpud_ibstat.47.0.some.down.0", "infiniband/ibstat/gpud_ibstat.47.0.some.down.1",
             "infiniband/ibstat/gpud_ibstatus.39.0.a100.all.active.0"):
    INFINIBAND[_key] = INFINIBAND[_key]._replace(unobserved=INFINIBAND[_key].unobserved + (ROCE_GID,))

EXPECTED = dict(NVIDIA_XML, **NVLINK_TEXT, **KERNEL_LOG, **DCGM_JSON, **AMD, **INFINIBAND)
# Whole folders of formats the gate does not read (the project reads nvidia-smi's XML, not its text).
REFERENCE_FOLDERS = ("nvidia-smi-q", "nvidia-smi-summary")
