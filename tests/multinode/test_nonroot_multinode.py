"""The gate over an unprivileged login on the namespace test bed: no node fails for lacking root.

Every node gets the account ``pfuser`` (in its own ``/etc`` and ``/home``) that the controller's key
logs in as; ``ansible_user`` is that account and ``preflight_become`` stays false.  Two runs of
preflight.yml over one bed:

* with a Python the account can run (tests/job_env.py's): what cannot be observed without root is
  ``blocked`` ("needs root: ..."), never ``fail``, and nothing compared with a fallback passes;
* with the project's own interpreter, which lives under ``/root`` (0700): every node's
  ``preflight.facts`` says what the node's shell said (Permission denied) and names the interpreter.
"""

import os
import subprocess

import pytest

from job_env import account_exists, job_python
from playbook import run_playbook
from testbed import TRAINING_PYTHON, testbed_fixture

pytestmark = pytest.mark.timeout(900)

LOGIN = "pfuser"
NODES = 2
FAST = {"allreduce_timeout": 15, "allreduce_hard_timeout": 60, "allreduce_sizes": [1048576],
        "allreduce_iters": 2, "allreduce_warmup": 1}
# Words of a found text that say it rests on an assumption rather than on what was observed.
ASSUMED = ("assumed", "fallback", "could not be found without root")


def _runs_as_login_would(python):
    """Whether an unprivileged account (nobody, on this machine) can start ``python``."""
    done = subprocess.run(["runuser", "-u", "nobody", "--", python, "-c", "pass"], cwd="/", capture_output=True,
                          timeout=60, check=False)
    return done.returncode == 0


@pytest.fixture(scope="module")
def bed(request):
    python = job_python(LOGIN if account_exists(LOGIN) else "nobody")
    if python is None:
        pytest.skip("no Python with torch that an unprivileged account can run on this machine")
    # /root private too: the bed's sshd then reads ~/.ssh/authorized_keys, which the login's own is.
    bed = testbed_fixture(request, nodes=NODES, private_dirs=("/etc", "/home", "/root"), training_python=python)
    with open(bed.ssh_key + ".pub", encoding="ascii") as handle:
        public = handle.read()
    for node in bed.nodes:
        # The overlay's upper directory gave the node's /root mode 0755: back to the host's 0700.
        bed.run(node, ["chmod", "0700", "/root"], check=True)
        bed.run(node, ["useradd", "--create-home", "--shell", "/bin/bash", LOGIN], check=True)
        # No password, but not locked either: the bed's sshd (UsePAM no) refuses a locked account.
        bed.run(node, ["usermod", "--password", "*", LOGIN], check=True)
        ssh_dir = "/home/%s/.ssh" % LOGIN
        bed.run(node, ["install", "-d", "-m", "0700", "-o", LOGIN, "-g", LOGIN, ssh_dir], check=True)
        bed.run(node, ["sh", "-c", 'cat > "$1" && chown "$2:$2" "$1" && chmod 0600 "$1"', "-",
                       ssh_dir + "/authorized_keys", LOGIN], input=public, check=True)
    bed.job_python = python
    return bed


def run(bed, tmp_path, python):
    login = {"ansible_user": LOGIN, "ansible_python_interpreter": python, "preflight_training_python": python}
    inventory = bed.write_inventory(path=str(tmp_path / "inventory.yml"),
                                    host_vars={node.name: login for node in bed.nodes})
    return run_playbook(tmp_path, inventory=inventory, timeout=600, extravars=dict(FAST))


def _checks(verdict):
    return {(host, name): check for host in verdict["hosts"]
            for name, check in verdict["nodes"][host]["checks"].items()}


def _no_pass_on_an_assumption(verdict):
    passed = ["%s %s: %s" % (host, name, check["found"]) for (host, name), check in _checks(verdict).items()
              if check["status"] == "pass" and any(word in check["found"] for word in ASSUMED)]
    assert passed == [], "passes resting on an assumption:\n" + "\n".join(passed)


def _no_fail_for_lacking_root(verdict):
    failing = ["%s %s: %s" % (host, name, check["found"]) for (host, name), check in _checks(verdict).items()
               if check["status"] == "fail" and ("root" in check["found"] or "Permission denied" in check["found"])
               and name != "preflight.facts" and not name.endswith(".no_result")]
    assert failing == [], "failed for lacking root:\n" + "\n".join(failing)


def test_an_unprivileged_login_is_blocked_where_it_needs_root_never_failed(bed, tmp_path):
    result = run(bed, tmp_path, bed.job_python)
    verdict = result.verdict
    assert verdict is not None, result.stdout[-4000:]
    _no_fail_for_lacking_root(verdict)
    _no_pass_on_an_assumption(verdict)
    detail = "\n".join("%s %s %s: %s" % (h, n, c["status"], c["found"][:300]) for (h, n), c in
                       sorted(_checks(verdict).items()) if c["status"] not in ("pass", "not_applicable"))
    assert verdict["failed_hosts"] == [], detail
    for node in bed.nodes:
        served = verdict["nodes"][node.name]["checks"]["ssh_trust.host_keys_served"]
        assert (served.get("details") or {}).get("blocked") and served["found"].startswith("needs root: "), served
        assert "preflight_become: true" in served["fix"]
        unchanged = verdict["nodes"][node.name]["checks"]["ssh_trust.host_key_unchanged"]
        assert unchanged["status"] != "pass", unchanged
        assert verdict["nodes"][node.name]["status"] == "unverified", detail


def test_a_login_that_cannot_run_the_nodes_python_says_so_and_names_it(bed, tmp_path):
    if _runs_as_login_would(TRAINING_PYTHON):
        pytest.skip("%s is reachable by other accounts here: nothing to refuse" % TRAINING_PYTHON)
    result = run(bed, tmp_path, TRAINING_PYTHON)
    verdict = result.verdict
    assert verdict is not None, result.stdout[-4000:]
    _no_fail_for_lacking_root(verdict)
    _no_pass_on_an_assumption(verdict)
    for node in bed.nodes:
        facts = verdict["nodes"][node.name]["checks"]["preflight.facts"]
        assert facts["status"] == "fail" and "Permission denied" in facts["found"], facts
        assert TRAINING_PYTHON in facts["fix"] and "ansible_python_interpreter" in facts["fix"], facts
        assert "login user %s" % LOGIN in facts["fix"], facts
