# -*- coding: utf-8 -*-
"""Run the project's playbooks through ansible-runner and return the run's verdict, typed.

Each run keeps what ``ansible.cfg`` says: ``ANSIBLE_CONFIG`` is the project's, host-key checking
stays on (ansible-runner turns it off unless told), and the ``preflight_summary`` callback still
runs (ansible-runner replaces ``ANSIBLE_CALLBACK_PLUGINS``; it is given back through ``envvars``).
The verdict is the file the run's ``preflight_verdict`` task reports having written, never
``results/latest`` (another run may have moved it, and bring-up and health checks do not move it).
Nothing here exits the process: failures are a :class:`Result` or a :class:`UsageError`.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from ..verdict.value import (EXIT_FAIL, EXIT_INTERRUPTED, EXIT_PASS, EXIT_UNKNOWN, EXIT_USAGE, ROOT, Verdict,
                             VerdictError, exit_code, load_verdict)

PLAYBOOKS = {"gate": "preflight.yml", "bringup": "bringup.yml", "healthcheck": "healthcheck.yml",
             "diagnose": "diagnose.yml"}
DEFAULT_INVENTORY = os.path.join(ROOT, "inventory", "hosts.yml")
SUMMARY_CALLBACK = "preflight_summary"
# Lines of the summary callback's block (callback_plugins/preflight_summary.py), from its title on.
SUMMARY_TITLE = re.compile(r"^(PREFLIGHT|BRING-UP|HEALTH CHECK) SUMMARY: ")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TASK_BANNER = re.compile(r"^TASK \[.*\] \**$")


class UsageError(ValueError):
    """The run cannot start as asked (no such inventory or playbook, no ansible-playbook); one line."""


@dataclass
class Result:
    """A finished run: ``rc`` of ansible-playbook (254 when cancelled or timed out, as ansible-runner
    says), its ``status`` in ansible-runner's words, the ``verdict`` (``None`` when the run wrote
    none or an invalid one: ``error`` says why; a ``pass`` that ansible-playbook's rc contradicts is
    kept but exits 3) and the documented ``exit_code``.
    ``summary``: the summary callback's block (or a report's own lines); ``report_file``: the report
    of a playbook that writes one instead of a verdict (``diagnose.yml``'s ``diagnose.json``)."""

    playbook: str
    rc: int
    status: str
    verdict: Optional[Verdict]
    exit_code: int
    error: str = ""
    summary: List[str] = field(default_factory=list)
    report_file: Optional[str] = None
    stats: Dict[str, Any] = field(default_factory=dict)
    # What each changed file would look like, ``[(host, task, diff text)]``, when ansible-playbook ran with --diff.
    diffs: List[Any] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.exit_code == EXIT_PASS


class _Collector:
    """What a run's events tell, kept small: the verdict task's report, the summary block, errors."""

    def __init__(self, forward=None):
        self.forward = forward
        self.verdict_file = None
        self.outputs = None
        self.report_file = None
        self.report_lines = []
        self.plays = 0
        self.stats = {}
        self.summary = []
        self.errors = []
        self.diffs = []
        self.after_stats = False

    def __call__(self, event):
        kind = event.get("event")
        data = event.get("event_data") or {}
        res = data.get("res") if isinstance(data.get("res"), dict) else {}
        if kind in ("runner_on_ok", "runner_on_failed") and isinstance(res.get("verdict_file"), str):
            self.verdict_file = res["verdict_file"]
            self.outputs = res.get("outputs") if isinstance(res.get("outputs"), dict) else None
        if kind in ("runner_on_ok", "runner_on_failed") and isinstance(res.get("report_file"), str):
            self.report_file = res["report_file"]
            self.report_lines = [str(line) for line in res.get("lines") or []]
        if kind == "playbook_on_play_start":
            self.plays += 1
        if kind == "runner_on_file_diff" and event.get("stdout"):
            # The diff alone: the stdout callback puts the task's banner before a task's first output.
            text = ANSI.sub("", event["stdout"]).replace("\r\n", "\n")
            lines = [line for line in text.split("\n") if not TASK_BANNER.match(line)]
            self.diffs.append((str(data.get("host") or "?"), str(data.get("task") or "?"),
                               "\n".join(lines).strip("\n")))
        if kind == "runner_on_failed" and not data.get("ignore_errors") and res.get("msg"):
            self.errors.append("%s / %s: %s" % (data.get("host"), data.get("task"), str(res["msg"]).strip()))
        if kind == "playbook_on_stats":
            self.after_stats = True
            self.stats = {key: data.get(key) or {} for key in ("ok", "dark", "failures", "changed", "skipped",
                                                               "ignored", "rescued")}
        for raw in (event.get("stdout") or "").splitlines():
            # Colour stays in the summary when it was asked for; matching is on the plain text.
            line = ANSI.sub("", raw)
            if self.after_stats and (self.summary or SUMMARY_TITLE.match(line)):
                self.summary.append(raw)
            elif re.match(r"^(ERROR!|\[ERROR\]|ansible-playbook: error:)", line):
                self.errors.append(line)
        if self.forward is not None:
            self.forward(event)
        # The run directory is the record; runner's own event files need not be written.
        return False


def _envvars(extra=None, color=False):
    bindir = os.path.dirname(sys.executable)
    path = os.pathsep.join(filter(None, (bindir, os.environ.get("PATH"))))
    enabled = [name for name in (os.environ.get("ANSIBLE_CALLBACKS_ENABLED") or "").split(",") if name.strip()]
    if SUMMARY_CALLBACK not in enabled:
        enabled.append(SUMMARY_CALLBACK)
    env = {
        "ANSIBLE_CONFIG": os.path.join(ROOT, "ansible.cfg"),
        # ansible-runner sets it to False unless it is given: keep ansible.cfg's (and ssh's) checking on.
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        # ansible-runner puts its own directory after these, so the summary callback is still found.
        "ANSIBLE_CALLBACK_PLUGINS": os.path.join(ROOT, "callback_plugins"),
        "ANSIBLE_CALLBACKS_ENABLED": ",".join(enabled),
        "PATH": path,
    }
    env.update({"ANSIBLE_FORCE_COLOR": "1"} if color else {"ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"})
    env.update(extra or {})
    return env


def run_playbook(playbook: str, inventory: Optional[str] = None, limit: Optional[str] = None,
                 extravars: Optional[Dict[str, Any]] = None, results_dir: Optional[str] = None,
                 cmdline: Optional[List[str]] = None, progress: Optional[Callable[[dict], Any]] = None,
                 cancel: Optional[Callable[[], bool]] = None, timeout: Optional[int] = None,
                 envvars: Optional[Dict[str, str]] = None, color: bool = False) -> Result:
    """Run ``playbook`` (a file name in the project, e.g. ``preflight.yml``) and return its :class:`Result`.

    ``inventory``: a path (default: the embedded ``inventory/hosts.yml``); ``limit`` as ``--limit``;
    ``extravars`` as ``-e`` (``results_dir`` sets ``preflight_results_dir``); ``cmdline``: further
    ansible-playbook arguments (``-v``, ``--forks 8``, ``-e @vars.yml``); ``progress``: called with
    every runner event; ``cancel``: polled, True stops the run (exit code 130); ``timeout``: seconds
    for the whole run. Raises :class:`UsageError` when the run cannot start.
    """
    import ansible_runner  # pylint: disable=import-outside-toplevel  (the verdict reader needs no Ansible)

    path = os.path.join(ROOT, playbook)
    if not os.path.isfile(path):
        raise UsageError("no playbook %s in %s" % (playbook, ROOT))
    inventory = os.path.abspath(inventory or DEFAULT_INVENTORY)
    if not os.path.exists(inventory):
        raise UsageError("no inventory at %s (give a file or directory with -i)" % inventory)
    env = _envvars(envvars, color)
    if not shutil.which("ansible-playbook", path=env["PATH"]):
        raise UsageError("ansible-playbook is not on PATH nor next to %s: run scripts/preflight once (it sets up "
                         ".venv) and use .venv/bin/python" % sys.executable)
    extravars = dict(extravars or {})
    if results_dir:
        extravars["preflight_results_dir"] = os.path.abspath(results_dir)
    collector = _Collector(progress)
    private = tempfile.mkdtemp(prefix="cluster-preflight-")
    try:
        run = ansible_runner.run(
            private_data_dir=private, project_dir=ROOT, playbook=path, inventory=inventory, limit=limit or None,
            extravars=extravars or None, envvars=env, cmdline=shlex.join(cmdline) if cmdline else None,
            quiet=True, suppress_env_files=True, event_handler=collector, cancel_callback=cancel,
            timeout=timeout)
        rc, status = run.rc, run.status
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return _result(playbook, rc, status, collector)


def _result(playbook, rc, status, collector):
    common = dict(playbook=playbook, rc=rc, status=status, summary=collector.summary or collector.report_lines,
                  stats=collector.stats, report_file=collector.report_file, diffs=collector.diffs)
    if status == "canceled":
        return Result(verdict=None, exit_code=EXIT_INTERRUPTED, error="the run was interrupted", **common)
    if not collector.verdict_file:
        why = collector.errors[-1] if collector.errors else "see the playbook's output"
        if status == "timeout":
            return Result(verdict=None, exit_code=EXIT_UNKNOWN, error="%s went over its timeout and wrote no "
                          "verdict" % playbook, **common)
        if rc != 0 and not collector.plays:
            # ansible-playbook refused its arguments, the inventory or the limit before any play.
            return Result(verdict=None, exit_code=EXIT_USAGE, error="ansible-playbook refused to start %s (rc %s): "
                          "%s" % (playbook, rc, why), **common)
        if collector.report_file:
            # A report, not a verdict (diagnose.yml): its task fails when it is asked to on what it found.
            return Result(verdict=None, exit_code=EXIT_PASS if rc == 0 else EXIT_FAIL, **common)
        return Result(verdict=None, exit_code=EXIT_UNKNOWN,
                      error="%s wrote no verdict (ansible-playbook rc %s): %s" % (playbook, rc, why), **common)
    try:
        verdict = load_verdict(collector.verdict_file, collector.outputs)
    except VerdictError as exc:
        return Result(verdict=None, exit_code=EXIT_UNKNOWN, error=str(exc), **common)
    code = exit_code(verdict)
    error = ""
    if code == EXIT_PASS and rc != 0:
        # The verdict task is the play's last; a pass the run itself contradicts is not trusted.
        code, error = EXIT_UNKNOWN, "the verdict %s says pass but ansible-playbook exited %s" % (verdict.path, rc)
    return Result(verdict=verdict, exit_code=code, error=error, **common)


def gate(**kwargs) -> Result:
    """The pre-job gate (``preflight.yml``); arguments as :func:`run_playbook`."""
    return run_playbook(PLAYBOOKS["gate"], **kwargs)


def bringup(**kwargs) -> Result:
    """Node bring-up (``bringup.yml``); arguments as :func:`run_playbook`."""
    return run_playbook(PLAYBOOKS["bringup"], **kwargs)


def healthcheck(**kwargs) -> Result:
    """The node-local health check (``healthcheck.yml``); arguments as :func:`run_playbook`."""
    return run_playbook(PLAYBOOKS["healthcheck"], **kwargs)


def diagnose_available() -> bool:
    return os.path.isfile(os.path.join(ROOT, PLAYBOOKS["diagnose"]))


def diagnose(**kwargs) -> Result:
    """``diagnose.yml`` when the project has it, else :class:`UsageError`; arguments as :func:`run_playbook`."""
    if not diagnose_available():
        raise UsageError("this checkout has no diagnose.yml (the diagnose playbook is not part of it yet); "
                         "use gate, bringup or healthcheck")
    return run_playbook(PLAYBOOKS["diagnose"], **kwargs)
