# -*- coding: utf-8 -*-
"""Known failure signatures of a torch / NCCL / gloo job, and the matcher that reads a node's log lines with them.

The gate reads a node's torchrun log and its ranks' own log files (``log`` and ``rank_logs`` of the ``allreduce``
module) and names what it recognises: the cause in words, the fix, and the check that would have caught it before
the job.  The rows are one table, kept by category in ``cluster_preflight/capabilities/allreduce/signature_table/`` (the job's environment
on the node, the RDMA fabric, the GPUs, the sockets of the rendezvous and the collectives); nothing else in the
preflight matches these lines, so a new signature is one new row plus a line of the same shape in
``tests/unit/test_signatures.py``.

The line's own facts come first.  A row's regular expression captures what the line says (an address, a port, an
errno, the call that failed, the NCCL source file, a size, an interface name) and the row's ``when`` may look at those
facts before the row takes the line: a refused connection to a loopback address is a name-resolution fault, not a
firewall; an ``ibv_modify_qp`` that timed out is a RoCE path, not a TCP drop.  Rows are of three levels:

* ``cause``: the line names the cause.  It takes the line: the generic rows are not tried on it.
* ``symptom``: a generic reading (a refused connection, an NCCL system error, a watchdog timeout); named only where
  no cause row explains the log.
* ``info``: what NCCL chose (its transport), shown but never the cause.

Facts of the whole log are read too (``NCCL_SOCKET_IFNAME set to …``, the interface NCCL bootstrapped on, the
``NCCL_IB_GID_INDEX`` in use, the link layer of the RDMA devices, the NCCL version) and given to every row's text.
:func:`primary` is the one cause the log names: the first ``cause`` row that warns or fails, in table order (the
table puts the causes that explain others first), else the first ``symptom`` that does.

Where the log allows it, the socket rows tell the errnos apart: ``Connection refused`` (ECONNREFUSED, 111: the host
answered, nothing listens, or a REJECT), ``Connection timed out`` (ETIMEDOUT, 110: no answer, a DROP or a host
down), ``No route to host`` (EHOSTUNREACH, 113) and ``Network is unreachable`` (ENETUNREACH, 101); torch's TCPStore
retries refused connections until its timeout and then only says ``The client socket has timed out after ...``.
"""

from __future__ import annotations

import collections
import re

from cluster_preflight.capabilities.allreduce.signature_table import CATEGORIES, ROWS, Signature

# One finding per signature; the line is cut to this many characters.
LINE_MAX = 300
LEVELS = ("cause", "symptom", "info")
SIGNATURES = ROWS
BY_ID = {signature.id: signature for signature in SIGNATURES}
TRANSPORTS = {"nccl_net_ib": "NET/IB", "nccl_net_ofi": "NET/OFI", "nccl_net_socket": "NET/Socket"}

# Prefixes that carry a rank but no meaning for the rows: torchrun's --tee "[node1:0]:" (local rank), torch's
# "[rank3]:", mpirun's "[1,3]<stdout>:"; glog's "[E1123 15:44:16.477 socket.cpp:1028] " stays (rows read past it).
_TEE_RE = re.compile(r"^\[(?P<role>[^\]\s]+):(?P<local>\d+)\]:")
_RANK_RE = re.compile(r"^\[rank(?P<rank>\d+)\]:\s?")
_MPI_RE = re.compile(r"^\[\d+,(?P<rank>\d+)\]<std(?:out|err)>:")

