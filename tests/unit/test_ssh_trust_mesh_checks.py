"""The ssh_trust capability (cluster_preflight/capabilities/ssh_trust/, node half
module_utils/preflight_node/capabilities/ssh_trust.py), continued from test_ssh_trust_capability.py: the
per-user cluster key and ssh directory audit, the mesh (probe with FakeOps, decide from its
rows), probe_args, the check contract and the role defaults."""

import os

import pytest

from preflight_node import checks as pc
from cluster_preflight.capabilities import ssh_trust as st
from preflight_node.ssh import checks as ssh_checks
from preflight_node.capabilities import ssh_trust_probe
from fake_ops import FakeOps
from capability_helpers import write
from ssh_trust_helpers import (KEYS, KH, NODES3, ROLE, UKEY, assert_contract, cluster, decide_all, facts,
                               fake_key, fp, in_sync, key_state, load_yaml, node, probe_result, settings,
                               ssh_answers, ssh_state, synced_users)


def test_cluster_key_is_per_user_and_node_and_authorized_from_every_node():
    on = {"ssh_trust_cluster_key": True, "ssh_trust_cluster_key_users": ["root", "train"]}
    block = in_sync(**on)["facts"]["node1"]["known_hosts"]["block"]

    def view_with(states, **extra):
        return cluster({n: facts(n, [KEYS[n]], block=block, cluster_key=states.get(n) or synced_users(n))
                        for n in NODES3}, **dict(on, **extra))

    view = view_with({})
    assert st.plan(view)["cluster_key"] == {
        "enabled": True, "users": ["root", "train"],
        "from": ["198.19.0.1", "198.18.0.1", "198.19.0.2", "198.18.0.2", "198.19.0.3", "198.18.0.3"]}
    for host, checks in decide_all(view).items():
        assert_contract(host, checks)
        assert checks["cluster_key"]["status"] == "pass", checks["cluster_key"]
        assert checks["ssh_dirs"]["status"] == "pass", checks["ssh_dirs"]

    cases = [
        # (what is wrong on node3, status, words in found)
        ({"train": {"authorized": [(n, UKEY[(n, "train")]) for n in ("node1", "node3")]}}, "warn",
         "train's authorized_keys lacks the key of train from node2"),
        ({"train": {"authorized": [(n, UKEY[(n, "train")]) for n in NODES3] + [("", fake_key("old-shared"))]}},
         "warn", "no node=, the old shared key?"),
        ({"train": {"authorized": [(n, UKEY[(n, "train")]) for n in NODES3] + [("node9", fake_key("gone"))]}},
         "warn", "(node=node9)"),
        ({"train": {"mode": 0o644}}, "warn", "/home/train/.ssh/id_ed25519_cluster is mode 0644"),
        ({"train": {"private": False}}, "warn", "train has no /home/train/.ssh/id_ed25519_cluster"),
    ]
    for change, status, words in cases:
        view = view_with({"node3": synced_users("node3", **change)})
        result = st.decide("node3", view["facts"]["node3"], view["settings"]["node3"], None, view)["cluster_key"]
        assert result["status"] == status and words in result["found"] and "node3" in result["found"], (change,
                                                                                                       result)
        assert "bringup.yml" in result["fix"]

    # root's key handed to train: a failure on the node that holds it, naming both users.
    state = synced_users("node3")
    state["users"]["train"] = key_state("train", UKEY[("node2", "root")],
                                        [(n, UKEY[(n, "train")]) for n in NODES3])
    view = view_with({"node3": state})
    result = st.decide("node3", view["facts"]["node3"], view["settings"]["node3"], None, view)["cluster_key"]
    assert result["status"] == "fail" and "also the key of root on node2" in result["found"], result
    assert "one user's key handed to another" in result["found"]
    # A pair copied between nodes (the old design): drift on every node holding the copy.
    copied = {n: synced_users(n) for n in NODES3}
    for n in NODES3:
        copied[n]["users"]["train"] = key_state("train", UKEY[("node1", "train")],
                                                [("node1", UKEY[("node1", "train")])])
    view = view_with(copied)
    result = st.decide("node2", view["facts"]["node2"], view["settings"]["node2"], None, view)["cluster_key"]
    assert result["status"] == "warn" and "the same pair as on node1, node3" in result["found"], result
    # restrict_from: every line must carry from="...".
    view = view_with({}, ssh_trust_cluster_key_restrict_from=True)
    result = st.decide("node1", view["facts"]["node1"], view["settings"]["node1"], None, view)["cluster_key"]
    assert result["status"] == "warn" and "with options ''" in result["found"]
    # A missing user is not drift bring-up can fix.
    state = synced_users("node2")
    state["users"]["train"] = key_state("train", exists=False)
    view = view_with({"node2": state})
    result = st.decide("node2", view["facts"]["node2"], view["settings"]["node2"], None, view)["cluster_key"]
    assert result["status"] == "fail" and "create the user" in result["fix"]
    for host, checks in decide_all(view).items():
        assert_contract(host, checks)


