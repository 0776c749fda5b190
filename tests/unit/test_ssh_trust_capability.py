"""The ssh_trust capability (module_utils/preflight_node/capabilities/ssh_trust.py): validate, read on sandbox roots
with FakeOps, plan and decide from tables of node facts, probe with FakeOps (ssh rc/stderr
classifications), and the writer (known_hosts_block) agreeing with the audit because both use
the same plan and the same block functions.  The per-user cluster key audit, the mesh probe and
the contract checks are in test_ssh_trust_mesh_checks.py; shared helpers in tests/ssh_trust_helpers.py."""

import os

import pytest

import known_hosts_block
from preflight_node import checks as pc
from cluster_preflight.capabilities import ssh_trust as st
from cluster_preflight.capabilities.ssh_trust import cluster_plan as ssh_trust_plan, settings as ssh_trust_settings
from preflight_node.ssh import known_hosts_plan, primitives as ps
from preflight_node.capabilities import ssh_trust as node_st
from fake_ops import FakeOps
from capability_helpers import write
from ssh_trust_helpers import (DROPIN, KEYS, KH, NO_LISTENER, NO_SSHD, assert_contract, cluster,
                               decide_all, facts, fake_key, fp, in_sync, node, probe_result, settings,
                               synced_block)


# ----------------------------------------------------------------------------
# validate


def test_defaults_validate_and_are_mirrored_in_python():
    assert st.validate(settings()) == []
    defaults = settings()
    for name, value in ssh_trust_settings.DEFAULTS.items():
        assert defaults[name] == value, name


def alone(name, *values):
    """A bad-input case per value: ``name`` set to it alone, the one problem naming ``name``."""
    return [({name: value}, name) for value in values]


BAD = [
    *alone("ssh_trust_port", 70000, 0, "22"),
    *alone("ssh_trust_mesh_timeout", 0),
    *alone("ssh_trust_mesh_connect_timeout", -1),
    ({"ssh_trust_mesh_connect_timeout": 20, "ssh_trust_mesh_timeout": 20}, "ssh_trust_mesh_connect_timeout"),
    *alone("ssh_trust_mesh_parallel", 0),
    *alone("ssh_trust_task_timeout", 0),
    *alone("ssh_trust_cluster_key_name", "../id_rsa", "..", "my key"),
    *alone("ssh_trust_cluster_key_comment", "two words"),
    *alone("ssh_trust_ssh_config_dropin", "/etc/ssh/ssh_config", "/etc/ssh/ssh_config.d/cluster"),
    ({"ssh_trust_cluster_key": True, "ssh_trust_cluster_key_users": []}, "ssh_trust_cluster_key_users"),
    *alone("ssh_trust_cluster_key_users", ["root", "bad user"]),
    *alone("ssh_trust_mesh_user", "-oProxyCommand=x"),
    # Policies and paths: one bad value each.
    *[case for name, value in (("ssh_trust_drift_policy", "ignore"), ("ssh_trust_unknown_key_policy", "pass"),
                               ("ssh_trust_login_policy", "{{ 'fail' }}"), ("ssh_trust_pdsh", "always"),
                               ("ssh_trust_sshd_config", "sshd_config"),
                               ("ssh_trust_known_hosts_file", "known_hosts")) for case in alone(name, value)],
    *alone("ssh_trust_host_key_files", ["ssh_host_ed25519_key"]),
    *alone("ssh_trust_extra_names", ["gpu01 gpu02"]),
]


@pytest.mark.parametrize("overrides,name", BAD)
def test_validate_names_each_bad_input_with_found_expected_fix(overrides, name):
    problems = st.validate(settings(**overrides))
    assert [p["name"] for p in problems] == [name]
    [problem] = problems
    assert set(problem) == {"name", "found", "expected", "fix"} and all(problem.values())
    assert name in problem["found"]


def test_validate_accepts_a_good_override_set():
    good = settings(ssh_trust_port=2222, ssh_trust_mesh_connect_timeout=3, ssh_trust_mesh_timeout=10,
                    ssh_trust_cluster_key=True, ssh_trust_cluster_key_users=["root", "svc.train"],
                    ssh_trust_mesh_user="svc.train", ssh_trust_extra_names=["gpu01-ib0", "198.18.10.1"],
                    ssh_trust_host_key_files=["/srv/sshd/ssh_host_ed25519_key"], ssh_trust_login_policy="fail")
    assert st.validate(good) == []


