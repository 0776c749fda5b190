# -*- coding: utf-8 -*-
"""One task of a srun engine step (node layer): the same node-side code an Ansible module runs, its result printed.

The srun engine (``cluster_preflight/engine/srun.py``) runs every node call of the gate as one Slurm step over the
nodes it concerns: each task is ``<python> -I -S <archive> <call>`` (isolated, no site packages: the node layer needs
the standard library only), where the archive is this package zipped with a
``__main__`` (``cluster_preflight/engine/archive.py``), sent to the node's own directory with ``sbcast``.  The task:

* reads the step's arguments from standard input (srun hands every task the same stream): ``{call, common,
  nodes: {node: args}}``, zlib-compressed JSON; its node's arguments are ``common`` updated with its own entry;
* runs the body of the module the ssh engine would run for that call (:data:`CALLS`) over a :class:`StepModule`,
  which gives it what it uses of an ``AnsibleModule`` (``params`` with the spec's defaults, ``exit_json``,
  ``fail_json``, ``get_bin_path``): the facts and probes calls, the port probe, the run lock, and a rank of an
  all-reduce (``module_utils/preflight_node/allreduce_run/rank_run.py``);
* prints its protocol on its own copy of standard output (whatever else writes to fd 1 goes to ``/dev/null``), in
  lines short enough that Slurm never splits or interleaves them: ``PFR <node> <local> +`` when it starts,
  ``PFR <node> <local> .`` every :data:`HEARTBEAT` seconds while it works (the controller names a node that falls
  silent as lost, as SSH's keep-alives do), then its result as base64 chunks of zlib-compressed JSON and an ``end``
  line with the SHA-256 of the whole, so a result is taken whole or not at all.

Every call is bounded by the node code's own bounds, and the controller's kill of the step backs them up.  A task
never exits non-zero for a finding: what went wrong is its result (``failed`` with ``msg``), as a module's is.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import pwd
import sys
import threading
import traceback
import zlib

PREFIX = "PFR"
HEARTBEAT = 3.0
CHUNK = 760
# Where the node's tools are looked for besides PATH (as AnsibleModule.get_bin_path does).
SBIN = ("/sbin", "/usr/sbin", "/usr/local/sbin")


class StepExit(Exception):
    """The body's result (``exit_json`` / ``fail_json``)."""

    def __init__(self, result):
        super().__init__("step result")
        self.result = result


def _typed(kind, value):
    if value is None:
        return None
    if kind == "float" and isinstance(value, (int, str)) and not isinstance(value, bool):
        return float(value)
    if kind == "int" and isinstance(value, str):
        return int(value)
    if kind == "bool" and isinstance(value, str):
        return value.lower() in ("1", "true", "yes", "on")
    if kind == "path" and isinstance(value, str):
        return os.path.expanduser(value)
    return value


def with_defaults(spec, params):
    """``params`` with every option of ``spec`` (an Ansible argument spec): its default where it is missing, the
    spec's numbers and switches typed; ValueError names an option the spec does not have or a required one
    missing (the controller built the arguments, so this is a defect, never the operator's input)."""
    unknown = sorted(set(params) - set(spec))
    if unknown:
        raise ValueError("unsupported parameters: %s" % ", ".join(unknown))
    out = {}
    for name, option in spec.items():
        value = params.get(name)
        if value is None:
            if option.get("required"):
                raise ValueError("missing required argument: %s" % name)
            value = copy.deepcopy(option.get("default"))
        out[name] = _typed(option.get("type", "str"), value)
    return out


class StepModule(object):
    """What the node-side bodies use of an ``AnsibleModule``, for a srun task."""

    check_mode = True

    def __init__(self, spec, params):
        self.params = with_defaults(spec, params)

    @staticmethod
    def exit_json(**result):
        raise StepExit(result)

    @staticmethod
    def fail_json(msg, **result):
        raise StepExit(dict(result, failed=True, msg=msg))

    @staticmethod
    def get_bin_path(name, required=False, opt_dirs=None):  # pylint: disable=unused-argument
        paths = list(opt_dirs or []) + os.environ.get("PATH", "").split(os.pathsep) + list(SBIN)
        for directory in paths:
            path = os.path.join(directory, name)
            if directory and os.path.isfile(path) and os.access(path, os.X_OK):
                return path
        return None


