# -*- coding: utf-8 -*-
"""``python -m cluster_preflight``: the command line. The only place that turns a result into an exit
code for the process (``main`` returns it; ``__main__`` exits with it). Exit codes: see the package."""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from . import explain as explain_cli, history as history_cli, known_hosts, playbooks
from ..outputs import summary
from ..engine import ENGINES, SETTING as ENGINE_SETTING
from ..verdict.printable import printable
from .progress import Progress
from ..verdict.file import age_problem, parse_age
from ..verdict.value import (EXIT_INTERRUPTED, EXIT_MEANING, EXIT_UNKNOWN, EXIT_USAGE, ROOT, VerdictError, exit_code,
                             load_verdict)

RUN_COMMANDS = {
    "gate": "the pre-job gate (preflight.yml): audit every node, all-reduce across them, verdict.json",
    "bringup": "node bring-up (bringup.yml): apply what the gate audits, then audit it (bringup.json)",
    "healthcheck": "node-local health check (healthcheck.yml) within its time budget (healthcheck.json)",
    "diagnose": "diagnose.yml, when this checkout has it",
}
BASELINE_HELP = ("record a known-good profile per inventory group from gates that passed and point each group at "
                 "it (docs/profile.md)")
LABELS = {"verdict.json": "PREFLIGHT", "bringup.json": "BRING-UP", "healthcheck.json": "HEALTH CHECK"}


class UsageError(ValueError):
    """A command line that cannot be run; one line."""


class _Parser(argparse.ArgumentParser):
    # argparse exits 2 on a usage error, which is scripts/verdict's "fail": ours is 4.
    def error(self, message):
        raise UsageError("%s: %s" % (self.prog, message))


def extra_var(text):
    """``-e KEY=VALUE`` (several pairs in one argument too, quoted as ansible-playbook takes them) as a
    dict; ``-e @file`` and ``-e '{json}'`` are given to ansible-playbook as they are (``None`` here)."""
    text = text.strip()
    if text.startswith("@") or text.startswith("{") or text.startswith("["):
        return None
    from ansible.parsing.splitter import parse_kv  # pylint: disable=import-outside-toplevel

    try:
        pairs = parse_kv(text)
    except Exception as exc:  # ansible's own parse error, whatever its class
        raise UsageError("-e %s: %s" % (text, exc)) from exc
    if not pairs or "_raw_params" in pairs or any(not key for key in pairs):
        raise UsageError("-e %r is not KEY=VALUE (nor @FILE or a JSON object)" % text)
    return pairs


def _run_options(sub):
    """The options of a command that runs a playbook."""
    sub.add_argument("-i", "--inventory", "--inventory-file", action="append", dest="inventory",
                     metavar="INVENTORY", help="inventory file or directory (default: the embedded inventory/hosts.yml; "
                          "a relative path is taken from the current directory)")
    sub.add_argument("-l", "--limit", metavar="HOSTS", help="only these nodes (the verdict covers exactly them)")
    sub.add_argument("-e", "--extra-vars", action="append", default=[], dest="extra_vars", metavar="KEY=VALUE",
                     help="a setting (repeatable), as ansible-playbook's -e")
    sub.add_argument("--results-dir", metavar="DIR", help="where run directories go (preflight_results_dir)")
    sub.add_argument("-q", "--quiet", action="store_true", help="no progress and no summary: one line at the end")
    sub.add_argument("--timeout", type=int, metavar="SECONDS", help="stop the whole run after this long")


