"""Node-to-node ssh with host-key checking on, through the real playbooks on the namespace test
bed: bringup.yml for the ssh_trust capability alone, preflight.yml with strict ssh_trust policies.

Three nodes with their own /etc, /root and /home (so each has its own ssh_known_hosts, users,
~/.ssh and authorized_keys), a fabric network, real sshd started with -f from the bed's
directory (not /etc/ssh: the keys must be found from the running sshd, no
ssh_trust_sshd_config is given), and a real unprivileged user on every node.  The steps run
in file order on one bed: before bring-up the node-to-node matrix fails (host keys unknown);
bring-up makes it pass, gives root and the user a key pair of their own on every node and a
re-run changes nothing; a node calling itself by another node's name gets no name into any
known_hosts and a user whose ~/.ssh is a symlink is refused without a write through it; a
regenerated host key is named with both fingerprints and is never replaced without
ssh_trust_accept_changed.  Every audit must leave every file of every node as it was, and no
result or log of any run holds a byte of a private key.
"""

import base64
import hashlib
import json
import os
import subprocess

import pytest

import testbed as tb
from playbook import newest_run_dir, run_playbook, task_results

APPLY = "bringup.yml"
AUDIT = "preflight.yml"
PROBES_TASK = "Run the probes that act"
RUN_TIMEOUT = 300
# bringup.yml for this capability only; preflight.yml with the ssh_trust policies strict (the
# defaults are warn) and a small all-reduce (tests/multinode/test_gate_multinode.py covers it).
APPLY_VARS = {"preflight_bringup_capabilities": ["ssh_trust"]}
AUDIT_VARS = {"ssh_trust_drift_policy": "fail", "ssh_trust_unknown_key_policy": "fail",
              "preflight_nproc_per_node": 1, "allreduce_sizes": [65536], "allreduce_iters": 2,
              "allreduce_warmup": 1}
# The unprivileged user every node gets (same uid everywhere, a home of each node's own).
USER, UID = "pfuser", 23456
KEY = "id_ed25519_cluster"
# Every run's directory (runner artifacts, results) and output: the last test greps them all.
RUNS = []

pytestmark = [
    pytest.mark.multinode,
    pytest.mark.skipif(tb.unavailable_reason() is not None,
                       reason=f"test bed unavailable: {tb.unavailable_reason()}"),
]


def _write_plain_shell(bed):
    """Give each node's root a plain ~/.bashrc.  The nodes' /root is an overlay of this
    machine's, whose shell start-up may run tools (pyenv rehash) that wait on locks the
    nodes share; every ssh login into a node would then stall.  Written from inside each
    node, before any login, so the overlay sees it."""
    for node in bed.nodes:
        bed.run(node, ["sh", "-c", 'printf "%s\\n" "$1" > /root/.bashrc && cp /root/.bashrc /root/.profile',
                       "plain-shell", "# test-bed node: a plain shell"], check=True)


def _add_user(bed):
    """A real unprivileged account on every node, created inside the node (its /etc and /home are
    the node's own overlays); ``*`` instead of a locked password so sshd (UsePAM no) lets it in."""
    for node in bed.nodes:
        bed.run(node, ["useradd", "--no-log-init", "--create-home", "--home-dir", f"/home/{USER}", "--uid", str(UID),
                       "--user-group", "--shell", "/bin/sh", USER], check=True)
        bed.run(node, ["usermod", "--password", "*", USER], check=True)


def _as_user(bed, node, argv, timeout=30):
    """argv inside the node as the unprivileged user (its ids, a clean environment, no PAM)."""
    return bed.run(node, ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--init-groups", "--",
                          "env", "-i", f"HOME=/home/{USER}", f"USER={USER}", f"LOGNAME={USER}",
                          "PATH=/usr/bin:/bin"] + list(argv), timeout=timeout)


def _cat(bed, node, path):
    proc = bed.run(node, ["cat", path])
    return proc.stdout if proc.returncode == 0 else None


