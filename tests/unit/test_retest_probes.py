"""Retest before blame in the node probes: an ssh of the ssh_trust mesh that timed out is tried once more
(module_utils/preflight_node/ssh_mesh.py, switched by preflight_retest_ssh through cluster_preflight/stages.py);
one refused or denied never is."""

import pytest

from preflight_node import ssh_mesh
from preflight_node import ssh_trust_probe
from fake_ops import FakeOps

PEERS = [{"node": "n2", "targets": ["n2"], "port": 22}]
TIMED_OUT = (124, "", "")
REFUSED = (255, "", "ssh: connect to host n2 port 22: Connection refused")


@pytest.fixture(autouse=True)
def no_pause(monkeypatch):
    monkeypatch.setattr(ssh_mesh, "RETRY_PAUSE", 0)


def _ops(*answers):
    queue = list(answers)

    def ssh(argv):
        return queue.pop(0) if len(queue) > 1 else queue[0]
    return FakeOps(programs={"ssh": "/usr/bin/ssh"}, commands={("/usr/bin/ssh", "-n"): ssh,
                                                               ("/usr/bin/ssh", "-G"): (0, "", "")})


def _probe(ops, retry):
    report = ssh_trust_probe.probe({"source": "n1", "peers": PEERS, "keyscan": False, "pdsh": "never",
                                    "retry_timeouts": retry}, ops)
    return report["results"][0], [call for call in ops.calls if call[1] == "-n"]


def test_a_timeout_that_clears_is_retried_once_and_passes_saying_so():
    row, calls = _probe(_ops(TIMED_OUT, (0, "", "")), retry=True)
    assert row["status"] == "ok" and len(calls) == 2
    assert row["retried"]["status"] == "timeout" and "retried once" in row["stderr"]


def test_a_timeout_that_persists_is_a_timeout_whose_finding_says_retried():
    row, calls = _probe(_ops(TIMED_OUT), retry=True)
    assert row["status"] == "timeout" and len(calls) == 2
    assert row["stderr"].splitlines()[-1].endswith("retried once after 0 s: timed out again")


def test_refused_is_never_retried_and_retry_off_tries_once():
    row, calls = _probe(_ops(REFUSED, (0, "", "")), retry=True)
    assert row["status"] == "refused" and len(calls) == 1 and "retried" not in row
    row, calls = _probe(_ops(TIMED_OUT, (0, "", "")), retry=False)
    assert row["status"] == "timeout" and len(calls) == 1 and "retried" not in row


@pytest.mark.parametrize("switch", [True, False])
def test_the_stages_hand_the_run_wide_switch_to_the_ssh_probe(switch):
    from capability_helpers import role_settings  # pylint: disable=import-outside-toplevel
    from cluster_preflight import stages  # pylint: disable=import-outside-toplevel
    from cluster_preflight.cluster import ClusterView  # pylint: disable=import-outside-toplevel
    names = ["n1", "n2"]
    hostvars = {host: {"preflight_settings": {"settings": {
        "ssh_trust": role_settings("ssh_trust"), "preflight": {"preflight_retest_ssh": switch}},
        "node": {"name": host, "node_addr": "198.18.0.%d" % index, "ssh_host": host, "aliases": []}},
        "preflight_facts": {"facts": {}, "errors": {}}} for index, host in enumerate(names)}
    view = ClusterView({"ansible_play_hosts_all": names, "hostvars": hostvars})
    args = stages._probe_args(view, names, {}, None)  # pylint: disable=protected-access
    assert args["n1"]["ssh_trust"]["retry_timeouts"] is switch
    assert args["n1"]["ssh_trust"]["peers"][0]["node"] == "n2"