def build_parser():
    parser = _Parser(prog="python -m cluster_preflight", allow_abbrev=False,
                     description="Run the cluster preflight and answer with its verdict "
                                 "(exit codes: README.md, 'Exit codes'; docs/cli.md).")
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="this checkout's version and commit, ansible-core's and Python's, then exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    for name, text in RUN_COMMANDS.items():
        sub = commands.add_parser(name, help=text, description=text + ". Other options go to "
                                  "ansible-playbook as they are (-v, --forks N, -e @vars.yml).", allow_abbrev=False)
        _run_options(sub)
        sub.add_argument("--check", action="store_true", help="dry run (ansible-playbook --check): read and judge, "
                         "write nothing on a node" + ("; bring-up then says what it would change" if name == "bringup"
                                                      else ""))
        sub.add_argument("--diff", action="store_true", help="print each file's change (ansible-playbook --diff); "
                         "with --check, what would change")
        if name == "gate":
            sub.add_argument("--engine", choices=ENGINES, help="how the gate reaches its nodes (preflight_engine): "
                             "ssh, a module over each node's connection (the default); srun, one Slurm step per "
                             "node call, inside an allocation of the inventory's nodes (docs/scale.md)")
    sub = commands.add_parser("baseline", help=BASELINE_HELP, allow_abbrev=False, description=BASELINE_HELP +
                              ". By default from the latest gate of this inventory's cluster that passed (in "
                              "--results-dir); --from names runs, --run-gate runs the gate now (options as gate).")
    _run_options(sub)
    sub.add_argument("--from", dest="source", metavar="RUN", action="extend", nargs="+",
                     help="record from these run directories or verdict files (repeatable; each must have passed; "
                          "several: each node's floors are its median over them, the group's the lowest node's)")
    sub.add_argument("--run-gate", action="store_true", help="run the gate now and record from exactly that run "
                                                             "(refused unless it passes)")
    sub.add_argument("--no-wire", action="store_true", help="print the profile_file line instead of writing it "
                                                            "into the inventory's group_vars")
    sub.add_argument("--out", metavar="DIR", help="where the profiles go (default: <inventory file's dir>/profiles)")
    sub.add_argument("--group", action="append", default=[], metavar="GROUP",
                     help="only this inventory group (repeatable; default: every group with a node of the run)")
    sub.add_argument("--force", action="store_true", help="replace existing profile files")
    sub.add_argument("--allow-personal-env", action="store_true",
                     help="record even from runs whose job-side code came from an environment an account other than "
                          "root can change (a venv in a home directory): its figures are what that account's code "
                          "reported")
    sub = commands.add_parser("verdict", help="validate and summarise a verdict file (as scripts/verdict)",
                              description="Validate and summarise a verdict (default results/latest); exit 0 pass, "
                                          "1 pass with warnings, 2 fail, 3 unknown, 4 invalid settings.",
                              allow_abbrev=False)
    sub.add_argument("path", nargs="?", default=os.path.join(ROOT, "results", "latest"),
                     help="a run directory or a verdict file (default: results/latest)")
    group = sub.add_mutually_exclusive_group()
    group.add_argument("--drain-list", action="store_true", help="print the nodes to drain, one per line")
    group.add_argument("--nhc", action="store_true", help="print 'ERROR: nhc: Health check failed:' lines")
    sub.add_argument("--max-age", metavar="AGE", help="treat a verdict that finished longer ago than AGE (24h; "
                                                      "units s, m, h, d) as none: exit 3")
    history_cli.add_parser(commands, ROOT)
    known_hosts.add_parser(commands)
    explain_cli.add_parser(commands)
    return parser


class _Version(argparse.Action):
    """``--version``: one line, worked out only when asked (it asks git for the commit)."""

    def __call__(self, parser, namespace, values, option_string=None):
        _out(version_text())
        parser.exit(0)


def version_text():
    """``cluster-preflight 1.0.0 (commit abc1234, /opt/preflight); ansible-core 2.19.4; Python 3.11.7``: what a bug
    report needs (the checkout's commit when it is a git checkout; git bounded, never required)."""
    import importlib.metadata  # pylint: disable=import-outside-toplevel
    import platform  # pylint: disable=import-outside-toplevel
    import subprocess  # pylint: disable=import-outside-toplevel

    def _version(name):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    commit = ""
    try:
        done = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=5, check=False)
        commit = done.stdout.strip() if done.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        pass
    return "cluster-preflight %s (%s%s); ansible-core %s; Python %s" % (
        _version("cluster-preflight"), "commit %s, " % commit if commit else "", ROOT, _version("ansible-core"),
        platform.python_version())


