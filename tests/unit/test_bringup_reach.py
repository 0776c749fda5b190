"""Bring-up names a job user who cannot run the training Python before the first gate: its final decision judges
the job user its facts call resolved (allreduce.job_user, allreduce.python, the gate's names and words), with the
least-privilege fix first."""

from cluster_preflight.plays import stage_results as registers
from cluster_preflight.stages.decisions import decide

PYTHON = "/root/train/.venv/bin/python"
BLOCKED = {"path": "/root", "kind": "permission", "links": [],
           "found": "/root (mode 0700, owner root, group root): trainer cannot enter it"}


def bringup_vars(job_users):
    """hostvars of a bring-up: no all-reduce settings, facts read, each node's resolved job user."""
    hostvars = {}
    for host, job in job_users.items():
        hostvars[host] = {
            registers.SETTINGS: {"ok": True, "errors": [], "settings": {"core_dumps": {}},
                                 "node": {"name": host, "ansible_host": host, "node_addr": host, "user": "root",
                                          "ssh_port": 22},
                                 "job": {"user": "trainer", "named": True, "python": PYTHON}},
            registers.FACTS: {"changed": False, "facts": {}, "errors": {}, "job_user": job}}
    hosts = sorted(hostvars)
    return {"ansible_play_hosts_all": hosts, "groups": {"cluster": hosts}, "hostvars": hostvars}


def test_a_job_user_the_venv_keeps_out_fails_bring_up_with_the_least_privilege_fix_first():
    trainer = {"name": "trainer", "uid": 1000, "run_as": "trainer", "how": "named", "note": "", "python": PYTHON}
    result = decide("final", bringup_vars({"n1": dict(trainer, python_blocked=BLOCKED), "n2": trainer}))
    n1, n2 = result["checks_by_host"]["n1"]["allreduce"], result["checks_by_host"]["n2"]["allreduce"]
    assert n1["job_user"]["status"] == "pass" and n1["python"]["status"] == "fail"
    assert n1["python"]["found"] == ("training Python %s on n1 cannot be run by trainer: /root (mode 0700, owner "
                                     "root, group root): trainer cannot enter it" % PYTHON)
    fix = n1["python"]["fix"]
    assert fix.startswith("/root stops trainer from running %s on n1. Least privilege first: as root on n1, make the "
                          "training venv from the system interpreter" % PYTHON)
    assert "/usr/bin/python3 -m venv /opt/venv" in fix and "setfacl -m u:trainer:x /root" in fix
    assert n2["python"]["status"] == "pass" and "trainer can reach" in n2["python"]["found"]


def test_a_job_user_that_does_not_exist_is_one_finding():
    missing = {"name": "trainer", "uid": None, "how": "missing", "note": "no account trainer on this node"}
    checks = decide("final", bringup_vars({"n1": missing}))["checks_by_host"]["n1"]["allreduce"]
    assert checks["job_user"]["status"] == "fail" and "create trainer on n1" in checks["job_user"]["fix"]
    assert checks["python"]["status"] == "skipped"