# ----------------------------------------------------------------------------
# read on sandbox roots


def args_for(root, **overrides):
    args = st.read_args(settings(**overrides), node("node1", 1))
    args["root"] = str(root)
    return args


def test_read_without_sshd_or_any_ssh_file_is_facts_not_an_exception(tmp_path):
    ops = FakeOps()
    result = node_st.read(args_for(tmp_path), ops)
    assert result["keys"] == [] and result["problems"] == [NO_SSHD]
    assert result["sshd_config"] == {"path": "/etc/ssh/sshd_config", "exists": False}
    assert result["sshd"]["source"] == "default" and result["sshd"]["discovery"] == NO_LISTENER
    assert result["known_hosts"] == {"path": KH, "exists": False, "present": False, "block": [], "error": None}
    assert result["client"]["ssh_config_exists"] is False and result["client"]["dropin_included"] is False
    assert result["cluster_key"] is None and ops.calls == []
    # The embedded default inventory is this one node: not applicable, whatever the node lacks.
    checks = st.decide("localhost", result, settings(), None, None)
    assert list(checks) == ["peers"] and checks["peers"]["status"] == "not_applicable"
    assert "only targeted node" in checks["peers"]["found"] and NO_SSHD in checks["peers"]["found"]
    view = {"hosts": ["localhost"], "all_hosts": ["localhost"], "nodes": {"localhost": node("localhost", 1)},
            "facts": {"localhost": result}, "settings": {"localhost": settings()}, "probes": {"localhost": None}}
    assert st.decide("localhost", result, settings(), None, view) == checks
    assert st.probe_args(settings(), node("localhost", 1), {"hosts": ["localhost"], "nodes": view["nodes"]}) is None


def test_read_host_keys_block_client_and_cluster_key(tmp_path):
    ed, ecdsa = fake_key("host-ed"), fake_key("host-ecdsa", "ecdsa-sha2-nistp256")
    write(tmp_path, "/srv/sshd/sshd_config", "HostKey /srv/sshd/ed_key\nHostKey /srv/sshd/ecdsa_key\n"
                                             "HostKey /srv/sshd/rsa_key\n")
    write(tmp_path, "/srv/sshd/ed_key.pub", ed + " root@node1\n")
    write(tmp_path, "/srv/sshd/ecdsa_key", "-----BEGIN OPENSSH PRIVATE KEY-----\nSECRETBODY\n", 0o600)
    begin, end = ps.markers()
    write(tmp_path, KH, "gw.example.org %s\n%s\nnode2,198.19.0.2 %s node=node2\n%s\n" % (KEYS["stranger"], begin,
                                                                                       KEYS["node2"], end))
    write(tmp_path, "/etc/ssh/ssh_config", "Include /etc/ssh/ssh_config.d/*.conf\nHost *\n    SendEnv LANG\n")
    write(tmp_path, DROPIN, "# old drop-in\n")
    cluster_pub, peer_pub = fake_key("cluster"), fake_key("cluster-node2")
    write(tmp_path, "/home/train/.ssh/id_ed25519_cluster", "-----BEGIN OPENSSH PRIVATE KEY-----\nCLUSTERSECRET\n",
          0o600)
    write(tmp_path, "/home/train/.ssh/id_ed25519_cluster.pub", cluster_pub + " preflight-ssh-trust-cluster-key\n")
    write(tmp_path, "/home/train/.ssh/authorized_keys", 'ssh-rsa AAAA other\nfrom="198.19.0.1,198.19.0.2" %s '
                                                        'node=node2 preflight-ssh-trust-cluster-key\n' % peer_pub)
    ops = FakeOps(programs={"ssh-keygen": "/usr/bin/ssh-keygen", "getent": "/usr/bin/getent"},
                  commands={("/usr/bin/ssh-keygen", "-y"): (0, ecdsa + "\n", ""),
                            ("/usr/bin/getent", "passwd", "train"): (0, "train:x:1000:1000::/home/train:/bin/sh\n",
                                                                     ""),
                            ("/usr/bin/getent", "passwd", "ghost"): (2, "", "")})
    args = args_for(tmp_path, ssh_trust_sshd_config="/srv/sshd/sshd_config", ssh_trust_cluster_key=True,
                    ssh_trust_cluster_key_users=["train", "ghost"])
    result = node_st.read(args, ops)
    assert [k["public_key"] for k in result["keys"]] == [ed, ecdsa]
    assert result["keys"][1]["path"] == "/srv/sshd/ecdsa_key (public half derived with ssh-keygen -y)"
    assert result["problems"] == ["/srv/sshd/rsa_key: no such host key (neither it nor /srv/sshd/rsa_key.pub exists)"]
    assert ops.calls[0][:3] == ["/usr/bin/ssh-keygen", "-y", "-f"]
    assert result["known_hosts"]["present"] and result["known_hosts"]["block"] == [
        "node2,198.19.0.2 %s node=node2" % KEYS["node2"]]
    assert result["client"]["dropin_included"] is True and result["client"]["dropin_text"] == "# old drop-in\n"
    users = result["cluster_key"]["users"]
    assert users["ghost"] == {"exists": False, "problem": "no user ghost"}
    train = users["train"]
    assert train["private"] is True and train["private_mode"] == 0o600 and train["fingerprint"] == fp(cluster_pub)
    assert train["path"] == "/home/train/.ssh/id_ed25519_cluster" and train["uid"] == 1000
    assert train["ssh"]["ssh_dir_state"]["kind"] == "dir" and train["problem"] == ""
    assert train["authorized"] == [{"options": 'from="198.19.0.1,198.19.0.2"', "type": "ssh-ed25519",
                                    "public_key": peer_pub, "fingerprint": fp(peer_pub),
                                    "comment": "node=node2 preflight-ssh-trust-cluster-key", "node": "node2"}]
    # Private key material is never read.
    assert "SECRETBODY" not in str(result) and "CLUSTERSECRET" not in str(result)