@pytest.fixture(scope="module")
def bed(request):
    bed = tb.testbed_fixture(request, nodes=3, fabric=True, private_dirs=("/etc", "/root", "/home"))
    _write_plain_shell(bed)
    _add_user(bed)
    return bed


@pytest.fixture(scope="module")
def controller(bed, tmp_path_factory):
    """The controller's own known_hosts copy and an inventory that uses it."""
    work = tmp_path_factory.mktemp("ssh_trust")
    known = work / "known_hosts"
    with open(bed.known_hosts, encoding="ascii") as handle:
        known.write_text(handle.read())
    known.chmod(0o600)
    args = f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes"
    # ansible-runner sets ANSIBLE_HOST_KEY_CHECKING=False unless told otherwise, and Ansible's
    # own -o StrictHostKeyChecking=no would then win over the one above: the host variable
    # keeps the controller's host-key checking on.  ssh_trust_sshd_config is empty (the role's
    # default) over the bed's own inventory value: the sshd runs with -f from the bed's
    # directory, and the keys must be found from the running process.
    host_vars = {node.name: {"ssh_trust_sshd_config": "",
                             "ansible_ssh_common_args": args, "ansible_host_key_checking": True}
                 for node in bed.nodes}
    group_vars = {"ssh_trust_cluster_key": True, "ssh_trust_cluster_key_users": ["root", USER],
                  "ssh_trust_mesh_connect_timeout": 3, "ssh_trust_mesh_timeout": 10}
    inventory = bed.write_inventory(host_vars=host_vars, group_vars=group_vars,
                                    path=str(work / "inventory.yml"))
    return {"inventory": inventory, "known_hosts": known}


def _run(tmp_path, controller, playbook, name, extravars=None, **kwargs):
    directory = tmp_path / name
    directory.mkdir()
    extravars = dict(APPLY_VARS if playbook == APPLY else AUDIT_VARS, **(extravars or {}))
    result = run_playbook(directory, playbook=playbook, inventory=controller["inventory"],
                          timeout=RUN_TIMEOUT, extravars=extravars, **kwargs)
    RUNS.append((str(directory), result.stdout))
    return result


@pytest.fixture(scope="module")
def applied(bed, controller, tmp_path_factory):
    """Bring-up with the cluster key, once for the module."""
    return _run(tmp_path_factory.mktemp("apply"), controller, APPLY, "first")


def _checks(result):
    """{node: {ssh_trust check name: check}} from the run's verdict or bring-up report."""
    verdict = result.verdict
    if verdict is None:
        report = os.path.join(newest_run_dir(result.results_dir), "bringup.json")
        with open(report, encoding="utf-8") as handle:
            verdict = json.load(handle)
    return {host: {name[len("ssh_trust."):]: check for name, check in node["checks"].items()
                   if name.startswith("ssh_trust.")}
            for host, node in verdict["nodes"].items()}


def _mesh_rows(result):
    """{node: the ssh rows of its probe} from the probes task of preflight.yml."""
    return {host: res["probes"]["ssh_trust"]["results"] for host, res in task_results(result, PROBES_TASK).items()
            if "ssh_trust" in res.get("probes", {})}


def _snapshot(bed):
    """sha256 of every regular file and symlink each node wrote under /etc and /root (the
    overlay upper dirs), leaving out Ansible's own remote temp dir."""
    state = {}
    for node in bed.nodes:
        for directory in ("/etc", "/root", "/home"):
            upper = bed.overlay_path(node, directory)
            for base, dirs, files in os.walk(upper):
                dirs[:] = [d for d in dirs if not (base == upper and d == ".ansible")]
                for name in files:
                    path = os.path.join(base, name)
                    if os.path.islink(path):
                        digest = "link:" + os.readlink(path)
                    elif os.path.isfile(path):
                        with open(path, "rb") as handle:
                            digest = hashlib.sha256(handle.read()).hexdigest()
                    else:
                        digest = "special"
                    state[f"{node.name}:{directory}/{os.path.relpath(path, upper)}"] = digest
    return state


