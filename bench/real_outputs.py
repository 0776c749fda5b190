#!/usr/bin/env python3
"""Conformance over real outputs: every sample of a corpus laid out like ``../shared/real-outputs`` through the node
readers and the controller's checks, exactly as the gate runs them, judged against ``bench/real_outputs_expected.py``.

Each sample gets a fake node built around it (``bench/real_outputs_nodes.py``: fake tools on PATH print the capture,
a fake PCI bus lists its GPUs, RDMA samples are or become a ``/sys/class/infiniband`` tree).  The readers run with
the roles' defaults (``gpu_health_dcgm_level`` 1) through JSON, as the node call hands their facts over; the
fabric's counters are read a second time, as the gate does after its all-reduce; the deciders' checks go through
the verdict's contract.

Prints one block per sample (outcome, the parse, every check's status and text), then a summary line: samples
judged, correct, missed (a documented fault not named, or a check passing over what it could not observe, or a fact
misread), false alarms (a warn or fail the sample does not document) and errors (a reader or decider raised, or the
sample has no expectation).  Formats the gate does not read are listed as reference.  Exit status 0 when every
sample is correct.  Use the project's venv:
    .venv/bin/python bench/real_outputs.py ../shared/real-outputs [--quiet]
"""

import argparse
import contextlib
import json
import os
import sys
import tempfile
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

# pylint: disable=wrong-import-position
import real_outputs_nodes as nodes  # noqa: E402
from capability_helpers import role_settings  # noqa: E402
from fake_ops import LocalOps  # noqa: E402
from real_outputs_expected import EXPECTED, REFERENCE, REFERENCE_FOLDERS  # noqa: E402
from cluster_preflight.capabilities import fabric, gpu_health  # noqa: E402
from preflight_node.capabilities import fabric as fabric_node, fabric_probe, gpu_health as gpu_node  # noqa: E402
from preflight_node.checks import normalize  # noqa: E402

HOST = "sample-node"
NODE = {"name": HOST, "ansible_host": "198.18.0.9", "node_addr": "198.18.0.9", "user": "root", "ssh_port": 22}
OUTCOMES = ("correct", "missed", "false alarm", "error")
TEXT_LIMIT = 400


# --- the samples of a corpus ----------------------------------------------------------------------------


def _kind(key, path):
    """What the gate reads a sample as, from where it lies in the corpus; None for a format it does not read."""
    folder = key.split("/", 1)[0]
    if folder in REFERENCE_FOLDERS or EXPECTED.get(key) == REFERENCE:
        return None
    if folder == "infiniband":
        if key.startswith("infiniband/ibstat/"):
            return "ibstat"
        return "ib_tree" if nodes.sysfs_root_of(path) else "ib_port"
    return {"nvidia-smi-xml": "nvidia_xml", "nvlink": "nvlink", "kmsg-xid": "kernel_log", "dcgmi": "dcgm",
            "amd-smi": "amd_smi", "rocm-smi": "rocm_smi"}.get(folder, "unknown")


def samples(corpus):
    """``[(key, path, kind)]``: every file of the corpus, except the RDMA trees, which are one sample each."""
    found = []
    for folder in sorted(os.listdir(corpus)):
        top = os.path.join(corpus, folder)
        if not os.path.isdir(top):
            continue
        for name in sorted(os.listdir(top)):
            path, key = os.path.join(top, name), "%s/%s" % (folder, name)
            if folder == "infiniband" and name == "ibstat":
                found.extend(("%s/%s" % (key, entry), os.path.join(path, entry), "ibstat")
                             for entry in sorted(os.listdir(path)))
            elif folder == "infiniband" or os.path.isfile(path):
                found.append((key, path, _kind(key, path)))
    return found


# --- one sample through the readers and the deciders ----------------------------------------------------


@contextlib.contextmanager
def first_on_path(bin_dir):
    saved = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([bin_dir, "/usr/bin", "/bin"])
    try:
        yield
    finally:
        os.environ["PATH"] = saved


