# -*- coding: utf-8 -*-
"""What other tools read from a verdict: JUnit, Prometheus, host lists.

Controller-side only (it imports ``junit_xml``, ``prometheus_client`` and
nothing a node has); called by the verdict action plugin after the verdict
file is written.  Every function is a pure function of the verdict dict
(``cluster_preflight/verdict/accounting.py`` ``build_verdict``) except
:func:`write_outputs`, which writes them all into the run directory.

``junit.xml`` -- one ``<testsuite>`` per node (``name`` and ``hostname`` the node),
one ``<testcase>`` per check of that node: ``classname`` the node, ``name`` the
check (``allreduce.correctness``).  A CI job or a dashboard that reads JUnit
then shows which node failed which check, with what to do:

=================================  ==========================================
check                               JUnit
=================================  ==========================================
``pass``                            passed
``warn``                            passed, ``<system-out>`` ``WARN`` + found /
                                    expected / fix: drift that does not block a
                                    job, like the node it leaves ``healthy``
``not_applicable``, ``skipped``     ``<skipped>`` with the reason
``fail``                            ``<failure>``: message found, text found /
                                    expected / fix
blocked (``details.blocked``,       ``<error>`` (type ``unverified``): the check
any status but ``fail``)            could not prove anything because of another
                                    node or a cluster-wide problem -- JUnit's
                                    "could not run", not "ran and was wrong"
=================================  ==========================================

``preflight.prom`` -- Prometheus text format for node_exporter's textfile
collector (it reads ``*.prom`` in its ``--collector.textfile.directory``: link
``results/latest/preflight.prom`` there, and give node_exporter's group read
access, the file is ``0640``).  Every series carries ``kind`` (``preflight``,
``healthcheck``, ``bringup``) so the reports of different playbooks can sit
side by side in that directory.

* ``preflight_check_status{kind,host,check}`` -- a numeric code ordered by
  severity, so ``>= 3`` is everything that needs attention: 0 pass,
  1 not_applicable, 2 skipped, 3 warn, 4 blocked (unverified), 5 fail.  A code
  rather than one series per status keeps the cardinality at nodes x checks.
* ``preflight_host_status{kind,host,status}`` -- one-hot over pass, warn,
  unverified, fail (``count(preflight_host_status{status="fail"} == 1)``).
* ``preflight_host_reachable{kind,host}`` -- 1, or 0 when the node stopped answering.
* ``preflight_run_status{kind,status}`` -- one-hot over pass, fail;
  ``preflight_run_timestamp_seconds{kind}`` -- when the verdict was made;
  ``preflight_run_info{kind,run_id,run_dir}`` -- 1.
* With an all-reduce (``preflight.yml``): ``preflight_allreduce_status{kind,status}``
  one-hot over pass, fail, skipped; ``preflight_allreduce_world_size`` and
  ``preflight_allreduce_planned_world_size``; per message size (rank 0's timing)
  ``preflight_allreduce_busbw_bytes_per_second``,
  ``preflight_allreduce_algbw_bytes_per_second`` (the verdict's GB/s x 1e9:
  Prometheus wants base units) and ``preflight_allreduce_duration_seconds``
  (one timed all-reduce of that size).

Host lists, of the nodes the verdict calls healthy (``healthy_hosts``: ``pass``
and ``warn``), in the verdict's order; empty files when none is, so a stale list
is never used.  Each node is named as the other nodes reach it (the verdict's
``hostfile``, :func:`launch_names`): its inventory name, or its address when the
gate saw that name not resolve on its peers (``preflight_hostfile_names``):

* ``hostfile`` -- ``<host> slots=<N>`` (MPI, DeepSpeed), ``N`` the ranks the
  all-reduce planned on that node.  A verdict without an all-reduce
  (healthcheck, bring-up) knows no rank count: the line is the bare name (MPI
  then counts the node's cores; DeepSpeed refuses the line rather than guess).
* ``hosts.txt`` -- one node per line (``pdsh -w ^hosts.txt``, ``xargs``).
* ``hosts.csv`` -- one line, comma-separated (``pdsh -w "$(cat hosts.csv)"``,
  ``srun --nodelist``).
"""

