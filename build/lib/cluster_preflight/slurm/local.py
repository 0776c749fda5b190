# -*- coding: utf-8 -*-
"""The node-local Slurm modes (controller layer, ``cluster_preflight/slurm/local.py``): the
HealthCheckProgram and the prolog, run on a Slurm node by ``scripts/slurm-healthcheck`` and
``scripts/slurm-prolog``.

:func:`local_main` is their command line; :func:`local_check` runs healthcheck.yml on this node alone
over the local connection within a budget (:func:`run_bounded` kills the whole session at its end).
The drain and resume rules, the parsers and the runners are ``cluster_preflight/slurm/drain.py``.
:func:`fresh_pass` is the ``--max-age`` fast path (a recent pass of this node: no checks run), and each
run is recorded in the node's run history (:func:`history_db`), which dates the drain reason.

Everything these scripts keep as root (the run's inventory, Ansible's local temp, the run directory, ``last.json``,
the history) lives in the results directory, which must be root's alone: :func:`local_main` checks it at every
start (``preflight_node.host.state_dir``) and refuses (exit 2, one line, nothing read or written there) a directory
another account owns or may write, and a variables file another account may write.  An invalid variables file
(unreadable, or settings the run refuses) means the script could not run: one line, nothing drained.
Standard library plus PyYAML (the node's variables file), no Ansible import.
"""

from __future__ import annotations

import json
import os
import socket

from cluster_preflight.outputs.history import db_path
from cluster_preflight.slurm.drain import (BAD_CONF_FIX, PREFIX, SLURM_CONF_HELP, conf_words, failure_line,
                                           find_slurm_conf, history_since, one_line, reconcile, slurm_runner)
from cluster_preflight.verdict.file import VerdictError, load, parse_age
from preflight_node.host.state_dir import UnsafeState, private_dir, trusted_file

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
    if hostvars["preflight_training_python"] == python:
        # The checkout's own interpreter, which these checks already run with: naming its user (root under
        # slurmd) as the job user trusts nothing new. A site's training Python needs its job user named.
        import pwd  # pylint: disable=import-outside-toplevel
        hostvars.setdefault("preflight_job_user", pwd.getpwuid(os.geteuid()).pw_name)
    return {"all": {"children": {group: {"hosts": {node: hostvars}}}}}


def healthcheck_argv(ansible_playbook, playbook, inventory, results_dir, budget, history=None):
    """``history``: the database the run is recorded in (None: not recorded, ``preflight_history_db=none``)."""
    return [ansible_playbook, playbook, "-i", inventory, "-e", "preflight_results_dir=%s" % results_dir,
            "-e", "preflight_healthcheck_budget=%d" % budget,
            "-e", json.dumps({"preflight_history_db": history or "none"})]


def run_bounded(argv, timeout, env, cwd):
    """Run argv in its own session, marked; at its end (in time or not) kill everything it started, the
    commands its modules started in sessions of their own included (they carry its marker), and reap them
    within a bound (``preflight_node.host.reap``).  ``(rc, output)``, rc None on timeout; what did not die from
    the kill (stuck in the kernel) is named at the end of the output."""
    from preflight_node.host import reap  # pylint: disable=import-outside-toplevel

    # What a timed-out node task left behind (a hung probe's children) goes with the run, not later.
    rc, out, _err, timed_out, stuck = reap.capture(argv, timeout, env=env, cwd=cwd, merge=True, leftovers=True)
    output = out.decode("utf-8", "replace")
    if stuck:
        output += "\n%s" % reap.stuck_text(stuck)
    return (None if timed_out else rc), output


BUDGET = 30
# Seconds of the budget kept for the script itself: its start, the report, scontrol.
SCRIPT_MARGIN = 3.0
# ansible-playbook is killed this long before the budget ends, whatever it is doing.
KILL_MARGIN = 1.5
VARS_FILE = "/etc/preflight/node.yml"
RESULTS_BASE = "/var/lib/preflight-slurm"
STATE_FIX = ("remove it (after reading what is in it: another account may have forged a verdict there) and let the "
             "script create it (root's, mode 0700), or point --results-dir at a directory of root's alone")
# Exit codes of the node-local scripts (README.md, docs/slurm.md).
PASS, FAIL, NOT_RUN = 0, 1, 2


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


def local_check(node, root, python, results_base, budget=BUDGET, host_vars=None, environ=None, history=None):
    """healthcheck.yml on this node alone over the local connection, bounded by ``budget`` seconds, recorded in
    the run history ``history`` (a path; None: not recorded).

    Returns ``(report, log)``: the health-check report (``run_failure`` when there is none) and
    ansible-playbook's output.  The run's directory is temporary; the caller keeps what it wants."""
    import shutil  # pylint: disable=import-outside-toplevel
    import tempfile  # pylint: disable=import-outside-toplevel
    import time  # pylint: disable=import-outside-toplevel

    started = time.monotonic()
    # Root's alone (refused with UnsafeState otherwise): the inventory and Ansible's local temp live below it.
    results_base = private_dir(results_base, STATE_FIX)
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
                                os.path.join(root, "healthcheck.yml"), inventory, results_dir, playbook_budget,
                                history)
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


