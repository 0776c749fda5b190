# -*- coding: utf-8 -*-
"""Slurm drain and resume owned by the preflight (controller layer, ``cluster_preflight/slurm/drain.py``).

Standard library plus python-hostlist, so the scripts ``scripts/slurm-drain``,
``scripts/slurm-healthcheck`` and ``scripts/slurm-prolog`` use it without Ansible.  The node-local
modes of the last two (HealthCheckProgram, prolog) are ``cluster_preflight/slurm/local.py``.

The rule, as LBNL NHC keeps it: the preflight drains a node with a reason that starts with its own
prefix (``preflight:``), and it resumes a node **only** when the node's current reason carries that
prefix.  A node an admin drained (``admin: disk``), or Slurm itself (``Prolog error``, ``Not
responding``), is never resumed and its reason is never overwritten.  Applying the same verdict
twice changes nothing the second time.

A drain reason says since when the node has failed that way when the run history knows
(:func:`history_since`, over ``cluster_preflight/outputs/history.py``); the history is optional.

Pure functions (unit-tested with recorded scontrol/sinfo text): :func:`drain_reason`,
:func:`owns`, :func:`parse_sinfo`, :func:`parse_scontrol_nodes`, :func:`plan`.  Runners take argv
lists only (no shell) and a ``run`` callable, so tests can record what would run.
"""

from __future__ import annotations

import os
import re
import subprocess

from cluster_preflight.verdict.printable import printable

# The drain reason prefix the preflight owns. A reason that starts with it was written by the
# preflight and may be cleared by it; any other reason belongs to whoever wrote it.
PREFIX = "preflight:"
# Slurm keeps any length, but sinfo -R, squeue and dashboards cut long reasons; the check name
# must survive, the details are in the report.
REASON_MAX = 120
# One line on a prolog's stderr: slurmd logs it, the admin reads it.
LINE_MAX = 600
SLURM_TIMEOUT = 10
# Run-level findings explain everything else on a node (it was unreachable, its call timed out).
_RUN_NAMESPACE = "preflight."
_NOT_RESPONDING = "*"


def one_line(text):
    """``text`` on one line (``printable``: no escape sequence or control character), runs of white space one
    space."""
    return re.sub(r"\s+", " ", printable(text)).strip()


def shorten(text, limit):
    text = one_line(text)
    return text if len(text) <= limit else text[:max(limit - 3, 0)].rstrip() + "..."


def drain_reason(check, found, more=0, limit=REASON_MAX, since=None):
    """``preflight: <check>: <short found>`` within ``limit`` characters; `` since <UTC time>`` when the run
    history knows when the node first failed this way (``since``, see :func:`since_text`); ``(+N more)`` when
    other checks failed too.  The prefix and the check name are never cut; the time is kept whole or left
    out when the limit leaves no room for it."""
    head = "%s %s: " % (PREFIX, one_line(check))
    tail = " (+%d more)" % more if more else ""
    when = " since %s" % one_line(since) if since else ""
    if when and limit - len(head) - len(tail) - len(when) < 8:
        when = ""  # the check name and what was found matter more than when it began
    room = limit - len(head) - len(tail) - len(when)
    if room < 8:  # a check name too long to leave room for what was found: keep the name
        return shorten(head + one_line(found), limit) if len(head) < limit else head[:limit].rstrip()
    return head + shorten(found, room) + when + tail


def since_text(finished):
    """A history ``finished`` time (``2026-11-20T10:00:00Z``) as ``2026-11-20 10:00 UTC`` (the text as given
    when it is not in that form)."""
    match = re.fullmatch(r"(\d{4}-\d\d-\d\d)T(\d\d:\d\d)(?::\d\d)?Z", str(finished or "").strip())
    return "%s %s UTC" % match.groups() if match else one_line(finished or "")


def history_since(db):
    """``since(node, check)``: when ``node`` first failed ``check`` in its current streak of failing runs, as
    :func:`since_text`, from the run history at ``db`` (``cluster_preflight/outputs/history.py``:
    ``first_failure``); None when the history does not say.  The history is optional: no ``db``, a missing,
    corrupt or older database gives None, never an error."""
    if not db:
        return lambda node, check: None
    import sqlite3  # pylint: disable=import-outside-toplevel

    from cluster_preflight.outputs.history import HistoryError, first_failure  # pylint: disable=import-outside-toplevel

    def since(node, check):
        try:
            first = first_failure(db, node, check)
        except (HistoryError, sqlite3.Error, OSError, ValueError):
            return None
        return since_text(first["finished"]) if first and first.get("finished") else None
    return since