def test_read_records_broken_markers_and_an_unreadable_key_file(tmp_path):
    begin, _end = ps.markers()
    write(tmp_path, KH, begin + "\nnode2 %s node=node2\n" % KEYS["node2"])
    write(tmp_path, "/etc/ssh/sshd_config", "HostKey /etc/ssh/ssh_host_ed25519_key\n")
    os.makedirs(os.path.join(str(tmp_path), "etc/ssh/ssh_host_ed25519_key.pub"))  # a directory: cannot be read
    result = node_st.read(args_for(tmp_path), FakeOps())
    assert "markers are broken" in result["known_hosts"]["error"]
    assert result["keys"] == [] and "cannot be read" in result["problems"][0]


# ----------------------------------------------------------------------------
# plan and decide


def test_in_sync_cluster_passes_everything_and_plan_has_the_shape_the_role_expects():
    view = in_sync()
    plan = st.plan(view)
    assert [e["node"] for e in plan["entries"]] == ["node1", "node2", "node3"]
    assert plan["entries"][0] == {"node": "node1", "names": ["node1", "198.19.0.1", "198.18.0.1"],
                                  "keys": [KEYS["node1"]], "port": 22}
    assert plan["keep_nodes"] == ["node1", "node2", "node3"]
    assert plan["peers"] == {"node%d" % i: {"targets": ["198.19.0.%d" % i, "node%d" % i], "port": 22} for i in (1, 2, 3)}
    assert plan["dropin"]["node1"] == {"state": "absent", "content": ""}
    assert plan["cluster_key"]["enabled"] is False
    assert plan["changed_keys"] == [] and plan["unreadable"] == {} and plan["unread"] == []
    for host, checks in decide_all(view).items():
        assert_contract(host, checks)
        statuses = {name: c["status"] for name, c in checks.items()}
        assert statuses == {"host_keys": "pass", "host_keys_served": "skipped", "names": "pass", "hostname": "pass",
                            "known_hosts": "pass", "host_key_unchanged": "pass", "ssh_dirs": "skipped",
                            "cluster_key": "skipped", "client_dropin": "pass", "inbound": "skipped",
                            "client_config": "skipped", "mesh": "skipped", "login": "skipped",
                            "pdsh": "skipped"}, host
        assert "sshd listening on port 22 (pid 812" in checks["host_keys"]["found"]