# The verdicts of this node that --max-age may trust, under the results directory: the last node-local run's
# report, and a gate's or health check's run that `latest` points at (preflight_results_dir set to it).
LATEST_FILES = ("last.json", os.path.join("latest", "verdict.json"), os.path.join("latest", "healthcheck.json"))
NODE_PASSES = ("pass", "warn")


def fresh_pass(results_base, node, max_age, now=None):
    """The verdict file that lets this node skip its checks, or None (run them).

    The node's latest verdict among :data:`LATEST_FILES` (by ``finished``) must name ``node`` as pass or warn
    (its own checks agreeing, among the verdict's healthy hosts, the run not stopped) and be younger than
    ``max_age`` seconds and not dated in the future (``verdict_file.load``'s ``max_age``).  A file there that
    cannot be trusted (truncated, invalid, of a shape no run writes, a report of a run that gave none), or a
    verdict naming the node without a finished time, means the last outcome is unknown: None."""
    latest = []
    for name in LATEST_FILES:
        path = os.path.join(results_base, name)
        if not os.path.exists(path):
            continue
        try:
            verdict = load(path)
            if node not in verdict["hosts"]:
                continue
            latest.append((finished_epoch(verdict), path, verdict))
        except (VerdictError, ValueError, TypeError, KeyError, AttributeError):
            # Whatever its shape, a file that cannot be judged is no pass: run the checks.
            return None
    if not latest or any(finished is None for finished, _path, _verdict in latest):
        return None
    _finished, path, verdict = max(latest, key=lambda item: item[0])
    if not node_passed(verdict, node):
        return None
    try:
        load(path, max_age=max_age, now=now)
    except (VerdictError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return path


def finished_epoch(verdict):
    """A verdict's ``finished`` time in seconds since the epoch, or None when it has none in the verdict's format."""
    import calendar  # pylint: disable=import-outside-toplevel
    import time  # pylint: disable=import-outside-toplevel

    try:
        return calendar.timegm(time.strptime(verdict.get("finished"), "%Y-%m-%dT%H:%M:%SZ"))
    except (TypeError, ValueError):
        return None


def node_passed(verdict, node):
    """Whether ``verdict`` says ``node`` passed, every way it can say so: its status, its own checks (a pass
    with a failing or blocked check contradicts itself), the healthy hosts, and a run that was not stopped."""
    from preflight_node.checks import node_status  # pylint: disable=import-outside-toplevel

    result = verdict["nodes"][node]
    if verdict.get("stopped") or result.get("status") not in NODE_PASSES:
        return False
    if node not in verdict["healthy_hosts"] or node in verdict["failed_hosts"] \
            or node in verdict["unreachable_hosts"] or node in (verdict.get("busy_hosts") or []):
        return False
    return node_status(result["checks"]) in NODE_PASSES


def history_db(option, host_vars, results_base):
    """The run history the node-local runs are recorded in and the drain reason is dated from:
    ``--history-db``, else the node's ``preflight_history_db``, else ``<results-dir>/history.sqlite``;
    None when that is "none"."""
    return db_path(option or (host_vars or {}).get("preflight_history_db") or "", results_base)


def _max_age(text):
    import argparse  # pylint: disable=import-outside-toplevel

    try:
        return parse_age(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser(mode):
    import argparse  # pylint: disable=import-outside-toplevel

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
    # argparse passes a string default through ``type`` too: the environment's value is checked the same way.
    parser.add_argument("--max-age", type=_max_age, default=os.environ.get("PREFLIGHT_MAX_AGE") or None,
                        metavar="AGE", help="exit 0 at once, running nothing, when this node's latest verdict under "
                        "the results directory is a pass younger than AGE (6h, 30m, 1d; $PREFLIGHT_MAX_AGE)")
    parser.add_argument("--history-db", default="", metavar="PATH",
                        help="the run history each run is recorded in and drain reasons are dated from (default: "
                             "the node's preflight_history_db, else history.sqlite in the results directory; "
                             "\"none\": none)")
    parser.add_argument("--slurm-conf", default=None, metavar="PATH", help=SLURM_CONF_HELP)
    if mode == "healthcheck":
        parser.add_argument("--dry-run", action="store_true", help="print the scontrol commands, run none")
    return parser


def _not_run(mode, line, stderr):
    """The node could not be checked (its own variables are invalid): one line, nothing drained.  The health check
    exits 2; the prolog exits 0, since Slurm drains a node on any other exit of its prolog, and one typo in a file
    deployed to every node must not drain the cluster (the line is in slurmd's log)."""
    print(line, file=stderr)
    return PASS if mode == "prolog" else NOT_RUN


def _node_settings(args, node, mode, stderr):
    """``(host_vars, None)``, or ``(None, exit code)`` when the variables file is refused or invalid."""
    unsafe = trusted_file(args.vars) if args.vars else ""
    if unsafe:
        # Another account could choose what root runs (the training Python): refused, never read.
        print("%s %s: preflight.node_vars: %s: refused, not read -- fix: make it root's and writable by root "
              "alone (chown root:root, chmod 0644, in directories only root may write)" % (PREFIX, node, unsafe),
              file=stderr)
        return None, NOT_RUN
    try:
        return load_node_vars(args.vars), None
    except ValueError as exc:
        return None, _not_run(mode, "%s %s: preflight.node_vars: %s -- fix: correct or remove %s; could not run: "
                                    "nothing was checked or drained" % (PREFIX, node, exc, args.vars), stderr)


def local_main(argv, mode, root, stderr=None):
    """The command line of ``scripts/slurm-healthcheck`` (mode ``healthcheck``) and
    ``scripts/slurm-prolog`` (mode ``prolog``).  Prints nothing when the node passes."""
    import sys  # pylint: disable=import-outside-toplevel

    stderr = stderr or sys.stderr
    args = _parser(mode).parse_args(argv)
    node = args.node or local_node_name()
    try:
        # Checked at every start, before anything is read from it: root's alone, or never used.
        results_dir = private_dir(args.results_dir, STATE_FIX)
    except UnsafeState as exc:
        print("%s %s: preflight.state_dir: the results directory %s" % (PREFIX, node, exc), file=stderr)
        return NOT_RUN
    if args.max_age is not None and fresh_pass(results_dir, node, args.max_age):
        return PASS  # a recent pass stands: no checks, no scontrol, nothing written
    python = sys.executable
    found = find_slurm_conf(args.slurm_conf)
    if found["error"] and mode == "healthcheck":  # a prolog never calls scontrol: nothing to stop for
        print("%s %s: slurm: %s -- fix: %s" % (PREFIX, node, found["error"], BAD_CONF_FIX), file=stderr)
        return NOT_RUN
    host_vars, code = _node_settings(args, node, mode, stderr)
    if host_vars is None:
        return code
    host_vars.setdefault("preflight_training_python", os.environ.get("PREFLIGHT_TRAINING_PYTHON") or python)
    environ = dict(os.environ)
    if found["path"]:  # the playbook's own Slurm clients, if any, read the same file
        environ["SLURM_CONF"] = found["path"]
    history = history_db(args.history_db, host_vars, results_dir)
    report, log = local_check(node, root, python, results_dir, args.budget, host_vars, environ, history)
    _keep_last(results_dir, report, log)
    result = (report.get("nodes") or {}).get(node) or {}
    if report.get("stopped"):
        line = failure_line(node, result) or "%s %s: preflight.inputs: %s" % (PREFIX, node, report["stopped"])
        return _not_run(mode, "%s; could not run: the node's settings (%s) are invalid, nothing was checked or "
                              "drained" % (line, args.vars), stderr)
    line = failure_line(node, result) if report.get("status") != "pass" else None
    if report.get("status") != "pass" and line is None:
        line = "%s %s: preflight.status: the report says %s -- fix: read %s" % (
            PREFIX, node, report.get("status"), os.path.join(results_dir, "last.json"))
    if mode == "prolog":
        if line:
            print(line, file=stderr)
            return FAIL
        return PASS
    return _health_check_outcome(args, node, report, line, found, history, stderr)


def _health_check_outcome(args, node, report, line, found, history, stderr):
    """HealthCheckProgram: Slurm ignores its exit code; the drain is what takes the node out."""
    if line:
        print(line, file=stderr)
    try:
        _actions, results = reconcile(report, runner=slurm_runner(found), dry_run=args.dry_run, nodes=[node],
                                     since=history_since(history))
    except RuntimeError as exc:
        print("%s %s: slurm: %s; %s" % (PREFIX, node, exc, conf_words(found)), file=stderr)
        return NOT_RUN
    failed = False
    for item, cmd, rc, err in results:
        if args.dry_run:
            print(" ".join(cmd))
        elif rc != 0:
            failed = True
            print("%s %s: could not %s: %s (rc %d)" % (PREFIX, node, item["action"], err, rc), file=stderr)
    if failed:
        return NOT_RUN
    return FAIL if line else PASS
