# -*- coding: utf-8 -*-
"""Slurm drain and resume owned by the preflight, and its node-local Slurm modes.

Standard library plus python-hostlist (and PyYAML for a node's variables file), so the scripts
``scripts/slurm-drain``, ``scripts/slurm-healthcheck`` and ``scripts/slurm-prolog`` use it without
Ansible.

The rule, as LBNL NHC keeps it: the preflight drains a node with a reason that starts with its own
prefix (``preflight:``), and it resumes a node **only** when the node's current reason carries that
prefix.  A node an admin drained (``admin: disk``), or Slurm itself (``Prolog error``, ``Not
responding``), is never resumed and its reason is never overwritten.  Applying the same verdict
twice changes nothing the second time.

Pure functions (unit-tested with recorded scontrol/sinfo text): :func:`drain_reason`,
:func:`owns`, :func:`parse_sinfo`, :func:`parse_scontrol_nodes`, :func:`plan`.  Runners take argv
lists only (no shell) and a ``run`` callable, so tests can record what would run.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess

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
    """``text`` on one line: control characters and runs of white space become one space."""
    return re.sub(r"\s+", " ", re.sub(r"[\x00-\x1f\x7f]", " ", str(text))).strip()


def shorten(text, limit):
    text = one_line(text)
    return text if len(text) <= limit else text[:max(limit - 3, 0)].rstrip() + "..."


def drain_reason(check, found, more=0, limit=REASON_MAX):
    """``preflight: <check>: <short found>`` within ``limit`` characters; ``(+N more)`` when other
    checks failed too.  The prefix and the check name are never cut."""
    head = "%s %s: " % (PREFIX, one_line(check))
    tail = " (+%d more)" % more if more else ""
    room = limit - len(head) - len(tail)
    if room < 8:  # a check name too long to leave room for what was found: keep the name
        return shorten(head + one_line(found), limit) if len(head) < limit else head[:limit].rstrip()
    return head + shorten(found, room) + tail


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


def node_reason(node_result, limit=REASON_MAX):
    """The drain reason for a failed node of a verdict or health-check report."""
    failing = failing_checks(node_result)
    if not failing:
        return drain_reason("preflight.status", "node status %s" % (node_result or {}).get("status"), limit=limit)
    name, check = failing[0]
    return drain_reason(name, check.get("found", ""), more=len(failing) - 1, limit=limit)


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


def plan(report, current):
    """Actions that make Slurm agree with a verdict or health-check ``report``.

    ``current``: ``{node: {"state", "reason"}}`` as Slurm has it now.  Returns one dict per node of
    the report: ``{node, action, reason, why}`` with action ``drain`` (failed; not drained by
    someone else), ``resume`` (healthy, drained with the preflight's prefix), or ``keep``.
    A node the report could not judge (``unverified``) is left as it is."""
    actions = []
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
            wanted = node_reason(result)
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


def reconcile(report, runner=run, sinfo="sinfo", scontrol="scontrol", dry_run=False, nodes=None):
    """Read Slurm, plan against ``report`` and apply: ``(actions, results)``."""
    nodes = list(nodes if nodes is not None else report.get("hosts") or [])
    current = read_states(nodes, runner, sinfo, scontrol)
    actions = [item for item in plan(report, current) if item["node"] in nodes]
    return actions, apply(actions, runner, scontrol, dry_run)


# -- the node-local modes (HealthCheckProgram, prolog) -------------------------------------------


def local_node_name(environ=None):
    """This node's Slurm name: ``SLURMD_NODENAME`` (set by slurmd for a prolog and a health check),
    else the short host name."""
    environ = os.environ if environ is None else environ
    return (environ.get("SLURMD_NODENAME") or "").strip() or socket.gethostname().split(".")[0]


def node_inventory(node, python, host_vars=None, group="cluster"):
    """An inventory of this node alone, reached with the local connection (no sshd, no key)."""
    hostvars = {"ansible_connection": "local", "ansible_python_interpreter": python,
                "preflight_training_python": python}
    hostvars.update(host_vars or {})
    return {"all": {"children": {group: {"hosts": {node: hostvars}}}}}


def healthcheck_argv(ansible_playbook, playbook, inventory, results_dir, budget):
    return [ansible_playbook, playbook, "-i", inventory, "-e", "preflight_results_dir=%s" % results_dir,
            "-e", "preflight_healthcheck_budget=%d" % budget]


def run_bounded(argv, timeout, env, cwd):
    """Run argv in its own session; on timeout kill the whole session. ``(rc, output)``, rc None on timeout."""
    with subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          env=env, cwd=cwd, start_new_session=True, text=True) as proc:
        try:
            output, _ = proc.communicate(timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            _killpg(proc.pid)
            output, _ = proc.communicate()
            return None, output
    # What a timed-out node task left behind (a hung probe's children) goes with the run, not later.
    _killpg(proc.pid)
    return rc, output


def _killpg(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


BUDGET = 30
# Seconds of the budget kept for the script itself: its start, the report, scontrol.
SCRIPT_MARGIN = 3.0
# ansible-playbook is killed this long before the budget ends, whatever it is doing.
KILL_MARGIN = 1.5
VARS_FILE = "/etc/preflight/node.yml"
RESULTS_BASE = "/var/tmp/preflight-slurm"


def load_node_vars(path):
    """The node's variables file (a YAML mapping), ``{}`` when there is none; ValueError names a bad one."""
    if not path or not os.path.exists(path):
        return {}
    import yaml  # pylint: disable=import-outside-toplevel

    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError("cannot read %s: %s" % (path, one_line(exc)[:300])) from exc
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(key, str) for key in data):
        raise ValueError("%s is not a mapping of variable names to values" % path)
    return data