def test_multi_node_missing_sshd_config_names_that_node_and_blames_no_peer():
    # node2 has no sshd configuration; node1 and node3 hold each other's keys (bring-up ran).
    base = cluster({"node1": facts("node1", [KEYS["node1"]]), "node2": facts("node2"),
                    "node3": facts("node3", [KEYS["node3"]])})
    block = synced_block(base)
    assert "node2" not in "".join(block)
    refused = "ssh: connect to host %s port 22: Connection refused\n"
    probes = {src: probe_result(src, {dst: (255, refused % dst) if dst == "node2" else (0, "")
                                      for dst in ("node1", "node2", "node3") if dst != src})
              for src in ("node1", "node3")}
    probes["node2"] = probe_result("node2", {"node1": (0, ""), "node3": (0, "")})
    view = cluster({"node1": facts("node1", [KEYS["node1"]], block=block), "node2": facts("node2", block=block),
                    "node3": facts("node3", [KEYS["node3"]], block=block)}, probes=probes)
    assert st.plan(view)["unreadable"] == {"node2": NO_SSHD}
    results = decide_all(view)
    for host, checks in results.items():
        assert_contract(host, checks)
    bad = results["node2"]["host_keys"]
    assert bad["status"] == "fail" and "node2" in bad["found"] and NO_SSHD in bad["found"]
    assert "ssh_trust_sshd_config" in bad["fix"] and "ssh_trust_host_key_files" in bad["fix"]
    assert results["node2"]["host_key_unchanged"]["status"] == "skipped"
    assert results["node2"]["inbound"]["status"] == "warn"  # login_policy: warn without the cluster key
    assert "no peer could log in to node2" in results["node2"]["inbound"]["found"]
    for peer in ("node1", "node3"):
        checks = results[peer]
        assert pc.node_status(checks) != "fail", (peer, checks)
        assert checks["known_hosts"]["status"] == "pass" and checks["host_keys"]["status"] == "pass"
        assert checks["login"]["status"] == "warn" and "collateral" in checks["login"]["found"]
        assert "node2's host keys could not be read" in checks["login"]["found"]
    # With failing policies the peers are still not failed for node2's problem.
    strict = dict(view, settings={h: settings(ssh_trust_login_policy="fail", ssh_trust_unknown_key_policy="fail",
                                              ssh_trust_drift_policy="fail") for h in view["hosts"]})
    for peer in ("node1", "node3"):
        assert pc.node_status(st.decide(peer, view["facts"][peer], strict["settings"][peer], probes[peer],
                                        strict)) == "warn"
    assert st.decide("node2", view["facts"]["node2"], strict["settings"]["node2"], probes["node2"],
                     strict)["inbound"]["status"] == "fail"


def test_changed_host_key_fails_that_node_with_both_fingerprints_and_is_never_replaced():
    old = in_sync()
    block = old["facts"]["node1"]["known_hosts"]["block"]
    # node2 was reinstalled: it presents a new key, every block still holds the old one.
    changed = dict(old["facts"], node2=facts("node2", [KEYS["node2new"]], block=block))
    view = cluster(changed)
    plan = st.plan(view)
    [change] = plan["changed_keys"]
    assert change["node"] == "node2" and change["seen_on"] == ["node1", "node2", "node3"]
    assert change["old_fingerprint"] == fp(KEYS["node2"]) and change["new_fingerprint"] == fp(KEYS["node2new"])
    assert change["accepted"] is False
    results = decide_all(view)
    result = results["node2"]["host_key_unchanged"]
    assert result["status"] == "fail" and "node2's host key changed" in result["found"]
    assert fp(KEYS["node2"]) in result["found"] and fp(KEYS["node2new"]) in result["found"]
    assert "-e ssh_trust_accept_changed=node2" in result["fix"] and "ssh-keygen -R node2 -f %s" % KH in result["fix"]
    for peer in ("node1", "node3"):
        assert results[peer]["host_key_unchanged"]["status"] == "pass"
        known = results[peer]["known_hosts"]
        assert known["status"] == "pass" and "old lines of node2 kept" in known["found"]
    # The writer, given the plan, keeps the old key.
    kept = known_hosts_plan.plan_block(block_text(block), plan["entries"], plan["keep_nodes"])
    assert kept["block"] == block

    # Accepted: node2 passes, every block is now drift until bring-up writes the new key.
    accepted = cluster(changed, ssh_trust_accept_changed=["node2"])
    results = decide_all(accepted)
    assert results["node2"]["host_key_unchanged"]["status"] == "pass"
    assert "accepted" in results["node2"]["host_key_unchanged"]["found"]
    assert results["node1"]["known_hosts"]["status"] == "warn"
    written = known_hosts_plan.plan_block(block_text(block), st.plan(accepted)["entries"], st.plan(accepted)["keep_nodes"],
                            ["node2"])["block"]
    assert any(KEYS["node2new"] in line for line in written) and not any(KEYS["node2"] in line for line in written)