def _through_json(value):
    return json.loads(json.dumps(value))


def gpu_checks(bin_dir, sysfs):
    """``(facts, checks)`` of ``gpu_health`` on the fake node."""
    settings = role_settings("gpu_health", gpu_health_sysfs_root=sysfs)
    args = _through_json(gpu_health.read_args(settings, NODE))
    with first_on_path(bin_dir):
        facts = _through_json(gpu_node.read(args, LocalOps()))
    return facts, gpu_health.decide(HOST, facts, settings)


def fabric_checks(sysfs_root):
    """``(facts, checks)`` of ``fabric`` on the tree: read, read again (the after-gate probe), decided alone."""
    settings = role_settings("fabric", fabric_sysfs_root=sysfs_root)
    args = _through_json(fabric.read_args(settings, NODE))
    facts = _through_json(fabric_node.read(args, LocalOps()))
    after = _through_json(fabric_probe.probe(args, LocalOps()))
    cluster = {"hosts": [HOST], "facts": {HOST: facts}, "settings": {HOST: settings}}
    return facts, fabric.decide(HOST, facts, settings, probe=after, cluster=cluster)


def build_node(kind, path, place):
    """``("gpu", bin dir, sysfs)`` or ``("fabric", sysfs root)`` of the fake node around a sample."""
    if kind == "nvidia_xml":
        return ("gpu",) + nodes.nvidia_node(place, path)
    if kind == "nvlink":
        return ("gpu",) + nodes.nvlink_node(place, path)
    if kind == "kernel_log":
        return ("gpu",) + nodes.h100_node(place, kernel_log=path)
    if kind == "dcgm":
        return ("gpu",) + nodes.h100_node(place, dcgm_json=path)
    if kind in ("amd_smi", "rocm_smi"):
        return ("gpu",) + nodes.amd_node(place, path, rocm=kind == "rocm_smi")
    if kind == "ibstat":
        return ("fabric", nodes.write_tree(place, nodes.parse_ibstat(nodes.read_text(path))))
    if kind == "ib_port":
        return ("fabric", nodes.port_folder_tree(place, path))
    if kind == "ib_tree":
        return ("fabric", nodes.sysfs_root_of(path))
    raise ValueError("no fake node for a sample of kind %r" % kind)


def run_sample(kind, path):
    """``(capability, facts, {check name: check})`` of one sample, the checks as the verdict names them."""
    with tempfile.TemporaryDirectory(prefix="real-outputs-") as place:
        node = build_node(kind, path, place)
        if node[0] == "gpu":
            facts, checks = gpu_checks(node[1], node[2])
        else:
            facts, checks = fabric_checks(node[1])
    capability = "gpu_health" if node[0] == "gpu" else "fabric"
    named = {"%s.%s" % (capability, name): normalize(check, "%s / %s.%s" % (HOST, capability, name))
             for name, check in checks.items()}
    return capability, facts, named


# --- what was parsed, and the judgement ----------------------------------------------------------------


def parse_line(capability, facts):
    """One line: what the readers made of the sample."""
    if capability == "fabric":
        devices = facts.get("devices") or {}
        ports = sum(len(device.get("ports") or []) for device in devices.values())
        return "%d RDMA devices, %d ports%s" % (len(devices), ports, "; error: %s" % facts["error"]
                                                if facts.get("error") else "")
    parts = []
    for vendor in ("nvidia", "amd"):
        section = facts.get(vendor) or {}
        if section.get("present"):
            parts.append("%s: %d GPUs%s, driver %s%s%s" % (
                vendor, len(section.get("gpus") or []),
                " (attached_gpus %s)" % section["attached_gpus"] if section.get("attached_gpus") is not None else "",
                section.get("driver_version"),
                ", CUDA %s" % section.get("cuda_version") if vendor == "nvidia" else "",
                "; error: %s" % section["error"] if section.get("error") else ""))
        if section.get("nvlink_error"):
            parts.append("nvlink error: %s" % section["nvlink_error"])
    xid = facts.get("xid") or {}
    parts.append("kernel log: %d events" % len(xid.get("events") or []))
    dcgm = facts.get("dcgm") or {}
    if dcgm.get("present"):
        parts.append("dcgm: %d results%s" % (len(dcgm.get("results") or []),
                                             "; error: %s" % dcgm["error"] if dcgm.get("error") else ""))
    return "; ".join(parts)