def _fingerprint(pub_path):
    proc = subprocess.run(["ssh-keygen", "-lf", pub_path], capture_output=True, text=True,
                          timeout=10, check=True)
    return proc.stdout.split()[1]


def _known_hosts(bed, node):
    path = os.path.join(bed.etc_path(node), "ssh", "ssh_known_hosts")
    with open(path, encoding="utf-8") as handle:
        return handle.read()


@pytest.mark.timeout(350)
def test_before_bringup_the_matrix_fails_and_the_audit_writes_nothing(bed, controller, tmp_path):
    before = _snapshot(bed)
    result = _run(tmp_path, controller, AUDIT, "audit")
    assert _snapshot(bed) == before, "the audit changed a file on a node"
    assert result.rc != 0 and result.verdict["failed_hosts"] == ["pfn1", "pfn2", "pfn3"], result.stdout[-3000:]
    checks = _checks(result)
    rows = _mesh_rows(result)
    assert sorted(checks) == sorted(rows) == ["pfn1", "pfn2", "pfn3"]
    for node in bed.nodes:
        peers = [n for n in bed.nodes if n is not node]
        mine = checks[node.name]
        assert mine["known_hosts"]["status"] == "fail"
        assert "lacks the current key" in mine["known_hosts"]["found"]
        assert mine["cluster_key"]["status"] == "fail"
        # The keys come from the sshd listening on port 22 (its -f), which the peers' ssh-keyscan confirms.
        host_keys = mine["host_keys"]
        assert host_keys["status"] == "pass" and "listening on port 22" in host_keys["found"], host_keys
        assert os.path.join(node.dir, "sshd_config") in host_keys["found"], host_keys
        assert mine["host_keys_served"]["status"] == "pass", mine["host_keys_served"]
        assert mine["hostname"]["status"] == "pass" and mine["names"]["status"] == "pass"
        mesh = mine["mesh"]
        assert mesh["status"] == "fail" and mesh["fix"], mesh
        assert "Host key verification failed" in mesh["found"]
        for peer in peers:
            assert f"does not know {peer.name}'s host key" in mesh["found"]
        assert mesh["details"]["peers"] == {peer.name: "fail" for peer in peers}
        # Login is never reached, and is not reported as the host-key problem.
        assert mine["login"]["status"] == "skipped", mine["login"]
        statuses = {(row["destination"], row["target"]): row["status"] for row in rows[node.name]}
        assert statuses == {(p.name, t): "host_key_unknown" for p in peers for t in (p.node_addr, p.name)}


def _public(bed, node, home):
    text = _cat(bed, node, f"{home}/.ssh/{KEY}.pub")
    return " ".join(text.split()[:2]) if text else None