SSH_DIRS = [
    # (home mode, ~/.ssh mode, ~/.ssh kind, words in found)
    (0o777, 0o700, "dir", "home /home/train is writable by group or others (mode 0777)"),
    (0o750, 0o770, "dir", "~/.ssh /home/train/.ssh is writable by group or others (mode 0770)"),
    (0o750, 0o777, "symlink", "~/.ssh /home/train/.ssh is a symlink to /srv/shared/.ssh"),
]


@pytest.mark.parametrize("home_mode,ssh_mode,kind,words", SSH_DIRS)
def test_an_unsafe_home_or_ssh_dir_is_refused_in_the_audit(home_mode, ssh_mode, kind, words):
    on = {"ssh_trust_cluster_key": True, "ssh_trust_cluster_key_users": ["root", "train"]}
    state = synced_users("node2")
    state["users"]["train"] = key_state("train", UKEY[("node2", "train")], [(n, UKEY[(n, "train")]) for n in NODES3],
                                        ssh=ssh_state("/home/train", home_mode, ssh_mode, 1000, kind))
    view = cluster({n: facts(n, [KEYS[n]], cluster_key=state if n == "node2" else synced_users(n)) for n in NODES3},
                   **on)
    results = decide_all(view)
    result = results["node2"]["ssh_dirs"]
    assert result["status"] == "fail" and words in result["found"] and "node2" in result["found"], result
    assert result["expected"] and "node2" in result["fix"] and "bringup.yml" in result["fix"]
    assert "train's ~/.ssh was not examined (see ssh_trust.ssh_dirs)" in results["node2"]["cluster_key"]["found"]
    for host in ("node1", "node3"):
        assert results[host]["ssh_dirs"]["status"] == "pass"
    assert_contract("node2", results["node2"])


# ----------------------------------------------------------------------------
# mesh: probe with FakeOps, decide from its rows

UNKNOWN = "No ED25519 host key is known for %s and you have requested strict checking.\nHost key verification failed.\n"
CHANGED = ("@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n"
           "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n"
           "The fingerprint for the ED25519 key sent by the remote host is\n%s.\n"
           "Offending ED25519 key in /etc/ssh/ssh_known_hosts:2\n"
           "Host key for %s has changed and you have requested strict checking.\nHost key verification failed.\n")



def test_probe_runs_strict_batch_ssh_to_every_peer_and_classifies_rc_and_stderr(tmp_path):
    write(tmp_path, KH, "# 1\nnode4,198.19.0.4 %s node=node4\n" % KEYS["node2"])
    table = {"198.19.0.2": (0, ""), "node2": (0, ""),
             "198.19.0.3": (255, "root@198.19.0.3: Permission denied (publickey).\n"),
             "node3": (255, "ssh: connect to host node3 port 22: Connection refused\n"),
             "198.19.0.4": (255, CHANGED % (fp(KEYS["node2new"]), "198.19.0.4")),
             "node4": (255, UNKNOWN % "node4"),
             "198.19.0.5": (124, ""), "node5": (255, "ssh: connect to host node5 port 22: No route to host\n")}
    ops = FakeOps(programs={"ssh": "/usr/bin/ssh"}, commands={("/usr/bin/ssh",): ssh_answers(table)})
    hosts = ["node1", "node2", "node3", "node4", "node5"]
    nodes = {h: node(h, i + 1) for i, h in enumerate(hosts)}
    args = st.probe_args(settings(ssh_trust_mesh_timeout=7, ssh_trust_pdsh="never"), nodes["node1"],
                         {"hosts": hosts, "nodes": nodes})
    args["root"] = str(tmp_path)
    result = ssh_trust_probe.probe(args, ops)
    rows = {r["target"]: r for r in result["results"]}
    assert {t: r["status"] for t, r in rows.items()} == {
        "198.19.0.2": "ok", "node2": "ok", "198.19.0.3": "auth_denied", "node3": "refused",
        "198.19.0.4": "host_key_changed", "node4": "host_key_unknown", "198.19.0.5": "timeout", "node5": "unreachable"}
    assert rows["198.19.0.4"]["new_fingerprint"] == fp(KEYS["node2new"])
    assert rows["198.19.0.4"]["old_fingerprint"] == fp(KEYS["node2"])
    assert rows["198.19.0.5"]["stderr"].endswith("killed after 7s")
    assert all(r["source"] == "node1" for r in result["results"])
    connects = [c for c in ops.calls if "-G" not in c]
    assert len(connects) == 8 and len([c for c in ops.calls if "-G" in c]) == 8
    for argv in connects:
        assert argv[0] == "/usr/bin/ssh" and argv[-1] == "true" and argv[-3] == "--"
        for option in ("BatchMode=yes", "StrictHostKeyChecking=yes", "ConnectTimeout=5", "UpdateHostKeys=no"):
            assert option in argv
        assert all(isinstance(part, str) for part in argv)  # argv lists, never a shell string
    assert result["pdsh"] == {"state": "off"} and set(result["client_config"]) == set(table)