def _parsed_value(facts, name):
    for vendor in ("nvidia", "amd"):
        section = facts.get(vendor) or {}
        if section.get("present"):
            return section.get(name)
    return None


def judge(expect, facts, checks):
    """``(outcome, [reasons])`` of one sample against its expectation."""
    missed, false = [], []
    for name, allowed in sorted(expect.fault.items()):
        status = (checks.get(name) or {}).get("status")
        if status not in allowed:
            missed.append("%s is %s, the documented fault wants %s" % (name, status, "/".join(allowed)))
    for name, check in sorted(checks.items()):
        if name not in expect.fault and check["status"] in ("warn", "fail"):
            false.append("%s %s on what the sample does not document" % (name, check["status"]))
    for name in expect.unobserved:
        status = (checks.get(name) or {}).get("status")
        if status == "pass":
            missed.append("%s passes over what the sample cannot show" % name)
        elif status not in ("not_applicable", "warn", "fail"):
            missed.append("%s is %s where it could not observe (not_applicable expected)" % (name, status))
    for name, word in sorted(expect.mentions.items()):
        if word.lower() not in (checks.get(name) or {}).get("found", "").lower():
            missed.append("%s does not mention %r" % (name, word))
    for name, wanted in sorted(expect.parsed.items()):
        value = _parsed_value(facts, name)
        if (value is not None) != wanted:
            missed.append("%s parsed as %r, expected %s" % (name, value, "a value" if wanted else "none"))
    if false:
        return "false alarm", false + missed
    return ("missed", missed) if missed else ("correct", [])


def evaluate(key, path, kind):
    """``(outcome, reasons, parse line, checks)`` of one sample; an exception is an ``error``."""
    expect = EXPECTED.get(key)
    if expect is None or kind in (None, "unknown"):
        return "error", ["no expectation in bench/real_outputs_expected.py (or no reader) for this sample"], "", {}
    try:
        capability, facts, checks = run_sample(kind, path)
    except Exception:  # pylint: disable=broad-except
        return "error", [traceback.format_exc(limit=3).strip().splitlines()[-1]], "", {}
    outcome, reasons = judge(expect, facts, checks)
    return outcome, reasons, parse_line(capability, facts), checks


def _clip(text):
    text = " ".join(str(text).split())
    return text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT] + "..."


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", help="a folder laid out like ../shared/real-outputs")
    parser.add_argument("--quiet", action="store_true", help="only the outcome line of each sample and the summary")
    args = parser.parse_args(argv)
    counts, reference = dict.fromkeys(OUTCOMES, 0), []
    for key, path, kind in samples(os.path.abspath(args.corpus)):
        if kind is None:
            reference.append(key)
            continue
        outcome, reasons, parsed, checks = evaluate(key, path, kind)
        counts[outcome] += 1
        print("%-11s %s" % (outcome.upper(), key))
        for reason in reasons:
            print("    ! %s" % reason)
        if args.quiet:
            continue
        print("    parse: %s" % (parsed or "-"))
        for name, check in sorted(checks.items()):
            print("    %-24s %-14s %s" % (name, check["status"], _clip(check["found"])))
    for key in reference:
        print("%-11s %s (a format the gate does not read)" % ("REFERENCE", key))
    total = sum(counts.values())
    print("SUMMARY samples %d, correct %d, missed %d, false alarms %d, errors %d (reference, not judged: %d)" % (
        total, counts["correct"], counts["missed"], counts["false alarm"], counts["error"], len(reference)))
    return 0 if counts["correct"] == total else 1


if __name__ == "__main__":
    sys.exit(main())