def owns(reason):
    """Whether the preflight wrote this drain reason (and so may resume the node)."""
    return one_line(reason or "").startswith(PREFIX)


def is_drained(state):
    """Slurm state text (``IDLE+DRAIN``, ``drained``, ``draining*``, ``DOWN``) that a resume would change."""
    words = re.split(r"[+ ]", (state or "").lower().rstrip("*~#!%$@^-"))
    return any(word.startswith("drain") or word == "down" for word in words)


def failing_checks(node_result):
    """``[(name, check)]`` of a node's failing checks, run-level findings (``preflight.*``) first."""
    checks = (node_result or {}).get("checks") or {}
    failing = [(name, check) for name, check in checks.items() if (check or {}).get("status") == "fail"]
    return sorted(failing, key=lambda item: (not item[0].startswith(_RUN_NAMESPACE), item[0]))


def node_reason(node_result, limit=REASON_MAX, since=None):
    """The drain reason for a failed node of a verdict or health-check report; ``since``: the first failing
    check's start as text (see :func:`history_since`), or None."""
    failing = failing_checks(node_result)
    if not failing:
        return drain_reason("preflight.status", "node status %s" % (node_result or {}).get("status"), limit=limit)
    name, check = failing[0]
    return drain_reason(name, check.get("found", ""), more=len(failing) - 1, limit=limit, since=since)