from __future__ import annotations

import calendar
import collections
import os
import re
import time
import xml.etree.ElementTree as ET

from cluster_preflight.verdict.accounting import atomic_write
from junit_xml import TestCase, TestSuite
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily

JUNIT_FILE = "junit.xml"
PROM_FILE = "preflight.prom"
HOSTFILE = "hostfile"
HOSTS_TXT = "hosts.txt"
HOSTS_CSV = "hosts.csv"
# Readable by the operator's group (node_exporter, a CI agent), not by every user:
# the texts name the cluster's nodes, addresses and weaknesses.
MODE = 0o640

# Severity order for preflight_check_status (documented above; never renumber).
CHECK_CODES = {"pass": 0, "not_applicable": 1, "skipped": 2, "warn": 3, "blocked": 4, "fail": 5}
HOST_STATUSES = ("pass", "warn", "unverified", "fail")
RUN_STATUSES = ("pass", "fail")
ALLREDUCE_STATUSES = ("pass", "fail", "skipped")


def check_state(check):
    """``check``'s status, or ``blocked`` when another node or the cluster kept it from proving anything.

    A blocked ``fail`` stays ``fail``: the node status (``preflight_checks.node_status``)
    puts a failure before everything else too."""
    status = check.get("status")
    if status != "fail" and (check.get("details") or {}).get("blocked"):
        return "blocked"
    return status if status in CHECK_CODES else "fail"


def _explain(check):
    return "found: %s\nexpected: %s\nfix: %s" % (check.get("found", ""), check.get("expected", ""),
                                                 check.get("fix") or "-")


def _timestamp(verdict):
    """``finished`` (``%Y-%m-%dT%H:%M:%SZ``, UTC) as seconds since the epoch; now when absent."""
    finished = verdict.get("finished")
    if not finished:
        return time.time()
    return float(calendar.timegm(time.strptime(finished, "%Y-%m-%dT%H:%M:%SZ")))


def junit_suites(verdict):
    """One ``junit_xml.TestSuite`` per node of the verdict, one test case per check."""
    suites = []
    for host in verdict["hosts"]:
        node = verdict["nodes"][host]
        cases = []
        for name, check in sorted(node["checks"].items()):
            state = check_state(check)
            case = TestCase(name, classname=host, timestamp=verdict.get("finished"))
            if state == "fail":
                case.add_failure_info(message=check.get("found") or name, output=_explain(check),
                                      failure_type="fail")
            elif state == "blocked":
                case.add_error_info(message=check.get("found") or name, output=_explain(check),
                                    error_type="unverified")
            elif state in ("not_applicable", "skipped"):
                case.add_skipped_info(message="%s: %s" % (state, check.get("found", "")))
            elif state == "warn":
                case.stdout = "WARN\n" + _explain(check)
            cases.append(case)
        suites.append(TestSuite(host, cases, hostname=host, id=verdict.get("run_id"),
                                timestamp=verdict.get("finished"),
                                properties={"node_status": node["status"], "reachable": str(node.get("reachable")),
                                            "verdict_status": verdict["status"],
                                            "run_dir": str(verdict.get("run_dir") or "")}))
    return suites


def junit_xml(verdict):
    """``junit.xml`` as text: the document ``junit_xml.to_xml_report_string(suites, prettyprint=True,
    encoding="utf-8")`` gives, character for character, written straight from its element tree (the library
    re-parses the whole document with ``minidom`` to indent it, which a large cluster's nodes x checks make the
    slowest step of the verdict)."""
    root = ET.Element("testsuites")
    totals = collections.defaultdict(int)
    for suite in junit_suites(verdict):
        element = suite.build_xml_doc(encoding="utf-8")
        for key in ("disabled", "errors", "failures", "tests"):
            totals[key] += int(element.get(key, 0))
        totals["time"] += float(element.get("time", 0))
        root.append(element)
    for key, value in totals.items():
        root.set(key, str(value))
    out = ['<?xml version="1.0" encoding="utf-8"?>\n']
    _write_element(out, root, "")
    return "".join(out)