def test_probe_without_ssh_client_pdsh_states_and_mesh_off():
    hosts = ["node1", "node2"]
    nodes = {h: node(h, i + 1) for i, h in enumerate(hosts)}
    args = st.probe_args(settings(), nodes["node1"], {"hosts": hosts, "nodes": nodes})
    assert args["pdsh_hosts"] == ["node2"] and args["connect"] is True
    result = ssh_trust_probe.probe(args, FakeOps())
    assert result["problem"] == "no ssh client (ssh) on node1; install openssh-client"
    assert result["pdsh"] == {"state": "no_ssh"}

    ops = FakeOps(programs={"ssh": "/usr/bin/ssh"}, commands={("/usr/bin/ssh",): ssh_answers({})})
    assert ssh_trust_probe.probe(args, ops)["pdsh"] == {"state": "not_installed", "program": "pdsh", "hosts": ["node2"]}

    def pdsh(argv):
        assert argv[argv.index("-w") + 1] == "node2" and argv[-1] == "date"
        return 1, "", "node2: Host key verification failed.\npdsh@node1: node2: ssh exited with exit code 255\n"
    ops = FakeOps(programs={"ssh": "/usr/bin/ssh", "pdsh": "/usr/bin/pdsh"},
                  commands={("/usr/bin/ssh",): ssh_answers({"198.19.0.2": (0, ""), "node2": (0, "")}),
                            ("/usr/bin/pdsh",): pdsh})
    report = ssh_trust_probe.probe(args, ops)["pdsh"]
    assert report["state"] == "ran" and report["failed"]["node2"]["status"] == "host_key_unknown"

    off = st.probe_args(settings(ssh_trust_mesh=False), nodes["node1"], {"hosts": hosts, "nodes": nodes})
    ops = FakeOps(programs={"ssh": "/usr/bin/ssh"}, commands={("/usr/bin/ssh",): ssh_answers({})})
    result = ssh_trust_probe.probe(off, ops)
    assert result["connect"] is False and result["results"] == [] and result["pdsh"] == {"state": "off"}
    assert ops.calls and all("-G" in argv for argv in ops.calls)  # only the client configuration is read


def mesh_view(probes, **common):
    view = in_sync(**common)
    view["probes"] = probes
    return view


def test_mesh_decide_separates_host_key_from_login_and_follows_policies():
    ok = (0, "")
    probes = {"node1": probe_result("node1", {"node2": (255, UNKNOWN % "node2"),
                                              "node3": (255, "root@node3: Permission denied (publickey).\n")}),
              "node2": probe_result("node2", {"node1": ok, "node3": ok}),
              "node3": probe_result("node3", {"node1": ok, "node2": ok})}
    results = decide_all(mesh_view(probes))
    node1 = results["node1"]
    assert node1["mesh"]["status"] == "warn"  # unknown key: ssh_trust_unknown_key_policy (warn)
    assert "node1 does not know node2's host key for 198.19.0.2, node2" in node1["mesh"]["found"]
    assert node1["mesh"]["details"]["peers"] == {"node2": "warn"}
    # The cause the summary groups it under: host keys not brought up; the denied login is the login check's.
    assert [cause["id"] for cause in node1["mesh"]["details"]["causes"]] == ["host_keys_unknown"]
    assert [cause["id"] for cause in node1["login"]["details"]["causes"]] == ["login_opt_in"]
    # Host key of node3 verified, login denied: the login check says so, the mesh check does not.
    assert "node3" not in node1["mesh"]["found"]
    assert node1["login"]["status"] == "warn" and "auth_denied" in node1["login"]["found"]
    assert "ssh_trust_cluster_key: true" in node1["login"]["fix"]
    assert node1["client_config"]["status"] == "pass" and node1["pdsh"]["status"] == "not_applicable"
    for host in ("node2", "node3"):
        assert results[host]["mesh"]["status"] == "pass" and results[host]["login"]["status"] == "pass"
        assert results[host]["inbound"]["status"] == "pass"
    assert "node1" in results["node3"]["inbound"]["found"]  # 1 of 2 peers; node1's finding is on node1
    for host, checks in results.items():
        assert_contract(host, checks)
    strict = decide_all(mesh_view(probes, ssh_trust_unknown_key_policy="fail", ssh_trust_cluster_key=True))
    assert strict["node1"]["mesh"]["status"] == "fail" and strict["node1"]["login"]["status"] == "fail"
    # With the cluster key on, a denied login is a failure of its own, not the opt-in.
    assert "causes" not in strict["node1"]["login"].get("details", {})


