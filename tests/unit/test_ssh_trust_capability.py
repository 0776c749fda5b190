"""The ssh_trust capability (module_utils/preflight_node/ssh_trust.py): validate, read on sandbox roots
with FakeOps, plan and decide from tables of node facts, probe with FakeOps (ssh rc/stderr
classifications), and the writer (known_hosts_block) agreeing with the audit because both use
the same plan and the same block functions."""

import base64
import hashlib
import os
import struct

import pytest

import known_hosts_block
from preflight_node import checks as pc
from cluster_preflight.capabilities import ssh_trust as st
from cluster_preflight.capabilities import ssh_trust_plan, ssh_trust_settings
from preflight_node import known_hosts_plan, ssh as ps
from preflight_node import ssh_checks
from preflight_node import ssh_trust as node_st
from preflight_node import ssh_trust_probe
from fake_ops import FakeOps
from capability_helpers import assert_contract as check_contract, role_path, role_yaml, write

ROLE = role_path("ssh_trust")
KH = "/etc/ssh/ssh_known_hosts"
DROPIN = "/etc/ssh/ssh_config.d/60-preflight-cluster.conf"
NO_LISTENER = "no process listens on TCP port 22 (/proc/net/tcp, /proc/net/tcp6)"
NO_SSHD = ("sshd configuration /etc/ssh/sshd_config does not exist (no openssh-server, or sshd runs with another -f) "
           "and " + NO_LISTENER)
LISTENER = {"source": "listener", "config": "/etc/ssh/sshd_config", "how": "sshd -T", "port": 22, "pid": 812,
            "argv": ["/usr/sbin/sshd", "-D"], "discovery": ""}


def load_yaml(*parts):
    return role_yaml("ssh_trust", *parts)


def settings(**overrides):
    """The role's defaults, typed, with ``overrides``: what preflight_settings hands the capability."""
    values = {k: v for k, v in load_yaml("defaults", "main.yml").items() if not isinstance(v, str) or "{{" not in v}
    values["ssh_trust_login_policy"] = "fail" if overrides.get("ssh_trust_cluster_key") else "warn"
    values.update(overrides)
    return values


def fake_key(seed, key_type="ssh-ed25519"):
    """A well-formed public key (``TYPE BASE64``); no ssh-keygen needed."""
    raw = (struct.pack(">I", len(key_type)) + key_type.encode() + struct.pack(">I", 32)
           + hashlib.sha256(seed.encode()).digest())
    return "%s %s" % (key_type, base64.b64encode(raw).decode())


def fp(key):
    return ps.fingerprint(key.split()[1])


def node(name, index):
    return {"name": name, "ansible_host": "198.18.0.%d" % index, "node_addr": "198.19.0.%d" % index, "user": "root",
            "ssh_port": 22}


def facts(name, keys=(), block=None, problems=None, hostname=None, dropin_text=None, included=True,
          cluster_key=None, known_error=None):
    hostname = hostname or name
    return {
        "hostname": hostname, "fqdn": hostname, "short_name": hostname.split(".")[0],
        "sshd": dict(LISTENER),
        "sshd_config": {"path": "/etc/ssh/sshd_config", "exists": bool(keys)},
        "host_key_files": ["/etc/ssh/ssh_host_ed25519_key"] if keys else [],
        "keys": [{"type": k.split()[0], "public_key": k, "fingerprint": fp(k),
                  "path": "/etc/ssh/ssh_host_ed25519_key.pub"} for k in keys],
        "problems": list(problems) if problems is not None else ([] if keys else [NO_SSHD]),
        "known_hosts": {"path": KH, "exists": block is not None, "present": bool(block), "block": list(block or []),
                        "error": known_error},
        "client": {"ssh_config": "/etc/ssh/ssh_config", "ssh_config_exists": True,
                   "includes": ["/etc/ssh/ssh_config.d/*.conf"] if included else [], "dropin": DROPIN,
                   "dropin_included": included, "dropin_text": dropin_text, "problem": None},
        "cluster_key": cluster_key,
    }


KEYS = {name: fake_key(name) for name in ("node1", "node2", "node3", "node2new", "stranger")}


def cluster(node_facts, probes=None, all_hosts=None, node_settings=None, **common):
    """The view decide() gets: the hosts of ``node_facts`` targeted, each with ``common`` settings."""
    hosts = sorted(node_facts)
    all_hosts = all_hosts or hosts
    return {"hosts": hosts, "all_hosts": all_hosts,
            "nodes": {h: node(h, all_hosts.index(h) + 1) for h in all_hosts},
            "facts": dict(node_facts),
            "settings": {h: settings(**dict(common, **(node_settings or {}).get(h, {}))) for h in hosts},
            "probes": dict(probes or {})}