def parse_args(argv):
    """``(namespace, passthrough)``: our options, and those ansible-playbook gets as they are."""
    args, rest = build_parser().parse_known_args(argv)
    if args.command in ("verdict", "history", "known-hosts", "explain") and rest:
        raise UsageError("%s: unrecognized arguments: %s" % (args.command, " ".join(rest)))
    args.extravars, passthrough = {}, list(rest)
    for text in getattr(args, "extra_vars", []):
        pairs = extra_var(text)
        if pairs is None:
            passthrough += ["-e", text]
        else:
            args.extravars.update(pairs)
    if getattr(args, "inventory", None):
        args.inventory = args.inventory[0] if len(args.inventory) == 1 else args.inventory
    for option in ("check", "diff"):
        if getattr(args, option, False):
            passthrough.append("--" + option)
    if getattr(args, "engine", None):
        # One setting, whichever way it is given: the run's settings check it (srun outside an allocation: exit 4).
        args.extravars[ENGINE_SETTING] = args.engine
    return args, passthrough


def headline(verdict):
    """``PREFLIGHT PASS: 1/1 nodes healthy; verdict PATH`` (the verdict task's own line); a bring-up adds what it
    changed, and one in check mode says first that it wrote nothing and how much it would change."""
    label = LABELS.get(os.path.basename(verdict.path), "PREFLIGHT")
    text = "%s %s: %d/%d nodes healthy" % (label, verdict.status.upper(), len(verdict.healthy_hosts),
                                          len(verdict.hosts))
    if verdict.failed_hosts:
        text += "; failed: %s" % ", ".join(verdict.failed_hosts)
    if verdict.unverified_hosts:
        text += "; unverified: %s" % ", ".join(verdict.unverified_hosts)
    if verdict.stopped:
        text += "; stopped: %s" % verdict.stopped
    change = summary.changes_line(verdict.raw)
    if verdict.raw.get("check_mode"):
        text = "%s DRY RUN (%s); the nodes as they are now: %s" % (label, change or "check mode, nothing was written",
                                                                  text[len(label) + 1:])
    elif change:
        text += "; %s" % change
    return printable(text + "; verdict %s" % verdict.path)


def finding_lines(verdict):
    """The findings, grouped by root cause (``cluster_preflight/outputs/summary.py``)."""
    # Found texts come from the nodes and the job (rank errors, log lines): no control codes on the terminal.
    return [printable(line) for line in summary.finding_lines(verdict.raw)]


def _out(text, stream=None):
    print(text, file=stream or sys.stdout, flush=True)


def cmd_verdict(args):
    try:
        max_age = None if args.max_age is None else parse_age(args.max_age)
    except ValueError as exc:
        _out("verdict: %s" % exc, sys.stderr)
        return EXIT_USAGE
    try:
        verdict = load_verdict(args.path)
        stale = age_problem(verdict.raw, max_age)
        if stale:
            raise VerdictError("the verdict at %s is not fresh: %s" % (verdict.path, stale))
    except VerdictError as exc:
        _out("UNKNOWN: %s" % printable(exc), sys.stderr)
        return EXIT_UNKNOWN
    if verdict.stopped and (args.drain_list or args.nhc):
        # Invalid settings stopped the run before any node was judged: nothing to drain.
        _out(printable("STOPPED: %s; no node was judged, none is listed to drain -- fix: correct the settings the "
                       "verdict names (its <capability>.inputs checks) and re-run" % verdict.stopped), sys.stderr)
    elif args.drain_list:
        for host in verdict.failed_hosts:
            _out(printable(host))
    elif args.nhc:
        for item in verdict.findings:
            if item.status == "fail":
                _out(printable("%s ERROR: nhc: Health check failed: preflight %s: %s" % (item.host, item.check,
                                                                                         item.found)))
    else:
        _out(headline(verdict))
        for line in finding_lines(verdict):
            _out(line)
    return exit_code(verdict, warnings=True)


class _Refused(Exception):
    """``baseline`` will not record: the exit code and one line."""

    def __init__(self, code, text):
        super().__init__(text)
        self.code = code