# What junit_xml removes from its document before indenting it: characters XML does not allow.  A carriage
# return in an attribute survives (the serializer wrote it as a character reference); in a text it goes.
_XML_ILLEGAL_RANGES = ((0x00, 0x08), (0x0B, 0x1F), (0x7F, 0x84), (0x86, 0x9F), (0xD800, 0xDFFF), (0xFDD0, 0xFDDF),
                       (0xFFFE, 0xFFFF)) + tuple((plane + 0xFFFE, plane + 0xFFFF)
                                                 for plane in range(0x10000, 0x110000, 0x10000))


def _ranges(ranges):
    return re.compile("[%s]" % "".join("%s-%s" % (re.escape(chr(low)), re.escape(chr(high))) for low, high in ranges))


# (text, attribute) x (any text, ASCII text: the usual case, found much faster by a small class)
_XML_ILLEGAL = {False: (_ranges(_XML_ILLEGAL_RANGES), _ranges(_XML_ILLEGAL_RANGES[:3])),
                True: (_ranges(((0x00, 0x08), (0x0B, 0x0C), (0x0E, 0x1F)) + _XML_ILLEGAL_RANGES[2:]),
                       _ranges(((0x00, 0x08), (0x0B, 0x0C), (0x0E, 0x1F), (0x7F, 0x7F))))}


def _xml_text(text, attribute=False):
    """``text`` as minidom's pretty printer writes it (after junit_xml's cleaning)."""
    text = _XML_ILLEGAL[attribute][text.isascii()].sub("", text)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace('"', "&quot;").replace(">", "&gt;")


def _write_element(out, element, indent):
    """``element`` as ``minidom``'s ``toprettyxml`` writes it (tab indents, a lone text child inline)."""
    out.append("%s<%s" % (indent, element.tag))
    for name, value in element.attrib.items():
        out.append(' %s="%s"' % (name, _xml_text(value, attribute=True)))
    text = _xml_text(element.text) if element.text else ""
    if len(element):
        out.append(">\n")
        for child in element:
            _write_element(out, child, indent + "\t")
        out.append("%s</%s>\n" % (indent, element.tag))
    elif text:
        out.append(">%s</%s>\n" % (text, element.tag))
    else:
        out.append("/>\n")