# Facts of the whole log: the job's settings and NCCL's choices as its INFO lines print them.
_CONTEXT = (
    re.compile(r"NCCL_SOCKET_IFNAME set (?:by environment )?to (?P<socket_ifname>[^\s.]+(?:\.\d+)?)"),
    re.compile(r"Bootstrap\s*:\s*Using\s+(?:\[\d+\])?(?P<bootstrap_if>[^\s:\[\]]+):(?P<bootstrap_addr>[^<\s]+)<"),
    re.compile(r"NCCL_IB_GID_INDEX set by environment to (?P<gid_index>\d+)"),
    re.compile(r"NET/IB\s*:\s*Using\s+\[\d+\]\S+?/(?P<ib_link>RoCE|IB)\b"),
    re.compile(r"NCCL version (?P<nccl_version>\d+\.\d+\.\d+)"),
)
# Generic facts of one line, read for every row: the errno the socket layer printed, and the peer's address in the
# shapes gloo ("[10.0.0.2]:43110"), NCCL ("10.0.0.2<43110>"), c10d ("(node2, 29500)") and others ("10.0.0.2:29500")
# print it.
_ERRNO_RE = re.compile(r"errno:?\s*(?P<errno>\d+)|\((?P<errno_paren>\d+)\)\s*$")
_ADDR_RES = (
    re.compile(r"\[(?P<addr>[0-9a-fA-F:.]+|[\w.-]+)\]:(?P<port>\d+)"),
    re.compile(r"(?P<addr>\d{1,3}(?:\.\d{1,3}){3}|[0-9a-fA-F]*:[0-9a-fA-F:.]+(?:%\w+)?)<(?P<port>\d+)>"),
    re.compile(r"\((?P<addr>[^,()\s]+), (?P<port>\d+)\)"),
    re.compile(r"(?P<addr>\d{1,3}(?:\.\d{1,3}){3}):(?P<port>\d+)"),
)


def _lines(lines_or_text):
    """``[(rank or None, line)]`` from a text, a list of texts, or a list of ``(rank, text)`` pairs."""
    if isinstance(lines_or_text, str):
        return [(None, line) for line in lines_or_text.splitlines()]
    lines = []
    for item in lines_or_text or ():
        rank, text = item if isinstance(item, tuple) else (None, item)
        lines.extend((rank, line) for line in str(text or "").splitlines())
    return lines


def _strip_prefix(raw):
    """``(line, rank, local rank)``: the line without the launchers' prefixes, and the rank they name."""
    line, rank, local = raw.strip(), None, None
    if not line.startswith("["):
        return line, rank, local
    for regex in (_TEE_RE, _RANK_RE, _MPI_RE):
        found = regex.match(line)
        if found:
            groups = found.groupdict()
            if groups.get("local") is not None:
                local = int(groups["local"])
            if groups.get("rank") is not None:
                rank = int(groups["rank"])
            line = line[found.end():].strip()
    return line, rank, local


def _read_context(line, context):
    for regex in _CONTEXT:
        found = regex.search(line)
        if found:
            context.update({key: value for key, value in found.groupdict().items() if value is not None})


def _line_facts(line, found, nodes):
    facts = {key: value for key, value in found.groupdict().items() if value is not None}
    errno = _ERRNO_RE.search(line)
    if errno and "errno" not in facts:
        value = errno.group("errno") or errno.group("errno_paren")
        facts["errno"] = value
    if "addr" not in facts:
        for regex in _ADDR_RES:
            peer = regex.search(line)
            if peer:
                facts.setdefault("addr", peer.group("addr"))
                facts.setdefault("port", peer.group("port"))
                break
    facts["nodes"] = nodes
    return facts


def _row_facts(sig, shapes, line, nodes):
    """The line's facts for the first of the row's shapes that matches and satisfies its ``when``; else None.
    ``shapes``: ``[(regex, keys)]``; a shape is searched only in a line holding one of its keys."""
    for regex, keys in shapes:
        if keys is not None:
            for key in keys:
                if key in line:
                    break
            else:
                continue
        hit = regex.search(line)
        if hit:
            facts = _line_facts(line, hit, nodes)
            if sig.when is None or sig.when(facts):
                return facts
    return None


def _needs_failure(sig, facts):
    return sig.on_failure(facts) if callable(sig.on_failure) else bool(sig.on_failure)


def _text(value, facts):
    return value(facts) if callable(value) else value