def _inventory_arg(args):
    """The inventory as given (a path or a list of paths), absolute; the embedded one when none was given."""
    given = args.inventory or playbooks.DEFAULT_INVENTORY
    return [os.path.abspath(item) for item in given] if isinstance(given, list) else os.path.abspath(given)


def _baseline_runs(args, passthrough, inventory):
    """``[(verdict dict, verdict path)]`` that ``baseline`` records from, each said on stdout; _Refused otherwise."""
    from . import baseline  # pylint: disable=import-outside-toplevel
    from ..outputs.cluster_names import inventory_key  # pylint: disable=import-outside-toplevel

    if args.run_gate:
        args.command = "gate"
        result, code = _run_and_show(args, passthrough)
        if result is None or result.verdict is None:
            raise _Refused(code or EXIT_UNKNOWN, "the gate run now wrote no verdict to record from%s" % (
                ": %s" % result.error if result is not None and result.error else ""))
        if code != 0:
            raise _Refused(code, "the gate run now did not pass (%s, %s): a profile is recorded only from a run "
                                 "that passed" % (result.verdict.status, result.verdict.path))
        _out("baseline: from the gate just run: %s" % result.verdict.path)
        return [(result.verdict.raw, os.path.realpath(result.verdict.path))]
    if args.source:
        runs = []
        for source in args.source:
            try:
                verdict = load_verdict(source)
            except VerdictError as exc:
                raise _Refused(EXIT_UNKNOWN, str(exc)) from None
            if "allreduce" not in verdict.raw:
                raise _Refused(EXIT_USAGE, "%s is not a gate's verdict (no all-reduce): a profile is recorded from "
                                           "gates" % verdict.path)
            runs.append((verdict.raw, os.path.realpath(verdict.path)))
        _out("baseline: from %d run%s named with --from: %s" % (len(runs), "" if len(runs) == 1 else "s",
                                                                ", ".join(path for _raw, path in runs)))
        return runs
    results_dir = os.path.abspath(args.results_dir or os.path.join(ROOT, "results"))
    key = inventory_key(inventory, args.extravars)
    found = baseline.latest_passing(results_dir, key)
    if found is None:
        raise _Refused(EXIT_UNKNOWN, "no gate of cluster %s passed in %s (runs of other clusters, runs that did "
                                     "not pass and runs made before runs named their cluster are not used): run "
                                     "the gate first, name runs with --from, or run one now with --run-gate"
                       % (key, results_dir))
    path, raw = found
    _out("baseline: from the latest gate of cluster %s that passed: %s (finished %s)" % (key, path,
                                                                                       raw.get("finished")))
    return [(raw, path)]


def cmd_baseline(args, passthrough):
    """Record a profile per inventory group from passing gates (see ``baseline``'s help), then point each group
    at its profile."""
    from . import baseline, baseline_wire  # pylint: disable=import-outside-toplevel

    inventory = _inventory_arg(args)
    try:
        if args.source and args.run_gate:
            raise _Refused(EXIT_USAGE, "--from and --run-gate exclude each other: record from runs made, or from "
                                       "one made now")
        runs = _baseline_runs(args, passthrough, inventory)
        groups = baseline.inventory_groups(inventory)
        if args.group:
            missing = sorted(set(args.group) - set(groups))
            if missing:
                raise baseline.BaselineError("no inventory group %s (groups: %s)" % (
                    ", ".join(missing), ", ".join(sorted(groups))))
            groups = {name: groups[name] for name in args.group}
        out_dir = args.out or baseline.default_out_dir(inventory[0] if isinstance(inventory, list) else inventory)
        written = baseline.record_runs(runs, groups, out_dir, force=args.force,
                                       allow_personal=args.allow_personal_env)
    except _Refused as exc:
        _out("BASELINE NOT RECORDED: %s" % exc, sys.stderr)
        return exc.code
    except (baseline.BaselineError, OSError) as exc:
        _out("BASELINE NOT RECORDED: %s" % exc, sys.stderr)
        return EXIT_USAGE if isinstance(exc, baseline.BaselineError) else EXIT_UNKNOWN
    for group, path, hosts, notes in written:
        _out("profile of group %s (%d nodes) -> %s" % (group, len(hosts), path))
        for note in notes:
            _out("  note: %s" % note)
        value = baseline_wire.line(baseline_wire.profile_value(
            inventory[0] if isinstance(inventory, list) else inventory, path))
        if args.no_wire:
            _out("  not wired (--no-wire): point the group at it with: %s" % value)
            continue
        state, text = baseline_wire.wire(inventory, group, path)
        _out("  %s: %s" % ({"written": "wired", "already": "wired already", "printed": "NOT wired"}[state], text))
    _out("the next gate compares each group with its profile; its summary says which (\"profile: ...\")")
    return 0