def prometheus_registry(verdict, kind="preflight"):
    """A ``CollectorRegistry`` holding the verdict's metrics (see the module's docstring)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_VerdictMetrics(_families(verdict, kind)))
    return registry


class _VerdictMetrics(object):
    """The verdict's metric families as a collector: a family's samples are added as plain rows, not as one
    labelled child per sample (a cluster's nodes x checks would cost a child, a lock and a copy each)."""

    def __init__(self, families):
        self.families = families

    def collect(self):
        return iter(self.families)


def _families(verdict, kind):
    """The verdict's metric families in the order the exposition lists them."""
    families = []

    def gauge(name, documentation, labels):
        families.append(GaugeMetricFamily(name, documentation, labels=["kind"] + list(labels)))
        return families[-1]

    def add(family, labels, value):
        family.add_metric([str(label) for label in labels], float(value))

    check_status = gauge("preflight_check_status", "Check outcome: 0 pass, 1 not_applicable, 2 skipped, 3 warn, "
                                                   "4 blocked (unverified), 5 fail.", ["host", "check"])
    host_status = gauge("preflight_host_status", "Node status, one-hot over pass, warn, unverified, fail.",
                        ["host", "status"])
    reachable = gauge("preflight_host_reachable", "1 when the node answered at every stage of the run.", ["host"])
    for host in verdict["hosts"]:
        node = verdict["nodes"][host]
        for name, check in node["checks"].items():
            add(check_status, (kind, host, name), CHECK_CODES[check_state(check)])
    for host in verdict["hosts"]:
        status = verdict["nodes"][host]["status"]
        for one in HOST_STATUSES:
            add(host_status, (kind, host, one), 1 if status == one else 0)
    for host in verdict["hosts"]:
        add(reachable, (kind, host), 1 if verdict["nodes"][host].get("reachable", True) else 0)
    run_status = gauge("preflight_run_status", "The verdict, one-hot over pass, fail.", ["status"])
    for status in RUN_STATUSES:
        add(run_status, (kind, status), 1 if verdict["status"] == status else 0)
    add(gauge("preflight_run_timestamp_seconds", "When the verdict was made, seconds since the epoch.", []), (kind,),
        _timestamp(verdict))
    families.append(InfoMetricFamily("preflight_run", "The run the metrics come from.", labels=["kind"]))
    families[-1].add_metric([str(kind)], {"run_id": str(verdict.get("run_id") or ""),
                                          "run_dir": str(verdict.get("run_dir") or "")})
    gate = verdict.get("allreduce")
    if gate:
        _allreduce_families(gate, kind, gauge, add)
    return families


def _allreduce_families(gate, kind, gauge, add):
    gate_status = gauge("preflight_allreduce_status", "The all-reduce gate, one-hot over pass, fail, skipped.",
                        ["status"])
    for status in ALLREDUCE_STATUSES:
        add(gate_status, (kind, status), 1 if gate.get("status") == status else 0)
    for key in ("world_size", "planned_world_size"):
        if gate.get(key) is not None:
            add(gauge("preflight_allreduce_%s" % key, "Ranks of the all-reduce (%s)." % key.replace("_", " "), []),
                (kind,), gate[key])
    sizes = gate.get("sizes") or []
    if sizes:
        busbw = gauge("preflight_allreduce_busbw_bytes_per_second",
                      "All-reduce bus bandwidth (nccl-tests busbw) at a message size, rank 0.", ["size_bytes"])
        algbw = gauge("preflight_allreduce_algbw_bytes_per_second",
                      "All-reduce algorithm bandwidth at a message size, rank 0.", ["size_bytes"])
        duration = gauge("preflight_allreduce_duration_seconds",
                         "Time of one all-reduce at a message size, rank 0.", ["size_bytes"])
        for family, value in ((busbw, lambda row: row["busbw_gbps"] * 1e9),
                              (algbw, lambda row: row["algbw_gbps"] * 1e9),
                              (duration, lambda row: row["time_us"] / 1e6)):
            for row in sizes:
                add(family, (kind, row["size_bytes"]), value(row))


def prometheus_text(verdict, kind="preflight"):
    """``preflight.prom`` as bytes (Prometheus text exposition format)."""
    return generate_latest(prometheus_registry(verdict, kind))


def slots_by_host(verdict):
    """Ranks the all-reduce planned on each node (its rank rows, reported or not)."""
    slots = {}
    for row in (verdict.get("allreduce") or {}).get("ranks") or []:
        if row.get("host"):
            slots[row["host"]] = slots.get(row["host"], 0) + 1
    return slots


def healthy_hosts(verdict):
    """The nodes the verdict calls healthy, in the verdict's order."""
    healthy = set(verdict.get("healthy_hosts") or [])
    return [host for host in verdict["hosts"] if host in healthy]


HOSTFILE_NAMES = ("auto", "inventory", "address")
# Where a node's inventory name was seen not to resolve: the ssh mesh's logins to it by name (ssh_trust).
UNRESOLVED_CHECK = "ssh_trust.inbound"


def unresolved_names(verdict):
    """``{host: [peers]}``: the nodes whose inventory name did not resolve on those peers in this run."""
    found = {}
    for host in verdict["hosts"]:
        details = (verdict["nodes"][host]["checks"].get(UNRESOLVED_CHECK) or {}).get("details") or {}
        peers = [str(peer) for peer in details.get("name_unresolved_on") or []]
        if peers:
            found[host] = peers
    return found


def launch_names(verdict, addresses, mode="auto"):
    """``{names: {host: entry}, mode, note}``: how the host lists name each node.  ``addresses``: ``{host:
    address}`` (preflight_node_addr, else ansible_host); ``mode``: ``auto`` (the inventory name, or the address of
    a node whose name did not resolve on its peers), ``inventory`` or ``address``.  ``note`` says which nodes are
    listed by address and why, or that their names were used as they are; empty when there is nothing to say."""
    unresolved = unresolved_names(verdict)
    mode = mode if mode in HOSTFILE_NAMES else "auto"
    by_address = [host for host in verdict["hosts"] if addresses.get(host) and addresses[host] != host and (
        mode == "address" or (mode == "auto" and host in unresolved))]
    names = {host: addresses[host] if host in by_address else host for host in verdict["hosts"]}
    note = ""
    if by_address and mode == "address":
        note = ("hostfile, hosts.txt and hosts.csv list the nodes by address (preflight_hostfile_names: address): "
                "%s" % ", ".join("%s=%s" % (host, names[host]) for host in by_address))
    elif by_address:
        note = ("hostfile, hosts.txt and hosts.csv list %s by address: the name did not resolve on its peers (%s); "
                "make the names resolvable on every node (/etc/hosts or DNS), or set preflight_hostfile_names: "
                "inventory to list names anyway" % (", ".join("%s as %s" % (host, names[host]) for host in by_address),
                                                    "; ".join("%s on %s" % (host, ", ".join(unresolved[host]))
                                                              for host in by_address)))
    elif mode == "inventory" and unresolved:
        note = ("hostfile, hosts.txt and hosts.csv list inventory names as asked (preflight_hostfile_names: inventory), "
                "though %s did not resolve on peers: a launcher on a node cannot reach them by name"
                % ", ".join(sorted(unresolved)))
    elif mode == "auto" and "allreduce" in verdict and len(verdict["hosts"]) > 1 and not any(
            (verdict["nodes"][host]["checks"].get(UNRESOLVED_CHECK) or {}).get("status") in ("pass", "warn", "fail")
            for host in verdict["hosts"]):
        note = ("hostfile, hosts.txt and hosts.csv list inventory names; whether they resolve on the nodes was not "
                "checked (no ssh mesh in this run: ssh_trust_mesh); set preflight_hostfile_names: address to list "
                "the nodes' addresses instead")
    return {"names": names, "mode": mode, "note": note}


def host_lists(verdict):
    """``{file name: text}`` of ``hostfile``, ``hosts.txt`` and ``hosts.csv``, each node named as the verdict's
    ``hostfile.names`` says (its inventory name when the verdict says nothing)."""
    named = (verdict.get("hostfile") or {}).get("names") or {}
    hosts = healthy_hosts(verdict)
    slots = slots_by_host(verdict)
    entries = [str(named.get(host) or host) for host in hosts]
    lines = ["%s slots=%d" % (entry, slots[host]) if slots.get(host) else entry for host, entry in zip(hosts, entries)]
    return {
        HOSTFILE: "".join(line + "\n" for line in lines),
        HOSTS_TXT: "".join(entry + "\n" for entry in entries),
        HOSTS_CSV: ",".join(entries) + "\n" if entries else "",
    }


def write_outputs(verdict, run_dir, kind="preflight", mode=MODE):
    """Write ``junit.xml``, ``preflight.prom``, ``hostfile``, ``hosts.txt`` and ``hosts.csv`` into
    ``run_dir``, each atomically with ``mode``; returns ``{file name: absolute path}``.

    ``run_dir`` must exist: it is the verdict's (``write_run_dir`` creates it with the
    run's permissions), so it is never created here with the umask's.  Everything is
    rendered before the first file is written, so a verdict these outputs cannot
    represent raises without leaving half of them behind.
    """
    rendered = {JUNIT_FILE: junit_xml(verdict).encode("utf-8"), PROM_FILE: prometheus_text(verdict, kind)}
    rendered.update((name, text.encode("utf-8")) for name, text in host_lists(verdict).items())
    paths = {}
    for name, data in rendered.items():
        paths[name] = os.path.abspath(os.path.join(run_dir, name))
        atomic_write(paths[name], data, mode)
    return paths