def run_failure(node, check, found, fix):
    """A report of one failed run-level check, for when the playbook gave none (shapes like a verdict)."""
    return {"status": "fail", "hosts": [node], "healthy_hosts": [], "failed_hosts": [node],
            "nodes": {node: {"status": "fail", "checks": {check: {
                "status": "fail", "found": found, "expected": "a health-check report within the budget",
                "fix": fix}}}}}


def local_check(node, root, python, results_base, budget=BUDGET, host_vars=None, environ=None):
    """healthcheck.yml on this node alone over the local connection, bounded by ``budget`` seconds.

    Returns ``(report, log)``: the health-check report (``run_failure`` when there is none) and
    ansible-playbook's output.  The run's directory is temporary; the caller keeps what it wants."""
    import json  # pylint: disable=import-outside-toplevel
    import shutil  # pylint: disable=import-outside-toplevel
    import tempfile  # pylint: disable=import-outside-toplevel
    import time  # pylint: disable=import-outside-toplevel

    started = time.monotonic()
    os.makedirs(results_base, mode=0o750, exist_ok=True)
    work = tempfile.mkdtemp(prefix="run-", dir=results_base)
    try:
        inventory = os.path.join(work, "inventory.json")  # JSON is YAML: the yaml inventory plugin reads it
        with open(inventory, "w", encoding="utf-8") as handle:
            json.dump(node_inventory(node, python, host_vars), handle)
        results_dir = os.path.join(work, "results")
        env = dict(os.environ if environ is None else environ)
        env.update(ANSIBLE_CONFIG=os.path.join(root, "ansible.cfg"), ANSIBLE_NOCOLOR="1", LANG="C.UTF-8",
                   ANSIBLE_LOCAL_TEMP=os.path.join(work, "tmp"), ANSIBLE_RETRY_FILES_ENABLED="0")
        venv_bin = os.path.dirname(python)
        env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH") or "/usr/bin:/bin", "/usr/sbin", "/sbin"])
        if not env.get("HOME"):
            import pwd  # pylint: disable=import-outside-toplevel

            env["HOME"] = pwd.getpwuid(os.geteuid()).pw_dir
        playbook_budget = max(int(budget - SCRIPT_MARGIN), 5)
        argv = healthcheck_argv(os.path.join(os.path.dirname(python), "ansible-playbook"),
                                os.path.join(root, "healthcheck.yml"), inventory, results_dir, playbook_budget)
        rc, log = run_bounded(argv, max(budget - KILL_MARGIN - (time.monotonic() - started), 1), env, root)
        reports = []
        if os.path.isdir(results_dir):
            reports = sorted(name for name in os.listdir(results_dir)
                             if os.path.exists(os.path.join(results_dir, name, "healthcheck.json")))
        if reports:
            with open(os.path.join(results_dir, reports[-1], "healthcheck.json"), encoding="utf-8") as handle:
                return json.load(handle), log
        if rc is None:
            return run_failure(node, "preflight.budget", "no report within the %d s budget (ansible-playbook killed)"
                               % budget, "find the slow step in %s (a hung mount or sysfs read, an overloaded "
                               "node)" % os.path.join(results_base, "last.log")), log
        last = [line for line in (log or "").splitlines() if line.strip()][-1:] or ["no output"]
        return run_failure(node, "preflight.report", "ansible-playbook ended (rc %s) without a report: %s"
                           % (rc, last[0]), "run scripts/slurm-healthcheck --dry-run on the node and read "
                           "%s" % os.path.join(results_base, "last.log")), log
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _keep_last(results_base, report, log):
    """The last run's report and ansible output, for the admin (``last.json``, ``last.log``), atomically."""
    import json  # pylint: disable=import-outside-toplevel
    import tempfile  # pylint: disable=import-outside-toplevel

    for name, text in (("last.log", log or ""), ("last.json", json.dumps(report, indent=2, sort_keys=True) + "\n")):
        fd, tmp = tempfile.mkstemp(dir=results_base, prefix=".tmp-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.chmod(tmp, 0o640)
            os.replace(tmp, os.path.join(results_base, name))
        except OSError:
            if os.path.exists(tmp):
                os.unlink(tmp)


def local_main(argv, mode, root, stderr=None):
    """The command line of ``scripts/slurm-healthcheck`` (mode ``healthcheck``) and
    ``scripts/slurm-prolog`` (mode ``prolog``).  Prints nothing when the node passes."""
    import argparse  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel

    stderr = stderr or sys.stderr
    parser = argparse.ArgumentParser(
        prog="slurm-" + mode,
        description="Run healthcheck.yml on this node alone (local connection) within the budget. "
                    + ("On failure drain the node with a 'preflight:' reason; resume it when it passes and the "
                       "preflight had drained it." if mode == "healthcheck" else
                       "On failure print one line on stderr and exit 1 (Slurm drains a node whose prolog "
                       "fails); never calls scontrol."))
    parser.add_argument("--node", default=None, help="Slurm node name (default: $SLURMD_NODENAME, else the short "
                                                       "host name)")
    parser.add_argument("--budget", type=int, default=int(os.environ.get("PREFLIGHT_HEALTHCHECK_BUDGET") or BUDGET),
                        help="seconds for the whole run (default 30, $PREFLIGHT_HEALTHCHECK_BUDGET)")
    parser.add_argument("--vars", default=os.environ.get("PREFLIGHT_NODE_VARS") or VARS_FILE,
                        help="YAML file of the node's preflight variables (default %s, $PREFLIGHT_NODE_VARS)"
                             % VARS_FILE)
    parser.add_argument("--results-dir", default=os.environ.get("PREFLIGHT_SLURM_RESULTS") or RESULTS_BASE,
                        help="where last.json and last.log of the last run are kept (default %s, "
                             "$PREFLIGHT_SLURM_RESULTS)" % RESULTS_BASE)
    parser.add_argument("--slurm-conf", default=None, metavar="PATH", help=SLURM_CONF_HELP)
    if mode == "healthcheck":
        parser.add_argument("--dry-run", action="store_true", help="print the scontrol commands, run none")
    args = parser.parse_args(argv)
    node = args.node or local_node_name()
    python = sys.executable
    found = find_slurm_conf(args.slurm_conf)
    if found["error"] and mode == "healthcheck":  # a prolog never calls scontrol: nothing to stop for
        print("%s %s: slurm: %s -- fix: %s" % (PREFIX, node, found["error"], BAD_CONF_FIX), file=stderr)
        return 2
    try:
        host_vars = load_node_vars(args.vars)
    except ValueError as exc:
        print("%s %s: preflight.node_vars: %s -- fix: correct or remove %s" % (PREFIX, node, exc, args.vars),
              file=stderr)
        return 2
    host_vars.setdefault("preflight_training_python", os.environ.get("PREFLIGHT_TRAINING_PYTHON") or python)
    environ = dict(os.environ)
    if found["path"]:  # the playbook's own Slurm clients, if any, read the same file
        environ["SLURM_CONF"] = found["path"]
    report, log = local_check(node, root, python, args.results_dir, args.budget, host_vars, environ)
    _keep_last(args.results_dir, report, log)
    result = (report.get("nodes") or {}).get(node) or {}
    line = failure_line(node, result) if report.get("status") != "pass" else None
    if report.get("status") != "pass" and line is None:
        line = "%s %s: preflight.status: the report says %s -- fix: read %s" % (
            PREFIX, node, report.get("status"), os.path.join(args.results_dir, "last.json"))
    if mode == "prolog":
        if line:
            print(line, file=stderr)
            return 1
        return 0
    # HealthCheckProgram: Slurm ignores its exit code; the drain is what takes the node out.
    if line:
        print(line, file=stderr)
    try:
        _actions, results = reconcile(report, runner=slurm_runner(found), dry_run=args.dry_run, nodes=[node])
    except RuntimeError as exc:
        print("%s %s: slurm: %s; %s" % (PREFIX, node, exc, conf_words(found)), file=stderr)
        return 2
    failed = False
    for item, cmd, rc, err in results:
        if args.dry_run:
            print(" ".join(cmd))
        elif rc != 0:
            failed = True
            print("%s %s: could not %s: %s (rc %d)" % (PREFIX, node, item["action"], err, rc), file=stderr)
    if failed:
        return 2
    return 1 if line else 0