@pytest.mark.timeout(600)
def test_bringup_makes_the_mesh_pass_with_host_key_checking_and_reruns_unchanged(
        bed, controller, applied, tmp_path):
    assert applied.rc == 0, applied.stdout[-3000:]
    assert sum(applied.stats.get("changed", {}).values()) > 0
    block = _known_hosts(bed, "pfn1")
    with open("/etc/ssh/ssh_host_ed25519_key.pub", encoding="ascii") as handle:
        etc_ssh_blob = handle.read().split()[1]  # what /etc/ssh/sshd_config would have named
    assert etc_ssh_blob not in block
    for node in bed.nodes:
        assert _known_hosts(bed, node) == block
        with open(os.path.join(node.dir, "ssh_host_ed25519_key.pub"), encoding="ascii") as handle:
            blob = handle.read().split()[1]
        line = next(l for l in block.splitlines() if blob in l)
        assert line.split()[0].split(",")[:3] == [node.name, node.node_addr, node.address]
        dropin = os.path.join(bed.etc_path(node), "ssh", "ssh_config.d", "60-preflight-cluster.conf")
        with open(dropin, encoding="utf-8") as handle:
            text = handle.read()
        assert "IdentityFile ~/.ssh/id_ed25519_cluster" in text
        assert "StrictHostKeyChecking" not in text and "Host *" not in text
        for home, uid in (("/root", 0), (f"/home/{USER}", UID)):
            stat = bed.run(node, ["stat", "-c", "%u %a", f"{home}/.ssh/{KEY}", f"{home}/.ssh"], check=True).stdout
            assert stat.split() == [str(uid), "600", str(uid), "700"], (node.name, home, stat)
    assert "PRIVATE KEY" not in applied.stdout

    # Every node and user has a pair of its own; the user's authorized_keys holds exactly its own keys
    # from every node, never root's.
    user_keys = {node.name: _public(bed, node, f"/home/{USER}") for node in bed.nodes}
    root_keys = {node.name: _public(bed, node, "/root") for node in bed.nodes}
    assert len(set(user_keys.values()) | set(root_keys.values())) == 6, (user_keys, root_keys)
    for node in bed.nodes:
        authorized = _cat(bed, node, f"/home/{USER}/.ssh/authorized_keys")
        lines = [l for l in authorized.splitlines() if l.endswith(" preflight-ssh-trust-cluster-key")]
        assert lines == [f"{user_keys[n.name]} node={n.name} preflight-ssh-trust-cluster-key" for n in bed.nodes]
        assert not any(key.split()[1] in authorized for key in root_keys.values()), node.name
    # The user logs in from every node to every other with StrictHostKeyChecking=yes, by name and address.
    for node in bed.nodes:
        for peer in bed.nodes:
            if peer is node:
                continue
            for target in (peer.name, peer.node_addr):
                login = _as_user(bed, node, ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                                             "-o", "ConnectTimeout=5", target, "id", "-un"])
                assert login.returncode == 0 and login.stdout.strip() == USER, (node.name, target, login.stderr)
        # root's key does not open the user's account.
        denied = bed.run(node, ["ssh", "-F", "/dev/null", "-o", "IdentitiesOnly=yes", "-i", f"/root/.ssh/{KEY}",
                                "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                                "-o", "GlobalKnownHostsFile=/etc/ssh/ssh_known_hosts", "-o", "ConnectTimeout=5",
                                f"{USER}@{bed.nodes[(node.index) % 3].name}", "true"], timeout=30)
        assert denied.returncode == 255 and "Permission denied" in denied.stderr, denied

    rerun = _run(tmp_path, controller, APPLY, "rerun")
    assert rerun.rc == 0, rerun.stdout[-3000:]
    assert sum(rerun.stats.get("changed", {}).values()) == 0, rerun.stats

    audit = _run(tmp_path, controller, AUDIT, "audit")
    assert audit.rc == 0 and audit.verdict["status"] == "pass", audit.stdout[-3000:]
    for host, mine in _checks(audit).items():
        bad = {name: c for name, c in mine.items()
               if c["status"] not in ("pass", "not_applicable", "skipped")}
        assert not bad, (host, bad)
        for name in ("mesh", "login", "known_hosts", "host_keys", "host_keys_served", "cluster_key", "ssh_dirs",
                     "names", "hostname"):
            assert mine[name]["status"] == "pass", (host, name, mine[name])
        assert mine["pdsh"]["status"] in ("pass", "not_applicable")
    for host, rows in _mesh_rows(audit).items():
        assert {row["status"] for row in rows} == {"ok"}, (host, rows)


