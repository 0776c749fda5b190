"""README.md as written, on a new 3-node cluster: the commands of "The first five minutes", steps 2 to 5, taken from
the README at test time (tests/readme_steps.py), run one after another from the repository root, and what the
README says each step gives, checked.

Before step 3 the operator makes the two mistakes of a first day, one bring-up dry run each (the README's own
command): an inventory without the example's ``ansible_python_interpreter`` on nodes whose root ``PATH`` starts
with a pyenv shim that does not run, then a training venv under ``/root`` the job user cannot reach.  Each must be
named once, first, with the error the node gave and a fix that weakens nothing; the operator then does what the
fix says (the example's interpreter back; a venv made from the system interpreter) and goes on as the README says.

The cluster is the namespace bed (tests/testbed.py) with its own /etc and /root per node, real sshd, host-key
checking on.  Its inventory names (gpu-node-1..3) are what the operator calls the nodes; the nodes know
themselves as pfn1..3, so the names do not resolve on the nodes, as on a cluster whose names only the controller
knows.  The operator's part the README leaves to them is done here: listing the nodes in the copied inventory,
and answering ``yes`` to ``known-hosts`` once the fingerprints shown are the nodes' own.

The controller side runs in a mount namespace of its own (one holder process; every command enters it), so what
the commands write where the README says (``clusters/``, ``results/``, ``~/.ssh/known_hosts``) lands in this
test's directory: ``clusters/`` and ``results/`` bound there, ``/root`` an overlay.  One bed, one pass through
the steps (each a module-scoped fixture, in order); the tests only read what the steps left.

Bring-up sets the global ``kernel.core_pattern``: it is saved first and restored on every way out.
"""

import atexit
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import time

import pytest
import yaml

from cluster_preflight.capabilities import BRINGUP_NAMES
from cluster_preflight.cli.known_hosts import ON_THE_NODE
from job_env import job_python
from readme_steps import ROOT, inventory_of, readme_steps
from testbed import testbed_fixture, unavailable_reason
from multinode.test_bringup_multinode import SysctlGuard, ensure_fresh_apt_lists, host_prerequisites_missing

pytestmark = [pytest.mark.multinode, pytest.mark.timeout(1500)]

NODES = 3
NAMES = ["gpu-node-%d" % index for index in range(1, NODES + 1)]
COMMAND_TIMEOUT = 400
# The holder of the controller's mount namespace: the README's directories bound to this test's, /root an overlay.
HOLDER = r"""
set -e
mount --bind "$T_CLUSTERS" "$T_ROOT/clusters"
mount --bind "$T_RESULTS" "$T_ROOT/results"
mount -t overlay overlay -o "lowerdir=/root,upperdir=$T_HOME/upper,workdir=$T_HOME/work" /root
touch "$T_READY"
exec sleep 3600
"""


class Controller:
    """The operator's shell on the controller: runs a README command from the repository root."""

    def __init__(self, base, ssh_key):
        self.base = base
        self.clusters, self.results = base / "clusters", base / "results"
        upper = base / "home" / "upper"
        (upper / ".ssh").mkdir(parents=True, mode=0o700)
        (base / "home" / "work").mkdir()
        # The key the nodes accept, where ssh looks for it: the operator's own key.
        shutil.copy(ssh_key, str(upper / ".ssh" / "id_ed25519"))
        os.chmod(str(upper / ".ssh" / "id_ed25519"), 0o600)
        shutil.copytree(os.path.join(ROOT, "clusters", "example"), str(self.clusters / "example"))
        self.results.mkdir()
        os.makedirs(os.path.join(ROOT, "results"), exist_ok=True)
        ready = base / "ready"
        env = dict(os.environ, T_CLUSTERS=str(self.clusters), T_RESULTS=str(self.results), T_ROOT=ROOT,
                   T_HOME=str(base / "home"), T_READY=str(ready))
        self.holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "bash", "-c", HOLDER],
                                       env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 20
        while not ready.exists():
            if self.holder.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("the controller's mount namespace did not come up (rc %s)" % self.holder.poll())
            time.sleep(0.05)
        self.log = []

    def run(self, command, answer=None, timeout=COMMAND_TIMEOUT):
        """``command`` as the README has it, in a shell at the repository root; CompletedProcess (text)."""
        argv = ["nsenter", "--mount=/proc/%d/ns/mnt" % self.holder.pid, "--", "bash", "-c",
                'cd "$0" && exec bash -c "$1"', ROOT, command]
        started = time.monotonic()
        done = subprocess.run(argv, input=answer or "", capture_output=True, text=True, timeout=timeout, check=False)
        self.log.append((command, done.returncode, round(time.monotonic() - started, 1)))
        print("$ %s\n(exit %d, %.1f s)\n%s%s" % (command, done.returncode, time.monotonic() - started, done.stdout,
                                                done.stderr[-3000:]))
        return done

    def read(self, path):
        """A file as the controller's commands see it (``results/latest/...``), or None."""
        done = subprocess.run(["nsenter", "--mount=/proc/%d/ns/mnt" % self.holder.pid, "--", "cat",
                               os.path.join(ROOT, path)], capture_output=True, text=True, timeout=30, check=False)
        return done.stdout if done.returncode == 0 else None

    def close(self):
        if self.holder.poll() is None:
            os.killpg(self.holder.pid, signal.SIGKILL)
        try:
            self.holder.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