def _has_fabric(need, fabric):
    """Whether the node has the fabric a ``needs_fabric`` row asks for (``True``: any fabric; a kind: that one)."""
    if need is True:
        return bool(fabric)
    return isinstance(fabric, (list, tuple, set)) and need in fabric


_QUANTIFIERS = "?*{+"
_META = ".^$*+?{}[]()|"
_LITERAL_ESCAPES = ".()[]{}?*+|^$\\/-'\" <>=:,"


def _branches(pattern):
    """The top-level alternatives of a regular expression (``|`` outside groups and character classes)."""
    parts, depth, start, index, in_class = [], 0, 0, 0, False
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            index += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "|" and depth == 0:
            parts.append(pattern[start:index])
            start = index + 1
        index += 1
    return parts + [pattern[start:]]


def _required(branch):
    """The longest run of literal characters a match of ``branch`` must contain (outside groups, classes and
    optional characters), or ``""``."""
    runs, run, index, depth, in_class = [], [], 0, 0, False
    while index < len(branch):
        char, literal = branch[index], None
        if char == "\\" and index + 1 < len(branch):
            if depth == 0 and not in_class and branch[index + 1] in _LITERAL_ESCAPES:
                literal = branch[index + 1]
            width = 2
        else:
            width = 1
            if in_class:
                in_class = char != "]"
            elif char == "[":
                in_class = True
            elif char == "(":
                depth += 1
            elif char == ")":
                depth -= 1
            elif depth == 0 and char not in _META:
                literal = char
        following = branch[index + width:index + width + 1]
        if literal is not None and following and following in _QUANTIFIERS:
            literal = None
        if literal is None:
            if char == "(" or char == "[" or depth or in_class or char in _META or char == "\\":
                runs.append("".join(run))
                run = []
        else:
            run.append(literal)
        index += width
    runs.append("".join(run))
    return max(runs, key=len)


def _keys(regex):
    """Literals of which a line the shape matches contains at least one (one per top-level alternative); None when
    an alternative requires none of 3 characters or more (the shape is then tried on every line)."""
    if regex.flags & re.IGNORECASE:
        return None
    keys = [_required(branch) for branch in _branches(regex.pattern)]
    return tuple(keys) if all(len(key) >= 3 for key in keys) else None


_PLANS = {}


def _plan(rows):
    """``[(row, [(regex, keys)])]`` in the order rows are tried on a line: cause rows first, so the line's own facts
    win over a generic reading (computed once per set of rows)."""
    key = tuple(row.id for row in rows)
    if key not in _PLANS:
        ordered = [row for row in rows if row.level == "cause"] + [row for row in rows if row.level != "cause"]
        _PLANS[key] = [(row, [(regex, _keys(regex)) for regex in row.regex]) for row in ordered]
    return _PLANS[key]


def _scan(lines, rows, nodes):
    """``(found, context)``: per row id, the first line it took (``line``, ``facts``, ``count``, ranks)."""
    found, context = {}, {}
    plan = _plan(rows)
    # Only rows that write their text from facts read the log's context (a healthy run's transport rows do not).
    with_context = any(callable(row.cause) or callable(row.fix) for row in rows)
    for source_rank, raw in lines:
        line, rank, local = _strip_prefix(raw)
        if not line:
            continue
        if with_context:
            _read_context(line, context)
        claimed = False
        for sig, shapes in plan:
            if claimed and sig.level == "symptom":
                continue
            facts = _row_facts(sig, shapes, line, nodes)
            if facts is None:
                continue
            claimed = claimed or sig.level == "cause"
            entry = found.setdefault(sig.id, {"line": line[:LINE_MAX], "facts": facts, "count": 0,
                                              "ranks": set(), "local_ranks": set()})
            entry["count"] += 1
            if rank is not None or source_rank is not None:
                entry["ranks"].add(rank if rank is not None else source_rank)
            elif local is not None:
                entry["local_ranks"].add(local)
    return found, context


def _status(sig, fabric):
    if sig.needs_fabric and not _has_fabric(sig.needs_fabric, fabric):
        return "pass"
    return sig.status


