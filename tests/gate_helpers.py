"""What the multi-node tests share: the gate's processes on a node, their ranks and stages,
and a one-paragraph explanation of a verdict."""

import json
import os
import time

from preflight_node.host.proc import environ_of

WORKER = "allreduce_worker.py"

def _read(path, mode="r"):
    try:
        with open(path, mode) as handle:  # pylint: disable=unspecified-encoding
            return handle.read()
    except OSError:
        return None


def cmdline(pid):
    raw = _read(f"/proc/{pid}/cmdline", "rb") or b""
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def environ(pid):
    return environ_of(pid)


def proc_state(pid):
    stat = _read(f"/proc/{pid}/stat")
    return stat.rsplit(")", 1)[1].split()[0] if stat else None


def node_pid(pid):
    """The pid that host pid ``pid`` has inside its node's PID namespace."""
    for line in (_read(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    return None


def send_signal(pid, sig):
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def gate_leftovers(bed, seconds):
    """``{node name: gate pids}`` still on the bed's nodes once they are gone or ``seconds`` have passed."""
    deadline = time.monotonic() + seconds
    leftovers = {}
    while time.monotonic() < deadline:
        leftovers = {node.name: gate_processes(bed, node) for node in bed.nodes}
        leftovers = {name: pids for name, pids in leftovers.items() if pids}
        if not leftovers:
            break
        time.sleep(0.5)
    return leftovers


def gate_processes(bed, node):
    """Host pids of live gate processes (torchrun or ranks) in the node."""
    found = []
    for pid in bed.host_pids(node):
        if proc_state(pid) in (None, "Z", "X"):
            continue
        argv = cmdline(pid)
        if any(part.endswith(WORKER) for part in argv) or "torch.distributed.run" in argv:
            found.append(pid)
    return found


def rank_processes(bed, node):
    """{global rank: host pid} of the worker processes (not torchrun) in the node."""
    ranks = {}
    for pid in gate_processes(bed, node):
        argv = cmdline(pid)
        env = environ(pid)
        if "torch.distributed.run" in argv or "RANK" not in env:
            continue
        ranks[int(env["RANK"])] = pid
    return ranks


def rank_stage(pid, rank):
    """The stage the rank recorded in its result file (read through its own mount namespace)."""
    argv = cmdline(pid)
    if "--out" not in argv:
        return None
    out_dir = argv[argv.index("--out") + 1]
    if not os.path.isabs(out_dir):
        return None
    text = _read(f"/proc/{pid}/root{out_dir}/rank{rank}.json")
    try:
        return json.loads(text).get("stage") if text else None
    except ValueError:
        return None


def explain(result):
    """Context for an assertion message: the verdict's failure summary."""
    verdict = result.verdict or {}
    lines = [f"status={verdict.get('status')} failed={verdict.get('failed_hosts')} "
             f"unverified={verdict.get('unverified_hosts')} unreachable={verdict.get('unreachable_hosts')}"]
    for host, node in (verdict.get("nodes") or {}).items():
        for name, check in sorted(node["checks"].items()):
            if check["status"] == "fail" or (check.get("details") or {}).get("blocked"):
                word = "FAIL" if check["status"] == "fail" else "blocked"
                lines.append(f"{host}/{name} {word}: {check['found'][:400]} | fix: {check['fix']}")
    ar = verdict.get("allreduce") or {}
    lines.append(f"allreduce: status={ar.get('status')} reason={ar.get('reason')} "
                 f"suspects={ar.get('suspects')} confirm={ar.get('confirm')}")
    localize = verdict.get("localize") or {}
    if localize:
        lines.append(f"localize: bad={localize.get('bad')} good={localize.get('good')} lost={localize.get('lost')} "
                     f"unproven={localize.get('unproven')} rounds={localize.get('rounds_run')} "
                     f"confirm={localize.get('confirm')}")
    return "\n".join(lines)


def clear_throttles(bed, ifname="eth0"):
    """Remove a test's ``tc`` qdisc from every node's ``ifname`` (none there is fine)."""
    for node in bed.nodes:
        bed.tc(node, ["qdisc", "del", "dev", ifname, "root"], check=False)


def trusted_bed(request, tmp_path_factory, **options):
    """A module's bed (``testbed_fixture``) whose nodes trust each other over ssh (the
    real bringup.yml, ssh_trust only): what every gate test on the bed starts from."""
    # pylint: disable=import-outside-toplevel
    from playbook import run_playbook
    from testbed import testbed_fixture
    bed = testbed_fixture(request, **options)
    directory = tmp_path_factory.mktemp("bringup")
    inventory = bed.write_inventory(path=str(directory / "inventory.yml"))
    result = run_playbook(directory, playbook="bringup.yml", inventory=inventory, timeout=600,
                          extravars={"preflight_bringup_capabilities": ["ssh_trust"]})
    assert result.rc == 0, result.stdout[-3000:]
    return bed


def assert_no_gate_processes(bed, seconds=30):
    """Every node of the bed free of gate processes within ``seconds`` (a killed tree takes a moment)."""
    import time  # pylint: disable=import-outside-toplevel
    deadline = time.monotonic() + seconds
    leftovers = {}
    while time.monotonic() < deadline:
        leftovers = {node.name: pids for node in bed.nodes for pids in [gate_processes(bed, node)] if pids}
        if not leftovers:
            return
        time.sleep(0.5)
    assert not leftovers, f"gate processes left on the nodes: {leftovers}"