def test_mesh_changed_key_on_the_wire_names_both_fingerprints():
    changed = (255, CHANGED % (fp(KEYS["stranger"]), "node2"))
    fine = {"node2": probe_result("node2", {"node1": (0, ""), "node3": (0, "")}),
            "node3": probe_result("node3", {"node1": (0, ""), "node2": (0, "")})}
    probes = dict(fine, node1=probe_result("node1", {"node2": changed, "node3": (0, "")}))
    view = mesh_view(probes)
    result = st.decide("node1", view["facts"]["node1"], view["settings"]["node1"], probes["node1"], view)["mesh"]
    assert result["status"] == "fail"
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED from node1 to node2" in result["found"]
    assert fp(KEYS["stranger"]) in result["found"]
    assert "none of the host keys read from node2 itself" in result["found"]
    assert "-e ssh_trust_accept_changed=node2" in result["fix"]
    # The same key node2 reads for itself: the stale line is on node1.
    probes = dict(fine, node1=probe_result("node1", {"node2": (255, CHANGED % (fp(KEYS["node2"]), "node2")),
                                                     "node3": (0, "")}))
    view = mesh_view(probes)
    result = st.decide("node1", view["facts"]["node1"], view["settings"]["node1"], probes["node1"], view)["mesh"]
    assert "the stale line is in /etc/ssh/ssh_known_hosts on node1" in result["found"]


def test_mesh_false_is_skipped_naming_the_variable_and_no_probe_is_not_a_pass():
    view = mesh_view({}, ssh_trust_mesh=False)
    probe = probe_result("node1", {"node2": (0, ""), "node3": (0, "")}, ssh_trust_mesh=False)
    checks = st.decide("node1", view["facts"]["node1"], view["settings"]["node1"], probe, view)
    for name in ("mesh", "login", "pdsh", "inbound"):
        assert checks[name]["status"] == "skipped" and "ssh_trust_mesh is false" in checks[name]["found"], name
    assert checks["client_config"]["status"] == "pass"  # ssh -G still read, no connection
    view = mesh_view({"node2": probe_result("node2", {"node1": (0, ""), "node3": (0, "")})})
    checks = st.decide("node1", view["facts"]["node1"], view["settings"]["node1"], None, view)
    assert checks["mesh"]["status"] == "skipped" and "no ssh mesh result from node1" in checks["mesh"]["found"]


def test_unreachable_peer_is_collateral_and_no_ssh_client_is_the_nodes_own_finding():
    timeout = (255, "ssh: connect to host x port 22: Connection timed out\n")
    probes = {"node1": probe_result("node1", {"node2": timeout, "node3": (0, "")}),
              "node3": probe_result("node3", {"node1": (0, ""), "node2": timeout})}
    view = mesh_view(probes)
    view["facts"]["node2"] = None  # unreachable: nothing was read from it
    view = dict(view, facts=dict(view["facts"]))
    assert st.decide("node2", None, view["settings"]["node2"], None, view) == {}
    for host in ("node1", "node3"):
        checks = st.decide(host, view["facts"][host], view["settings"][host], probes[host], view)
        assert pc.node_status(checks) == "warn"
        assert checks["login"]["status"] == "warn"
        assert "no ssh_trust facts were read from node2" in checks["login"]["found"]
    view = mesh_view({"node1": {"source": "node1", "ssh": None, "connect": True, "results": [], "client_config": {},
                                "pdsh": {"state": "no_ssh"},
                                "problem": "no ssh client (ssh) on node1; install openssh-client"}})
    checks = st.decide("node1", view["facts"]["node1"], view["settings"]["node1"], view["probes"]["node1"], view)
    assert checks["mesh"]["status"] == "fail" and checks["client_config"]["status"] == "fail"
    assert "openssh-client" in checks["mesh"]["fix"] and checks["pdsh"]["status"] == "skipped"