def cmd_run(args, passthrough):
    return _run_and_show(args, passthrough)[1]


def _run_and_show(args, passthrough):
    """Run ``args.command``'s playbook, show its progress, summary, findings and headline; ``(Result or None,
    exit code)``."""
    tty = sys.stderr.isatty()
    progress = None
    if not args.quiet:
        progress = Progress(sys.stderr, tty=tty, width=shutil.get_terminal_size((100, 20)).columns).start()
    # Ctrl-C (SIGINT) or SIGTERM stops the run: ansible-playbook and what it left running here are ended first
    # (cluster_preflight/cli/leftovers.py), the summary is printed, then the signal goes on (below).
    stopping = playbooks.Stopping(None)
    kwargs = dict(inventory=args.inventory, limit=args.limit, extravars=args.extravars, results_dir=args.results_dir,
                  cmdline=passthrough, progress=progress, cancel=stopping.asked, timeout=args.timeout,
                  color=sys.stdout.isatty() and not args.quiet)
    try:
        with stopping:
            if args.command == "diagnose":
                result = playbooks.diagnose(**kwargs)
            else:
                result = playbooks.run_playbook(playbooks.PLAYBOOKS[args.command], **kwargs)
    except playbooks.UsageError as exc:
        _out("%s: %s" % (args.command, exc), sys.stderr)
        return None, EXIT_USAGE
    finally:
        if progress is not None:
            progress.close()
    if not args.quiet:
        for host, task, diff in result.diffs:
            _out("--- diff: %s on %s" % (task, host))
            _out(diff.rstrip("\n"))
        for line in result.summary:
            _out(line)
        if result.verdict is not None:
            for line in finding_lines(result.verdict):
                _out(line)
    if result.verdict is not None:
        _out(headline(result.verdict))
    if result.error:
        word = {EXIT_INTERRUPTED: "INTERRUPTED", EXIT_USAGE: "USAGE"}.get(result.exit_code, "UNKNOWN")
        _out("%s: %s" % (word, result.error), sys.stderr)
    if not args.quiet:
        _out("exit %d (%s)" % (result.exit_code, EXIT_MEANING.get(result.exit_code, "")), sys.stderr)
    # A Ctrl-C goes on to whoever called (KeyboardInterrupt: python -m cluster_preflight exits 130, a test run stops).
    stopping.deliver()
    return result, result.exit_code


def main(argv=None):
    """Run the command line ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    try:
        args, passthrough = parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        _out(str(exc), sys.stderr)
        _out("usage: python -m cluster_preflight {gate,bringup,healthcheck,diagnose,baseline,verdict,history,"
             "known-hosts,explain} ... (--help)",
             sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    if args.command == "verdict":
        try:
            return cmd_verdict(args)
        except Exception as exc:  # pylint: disable=broad-except
            # Exit 1 (Python's for an uncaught exception) would read as a pass with warnings.
            _out(printable("UNKNOWN: the verdict could not be read: %s: %s" % (type(exc).__name__, exc)), sys.stderr)
            return EXIT_UNKNOWN
    if args.command == "baseline":
        return cmd_baseline(args, passthrough)
    if args.command == "history":
        return history_cli.run(args, lambda text, stream=None: _out(text, sys.stderr if stream else None))
    if args.command == "known-hosts":
        return known_hosts.run(args, lambda text, stream=None: _out(text, sys.stderr if stream else None))
    if args.command == "explain":
        return explain_cli.run(args, lambda text, stream=None: _out(text, sys.stderr if stream else None))
    return cmd_run(args, passthrough)