@pytest.mark.timeout(400)
def test_a_spoofed_hostname_gets_no_name_and_a_symlinked_ssh_dir_is_refused(bed, controller, applied, tmp_path):
    """pfn3 calls itself pfn1; pfn2's user replaced ~/.ssh by a link to /root/.ssh (the write
    through it would hand the user root's logins).  One bring-up: neither takes effect."""
    assert applied.rc == 0, applied.stdout[-3000:]
    spoofer, linked = bed.node("pfn3"), bed.node("pfn2")
    with open(os.path.join(spoofer.dir, "ssh_host_ed25519_key.pub"), encoding="ascii") as handle:
        spoofer_blob = handle.read().split()[1]
    root_ssh = bed.run(linked, ["sh", "-c", 'cd /root/.ssh && sha256sum -- * | sort'], check=True).stdout
    bed.run(spoofer, ["hostname", "pfn1"], check=True)
    bed.run(linked, ["mv", f"/home/{USER}/.ssh", f"/home/{USER}/ssh.moved"], check=True)
    bed.run(linked, ["ln", "-s", "/root/.ssh", f"/home/{USER}/.ssh"], check=True)
    try:
        result = _run(tmp_path, controller, APPLY, "spoofed")
    finally:
        bed.run(spoofer, ["hostname", "pfn3"], check=True)
        bed.run(linked, ["rm", f"/home/{USER}/.ssh"], check=True)
        bed.run(linked, ["mv", f"/home/{USER}/ssh.moved", f"/home/{USER}/.ssh"], check=True)
    assert result.rc != 0, result.stdout[-3000:]
    checks = _checks(result)
    # Nothing was written through the link: root's ~/.ssh on pfn2 is as it was.
    assert bed.run(linked, ["sh", "-c", 'cd /root/.ssh && sha256sum -- * | sort'], check=True).stdout == root_ssh
    refused = checks["pfn2"]["ssh_dirs"]
    assert refused["status"] == "fail" and "is a symlink to /root/.ssh" in refused["found"], refused
    assert "pfn2" in refused["found"] and refused["expected"] and "pfn2" in refused["fix"]
    assert "ssh_trust.error" not in checks["pfn2"] and "Traceback" not in json.dumps(checks["pfn2"])
    # The spoofing node is warned about, and its name stays its own everywhere.
    spoof = checks["pfn3"]["hostname"]
    assert spoof["status"] == "warn" and "calls itself hostname pfn1" in spoof["found"], spoof
    assert "the inventory name of pfn1" in spoof["found"]
    for node in bed.nodes:
        for line in _known_hosts(bed, node).splitlines():
            names = line.split()[0].split(",") if line and not line.startswith("#") else []
            if spoofer_blob in line:
                assert "pfn1" not in names and names[0] == "pfn3", (node.name, line)
            elif "pfn1" in names:
                assert line.endswith("node=pfn1"), (node.name, line)
    for node in ("pfn1", "pfn3"):
        assert checks[node]["ssh_dirs"]["status"] == "pass" and checks[node]["names"]["status"] == "pass"
    assert checks["pfn1"]["hostname"]["status"] == "pass"
    verdict_path = os.path.join(newest_run_dir(result.results_dir), "bringup.json")
    with open(verdict_path, encoding="utf-8") as handle:
        report = json.load(handle)
    assert report["failed_hosts"] == ["pfn2"], report["failed_hosts"]