def _body(call):
    """``(argument spec, body(module))`` of ``call``, importing only what that call runs (a rank's task loads no
    reader), so a failure to import is the task's result."""
    # pylint: disable=import-outside-toplevel
    if call in ("facts", "probes"):
        from .calls import FACTS_CALL_SPEC, PROBES_CALL_SPEC, node_call
        if call == "facts":
            from . import readers
            return FACTS_CALL_SPEC, lambda module: node_call(module, readers, "read", "facts")
        from . import probes
        return PROBES_CALL_SPEC, lambda module: node_call(module, probes, "probe", "probes")
    if call == "port_probe":
        from .net import port_probe
        return port_probe.ARGUMENT_SPEC, port_probe.module_main
    if call == "lock":
        from .host import lock
        return lock.MODULE_SPEC, lock.module_main
    if call == "rank":
        from .allreduce_run import gate_run, rank_run
        return dict(gate_run.MODULE_SPEC), rank_run.module_main
    raise KeyError("no node call %r (facts, probes, port_probe, lock, rank)" % call)


def node_args(payload, node):
    """This node's arguments in a step's payload: ``common`` updated with the node's own entry."""
    args = dict(payload.get("common") or {})
    args.update((payload.get("nodes") or {}).get(node) or {})
    return args


def origin_problem(path):
    """Why the archive at ``path`` lies where an account other than this one could have changed it, or "": it runs
    as root, so its file and directory must be root's alone (``state_dir``'s rules)."""
    from .host.state_dir import dir_problem, trusted_file  # pylint: disable=import-outside-toplevel
    path = os.path.abspath(path)
    problem = dir_problem(os.path.dirname(path)) or trusted_file(path)
    if problem:
        return ("refused to run the node code %s: %s (preflight_srun_dir and preflight_srun_archive must be root's "
                "alone)" % (path, problem))
    return ""


def run(call, params):
    """The result of ``call`` with ``params`` on this node (never raises)."""
    try:
        spec, body = _body(call)
        body(StepModule(spec, params))
        return {"failed": True, "msg": "the %s body returned without a result" % call}
    except StepExit as done:
        return done.result
    except Exception as exc:  # pylint: disable=broad-except
        return {"failed": True, "msg": "MODULE FAILURE: %s: %s" % (type(exc).__name__, exc),
                "module_stderr": traceback.format_exc()[-3000:]}


class Protocol(object):
    """The task's lines on its own copy of standard output, one ``os.write`` each."""

    def __init__(self, fd, node, local):
        self.fd, self.tag = fd, "%s %s %d" % (PREFIX, node, local)
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def line(self, text):
        with self.lock:
            os.write(self.fd, ("%s %s\n" % (self.tag, text)).encode("ascii"))

    def beat(self):
        while not self.stop.wait(HEARTBEAT):
            self.line(".")

    def result(self, result):
        text = base64.b64encode(zlib.compress(json.dumps(result, default=str).encode("utf-8"), 6)).decode("ascii")
        chunks = [text[start:start + CHUNK] for start in range(0, len(text), CHUNK)] or [""]
        self.stop.set()
        for index, chunk in enumerate(chunks):
            self.line("r %d %d %s" % (index, len(chunks), chunk))
        self.line("end %s" % hashlib.sha256(text.encode("ascii")).hexdigest())


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    node = os.environ.get("SLURMD_NODENAME") or os.uname()[1].split(".")[0]
    # The step carries no environment of the controller's (srun --export names PATH and the locale only).
    account = pwd.getpwuid(os.geteuid())
    for name, value in (("HOME", account.pw_dir), ("USER", account.pw_name), ("LOGNAME", account.pw_name)):
        os.environ.setdefault(name, value)
    local = int(os.environ.get("SLURM_LOCALID") or 0)
    proto_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    # Only the protocol reaches srun's standard output; standard input is the step's arguments, read once.
    os.dup2(devnull, 1)
    protocol = Protocol(proto_fd, node, local)
    protocol.line("+")
    beat = threading.Thread(target=protocol.beat, daemon=True)
    beat.start()
    try:
        payload = json.loads(zlib.decompress(sys.stdin.buffer.read()).decode("utf-8"))
        os.dup2(devnull, 0)
        call = argv[0] if argv else payload.get("call")
        if call != payload.get("call"):
            raise ValueError("the task runs %s, its arguments are for %s" % (call, payload.get("call")))
        refused = origin_problem(sys.argv[0]) if sys.argv[0].endswith(".pyz") else ""
        result = {"failed": True, "msg": refused} if refused else run(call, node_args(payload, node))
    except Exception as exc:  # pylint: disable=broad-except
        result = {"failed": True, "msg": "the step's arguments could not be read on %s: %s: %s" % (
            node, type(exc).__name__, exc)}
    protocol.result(result)
    return 0
