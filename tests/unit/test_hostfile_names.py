"""How the host lists name the nodes (cluster_preflight/outputs/formats.py ``launch_names``, ``host_lists``; the inbound
ssh check that tells which names did not resolve): what a launcher on a node can reach, and a note either way."""

from cluster_preflight.outputs import formats as outputs
from cluster_preflight.capabilities.ssh_trust import mesh as ssh_trust_mesh
from report_helpers import synthetic_verdict

HOSTS = ["gpu-node-1", "gpu-node-2", "gpu-node-3"]
ADDRESSES = {"gpu-node-1": "198.18.7.1", "gpu-node-2": "198.18.7.2", "gpu-node-3": "198.18.7.3"}


def gate_verdict(unresolved=None, mesh=True):
    verdict = synthetic_verdict(hosts=HOSTS)
    for host in HOSTS:
        peers = (unresolved or {}).get(host, [])
        status = "warn" if peers else "pass"
        check = {"status": status if mesh else "skipped", "found": "x", "expected": "y",
                 "fix": "z" if status == "warn" else "", "details": {"name_unresolved_on": peers}}
        verdict["nodes"][host]["checks"]["ssh_trust.inbound"] = check
    return verdict


def test_names_that_resolve_are_listed_as_they_are():
    named = outputs.launch_names(gate_verdict(), ADDRESSES)
    assert named == {"names": {host: host for host in HOSTS}, "mode": "auto", "note": ""}


def test_a_name_that_did_not_resolve_on_its_peers_is_listed_by_address_with_a_note():
    verdict = gate_verdict({"gpu-node-1": ["gpu-node-2", "gpu-node-3"], "gpu-node-2": ["gpu-node-1", "gpu-node-3"],
                            "gpu-node-3": ["gpu-node-1", "gpu-node-2"]})
    verdict["hostfile"] = outputs.launch_names(verdict, ADDRESSES)
    assert verdict["hostfile"]["names"] == ADDRESSES
    assert "did not resolve on its peers" in verdict["hostfile"]["note"]
    assert "gpu-node-1 as 198.18.7.1" in verdict["hostfile"]["note"]
    assert "preflight_hostfile_names: inventory" in verdict["hostfile"]["note"]
    lists = outputs.host_lists(verdict)
    assert lists["hostfile"] == "198.18.7.1 slots=2\n198.18.7.2 slots=2\n198.18.7.3 slots=2\n"
    assert lists["hosts.txt"] == "198.18.7.1\n198.18.7.2\n198.18.7.3\n"
    assert lists["hosts.csv"] == "198.18.7.1,198.18.7.2,198.18.7.3\n"


def test_the_option_forces_names_or_addresses_and_says_so():
    verdict = gate_verdict({"gpu-node-2": ["gpu-node-1"]})
    forced = outputs.launch_names(verdict, ADDRESSES, "inventory")
    assert forced["names"] == {host: host for host in HOSTS}
    assert "as asked" in forced["note"] and "gpu-node-2" in forced["note"]
    by_address = outputs.launch_names(gate_verdict(), ADDRESSES, "address")
    assert by_address["names"] == ADDRESSES and "preflight_hostfile_names: address" in by_address["note"]


def test_without_the_ssh_mesh_the_names_are_kept_and_the_note_says_they_were_not_checked():
    named = outputs.launch_names(gate_verdict(mesh=False), ADDRESSES)
    assert named["names"] == {host: host for host in HOSTS}
    assert "was not checked" in named["note"] and "ssh_trust_mesh" in named["note"]
    # A verdict with no node list note (bring-up, health check, one node) says nothing.
    single = synthetic_verdict(hosts=["localhost"])
    assert outputs.launch_names(single, {"localhost": "127.0.0.1"})["note"] == ""


def _row(source, target, destination, status):
    return {"source": source, "target": target, "destination": destination, "status": status,
            "stderr": "ssh: Could not resolve hostname %s: Temporary failure in name resolution" % target
            if status == "dns" else "", "rc": 255}


def test_the_inbound_check_names_the_peers_on_which_the_name_did_not_resolve():
    probes = {}
    for source in HOSTS:
        rows = []
        for node in HOSTS:
            if node != source:
                rows.append(_row(source, ADDRESSES[node], node, "auth_denied"))
                rows.append(_row(source, node, node, "dns"))
        probes[source] = {"connect": True, "results": rows}
    cluster = {"hosts": HOSTS, "probes": probes}
    analysis = {"suspects": {}}
    settings = {"ssh_trust_mesh": True, "ssh_trust_login_policy": "warn", "ssh_trust_port": 22}
    result = ssh_trust_mesh._inbound_check("gpu-node-1", settings, cluster, analysis)
    assert result["details"]["name_unresolved_on"] == ["gpu-node-2", "gpu-node-3"]