def block_text(block):
    begin, end = ps.markers()
    return "%s\n%s%s\n" % (begin, "".join(line + "\n" for line in block), end)


DRIFT = [
    # (what node1's block lacks or adds, drift_policy, expected status, words in found)
    ("lacks node3", "warn", "warn", ["lacks the current key for node3 (node3, 198.19.0.3, 198.18.0.3)"]),
    ("lacks node3", "fail", "fail", ["lacks the current key for node3"]),
    ("lists node9", "warn", "warn", ["still lists nodes no longer in the inventory: node9"]),
    ("empty", "warn", "warn", ["lacks the current key for node1", "node2", "node3"]),
]


@pytest.mark.parametrize("drift,policy,status,words", DRIFT)
def test_known_hosts_drift_follows_the_policy_and_names_what_is_missing(drift, policy, status, words):
    view = in_sync(ssh_trust_drift_policy=policy)
    block = list(view["facts"]["node1"]["known_hosts"]["block"])
    if drift == "lacks node3":
        block = [line for line in block if "node=node3" not in line]
    elif drift == "lists node9":
        block.append("node9,198.19.0.9 %s node=node9" % KEYS["stranger"])
    else:
        block = None
    view["facts"]["node1"] = facts("node1", [KEYS["node1"]], block=block)
    checks = st.decide("node1", view["facts"]["node1"], view["settings"]["node1"], None, view)
    result = checks["known_hosts"]
    assert result["status"] == status and "node1" in result["found"]
    for word in words:
        assert word in result["found"]
    assert "bringup.yml" in result["fix"]
    # A node outside this run (--limit) keeps its lines: not drift.
    limited = cluster({n: view["facts"][n] for n in ("node1", "node2")}, all_hosts=["node1", "node2", "node3"],
                      ssh_trust_drift_policy=policy)
    synced = in_sync()["facts"]["node1"]["known_hosts"]["block"]
    limited["facts"]["node1"] = facts("node1", [KEYS["node1"]], block=synced)
    assert st.decide("node1", limited["facts"]["node1"], limited["settings"]["node1"], None,
                     limited)["known_hosts"]["status"] == "pass"


def test_broken_markers_fail_the_node_that_holds_them():
    view = in_sync()
    view["facts"]["node3"] = facts("node3", [KEYS["node3"]], known_error="the managed block markers are broken")
    result = st.decide("node3", view["facts"]["node3"], view["settings"]["node3"], None, view)["known_hosts"]
    assert result["status"] == "fail" and "node3" in result["found"] and "BEGIN" in result["fix"]


def test_the_writer_and_the_audit_agree(run_module, tmp_path):
    """Bring-up writes the plan's entries with known_hosts_block; read + decide then pass."""
    view = cluster({n: facts(n, [KEYS[n]]) for n in ("node1", "node2")})
    plan = st.plan(view)
    root = tmp_path / "node1"
    write(root, KH, "# operator's line\ngw.example.org %s\n" % KEYS["stranger"])
    args = {"root": str(root), "entries": plan["entries"], "keep_nodes": plan["keep_nodes"]}
    result, failed = run_module(known_hosts_block, args, check_mode=True)
    assert not failed and result["changed"] and result["checks"]["ssh_known_hosts"]["status"] == "fail"
    before = node_st.read(args_for(root), FakeOps())
    drift = st.decide("node1", dict(view["facts"]["node1"], known_hosts=before["known_hosts"]),
                      view["settings"]["node1"], None, view)["known_hosts"]
    assert drift["status"] == "warn"
    result, failed = run_module(known_hosts_block, args)
    assert not failed and result["changed"]
    after = node_st.read(args_for(root), FakeOps())
    view["facts"]["node1"] = dict(view["facts"]["node1"], known_hosts=after["known_hosts"])
    view = dict(view, facts=dict(view["facts"]))
    assert st.decide("node1", view["facts"]["node1"], view["settings"]["node1"], None,
                     view)["known_hosts"]["status"] == "pass"
    result, _ = run_module(known_hosts_block, args)
    assert result["changed"] is False