# A pyenv shim of a version the node does not select, first on root's PATH (pyenv's own installer adds such a line
# to ~/.bashrc): Ansible's interpreter discovery takes it, and it does not run.
SHIMS = "/root/.preflight-test-pyenv/shims"
SHIM = r"""#!/bin/sh
echo "pyenv: python3.13: command not found" >&2
echo >&2
echo "The \`python3.13' command exists in these Python versions:" >&2
echo "  3.13.0" >&2
exit 127
"""
# The first venv the operator tries: their own, under root's 0700 home, which the job user cannot reach.
ROOT_VENV = "/root/train-venv"


def operator_edit(path, bed, python, interpreter=True):
    """What README step 2 leaves to the operator: the nodes and their training Python and job user in the copied
    example; the rest of it kept (its ``ansible_python_interpreter`` too, unless ``interpreter`` is false: the
    mistake of the first fault run).  A small, quick all-reduce and the bed's own lock directory keep the bed fast
    and apart from other beds; its 20 timed iterations (a few tens of milliseconds) make the bus bandwidth step 5
    compares with the profile a mean, not the time of one or two collectives on a machine other beds share.  Even a
    mean of loopback-speed gloo swings by more than the 20% the profile tolerates when the machine's two cores are
    busy: the bed tolerates 90%, so step 5 shows the comparison, not the machine's load (the tolerance's own
    judgement is unit-tested, tests/unit/test_profile.py)."""
    with open(path, encoding="utf-8") as handle:
        inventory = yaml.safe_load(handle)
    cluster = inventory["all"]["children"]["cluster"]
    if not interpreter:
        # The example names it; the mistake is an inventory without it.
        assert cluster["vars"].pop("ansible_python_interpreter") == "/usr/bin/python3"
    else:
        cluster["vars"]["ansible_python_interpreter"] = "/usr/bin/python3"
    cluster["hosts"] = {name: {"ansible_host": node.address, "preflight_node_addr": node.node_addr}
                        for name, node in zip(NAMES, bed.nodes)}
    cluster["vars"].update(preflight_training_python=python, preflight_job_user="nobody", preflight_nproc_per_node=1,
                           preflight_lock_dir=bed.lock_dir, allreduce_sizes=[65536], allreduce_iters=20,
                           allreduce_warmup=3, profile_busbw_tolerance=0.9)
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(inventory, handle, sort_keys=False)


def first_day_nodes(bed):
    """Each node as a first day finds it: a broken pyenv shim first on root's PATH, and the operator's venv under
    root's 0700 home (made from the system interpreter, as any venv is)."""
    for node in bed.nodes:
        done = bed.run(node, ["sh", "-c", 'mkdir -p "$1" && cat > "$1/python3.13" && chmod 0755 "$1/python3.13" && '
                              'printf \'export PATH="%s:$PATH"\\n\' "$1" >> /root/.bashrc && chmod 0700 /root && '
                              '/usr/bin/python3 -m venv --without-pip "$2"', "sh", SHIMS, ROOT_VENV],
                       input=SHIM, timeout=120)
        assert done.returncode == 0, done.stderr


