"""Fake GPU tools for tests and the multi-node test bed: ``install(bin_dir, ...)`` writes ``nvidia-smi``,
``dcgmi``, ``journalctl`` and ``amd-smi`` as small ``/bin/sh`` scripts that print fixture files copied next
to them (``<bin_dir>/.fake_gpu/``), so a node with ``bin_dir`` first on its PATH looks like a GPU node.

* ``nvidia-smi -q -x`` prints the XML; ``nvidia-smi nvlink -s`` 18 links per GPU (``nvlink_down``: inactive ones),
  or the file ``nvlink_file`` as it is; ``nvidia-smi --query-gpu=index,pci.bus_id,uuid,name
  --format=csv,noheader`` the CSV derived from the same XML; anything else exits 2 with a message.
* ``dcgmi diag -r <level> -j`` prints the JSON (exit ``dcgm_rc``: real dcgmi exits non-zero when a test fails).
* ``journalctl`` with ``-k`` prints the kernel log.
* ``amd-smi static ...`` / ``amd-smi metric ...`` print the two JSON files of ``amd=(static, metric)``.
* ``rocm-smi --showallinfo --json`` prints the JSON file ``rocm_smi``.
* ``lspci -D -vvv`` prints the text ``lspci`` (``tests/fabric_tree.py``'s ``lspci_text``: the bridges' ACS).
* ``nv-fabricmanager`` (``fabric_manager=True``): a copy of ``sleep``, so a process started from it shows in the
  process table as the fabric manager does (``nv-fabricmanage``, its name as the kernel keeps it).
"""

import os
import shutil
import stat
import xml.etree.ElementTree as ElementTree

from preflight_node.gpu.nvidia_gpus import QUERY_FIELDS

DATA_DIR = ".fake_gpu"
FABRIC_MANAGER = "nv-fabricmanager"
_HEAD = '#!/bin/sh\n# Fake %s written by tests/fake_gpu_tools.py.\nhere=$(dirname "$0")/%s\n'
_UNKNOWN = '  *) echo "fake %s: unsupported arguments: $*" >&2; exit 2 ;;\nesac\n'


def query_gpu_csv(xml_text):
    """What ``nvidia-smi --query-gpu=index,pci.bus_id,uuid,name --format=csv,noheader`` prints for the GPUs of
    a ``nvidia-smi -q -x`` document (index: the order of the <gpu> elements, nvidia-smi's PCI order)."""
    root = ElementTree.fromstring(xml_text)
    lines = ["%d, %s, %s, %s" % (index, gpu.findtext("pci/pci_bus_id").strip(), gpu.findtext("uuid").strip(),
                                 gpu.findtext("product_name").strip())
             for index, gpu in enumerate(root.findall("gpu"))]
    return "".join(line + "\n" for line in lines)


def nvlink_text(xml_text, down=None, links=18):
    """What ``nvidia-smi nvlink -s`` prints for the GPUs of a ``nvidia-smi -q -x`` document: ``links`` NVLinks per
    GPU at 26.562 GB/s (an H100 SXM's 18 NVLink4 links), those of ``down`` (``{gpu index: [link]}``) inactive."""
    down = down or {}
    out = []
    for index, gpu in enumerate(ElementTree.fromstring(xml_text).findall("gpu")):
        out.append("GPU %d: %s (UUID: %s)" % (index, gpu.findtext("product_name").strip(), gpu.findtext("uuid").strip()))
        out.extend("\t Link %d: %s" % (link, "<inactive>" if link in down.get(index, ()) else "26.562 GB/s")
                   for link in range(links))
    return "".join(line + "\n" for line in out)


def _script(bin_dir, name, cases):
    path = os.path.join(bin_dir, name)
    with open(path, "w") as handle:
        handle.write(_HEAD % (name, DATA_DIR) + 'case "$*" in\n' + cases + _UNKNOWN % name)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _copy(source, data_dir, name):
    shutil.copyfile(str(source), os.path.join(data_dir, name))
    return name


def install(bin_dir, nvidia_xml=None, kernel_log=None, dcgm_json=None, amd=None, dcgm_rc=0, nvlink_down=None,
            nvlink_file=None, rocm_smi=None, lspci=None, fabric_manager=False):
    """Write the fakes of the tools given a fixture path (or, for ``lspci``, a text) for into ``bin_dir``; returns their
    paths."""
    bin_dir = str(bin_dir)
    data_dir = os.path.join(bin_dir, DATA_DIR)
    os.makedirs(data_dir, exist_ok=True)
    written = []
    if nvidia_xml is not None:
        _copy(nvidia_xml, data_dir, "nvidia_smi.xml")
        with open(str(nvidia_xml)) as handle:
            csv = query_gpu_csv(handle.read())
        with open(os.path.join(data_dir, "query_gpu.csv"), "w") as handle:
            handle.write(csv)
        if nvlink_file is not None:
            _copy(nvlink_file, data_dir, "nvlink.txt")
        else:
            with open(str(nvidia_xml)) as source, open(os.path.join(data_dir, "nvlink.txt"), "w") as handle:
                handle.write(nvlink_text(source.read(), nvlink_down))
        written.append(_script(bin_dir, "nvidia-smi", (
            '  "-q -x") cat "$here/nvidia_smi.xml" ;;\n'
            '  "nvlink -s") cat "$here/nvlink.txt" ;;\n'
            '  "--query-gpu=%s --format=csv,noheader") cat "$here/query_gpu.csv" ;;\n' % ",".join(QUERY_FIELDS))))
    if dcgm_json is not None:
        _copy(dcgm_json, data_dir, "dcgmi_diag.json")
        written.append(_script(bin_dir, "dcgmi", (
            '  "diag -r "[0-9]" -j") cat "$here/dcgmi_diag.json"; exit %d ;;\n' % int(dcgm_rc))))
    if kernel_log is not None:
        _copy(kernel_log, data_dir, "kernel.log")
        written.append(_script(bin_dir, "journalctl", '  *-k*) cat "$here/kernel.log" ;;\n'))
    if amd is not None:
        static, metric = amd
        _copy(static, data_dir, "amd_smi_static.json")
        _copy(metric, data_dir, "amd_smi_metric.json")
        written.append(_script(bin_dir, "amd-smi", (
            '  "static "*) cat "$here/amd_smi_static.json" ;;\n'
            '  "metric "*) cat "$here/amd_smi_metric.json" ;;\n')))
    if rocm_smi is not None:
        _copy(rocm_smi, data_dir, "rocm_smi.json")
        written.append(_script(bin_dir, "rocm-smi", '  "--showallinfo --json") cat "$here/rocm_smi.json" ;;\n'))
    if lspci is not None:
        with open(os.path.join(data_dir, "lspci.txt"), "w") as handle:
            handle.write(lspci)
        written.append(_script(bin_dir, "lspci", '  "-D -vvv") cat "$here/lspci.txt" ;;\n'))
    if fabric_manager:
        path = os.path.join(bin_dir, FABRIC_MANAGER)
        shutil.copyfile(shutil.which("sleep"), path)
        os.chmod(path, 0o755)
        written.append(path)
    return written