def failure_line(node, node_result, limit=LINE_MAX):
    """The prolog's one line: ``preflight: <node>: <check>: <found> -- fix: <fix>`` (None when nothing failed)."""
    failing = failing_checks(node_result)
    if not failing:
        return None
    name, check = failing[0]
    more = " (+%d more failing checks)" % (len(failing) - 1) if len(failing) > 1 else ""
    fix = one_line(check.get("fix") or "see the report")
    head = "%s %s: %s: " % (PREFIX, node, name)
    room = max(limit - len(head) - len(" -- fix: ") - len(more) - min(len(fix), limit // 3), 40)
    return head + shorten(check.get("found", ""), room) + more + " -- fix: " + shorten(fix, limit // 3)


# -- what Slurm says ----------------------------------------------------------------------------

SINFO_FORMAT = "%N|%T|%E"


def parse_sinfo(text):
    """``sinfo -h -N -o '%N|%T|%E'`` → ``{node: {"state", "reason"}}``.

    A node is listed once per partition (the same state each time); the reason is the last field,
    so a ``|`` inside it is kept; sinfo prints ``none`` for no reason."""
    nodes = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.strip().split("|", 2)
        if len(parts) != 3:
            raise ValueError("unexpected sinfo line %r (expected NODE|STATE|REASON)" % line)
        name, state, reason = (part.strip() for part in parts)
        nodes.setdefault(name, {"state": state, "reason": "" if reason == "none" else reason})
    return nodes


# The trailing ``[user@time]`` is Slurm's; a reason may hold brackets of its own ("[Errno 2] ...").
_REASON_RE = re.compile(r"^\s*Reason=(?P<reason>.*?)(?:\s+\[(?P<user>[^\s@\[\]]*)@(?P<time>[^\s\[\]]*)\])?\s*$")


def parse_scontrol_nodes(text):
    """``scontrol show node [N]`` (the multi-line form) → ``{node: {"state", "reason", "reason_user"}}``.

    ``Reason=`` has a line of its own and ends with ``[user@time]``, which is not part of the reason."""
    nodes = {}
    current = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("NodeName="):
            name = stripped.split()[0].split("=", 1)[1]
            current = nodes.setdefault(name, {"state": "", "reason": "", "reason_user": ""})
            continue
        if current is None:
            continue
        match = _REASON_RE.match(line)
        if match:
            current["reason"] = match.group("reason").strip()
            current["reason_user"] = match.group("user") or ""
            continue
        for field in stripped.split():
            if field.startswith("State="):
                current["state"] = field.split("=", 1)[1]
    return nodes


# -- what to do ---------------------------------------------------------------------------------


def plan(report, current, since=None):
    """Actions that make Slurm agree with a verdict or health-check ``report``.

    ``current``: ``{node: {"state", "reason"}}`` as Slurm has it now.  ``since``: ``since(node, check)``
    (:func:`history_since`) puts when the node first failed into its drain reason.  Returns one dict per node of
    the report: ``{node, action, reason, why}`` with action ``drain`` (failed; not drained by
    someone else), ``resume`` (healthy, drained with the preflight's prefix), or ``keep``.
    A node the report could not judge (``unverified``) is left as it is, and so is every node of a report whose
    run stopped on invalid settings (``stopped``): it judged no node, whatever its nodes' entries say."""
    actions = []
    if report.get("stopped"):
        return [{"node": node, "action": "keep", "reason": "", "why": "not judged: the run stopped on %s"
                 % one_line(report["stopped"])} for node in report.get("hosts") or []]
    for node in report.get("hosts") or []:
        result = (report.get("nodes") or {}).get(node) or {}
        status = result.get("status")
        now = current.get(node)
        if now is None:
            actions.append({"node": node, "action": "keep", "reason": "",
                            "why": "not a Slurm node (not in sinfo/scontrol)"})
            continue
        drained, reason = is_drained(now.get("state")), now.get("reason") or ""
        if status == "fail":
            failing = failing_checks(result)
            wanted = node_reason(result, since=since(node, failing[0][0]) if since and failing else None)
            if drained and reason and not owns(reason):
                actions.append({"node": node, "action": "keep", "reason": reason,
                                "why": "failed, but drained by someone else (%r): left as it is" % reason})
            elif drained and reason == wanted:
                actions.append({"node": node, "action": "keep", "reason": reason, "why": "already drained"})
            else:
                actions.append({"node": node, "action": "drain", "reason": wanted, "why": "failed"})
        elif status in ("pass", "warn"):
            if drained and owns(reason):
                actions.append({"node": node, "action": "resume", "reason": reason,
                                "why": "healthy again; the preflight had drained it"})
            elif drained:
                actions.append({"node": node, "action": "keep", "reason": reason,
                                "why": "healthy, but drained by someone else (%r): never resumed by the preflight"
                                       % reason})
            else:
                actions.append({"node": node, "action": "keep", "reason": reason, "why": "healthy"})
        else:
            actions.append({"node": node, "action": "keep", "reason": reason,
                            "why": "%s: not judged, left as it is" % (status or "no result")})
    return actions


# -- argv and runners -----------------------------------------------------------------------------


def drain_argv(node, reason, scontrol="scontrol"):
    return [scontrol, "update", "nodename=%s" % node, "state=drain", "reason=%s" % reason]


def resume_argv(node, scontrol="scontrol"):
    return [scontrol, "update", "nodename=%s" % node, "state=resume"]


def show_node_argv(node, scontrol="scontrol"):
    return [scontrol, "show", "node", node]


def sinfo_argv(nodes, sinfo="sinfo"):
    import hostlist  # pylint: disable=import-outside-toplevel

    return [sinfo, "-h", "-N", "-n", hostlist.collect_hostlist(list(nodes)), "-o", SINFO_FORMAT]


def expand_nodelist(nodelist):
    """Node names of a Slurm node list (``gpu[01-03]``), in order, each once."""
    import hostlist  # pylint: disable=import-outside-toplevel

    return list(dict.fromkeys(name for name in hostlist.expand_hostlist(nodelist.strip()) if name))


def run(argv, timeout=SLURM_TIMEOUT, env=None):
    """Run argv (a list, never a shell string) bounded by ``timeout``: ``(rc, stdout, stderr)``."""
    env = dict(os.environ if env is None else env, LANG="C", LC_ALL="C")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, env=env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return 124, "", "%s took more than %d s (is slurmctld answering? try scontrol ping)" % (argv[0], timeout)
    except OSError as exc:
        return 127, "", "%s: %s" % (argv[0], exc.strerror or exc)
    return done.returncode, done.stdout, done.stderr


# -- which slurm.conf scontrol and sinfo read ----------------------------------------------------
#
# Slurm 22.05's client commands (src/common/read_config.c, _establish_config_source) take SLURM_CONF;
# else the compiled-in default when it exists (/etc/slurm/slurm.conf in Debian's build); else
# /run/slurm/conf/slurm.conf, the link a configless slurmd (--conf-server) keeps to its cache
# SlurmdSpoolDir/conf-cache; else DNS SRV records (_slurmctld._tcp), which only Slurm itself follows.
# Slurm runs a HealthCheckProgram with no arguments and no SLURM_CONF (its environment is
# SLURMD_NODENAME alone; a Prolog gets SLURM_CONF), so a slurmd started with ``-f FILE`` leaves the
# health check's own scontrol without a configuration: the -f of the slurmd that started this script
# is looked at too.
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
CONFIGLESS_LINK = "/run/slurm/conf/slurm.conf"
# The cache itself under the default SlurmdSpoolDir (the link above is gone when /run was emptied).
SPOOL_CONF_CACHE = "/var/spool/slurmd/conf-cache/slurm.conf"
CLIENT_DEFAULTS = (("the compiled-in default", DEFAULT_SLURM_CONF),
                   ("the configless cache of slurmd", CONFIGLESS_LINK),
                   ("slurmd's cache under the default SlurmdSpoolDir", SPOOL_CONF_CACHE))
# slurmd 22.05's short options that take no argument: "-Df FILE" is "-D -f FILE".
_SLURMD_F = re.compile(r"^-[bcCDGhsvVZ]*f(?P<rest>.*)$")


def slurmd_conf_of(pid, proc_root="/proc"):
    """The ``-f FILE`` of process ``pid`` when it is slurmd, else None (another program, or slurmd
    without -f: configless, or the default file)."""
    base = os.path.join(proc_root, str(pid))
    try:
        with open(os.path.join(base, "cmdline"), "rb") as handle:
            argv = [part.decode("utf-8", "replace") for part in handle.read().split(b"\0") if part]
    except OSError:
        return None
    if not argv or os.path.basename(argv[0]) != "slurmd":
        return None
    for index, arg in enumerate(argv[1:], 1):
        if arg == "--":
            break
        match = _SLURMD_F.match(arg)
        if match:
            path = match.group("rest") or (argv[index + 1] if index + 1 < len(argv) else "")
            if path and not os.path.isabs(path):
                try:  # slurmd resolved it against the directory it was started in
                    path = os.path.join(os.readlink(os.path.join(base, "cwd")), path)
                except OSError:
                    pass
            return path or None
    return None


def find_slurm_conf(option=None, environ=None, parent=None, proc_root="/proc", defaults=CLIENT_DEFAULTS):
    """The slurm.conf this script's scontrol and sinfo are given (as SLURM_CONF), in this order:

    1. ``--slurm-conf PATH`` (``option``): the command line beats the environment, as slurmd's -f does;
    2. ``$SLURM_CONF``, as for every Slurm client (slurmd sets it for a Prolog);
    3. the ``-f FILE`` of the slurmd that started this script (``parent``, default the parent process);
    4. the files Slurm's clients look at next, when they exist: /etc/slurm/slurm.conf, then the
       configless cache /run/slurm/conf/slurm.conf, then /var/spool/slurmd/conf-cache/slurm.conf.

    Returns ``{path, source, tried, error}``.  A file named by 1-3 that is not there is an ``error``
    (never a quiet fall-back to another cluster's file).  With nothing found ``path`` is None: the
    clients then run without SLURM_CONF (DNS SRV records may still work) and ``tried`` says, in
    :func:`not_found`, what was looked at."""
    environ = os.environ if environ is None else environ
    parent = os.getppid() if parent is None else parent
    explicit = (("--slurm-conf", option), ("SLURM_CONF", environ.get("SLURM_CONF")),
                ("the -f of slurmd (pid %s), which started this script" % parent, slurmd_conf_of(parent, proc_root)))
    tried = []
    for source, path in explicit:
        if not path:
            tried.append((source, None))
            continue
        if not os.path.isfile(path):
            return {"path": None, "source": source, "tried": tried + [(source, path)],
                    "error": "%s names %s, which is not a file" % (source, path)}
        return {"path": path, "source": source, "tried": tried, "error": None}
    for source, path in defaults:
        if os.path.isfile(path):
            return {"path": path, "source": source, "tried": tried, "error": None}
        tried.append((source, path))
    return {"path": None, "source": None, "tried": tried, "error": None}


SLURM_CONF_HELP = ("the slurm.conf scontrol and sinfo read (default: $SLURM_CONF, else the -f of the slurmd that "
                   "started this script, else the first of %s that exists)" % ", ".join(
                       path for _source, path in CLIENT_DEFAULTS))
BAD_CONF_FIX = ("pass --slurm-conf with the file slurmd runs with (ps -o args= -C slurmd shows its -f), or correct "
                "or unset SLURM_CONF")


def conf_words(found):
    """What to add to a Slurm client's failure: the file it was given, or how none was found."""
    if found.get("path"):
        return "slurm.conf used: %s (from %s)" % (found["path"], found["source"])
    return not_found(found)


def not_found(found):
    """Found / fix words for a Slurm client that failed with no slurm.conf given to it."""
    unset = [source.split(" (")[0] for source, path in found["tried"] if path is None]
    missing = [path for _source, path in found["tried"] if path]
    return ("no slurm.conf was found for scontrol/sinfo (not set: %s; not there: %s; DNS SRV gave none either). "
            "Fix: pass --slurm-conf PATH or set SLURM_CONF=PATH, PATH being the file slurmd runs with "
            "(ps -o args= -C slurmd shows its -f); as HealthCheckProgram, which Slurm runs without arguments, "
            "through a wrapper that runs this script with --slurm-conf PATH"
            % (", ".join(unset) or "none", ", ".join(missing) or "none"))


def slurm_runner(found, environ=None):
    """``run`` with SLURM_CONF set to ``found["path"]`` (removed when None) in the child's environment only."""
    env = dict(os.environ if environ is None else environ)
    env.pop("SLURM_CONF", None)
    if found.get("path"):
        env["SLURM_CONF"] = found["path"]

    def runner(argv, timeout=SLURM_TIMEOUT):
        return run(argv, timeout=timeout, env=env)
    return runner


def read_states(nodes, runner=run, sinfo="sinfo", scontrol="scontrol"):
    """``{node: {"state", "reason"}}`` from Slurm: ``scontrol show node`` for one node, sinfo for more."""
    nodes = list(nodes)
    if not nodes:
        return {}
    if len(nodes) == 1:
        rc, out, err = runner(show_node_argv(nodes[0], scontrol))
        if rc != 0:
            if "not found" in (err + out).lower() or "invalid node name" in (err + out).lower():
                return {}
            raise RuntimeError("scontrol show node %s failed (rc %d): %s" % (nodes[0], rc, one_line(err)[:300]))
        return parse_scontrol_nodes(out)
    rc, out, err = runner(sinfo_argv(nodes, sinfo))
    if rc != 0:
        raise RuntimeError("sinfo failed (rc %d): %s" % (rc, one_line(err)[:300]))
    return parse_sinfo(out)


def apply(actions, runner=run, scontrol="scontrol", dry_run=False):
    """Run the drains and resumes of :func:`plan`; returns ``[(action, argv, rc, error)]``."""
    done = []
    for item in actions:
        if item["action"] == "drain":
            argv = drain_argv(item["node"], item["reason"], scontrol)
        elif item["action"] == "resume":
            argv = resume_argv(item["node"], scontrol)
        else:
            continue
        if dry_run:
            done.append((item, argv, 0, ""))
            continue
        rc, _out, err = runner(argv)
        done.append((item, argv, rc, one_line(err)[:300]))
    return done


# scripts/slurm-drain's cap when none is given: a share of the verdict's nodes, and never fewer than this many.
DEFAULT_MAX_DRAIN = ("10%", 4)


def drain_cap(text, total):
    """The most nodes one run may drain: ``text`` is a count (``20``) or a share of the run's ``total`` nodes
    (``10%``, rounded up, at least 1); ValueError names a value that is neither."""
    text = str(text).strip()
    try:
        if text.endswith("%"):
            share = float(text[:-1])
            if not 0 <= share <= 100:
                raise ValueError
            return max(1, int(-(-share * total // 100))) if share else 0
        count = int(text)
        if count < 0:
            raise ValueError
        return count
    except ValueError:
        raise ValueError("--max-drain %r is neither a count of nodes (20) nor a share of them (10%%)" % text)


def capped(actions, cap):
    """``(actions, over)``: when more nodes would be drained than ``cap``, none is (each stays as it is, saying
    why) and ``over`` says so; resumes are kept.  Many nodes failing at once is a cause they share (a switch, an
    image, a configuration, the gate itself), which draining them all would hide and cost a cluster."""
    drains = [item for item in actions if item["action"] == "drain"]
    if cap is None or len(drains) <= cap:
        return actions, ""
    over = ("%d nodes failed, more than the %d one run may drain (--max-drain): none was drained; a cause that many "
            "nodes share is likely (a switch, an image, a configuration): read the verdict, then drain by hand or "
            "re-run with a higher --max-drain" % (len(drains), cap))
    return [dict(item, action="keep", why="failed, not drained: over the drain cap (%d of at most %d)" % (
        len(drains), cap)) if item["action"] == "drain" else item for item in actions], over


def reconcile(report, runner=run, sinfo="sinfo", scontrol="scontrol", dry_run=False, nodes=None, since=None,
              max_drain=None):
    """Read Slurm, plan against ``report`` (``since``: see :func:`plan`; ``max_drain``: :func:`capped`) and apply:
    ``(actions, results)``."""
    nodes = list(nodes if nodes is not None else report.get("hosts") or [])
    current = read_states(nodes, runner, sinfo, scontrol)
    actions, _over = capped([item for item in plan(report, current, since) if item["node"] in nodes], max_drain)
    return actions, apply(actions, runner, scontrol, dry_run)
