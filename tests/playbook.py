"""Run the project's real playbooks through ansible-runner and read the verdict."""

import json
import os
import sys
import types

import ansible_runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def run_playbook(tmp_path, playbook="preflight.yml", inventory=None, extravars=None, limit=None, timeout=900,
                 check=False, diff=False, forks=None, event_handler=None):
    """Returns an object with rc, status, stats, events, stdout, verdict (or None), results_dir.

    ``event_handler(event)`` sees every ansible-runner event as it happens (a fault test uses it to
    strike a node at a precise point of the run); it must return True."""
    results_dir = str(tmp_path / "results")
    private = tmp_path / "runner"
    private.mkdir(exist_ok=True)
    extravars = dict(extravars or {})
    extravars.setdefault("preflight_results_dir", results_dir)
    os.environ["PATH"] = BIN + os.pathsep + os.environ.get("PATH", "")
    cmdline = []
    if check:
        cmdline.append("--check")
    if diff:
        cmdline.append("--diff")
    if forks:
        cmdline.append("--forks=%d" % forks)
    run = ansible_runner.run(
        private_data_dir=str(private), project_dir=ROOT, playbook=os.path.join(ROOT, playbook),
        inventory=os.path.abspath(inventory or os.path.join(ROOT, "inventory")), extravars=extravars,
        # ansible-runner turns host-key checking off unless told: keep it on, as ansible.cfg says.
        envvars={"ANSIBLE_CONFIG": os.path.join(ROOT, "ansible.cfg"), "ANSIBLE_FORCE_COLOR": "0",
                 "ANSIBLE_HOST_KEY_CHECKING": "True",
                 # ansible-runner replaces the callback path: keep the summary for playbooks under playbooks/.
                 "ANSIBLE_CALLBACK_PLUGINS": os.path.join(ROOT, "callback_plugins"),
                 "PATH": os.environ["PATH"]},
        limit=limit, timeout=timeout, quiet=True, cmdline=" ".join(cmdline) or None, event_handler=event_handler)
    events = list(run.events)
    stdout = run.stdout.read()
    # The run's own verdict, as the command line finds it (latest moves only with a verdict that checked a node).
    written = [(item.get("event_data") or {}).get("res", {}).get("verdict_file") for item in events
               if item.get("event") in ("runner_on_ok", "runner_on_failed")
               and str((item.get("event_data") or {}).get("task_action") or "").endswith("preflight_verdict")]
    written = [path for path in written if isinstance(path, str) and path.endswith("/verdict.json")]
    verdict_path = written[-1] if written else os.path.join(results_dir, "latest", "verdict.json")
    verdict = None
    if os.path.exists(verdict_path):
        with open(verdict_path) as handle:
            verdict = json.load(handle)
    return types.SimpleNamespace(rc=run.rc, status=run.status, stats=run.stats, events=events, stdout=stdout,
                                 verdict=verdict, results_dir=results_dir)


def task_results(result, task_substring, event="runner_on_ok"):
    """Per-host results of the tasks whose name contains task_substring."""
    found = {}
    for item in result.events:
        data = item.get("event_data", {})
        if item.get("event") == event and task_substring in data.get("task", ""):
            found[data["host"]] = data.get("res", {})
    return found


def newest_run_dir(results_dir):
    """The newest run directory under ``results_dir`` (run ids sort by time; ``latest``, the run history and
    other files are not runs)."""
    runs = sorted(name for name in os.listdir(results_dir)
                  if name != "latest" and os.path.isdir(os.path.join(results_dir, name))
                  and not os.path.islink(os.path.join(results_dir, name)))
    return os.path.join(results_dir, runs[-1])