def match(lines_or_text, fabric=None, categories=None, signatures=SIGNATURES, nodes=None):
    """The signatures found in ``lines_or_text`` (a text, a list of lines or texts, or of ``(rank, text)``).

    One finding per signature (the first line that took it, ``count`` lines in all), in table order:
    ``{id, line, cause, fix, status, category, level, explains, checks, count, ranks, local_ranks, facts}``
    (``explains``: the row only explains another failure of the log).
    ``fabric``: whether the node has a fabric (``True``) or its kinds (``["infiniband"]``); a ``needs_fabric`` row
    gives its status only there, else it is information (NCCL on sockets is right on an Ethernet-only cluster).
    ``nodes``: how many nodes the job spans (``None``: unknown); a loopback address is a fault only across nodes.
    ``categories`` limits the rows (for example ``("transport",)`` on a healthy run).
    """
    rows = [sig for sig in signatures if categories is None or sig.category in categories]
    found, context = _scan(_lines(lines_or_text), rows, nodes)
    if "nccl_net_ib" in found or "nccl_net_ofi" in found:
        # NCCL took the fabric: socket lines then come from a transport it did not use.
        for sig_id in ("nccl_net_socket", "nccl_ib_no_device", "ibverbs_missing"):
            found.pop(sig_id, None)
    # A row that only explains a failure (the interface NCCL bootstrapped on) needs another failing row.
    failing = any(_status(sig, fabric) in ("warn", "fail") for sig in rows
                  if sig.id in found and not _needs_failure(sig, found[sig.id]["facts"]))
    findings = []
    for sig in rows:
        entry = found.get(sig.id)
        if entry is None or (_needs_failure(sig, entry["facts"]) and not failing):
            continue
        facts = dict(context, **entry["facts"])
        status, cause, fix = _status(sig, fabric), _text(sig.cause, facts), _text(sig.fix, facts)
        if status == "pass" and sig.needs_fabric:
            cause, fix = cause.split(" although")[0] + " (no such fabric on this node: expected)", ""
        findings.append({
            "id": sig.id, "line": entry["line"], "cause": cause, "fix": fix, "status": status,
            "category": sig.category, "level": sig.level, "count": entry["count"],
            "explains": _needs_failure(sig, entry["facts"]),
            "checks": list(sig.checks if sig.checks is not None else CATEGORIES[sig.category]["checks"]),
            "ranks": sorted(entry["ranks"]), "local_ranks": sorted(entry["local_ranks"]),
            "facts": {key: str(value) for key, value in sorted(facts.items())
                      if value is not None and key != "nodes"},
        })
    return findings


def primary(findings):
    """The one cause the findings name: the first ``cause`` that warns or fails (one that is a failure itself before
    one that only explains another, such as the interface NCCL used), else the first such ``symptom``."""
    for level, explains in (("cause", False), ("cause", True), ("symptom", False), ("symptom", True)):
        for finding in findings:
            if finding.get("level", "symptom") == level and bool(finding.get("explains")) == explains and \
                    finding["status"] in ("warn", "fail"):
                return finding
    return None


def expected(finding):
    """What a healthy node shows instead, in the words of the finding's category."""
    return CATEGORIES[finding["category"]]["expected"]


def transport(findings):
    """The NCCL transport the findings show (``NET/IB``, ``NET/OFI``, ``NET/Socket``), or None."""
    for finding in findings:
        if finding["id"] in TRANSPORTS:
            return TRANSPORTS[finding["id"]]
    return None


def table_summary():
    """``{category: [ids]}``: the rows by category, in table order (for docs and tests)."""
    out = collections.OrderedDict()
    for sig in SIGNATURES:
        out.setdefault(sig.category, []).append(sig.id)
    return out


__all__ = ["BY_ID", "CATEGORIES", "LEVELS", "LINE_MAX", "SIGNATURES", "Signature", "TRANSPORTS", "expected",
           "match", "primary", "table_summary", "transport"]