def test_known_hosts_names_come_only_from_the_inventory_and_a_reported_hostname_is_a_warning():
    # node2 calls itself node1 (another node's inventory name); node3 and node4 both call themselves
    # ubuntu; node1's FQDN is not in the inventory.
    view = cluster({"node1": dict(facts("node1", [KEYS["node1"]]), fqdn="node1.cluster.test"),
                    "node2": facts("node2", [KEYS["node2"]], hostname="node1"),
                    "node3": facts("node3", [KEYS["node3"]], hostname="ubuntu"),
                    "node4": facts("node4", [fake_key("node4")], hostname="ubuntu")})
    plan = st.plan(view)
    names = {e["node"]: e["names"] for e in plan["entries"]}
    assert names == {"node%d" % i: ["node%d" % i, "198.19.0.%d" % i, "198.18.0.%d" % i] for i in (1, 2, 3, 4)}
    assert "ubuntu" not in plan["names"] and "node1.cluster.test" not in plan["names"]
    block = known_hosts_plan.plan_block("", plan["entries"])["block"]
    assert [line for line in block if "node1" in line.split()[0].split(",")] == [
        "node1,198.19.0.1,198.18.0.1 %s node=node1" % KEYS["node1"]]
    results = decide_all(view)
    for host, checks in results.items():
        assert_contract(host, checks)
        assert checks["names"]["status"] == "pass", (host, checks["names"])
    spoof = results["node2"]["hostname"]
    assert spoof["status"] == "warn" and "node2 calls itself hostname node1" in spoof["found"]
    assert "(the inventory name of node1)" in spoof["found"] and "never trusted" in spoof["found"]
    assert "ssh_trust_extra_names for node2" in spoof["fix"] and "hostnamectl set-hostname node2" in spoof["fix"]
    assert "FQDN node1.cluster.test" in results["node1"]["hostname"]["found"]
    assert results["node1"]["hostname"]["status"] == "warn"
    for host in ("node3", "node4"):
        assert results[host]["hostname"]["status"] == "warn" and "ubuntu" in results[host]["hostname"]["found"]
    # The operator says the FQDN is node1's: then it is trusted and the warning goes.
    view = cluster(view["facts"], node_settings={"node1": {"ssh_trust_extra_names": ["node1.cluster.test"]}})
    assert "node1.cluster.test" in {e["node"]: e["names"] for e in st.plan(view)["entries"]}["node1"]
    assert st.decide("node1", view["facts"]["node1"], view["settings"]["node1"], None,
                     view)["hostname"]["status"] == "pass"


def test_a_duplicate_name_is_a_finding_on_exactly_the_two_nodes_that_share_it():
    view = cluster({n: facts(n, [KEYS[n]]) for n in ("node1", "node2", "node3")})
    # node2 and node3 were given the same ansible_host by mistake.
    view["nodes"]["node3"] = dict(view["nodes"]["node3"], ansible_host="198.18.0.2")
    plan = st.plan(view)  # no exception: the other nodes are planned as usual
    names = {e["node"]: e["names"] for e in plan["entries"]}
    assert names == {"node1": ["node1", "198.19.0.1", "198.18.0.1"], "node2": ["node2", "198.19.0.2"],
                     "node3": ["node3", "198.19.0.3"]}
    assert sorted(plan["duplicate_names"]) == ["node2", "node3"]
    results = decide_all(view)
    for host in ("node2", "node3"):
        finding = results[host]["names"]
        assert finding["status"] == "fail", finding
        assert "198.18.0.2 is a name of both" in finding["found"] and "node2" in finding["found"]
        assert "node3" in finding["found"] and "ansible_host" in finding["found"]
        assert finding["details"]["nodes"] == ["node2", "node3"]
        assert "ansible_host" in finding["fix"] and "node2 or node3" in finding["fix"]
        assert_contract(host, results[host])
    # node1 is not involved: no finding about the duplicate (its known_hosts is merely not written yet).
    assert results["node1"]["names"]["status"] == "pass" and pc.node_status(results["node1"]) != "fail"
    assert not [c for c in results["node1"].values() if "198.18.0.2" in c["found"]]
    assert "198.18.0.2" not in "".join(known_hosts_plan.plan_block("", plan["entries"])["block"])

    # A node listing another node's inventory name: the owner keeps its name, both are told.
    view = cluster({n: facts(n, [KEYS[n]]) for n in ("node1", "node2", "node3")},
                   node_settings={"node1": {"ssh_trust_extra_names": ["node2"]}})
    names = {e["node"]: e["names"] for e in st.plan(view)["entries"]}
    assert names["node2"][0] == "node2" and "node2" not in names["node1"]
    results = decide_all(view)
    assert results["node1"]["names"]["status"] == results["node2"]["names"]["status"] == "fail"
    assert "ssh_trust_extra_names" in results["node1"]["names"]["found"]
    assert "node2 (inventory name)" in results["node1"]["names"]["found"]
    assert results["node3"]["names"]["status"] == "pass"

    # The same address on different ssh ports (a NAT gateway) is two names in known_hosts: no finding.
    view = cluster({n: facts(n, [KEYS[n]]) for n in ("node1", "node2")},
                   node_settings={"node2": {"ssh_trust_port": 2222}})
    view["nodes"]["node2"] = dict(view["nodes"]["node2"], ansible_host="198.18.0.1")
    results = decide_all(view)
    assert results["node1"]["names"]["status"] == results["node2"]["names"]["status"] == "pass"