@pytest.mark.timeout(800)
def test_changed_host_key_is_named_and_never_silently_replaced(bed, controller, applied, tmp_path):
    assert applied.rc == 0, applied.stdout[-3000:]
    node = bed.node("pfn2")
    key = os.path.join(node.dir, "ssh_host_ed25519_key")
    old_fp = _fingerprint(key + ".pub")
    bed.run(node, ["sh", "-c", 'rm -f "$1" "$1.pub" && ssh-keygen -q -t ed25519 -N "" -C "$2" -f "$1"',
                   "regen", key, "pfn2-reinstalled"], check=True)
    bed.stop_sshd(node)
    bed.start_sshd(node)
    new_fp = _fingerprint(key + ".pub")
    assert new_fp != old_fp
    probe = bed.ssh(node, "true", timeout=20)
    assert probe.returncode == 255 and "Host key verification failed" in probe.stderr, probe

    # The controller still knows the old key: pfn2 is unreachable for Ansible and named, with
    # ssh's own words; its peers are checked among themselves and not blamed for it.
    before = _snapshot(bed)
    audit = _run(tmp_path, controller, AUDIT, "audit")
    assert _snapshot(bed) == before, "the audit changed a file on a node"
    assert audit.rc != 0
    assert audit.verdict["unreachable_hosts"] == ["pfn2"] and audit.verdict["failed_hosts"] == ["pfn2"]
    reach = audit.verdict["nodes"]["pfn2"]["checks"]["preflight.reachable"]
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in reach["found"], reach
    checks = _checks(audit)
    for host in ("pfn1", "pfn3"):
        found = checks[host]["mesh"]
        other = "pfn3" if host == "pfn1" else "pfn1"
        assert found["status"] == "pass" and other in found["found"] and "pfn2" not in found["found"], found

    # The operator verifies the new key and lets the controller know it; bring-up then
    # reads the new key from pfn2 itself, fails pfn2 and keeps the old key everywhere.
    lines = controller["known_hosts"].read_text().splitlines()
    with open(key + ".pub", encoding="ascii") as handle:
        new_key = " ".join(handle.read().split()[:2])
    controller["known_hosts"].write_text("\n".join(
        (line.split()[0] + " " + new_key) if line.split()[0].split(",")[0] == "pfn2" else line
        for line in lines) + "\n")
    refused = _run(tmp_path, controller, APPLY, "refused")
    assert refused.rc != 0
    unchanged = _checks(refused)["pfn2"]["host_key_unchanged"]
    assert unchanged["status"] == "fail", unchanged
    assert old_fp in unchanged["found"] and new_fp in unchanged["found"]
    assert "ssh_trust_accept_changed=pfn2" in unchanged["fix"]
    for host in ("pfn1", "pfn3"):
        text = _known_hosts(bed, host)
        assert new_key.split()[1] not in text
        assert any(l.startswith("pfn2,") for l in text.splitlines())

    accepted = _run(tmp_path, controller, APPLY, "accepted",
                    extravars={"ssh_trust_accept_changed": "pfn2"})
    assert accepted.rc == 0, accepted.stdout[-3000:]
    for host in ("pfn1", "pfn2", "pfn3"):
        assert new_key.split()[1] in _known_hosts(bed, host)
    audit = _run(tmp_path, controller, AUDIT, "after")
    assert audit.rc == 0, audit.stdout[-3000:]
    for host, mine in _checks(audit).items():
        assert mine["host_key_unchanged"]["status"] == "pass", (host, mine["host_key_unchanged"])
        assert mine["mesh"]["status"] == "pass", (host, mine["mesh"])


def _private_key_material(bed):
    """Per node and user, the strings a leak of its private key would show: each base64 line of
    the key file but the first (which every OpenSSH key shares) and the file as slurp encodes it."""
    material = {}
    for node in bed.nodes:
        for home in ("/root", f"/home/{USER}"):
            text = _cat(bed, node, f"{home}/.ssh/{KEY}")
            assert text and "OPENSSH PRIVATE KEY" in text, (node.name, home)
            lines = [l.strip() for l in text.splitlines() if l.strip() and not l.startswith("-----")]
            whole = base64.b64encode(text.encode("ascii")).decode("ascii")
            material[f"{node.name}:{home}"] = lines[1:] + ["".join(lines), whole[len(whole) // 3:][:60]]
    return material


@pytest.mark.timeout(120)
def test_no_result_or_log_of_any_run_holds_private_key_material(bed, applied):
    assert applied.rc == 0 and len(RUNS) >= 3, RUNS
    material = _private_key_material(bed)
    assert len(material) == 6 and all(len(needles) >= 4 for needles in material.values())
    leaks, scanned = [], 0
    for directory, stdout in RUNS:
        sources = [("stdout of " + directory, stdout.encode("utf-8", "replace"))]
        for base, _dirs, files in os.walk(directory):
            for name in files:
                with open(os.path.join(base, name), "rb") as handle:
                    sources.append((os.path.join(base, name), handle.read()))
        scanned += len(sources)
        for where, data in sources:
            for owner, needles in material.items():
                if any(needle.encode("ascii") in data for needle in needles):
                    leaks.append((owner, where))
    # Every run left its events (runner artifacts) and its report: the grep saw the whole record.
    assert scanned > 10 * len(RUNS), scanned
    assert not leaks, leaks