def test_client_config_relaxation_is_a_warning_only_when_opted_in():
    configs = {"198.19.0.2": {"stricthostkeychecking": "false", "globalknownhostsfile": [KH], "userknownhostsfile": [],
                            "identityfile": []}}
    result = ssh_checks.client_config_check("node1", configs, KH)
    assert result["status"] == "fail" and "set outside the ssh_trust role" in result["found"]
    result = ssh_checks.client_config_check("node1", configs, KH, relaxed=True)
    assert result["status"] == "warn" and "ssh_trust_strict_host_key_checking_no: true" in result["found"]


def test_probe_args_peers_and_ports():
    hosts = ["node1", "node2", "node3"]
    nodes = {h: node(h, i + 1) for i, h in enumerate(hosts)}
    args = st.probe_args(settings(ssh_trust_mesh_user="train", ssh_trust_mesh_parallel=4), nodes["node2"],
                         {"hosts": hosts, "nodes": nodes,
                          "settings": {"node3": settings(ssh_trust_port=2200)}})
    assert [p["node"] for p in args["peers"]] == ["node1", "node3"]
    assert [p["port"] for p in args["peers"]] == [22, 2200]
    assert args["user"] == "train" and args["parallel"] == 4 and args["source"] == "node2"


def test_every_check_name_decide_can_return_is_in_the_contract():
    names = set()
    for test_view in (in_sync(), in_sync(ssh_trust_cluster_key=True),
                      mesh_view({h: probe_result(h, {p: (0, "") for p in ("node1", "node2", "node3") if p != h})
                                 for h in ("node1", "node2", "node3")})):
        for host, checks in decide_all(test_view).items():
            assert_contract(host, checks)
            names |= set(checks)
    assert names == {"host_keys", "host_keys_served", "names", "hostname", "known_hosts", "host_key_unchanged",
                     "ssh_dirs", "cluster_key", "client_dropin", "client_config", "mesh", "login", "inbound", "pdsh"}


def test_role_defaults_mirror_argument_specs_and_carry_the_plan_inputs():
    defaults = load_yaml("defaults", "main.yml")
    options = load_yaml("meta", "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert set(defaults) == set(options)
    for name in ("ssh_trust_known_hosts_entries", "ssh_trust_known_hosts_keep_nodes", "ssh_trust_client_dropin",
                 "ssh_trust_cluster_key_from"):
        assert "preflight_plan.ssh_trust" in defaults[name], name
    assert defaults["ssh_trust_strict_host_key_checking_no"] is False
    assert defaults["ssh_trust_sshd_config"] == "" and defaults["ssh_trust_host_key_files"] == []
    tasks = os.listdir(os.path.join(ROLE, "tasks"))
    assert sorted(tasks) == ["client_config.yml", "cluster_key.yml", "known_hosts.yml", "main.yml"]
    for name in tasks:
        text = open(os.path.join(ROLE, "tasks", name), encoding="utf-8").read()
        # The one cross-node read: the public keys the nodes just registered (never a decision).
        assert text.count("hostvars") == (1 if name == "cluster_key.yml" else 0), name
        assert "ansible_play_hosts" not in text, name
        assert "ssh_trust_checks" not in text and "check_mode: true" not in text, name
        # Nothing delegated to another node; a task delegated to the controller must not become root there.
        assert "delegate_to" not in text or "become: false" in text, name
        # No private key handling in the role: no slurp, no copy of key material.
        assert "slurp" not in text and "b64decode" not in text and "no_log" not in text, name


def test_a_node_that_checked_only_its_share_of_peers_is_judged_on_those():
    """Above preflight_mesh_full_max each node checks a few peers: the others are not 'never reached'."""
    ok = (0, "")
    probes = {"node1": probe_result("node1", {"node2": ok}),
              "node2": probe_result("node2", {"node3": ok}),
              "node3": probe_result("node3", {"node1": ok})}
    results = decide_all(mesh_view(probes))
    for host, peer in (("node1", "node2"), ("node2", "node3"), ("node3", "node1")):
        mesh = results[host]["mesh"]
        assert mesh["status"] == "pass" and peer in mesh["found"], mesh
        assert "never reached" not in mesh["found"], mesh
        assert_contract(host, results[host])