def decide_all(view):
    return {h: st.decide(h, view["facts"][h], view["settings"][h], view["probes"].get(h), view)
            for h in view["hosts"]}


def synced_block(view):
    """The block every node holds after bring-up: the plan's entries through the writer's function."""
    plan = st.plan(view)
    return known_hosts_plan.plan_block("", plan["entries"], plan["keep_nodes"])["block"]


def in_sync(names=("node1", "node2", "node3"), **common):
    """A cluster after bring-up: every node's block holds every node's current key."""
    first = cluster({n: facts(n, [KEYS[n]]) for n in names}, **common)
    block = synced_block(first)
    return cluster({n: facts(n, [KEYS[n]], block=block) for n in names}, **common)


def assert_contract(host, checks):
    """Names within the contract, every warn/fail with a fix and naming the node it is about."""
    return check_contract(st.CAPABILITY, checks, host)


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


def ssh_state(home="/root", home_mode=0o700, ssh_mode=0o700, uid=0, ssh_kind="dir"):
    return {"home": home, "home_state": {"exists": True, "kind": "dir", "mode": home_mode, "uid": uid},
            "ssh_dir": home + "/.ssh", "ssh_dir_state": {"exists": True, "kind": ssh_kind, "mode": ssh_mode, "uid": uid,
                                                         "target": "/srv/shared/.ssh"},
            "authorized_keys_state": {"exists": True, "kind": "file", "mode": 0o600, "uid": uid}}


USERS = {"root": (0, "/root"), "train": (1000, "/home/train")}


def key_state(user="root", pub=None, authorized=(), private=True, exists=True, options="", mode=0o600, ssh=None):
    """One user's cluster key facts; ``authorized`` is [(node, public key)]."""
    if not exists:
        return {"exists": False, "problem": "no user %s" % user}
    uid, home = USERS[user]
    return {"exists": True, "uid": uid, "gid": uid, "home": home, "path": home + "/.ssh/id_ed25519_cluster",
            "ssh": ssh or ssh_state(home, uid=uid), "private": private, "private_mode": mode if private else None,
            "private_uid": uid if private else None, "public_key": pub or "", "fingerprint": fp(pub) if pub else "",
            "problem": "", "authorized": [
                {"options": options, "type": k.split()[0], "public_key": k, "fingerprint": fp(k),
                 "comment": ("node=%s " % n if n else "") + "preflight-ssh-trust-cluster-key", "node": n}
                for n, k in authorized]}


NODES3 = ("node1", "node2", "node3")
UKEY = {(n, u): fake_key("%s-%s" % (n, u)) for n in NODES3 for u in USERS}


def synced_users(node, users=("root", "train"), **changes):
    """Every user on ``node`` with its own key, authorizing its own keys from every node."""
    return {"users": {u: key_state(u, UKEY[(node, u)], **dict({"authorized": [(n, UKEY[(n, u)]) for n in NODES3]},
                                                               **changes.get(u, {})))
                      for u in users}}


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


def ssh_answers(table):
    """A FakeOps command for ssh: ``table`` maps a target to (rc, stderr); -G answers a safe configuration."""
    def answer(argv):
        if "-G" in argv:
            return 0, ("stricthostkeychecking true\nglobalknownhostsfile /etc/ssh/ssh_known_hosts "
                       "/etc/ssh/ssh_known_hosts2\nuserknownhostsfile ~/.ssh/known_hosts\n"
                       "identityfile ~/.ssh/id_ed25519_cluster\n"), ""
        target = argv[argv.index("--") + 1]
        rc, err = table.get(target, (255, "ssh: Could not resolve hostname %s: Name or service not known\n" % target))
        return rc, "", err
    return answer


def probe_result(source, by_peer, **kwargs):
    """What probe() returns on ``source`` when ssh to each peer (both targets) answers (rc, stderr)."""
    table = {}
    for peer, answer in by_peer.items():
        index = int(peer[-1])
        table["198.19.0.%d" % index] = answer
        table[peer] = answer
    ops = FakeOps(programs={"ssh": "/usr/bin/ssh"}, commands={("/usr/bin/ssh",): ssh_answers(table)})
    hosts = sorted(set(by_peer) | {source})
    view_nodes = {h: node(h, int(h[-1])) for h in hosts}
    args = st.probe_args(settings(**kwargs), view_nodes[source], {"hosts": hosts, "nodes": view_nodes})
    return ssh_trust_probe.probe(args, ops)


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
    assert node1["mesh"]["details"] == {"peers": {"node2": "warn"}}
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