def test_plan_port_extra_names_and_localhost_names():
    view = cluster({"node1": facts("node1", [KEYS["node1"]], hostname="localhost"),
                    "node2": facts("node2", [KEYS["node2"]])},
                   node_settings={"node2": {"ssh_trust_port": 2222, "ssh_trust_extra_names": ["node2-ib0"]}})
    plan = st.plan(view)
    entries = {e["node"]: e for e in plan["entries"]}
    assert "localhost" not in entries["node1"]["names"]
    assert entries["node2"]["port"] == 2222 and "node2-ib0" in entries["node2"]["names"]
    assert plan["peers"]["node2"] == {"targets": ["198.19.0.2", "node2"], "port": 2222}
    block = known_hosts_plan.plan_block("", plan["entries"])["block"]
    assert "[node2]:2222,[198.19.0.2]:2222,[198.18.0.2]:2222,[node2-ib0]:2222 %s node=node2" % KEYS["node2"] in block


def test_client_dropin_plan_and_decide():
    on = {"ssh_trust_cluster_key": True}
    view = in_sync(**on)
    plan = st.plan(view)
    content = plan["dropin"]["node1"]["content"]
    assert plan["dropin"]["node1"]["state"] == "present"
    assert content == ssh_trust_plan.render_dropin(plan["names"], True, "id_ed25519_cluster", False)
    assert "Host node1 198.19.0.1 198.18.0.1 node2 198.19.0.2 198.18.0.2 node3" in content
    assert "IdentityFile ~/.ssh/id_ed25519_cluster" in content and "Host *" not in content
    cases = [(dict(dropin_text=content), "pass", ""),
             (dict(dropin_text=None), "warn", "missing"),
             (dict(dropin_text="# hand edited\n"), "warn", "out of date"),
             (dict(dropin_text=None, included=False), "warn", "does not include ssh_config.d")]
    for kwargs, status, words in cases:
        block = view["facts"]["node1"]["known_hosts"]["block"]
        changed = dict(view["facts"], node1=facts("node1", [KEYS["node1"]], block=block, **kwargs))
        view2 = cluster(changed, **on)
        result = st.decide("node1", changed["node1"], view2["settings"]["node1"], None, view2)["client_dropin"]
        assert result["status"] == status and words in result["found"] and "node1" in result["found"], kwargs
    assert st.plan(cluster({"node1": facts("node1", [KEYS["node1"]], included=False),
                            "node2": facts("node2", [KEYS["node2"]])}, **on))["dropin"]["node1"] == {
        "state": "unsupported", "content": ""}
    # Nothing needs it: a leftover file is drift.
    off = in_sync()
    off["facts"]["node1"] = facts("node1", [KEYS["node1"]], block=off["facts"]["node1"]["known_hosts"]["block"],
                                  dropin_text=content)
    result = st.decide("node1", off["facts"]["node1"], off["settings"]["node1"], None, off)["client_dropin"]
    assert result["status"] == "warn" and "though nothing needs it" in result["found"]