def fingerprint(bed, node):
    done = subprocess.run(["ssh-keygen", "-lf", os.path.join(node.dir, "ssh_host_ed25519_key.pub")],
                          capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.split()[1]


@pytest.fixture(scope="module")
def first_hour(request, tmp_path_factory):
    """The bed, the controller, and every step's results: ``{step: [(command, CompletedProcess)]}``."""
    bed_missing = unavailable_reason()
    missing = [] if bed_missing else host_prerequisites_missing()
    python = None if bed_missing or missing else job_python("nobody")
    why = ("test bed unavailable: %s" % bed_missing if bed_missing else
           "bring-up would install on this machine, whose /usr and /opt the nodes share: pre-install %s (scripts/test "
           "does)" % ", ".join(missing) if missing else
           "no Python with torch that an unprivileged job user can run on this machine" if python is None else None)
    if why:
        pytest.skip(why)
    ensure_fresh_apt_lists()
    guard = SysctlGuard()
    request.addfinalizer(guard.restore)
    atexit.register(guard.restore)
    started = time.monotonic()
    bed = testbed_fixture(request, nodes=NODES, private_dirs=("/etc", "/root"))
    controller = Controller(tmp_path_factory.mktemp("first-hour"), bed.ssh_key)
    request.addfinalizer(controller.close)
    steps = readme_steps()
    inventory = inventory_of(steps[2])
    ran = {"bed": bed, "controller": controller, "inventory": inventory, "python": python}
    first_day_nodes(bed)
    edited = os.path.join(str(controller.clusters), os.path.relpath(inventory, "clusters"))
    for number in (2, 3, 4, 5):
        ran[number] = []
        if number == 3:
            # The first day's two mistakes, each seen with the README's own dry run, then fixed as the finding says.
            operator_edit(edited, bed, ROOT_VENV + "/bin/python", interpreter=False)
            ran["broken interpreter"] = controller.run(steps[3][0])
            operator_edit(edited, bed, ROOT_VENV + "/bin/python")
            ran["unreachable venv"] = controller.run(steps[3][0])
            operator_edit(edited, bed, python)
        for command in steps[number]:
            ran[number].append((command, controller.run(command, answer="yes\n" if "known-hosts" in command
                                                        else None)))
            if command.startswith("cp "):
                operator_edit(edited, bed, python)
                # The README's ping, before the controller knows the nodes' host keys: what the README says it gives.
                ran["ping before known-hosts"] = controller.run(steps[2][-1])
    ran["seconds"] = round(time.monotonic() - started, 1)
    print("README steps 2-5 on the bed: %s s; %s" % (ran["seconds"], controller.log))
    return ran


def outputs(ran, step):
    return [(command, done.returncode, done.stdout + done.stderr) for command, done in ran[step]]


def test_step2_host_keys_on_first_contact_then_every_node_answers(first_hour):
    bed = first_hour["bed"]
    before = first_hour["ping before known-hosts"]
    assert before.returncode != 0 and "Host key verification failed" in before.stdout + before.stderr
    (copy, _rc, _text), (scan, scan_rc, scanned), (ping, ping_rc, pinged) = outputs(first_hour, 2)
    assert copy.startswith("cp ") and "known-hosts" in scan and "-m ping" in ping
    assert scan_rc == 0, scanned
    for name, node in zip(NAMES, bed.nodes):
        assert re.search(r"new +%s +%s +ssh-ed25519 +%s" % (name, re.escape(node.address),
                                                           re.escape(fingerprint(bed, node))), scanned), scanned
    assert "recorded" in scanned and "Record these" in scanned
    assert ping_rc == 0 and pinged.count("SUCCESS") == NODES, pinged
    # The command it asks the operator to run on a node shows the same fingerprint: the key the node's sshd presents
    # (sshd -T names the bed's own key file, not /etc/ssh's).
    assert ON_THE_NODE in scanned
    for node in bed.nodes:
        shown = bed.run(node, ["sh", "-c", ON_THE_NODE.replace(
            "sshd -T", "sshd -T -f %s" % os.path.join(node.dir, "sshd_config"))], timeout=30)
        assert fingerprint(bed, node) in shown.stdout, (shown.stdout, shown.stderr)


def test_a_broken_node_interpreter_is_one_cause_with_the_node_s_words_and_the_fix(first_hour):
    done = first_hour["broken interpreter"]
    text = done.stdout + done.stderr
    assert done.returncode == 2, text
    # The findings: between the summary's "verdict:" line and the headline.
    every = text.splitlines()
    start = next(index for index, line in enumerate(every) if line.startswith("verdict: "))
    lines = every[start + 1:next(index for index, line in enumerate(every) if line.startswith("BRING-UP DRY RUN"))]
    assert lines[0] == "  [fail] preflight.facts on all 3 nodes (3 findings)", text
    assert "(rc 127); the node said: pyenv: python3.13: command not found" in lines[1]
    assert lines[2].startswith("    fix: Ansible's interpreter discovery chose %s/python3.13 on all 3 nodes "
                               "(ansible_python_interpreter is not set)" % SHIMS), lines[2]
    assert "set ansible_python_interpreter: /usr/bin/python3" in lines[2]
    assert lines[3].startswith("    + %d consequences of it" % (NODES * len(BRINGUP_NAMES))), lines[3]
    assert len(lines) == 4, lines
    assert "a defect of the preflight" not in text and "<node>" not in text
    assert "nothing checked on all 3 nodes" in text and "nothing would change" not in text
    report = json.loads(first_hour["controller"].read(re.search(r"verdict (\S+/bringup\.json)", text).group(1)
                                                      .replace(ROOT + "/", "")) or "{}")
    assert [cause["checks"] for cause in report["causes"]] == [["preflight.facts"]]
    assert all(report["nodes"][name]["checks"]["preflight.reachable"]["status"] == "pass" for name in NAMES)


def test_a_job_user_who_cannot_reach_the_venv_is_told_the_least_privilege_fix(first_hour):
    done = first_hour["unreachable venv"]
    text = done.stdout + done.stderr
    assert done.returncode == 2, text
    assert "--- diff: " in text  # the dry run still shows what bring-up would change
    fix = next(line for line in text.splitlines() if "/root stops nobody" in line)
    assert "allreduce.python" in text and ("cannot be run by nobody: /root (mode 0700" in text)
    assert fix.index("/usr/bin/python3 -m venv /opt/train-venv") < fix.index("setfacl -m u:nobody:x /root")
    assert "apt-get install acl" in fix and "Not chmod o+x /root" in fix
    assert "sudo" not in text and "<account>" not in text and "<node>" not in text
    # One cause for the three nodes, printed once.
    assert text.count("/root stops nobody") == 1, text


def test_step3_diffs_shown_nothing_written_then_applied_then_changed_0(first_hour):
    bed, controller = first_hour["bed"], first_hour["controller"]
    (_c, check_rc, check), (_a, apply_rc, applied), (_r, again_rc, again) = outputs(first_hour, 3)
    assert check_rc == 0 and apply_rc == 0 and again_rc == 0, (check, applied, again)
    assert "--- diff: " in check and "+++ after" in check
    dry = re.search(r"BRING-UP DRY RUN \(check mode, nothing was written: (\d+) changes would be made", check)
    assert dry and int(dry.group(1)) > 0, check
    made = re.search(r"changes: (\d+) changes made \((.*)\)", applied)
    assert made and all(int(count) > 0 for count in re.findall(r"gpu-node-\d (\d+)", made.group(2))), applied
    assert "changed=0 on every node" in again, again
    # The second apply's report records it; the dry run is in the history as one, never as a bring-up.
    runs = sqlite3.connect(str(controller.results / "history.sqlite")).execute(
        "SELECT kind, check_mode FROM runs WHERE kind = 'bringup' ORDER BY finished, id").fetchall()
    # The two fault runs and the README's dry run, then the two that wrote.
    assert [mode for _kind, mode in runs] == [1, 1, 1, 0, 0], runs
    reports = sorted(str(path) for path in controller.results.glob("*/bringup.json"))
    assert json.load(open(reports[-1]))["changed"] == {name: 0 for name in NAMES}
    for node in bed.nodes:
        assert bed.run(node, ["test", "-f", "/etc/sysctl.d/60-preflight-core.conf"]).returncode == 0


def test_step4_gate_passes_on_the_cluster_alone_and_its_hostfile_works_on_the_nodes(first_hour):
    bed, controller = first_hour["bed"], first_hour["controller"]
    (_gate, rc, text), = outputs(first_hour, 4)
    assert rc == 0, text
    assert "PREFLIGHT PASS: 3/3 nodes healthy" in text
    verdict = json.loads(controller.read("results/latest/verdict.json"))
    assert verdict["hosts"] == NAMES  # the cluster alone: no localhost
    assert "profile: all 3 nodes" not in text and "profile: none set for all 3 nodes" in text
    # The names do not resolve on the nodes: the hostfile names what they reach, and says so.
    assert "host lists: hostfile, hosts.txt and hosts.csv list" in text
    entries = [line.split()[0] for line in controller.read("results/latest/hostfile").splitlines()]
    assert entries == [node.node_addr for node in bed.nodes]
    for node in bed.nodes:
        for entry in entries:
            reached = bed.run(node, ["python3", "-c", "import socket; socket.create_connection((%r, 22), 5)" % entry],
                              timeout=20)
            assert reached.returncode == 0, (node.name, entry, reached.stderr)
    # The opt-in login is one grouped finding for the whole cluster, not one per node and check; so are the
    # nodes' own hostnames (pfn1..3), which are not their inventory names.
    assert text.count("node-to-node ssh login is not set up (it is opt-in)") == 1, text
    assert re.search(r"\[warn\] the nodes call themselves by names that are not their inventory names: 3 findings "
                     r"\(ssh_trust.hostname\) on all 3 nodes", text), text
    # No placeholder, no fix printed twice, a matrix that fits a terminal, a page that reads as the pass it is.
    assert "<node>" not in text
    fixes = [line for line in text.splitlines() if line.startswith("    fix: ")]
    assert len(fixes) == len(set(fixes)), fixes
    assert max(len(line) for line in text.splitlines() if line.startswith(("node ", "gpu-node-"))) <= 110
    page = controller.read("results/latest/report.html")
    assert "all 3 healthy" in page and "0 passed" not in page and "host lists: " in page


def test_step5_baseline_records_the_passing_gate_and_the_next_gate_compares_with_it(first_hour):
    controller = first_hour["controller"]
    (_baseline, rc, text), (_gate, gate_rc, gated) = outputs(first_hour, 5)[:2]
    assert rc == 0, text
    first_gate = [path for path in sorted(controller.results.glob("*/verdict.json"))][0]
    assert "baseline: from the latest gate of cluster %s that passed: %s" % (
        os.path.join(ROOT, first_hour["inventory"]), os.path.join(ROOT, "results", first_gate.parent.name,
                                                                  "verdict.json")) in text, text
    profile = os.path.join(ROOT, os.path.dirname(first_hour["inventory"]), "profiles", "cluster.yml")
    assert "profile of group cluster (3 nodes) -> %s" % profile in text
    assert "wired: " in text and "group_vars/cluster.yml created with: profile_file:" in text
    assert gate_rc == 0, gated
    assert "profile: all 3 nodes compared with %s" % profile in gated
    (_history, history_rc, shown), = outputs(first_hour, 5)[2:]
    assert history_rc == 0 and "Flaky nodes:\n  none" in shown, shown
    verdict = json.loads(controller.read("results/latest/verdict.json"))
    for name in NAMES:
        checks = verdict["nodes"][name]["checks"]
        assert checks["profile.summary"]["details"]["profile"] == profile
        compared = [check for key, check in checks.items() if key.startswith("profile.") and key != "profile.summary"]
        assert compared and all(check["status"] == "pass" for check in compared), checks
    print("README steps 2-5 took %s s on the bed" % first_hour["seconds"])
