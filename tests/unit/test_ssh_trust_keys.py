"""ssh_trust hardening: host keys from the RUNNING sshd (found from a fake /proc, and a real sshd
started with -f), ssh-keyscan confirmation, and each user's own cluster key (module ssh_cluster_key:
generated as the user, public keys only, unsafe ~/.ssh refused, authorized_keys lines per node)."""

import json
import os
import pwd
import shutil
import socket
import subprocess
import time

import pytest

import ssh_cluster_key
from cluster_preflight.capabilities import ssh_trust as st
from preflight_node.ssh import checks as ssh_checks
from preflight_node.ssh import keys_write as ssh_keys_write
from preflight_node.ssh import mesh as psm
from preflight_node.capabilities import ssh_trust as node_st
from preflight_node.ssh import sshd as psd
from capability_helpers import write
from fake_ops import FakeOps, LocalOps
from preflight_node import checks as pc
from ssh_trust_helpers import (KEYS, LISTENER, NODES3, assert_contract, cluster, decide_all, facts, fake_key,
                               fp, in_sync, probe_result, settings, synced_block, synced_users)

COMMENT = "preflight-ssh-trust-cluster-key"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (switches users, starts sshd)")
needs_openssh = pytest.mark.skipif(not (shutil.which("ssh-keygen") and os.path.exists("/usr/sbin/sshd")),
                                   reason="openssh-server not installed")


# ----------------------------------------------------------------------------
# The running sshd, from a fake /proc


def fake_proc(root, port=22, inode="4242", cmdline=None, exe="/usr/sbin/sshd", pid=1):
    """/proc of a node whose pid ``pid`` listens on ``port`` (socket ``inode``), plus noise."""
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    write(root, "/proc/net/tcp", header
          + "   0: 00000000:%04X 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 %s 1 0\n"
          % (port, inode)
          + "   1: 0100007F:0277 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 999 1 0\n"
          + "   2: 0A000001:%04X 0A000002:C350 01 00000000:00000000 00:00000000 00000000     0        0 0 1 0\n"
          % port)
    write(root, "/proc/net/tcp6", header
          + "   0: 00000000000000000000000000000000:%04X 00000000000000000000000000000000:0000 0A 00000000:00000000 "
            "00:00000000 00000000     0        0 %s 1 0\n" % (port, str(int(inode) + 1)))
    os.makedirs(os.path.join(str(root), "proc/%d/fd" % pid))
    os.symlink("/dev/null", os.path.join(str(root), "proc/%d/fd/0" % pid))
    os.symlink("socket:[%s]" % inode, os.path.join(str(root), "proc/%d/fd/3" % pid))
    os.symlink(exe, os.path.join(str(root), "proc/%d/exe" % pid))
    write(root, "/proc/%d/comm" % pid, os.path.basename(exe) + "\n")
    write(root, "/proc/%d/status" % pid, "Name:\t%s\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n" % os.path.basename(exe))
    write(root, "/proc/%d/cmdline" % pid, cmdline if cmdline is not None else
          "sshd: /usr/sbin/sshd -D -f /srv/sshd/sshd_config -h /srv/sshd/extra_key [listener] 0 of 10-100 startups")
    # Another process with sockets of its own, and a kernel thread without descriptors.
    os.makedirs(os.path.join(str(root), "proc/77/fd"))
    os.symlink("socket:[999]", os.path.join(str(root), "proc/77/fd/4"))
    write(root, "/proc/77/cmdline", "cupsd\0-l\0")
    os.makedirs(os.path.join(str(root), "proc/2"))


def test_sshd_command_lines_and_options():
    title = "sshd: /usr/sbin/sshd -D -f /srv/sshd/sshd_config [listener] 0 of 10-100 startups"
    assert psd.sshd_command_line(title) == ["/usr/sbin/sshd", "-D", "-f", "/srv/sshd/sshd_config"]
    assert psd.sshd_command_line("/usr/sbin/sshd\0-D\0-f\0/etc/alt\0") == ["/usr/sbin/sshd", "-D", "-f", "/etc/alt"]
    assert psd.sshd_command_line("sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups\0") == [
        "/usr/sbin/sshd", "-D"]
    assert psd.sshd_options(["/usr/sbin/sshd", "-Df/x/cfg", "-h", "/k1", "-h/k2", "-o", "HostKey=/k3", "-p", "2222"]) \
        == ("/x/cfg", ["/k1", "/k2"], ["HostKey=/k3"], None)
    assert psd.sshd_options(["/usr/sbin/sshd", "-D"]) == (None, [], [], None)
    assert psd.sshd_options(["/usr/sbin/sshd", "-Z"])[3].startswith("cannot parse sshd's options")


def test_the_listening_sshd_is_found_from_proc(tmp_path):
    fake_proc(tmp_path)
    assert psd.listening_inodes(str(tmp_path), 22) == ["4242", "4243"]
    assert psd.listening_inodes(str(tmp_path), 631) == ["999"]
    assert psd.socket_holders(str(tmp_path), ["4242", "4243"]) == ([1], 0)
    found = psd.discover_sshd(str(tmp_path), 22)
    assert found["pid"] == 1 and found["config"] == "/srv/sshd/sshd_config" and found["problem"] == ""
    assert found["host_key_args"] == ["/srv/sshd/extra_key"] and found["exe"] == "/usr/sbin/sshd"
    assert psd.discover_sshd(str(tmp_path), 2222)["problem"] == \
        "no process listens on TCP port 2222 (/proc/net/tcp, /proc/net/tcp6)"
    held = psd.discover_sshd(str(tmp_path), 631)
    assert held["pid"] is None and "not by an sshd (socket activation?" in held["problem"]


def sshd_t(answers):
    """FakeOps answer for ``sshd -T``: the HostKey lines it prints, per attempt (a list of (rc, out, err))."""
    calls = []

    def answer(argv):
        calls.append(argv)
        return answers[min(len(calls), len(answers)) - 1]
    answer.calls = calls
    return answer


def test_read_takes_the_host_keys_the_running_sshd_serves_not_etc_ssh(tmp_path):
    fake_proc(tmp_path)
    served, extra, stale = fake_key("served"), fake_key("extra", "ecdsa-sha2-nistp256"), fake_key("etc-default")
    write(tmp_path, "/srv/sshd/sshd_config", "HostKey /srv/sshd/ssh_host_ed25519_key\n")
    write(tmp_path, "/srv/sshd/ssh_host_ed25519_key.pub", served + " root@node1\n")
    write(tmp_path, "/srv/sshd/extra_key.pub", extra + "\n")
    write(tmp_path, "/etc/ssh/sshd_config", "HostKey /etc/ssh/ssh_host_ed25519_key\n")
    write(tmp_path, "/etc/ssh/ssh_host_ed25519_key.pub", stale + "\n")
    answer = sshd_t([(0, "port 22\nhostkey /srv/sshd/extra_key\nhostkey /srv/sshd/ssh_host_ed25519_key\n"
                         "hostkeyagent none\n", "")])
    ops = FakeOps(programs={"sshd": "/usr/sbin/sshd"}, commands={("/usr/sbin/sshd", "-T"): answer})
    args = st.read_args(settings(), {"name": "node1"})
    args["root"] = str(tmp_path)
    result = node_st.read(args, ops)
    assert [k["public_key"] for k in result["keys"]] == [extra, served]
    assert stale not in json.dumps(result)
    assert answer.calls == [["/usr/sbin/sshd", "-T", "-f", os.path.join(str(tmp_path), "srv/sshd/sshd_config"),
                             "-h", "/srv/sshd/extra_key"]]
    assert all(isinstance(part, str) for part in answer.calls[0])
    assert result["sshd"]["source"] == "listener" and result["sshd"]["pid"] == 1
    assert result["sshd"]["how"] == "sshd -T" and result["sshd_config"]["path"] == "/srv/sshd/sshd_config"
    check = ssh_checks.host_keys_check("node1", result["keys"], result["problems"], result["sshd"])
    assert check["status"] == "pass" and "listening on port 22 (pid 1" in check["found"]

    # A version that wants a connection spec for Match blocks: retried with -C.
    answer = sshd_t([(255, "", "Match blocks need -C"), (0, "hostkey /srv/sshd/ssh_host_ed25519_key\n", "")])
    ops = FakeOps(programs={"sshd": "/usr/sbin/sshd"}, commands={("/usr/sbin/sshd", "-T"): answer})
    assert [k["public_key"] for k in node_st.read(args, ops)["keys"]] == [served]
    assert answer.calls[1][-2:] == ["-C", "user=root,host=localhost,addr=127.0.0.1"]

    # No sshd -T (no binary): the file is parsed, the -h key first.
    result = node_st.read(args, FakeOps())
    assert [k["public_key"] for k in result["keys"]] == [extra, served]
    assert result["sshd"]["how"].startswith("parsed")

    # An explicit ssh_trust_sshd_config wins over the running sshd.
    args["sshd_config"] = "/etc/ssh/sshd_config"
    result = node_st.read(args, FakeOps())
    assert [k["public_key"] for k in result["keys"]] == [stale] and result["sshd"]["source"] == "ssh_trust_sshd_config"


def test_without_a_running_sshd_the_default_is_assumed_and_said(tmp_path):
    fake_proc(tmp_path, cmdline="/lib/systemd/systemd\0--system\0", exe="/lib/systemd/systemd")
    write(tmp_path, "/etc/ssh/sshd_config", "HostKey /etc/ssh/ssh_host_ed25519_key\n")
    write(tmp_path, "/etc/ssh/ssh_host_ed25519_key.pub", KEYS["node1"] + "\n")
    args = st.read_args(settings(), {"name": "node1"})
    args["root"] = str(tmp_path)
    result = node_st.read(args, FakeOps())
    assert result["sshd"]["source"] == "default" and "socket activation" in result["sshd"]["discovery"]
    check = ssh_checks.host_keys_check("node1", result["keys"], result["problems"], result["sshd"])
    assert check["status"] == "warn" and "node1" in check["found"] and "running sshd was not found" in check["found"]
    assert "preflight_become" in check["fix"] and "ssh_trust_host_key_files" in check["fix"]


@needs_root
@needs_openssh
def test_a_real_sshd_started_with_f_is_found_and_its_keys_read(tmp_path):
    """The bug this fixes: an sshd run with -f elsewhere serves keys that are not /etc/ssh's."""
    directory = tmp_path / "sshd"
    directory.mkdir()
    key = str(directory / "ssh_host_ed25519_key")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True, timeout=30)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = directory / "sshd_config"
    config.write_text("Port %d\nListenAddress 127.0.0.1\nHostKey %s\nPidFile %s\n" % (
        port, key, directory / "sshd.pid"))
    os.makedirs("/run/sshd", exist_ok=True)
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-f", str(config), "-E", str(directory / "log")])
    try:
        deadline = time.monotonic() + 10
        while not psd.listening_inodes("/", port) and time.monotonic() < deadline:
            time.sleep(0.05)
        paths, problem, sshd = psd.host_key_sources("/", "", (), LocalOps(), port)
        assert problem is None and sshd["source"] == "listener" and sshd["pid"] == proc.pid, sshd
        assert paths == [key] and sshd["how"] == "sshd -T"
        keys, _problems = psd.read_host_keys("/", paths, LocalOps())
        with open(key + ".pub", encoding="ascii") as handle:
            assert keys[0]["public_key"] == " ".join(handle.read().split()[:2])
        # ssh-keyscan (the mesh's confirmation) sees the same key.
        row = psm._keyscan(LocalOps(), psm.keyscan_argv("ssh-keyscan", "127.0.0.1", port, 5), 10, "127.0.0.1")
        assert row["keys"] == [keys[0]["public_key"]], row
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# ----------------------------------------------------------------------------
# ssh-keyscan from the peers: the served keys against the key files


def test_probe_scans_each_peer_and_decide_compares_with_its_files():
    probes = {h: probe_result(h, {p: (0, "") for p in ("node1", "node2", "node3") if p != h})
              for h in ("node1", "node2", "node3")}
    assert probes["node1"]["keyscan"] == "not_installed" and probes["node1"]["served"] == {}

    def scanned(source, wrong=None):
        """node -> what ssh-keyscan from ``source`` saw: each node's own key, ``wrong`` for node2."""
        return {p: {"target": "198.19.0.%s" % p[-1], "keys": [wrong if (p == "node2" and wrong) else KEYS[p]],
                    "error": ""} for p in ("node1", "node2", "node3") if p != source}

    view = in_sync()
    view["probes"] = {h: dict(probes[h], served=scanned(h)) for h in probes}
    results = decide_all(view)
    for host, checks in results.items():
        assert checks["host_keys_served"]["status"] == "pass", checks["host_keys_served"]
        assert_contract(host, checks)
    # node2's sshd serves a key that is not in the files read on node2 (sshd runs with another -f).
    view = in_sync()
    view["probes"] = {h: dict(probes[h], served=scanned(h, wrong=KEYS["stranger"])) for h in probes}
    results = decide_all(view)
    bad = results["node2"]["host_keys_served"]
    assert bad["status"] == "fail" and fp(KEYS["stranger"]) in bad["found"], bad
    assert "seen by node1 at 198.19.0.2" in bad["found"] and "seen by node3" in bad["found"]
    assert "ssh_trust_sshd_config" in bad["fix"] and "-f" in bad["fix"]
    for host in ("node1", "node3"):
        assert results[host]["host_keys_served"]["status"] == "pass"
    assert_contract("node2", results["node2"])
    # A key file the sshd does not serve: a warning.
    view = in_sync()
    view["facts"]["node3"] = dict(view["facts"]["node3"], keys=view["facts"]["node3"]["keys"] + [
        {"type": "ssh-rsa", "public_key": fake_key("rsa", "ssh-rsa"), "fingerprint": fp(fake_key("rsa", "ssh-rsa")),
         "path": "/etc/ssh/ssh_host_rsa_key.pub"}])
    view["probes"] = {h: dict(probes[h], served=scanned(h)) for h in probes}
    result = st.decide("node3", view["facts"]["node3"], view["settings"]["node3"], view["probes"]["node3"],
                       view)["host_keys_served"]
    assert result["status"] == "warn" and "not served by its sshd" in result["found"]
    # The module face: one peer's scan against that peer's files.
    row = {"target": "198.19.0.2", "keys": [KEYS["stranger"]], "error": ""}
    assert ssh_checks.served_keys_check("node1", "node2", [KEYS["node2"]], row)["status"] == "fail"
    assert ssh_checks.served_keys_check("node1", "node2", [KEYS["stranger"]], row)["status"] == "pass"


def test_keyscan_argv_is_a_list_and_parses_its_output():
    argv = psm.keyscan_argv("/usr/bin/ssh-keyscan", "pfn2", 2222, 3)
    assert argv == ["/usr/bin/ssh-keyscan", "-T", "3", "-p", "2222", "-t", "rsa,ecdsa,ed25519", "--", "pfn2"]
    out = "# pfn2:22 SSH-2.0-OpenSSH_9.2\n[pfn2]:2222 %s\n[pfn2]:2222 %s\n" % (KEYS["node1"], KEYS["node2"])
    assert psm.parse_keyscan(out) == [KEYS["node1"]]  # one per type


# ----------------------------------------------------------------------------
# Rules shared by the audit and the writer


def test_plan_authorized_keys_keeps_foreign_lines_and_unreached_nodes():
    old = ("# my keys\r\nssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFOREIGN laptop\n"
           "%s %s\n" % (fake_key("old-shared"), COMMENT)
           + "%s node=node9 %s\n" % (fake_key("node9"), COMMENT)
           + "%s node=node3 %s\n" % (fake_key("node3-old"), COMMENT)
           + "command=\"true\" ssh-rsa AAAAB3 backup\n")
    wanted = {n: ssh_keys_write.authorized_line(fake_key(n), n, COMMENT) for n in ("node2", "node1")}
    plan = ssh_keys_write.plan_authorized_keys(old, COMMENT, wanted, keep_nodes=["node1", "node2", "node3"])
    lines = plan["text"].split("\n")
    assert lines[:2] == ["# my keys\r", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFOREIGN laptop"]
    assert lines[2:5] == [wanted["node1"], wanted["node2"], "%s node=node3 %s" % (fake_key("node3-old"), COMMENT)]
    assert lines[5] == 'command="true" ssh-rsa AAAAB3 backup'
    assert fake_key("old-shared") not in plan["text"] and "node9" not in plan["text"]
    assert ssh_keys_write.plan_authorized_keys(plan["text"], COMMENT, wanted, ["node1", "node2", "node3"])["text"] == plan["text"]
    assert ssh_keys_write.plan_authorized_keys(None, COMMENT, {}, [])["text"] == ""
    assert ssh_keys_write.authorized_line(fake_key("a"), "node1", COMMENT, 'from="198.18.200.1"') == \
        'from="198.18.200.1" %s node=node1 %s' % (fake_key("a"), COMMENT)


def state_of(home_mode=0o750, ssh=("dir", 0o700), uid=1000, owner=1000, keys_kind="file"):
    return {"home": "/home/u", "home_state": {"exists": True, "kind": "dir", "mode": home_mode, "uid": owner},
            "ssh_dir": "/home/u/.ssh", "ssh_dir_state": {"exists": True, "kind": ssh[0], "mode": ssh[1], "uid": owner,
                                                         "target": "/tmp/x"},
            "authorized_keys_state": {"exists": True, "kind": keys_kind, "mode": 0o600, "uid": owner,
                                      "target": "/etc/shadow"}}


REFUSALS = [
    (state_of(), None),
    (state_of(home_mode=0o755, ssh=("dir", 0o755)), None),  # readable by others is fine
    (state_of(owner=0), None),  # root-owned is fine (StrictModes allows root)
    (state_of(home_mode=0o775), "home /home/u is writable by group or others (mode 0775)"),
    (state_of(ssh=("dir", 0o702)), "~/.ssh /home/u/.ssh is writable by group or others (mode 0702)"),
    (state_of(ssh=("symlink", 0o777)), "~/.ssh /home/u/.ssh is a symlink to /tmp/x"),
    (state_of(ssh=("file", 0o600)), "~/.ssh /home/u/.ssh is not a directory"),
    (state_of(owner=1001), "home /home/u is owned by uid 1001, neither u (uid 1000) nor root"),
    (state_of(keys_kind="symlink"), "/home/u/.ssh/authorized_keys is a symlink to /etc/shadow"),
    (dict(state_of(), home_state={"exists": False}), "home /home/u does not exist"),
]


@pytest.mark.parametrize("state,words", REFUSALS)
def test_ssh_dir_refusal_rules(state, words):
    refusal = ssh_keys_write.ssh_dir_refusal("node7", "u", 1000, state)
    if words is None:
        assert refusal is None
        return
    assert words in refusal["found"] and "node7" in refusal["found"]
    assert refusal["expected"] and "node7" in refusal["fix"] and "bringup.yml" in refusal["fix"]


def test_the_reader_never_reads_through_a_symlinked_ssh_dir(tmp_path):
    secret = write(tmp_path, "/srv/elsewhere/id_ed25519_cluster.pub", fake_key("elsewhere") + " x\n")
    os.makedirs(os.path.join(str(tmp_path), "home/train"), mode=0o750)
    os.symlink(os.path.dirname(secret), os.path.join(str(tmp_path), "home/train/.ssh"))
    write(tmp_path, "/etc/passwd", "train:x:1000:1000::/home/train:/bin/sh\n")
    state = node_st.read_cluster_key(str(tmp_path), ["train"], "id_ed25519_cluster", COMMENT,
                                     FakeOps())["users"]["train"]
    assert state["ssh"]["ssh_dir_state"]["kind"] == "symlink" and state["public_key"] == ""
    assert fake_key("elsewhere").split()[1] not in json.dumps(state)
    view = cluster({n: facts(n, [KEYS[n]], cluster_key={"users": {"train": state}}) for n in ("node1", "node2")},
                   ssh_trust_cluster_key=True, ssh_trust_cluster_key_users=["train"])
    check = st.decide("node1", view["facts"]["node1"], view["settings"]["node1"], None, view)["ssh_dirs"]
    assert check["status"] == "fail" and "is a symlink to" in check["found"] and "node1" in check["found"]


# ----------------------------------------------------------------------------
# ssh_cluster_key: the writer


@pytest.fixture
def sandbox(public_dir):
    """A root tree every user can traverse (pytest's tmp_path is 0700: other users could not)."""
    return public_dir


def nobody():
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody")


def home_of(sandbox, entry, mode=0o750):
    home = os.path.join(sandbox, entry.pw_dir.lstrip("/"))
    os.makedirs(home, exist_ok=True)
    os.chmod(home, mode)
    os.chown(home, entry.pw_uid, entry.pw_gid)
    return home


def private_body(path):
    """The base64 body of an OpenSSH private key file (what must never leak)."""
    with open(path, encoding="ascii") as handle:
        return "".join(line.strip() for line in handle if not line.startswith("-----"))


@needs_root
@needs_openssh
def test_each_user_gets_its_own_pair_generated_as_that_user_in_four_steps(run_module, sandbox):
    user = nobody()
    home = home_of(sandbox, user)
    home_of(sandbox, pwd.getpwnam("root"), 0o700)
    args = {"root": sandbox, "users": ["root", user.pw_name], "node": "node1"}

    result, failed = run_module(ssh_cluster_key, args, check_mode=True)
    assert not failed and result["changed"] is True, result
    assert result["users"][user.pw_name]["created_dir"] and result["users"][user.pw_name]["generated"]
    assert not os.path.exists(os.path.join(home, ".ssh")) and result["public_keys"] == {}

    result, failed = run_module(ssh_cluster_key, args)
    assert not failed and result["changed"] is True, result
    private = os.path.join(home, ".ssh", "id_ed25519_cluster")
    st_dir, st_key = os.stat(os.path.dirname(private)), os.stat(private)
    assert (st_dir.st_uid, st_dir.st_mode & 0o777) == (user.pw_uid, 0o700)
    assert (st_key.st_uid, st_key.st_mode & 0o777) == (user.pw_uid, 0o600)  # ssh-keygen ran as the user
    root_private = os.path.join(sandbox, "root/.ssh/id_ed25519_cluster")
    assert os.stat(root_private).st_uid == 0
    keys = result["public_keys"]
    assert set(keys) == {"root", user.pw_name} and keys["root"] != keys[user.pw_name]
    for path in (private, root_private):
        assert private_body(path) not in json.dumps(result)
    assert "PRIVATE KEY" not in json.dumps(result)

    result, failed = run_module(ssh_cluster_key, args)
    assert not failed and result["changed"] is False and result["public_keys"] == keys

    # Authorize every node's key of each user: root's key never lands in the user's file.
    other = {"root": fake_key("node2-root"), user.pw_name: fake_key("node2-nobody")}
    authorized = {"node1": keys, "node2": other, "node3": {}}
    args = dict(args, generate=False, authorized=authorized, keep_nodes=["node1", "node2", "node3"])
    result, failed = run_module(ssh_cluster_key, args, check_mode=True, diff=True)
    assert not failed and result["changed"] and len(result["diff"]) == 2
    assert not os.path.exists(os.path.join(home, ".ssh", "authorized_keys"))
    result, failed = run_module(ssh_cluster_key, args, diff=True)
    assert not failed and result["changed"]
    path = os.path.join(home, ".ssh", "authorized_keys")
    with open(path, encoding="ascii") as handle:
        text = handle.read()
    assert text == "%s node=node1 %s\n%s node=node2 %s\n" % (keys[user.pw_name], COMMENT, other[user.pw_name],
                                                             COMMENT)
    assert keys["root"] not in text and other["root"] not in text
    assert (os.stat(path).st_uid, os.stat(path).st_mode & 0o777) == (user.pw_uid, 0o600)
    result, failed = run_module(ssh_cluster_key, args)
    assert not failed and result["changed"] is False


@needs_root
def test_a_symlinked_or_writable_ssh_dir_is_refused_and_nothing_is_written_through_it(run_module, sandbox):
    user = nobody()
    home = home_of(sandbox, user)
    target = os.path.join(sandbox, "srv", "elsewhere")
    os.makedirs(target)
    os.symlink(target, os.path.join(home, ".ssh"))
    home_of(sandbox, pwd.getpwnam("root"), 0o700)
    args = {"root": sandbox, "users": [user.pw_name, "root"], "node": "node1",
            "authorized": {"node1": {user.pw_name: fake_key("k")}}}
    result, failed = run_module(ssh_cluster_key, args)
    assert not failed, result
    refusal = result["refused"][user.pw_name]
    assert "is a symlink to %s" % target in refusal["found"] and "node1" in refusal["found"]
    assert refusal["expected"] and "node1" in refusal["fix"]
    assert result["checks"]["ssh_dirs"]["status"] == "fail"
    assert os.listdir(target) == []  # nothing written through the link
    assert "root" in result["public_keys"]  # the other user was still handled
    assert_contract("node1", result["checks"])

    os.unlink(os.path.join(home, ".ssh"))
    os.chmod(home, 0o777)
    result, failed = run_module(ssh_cluster_key, dict(args, users=[user.pw_name]))
    assert not failed and "writable by group or others (mode 0777)" in result["refused"][user.pw_name]["found"]
    assert not os.path.exists(os.path.join(home, ".ssh"))


@needs_root
@needs_openssh
def test_files_in_the_users_ssh_dir_are_never_followed_nor_chowned(run_module, sandbox):
    user = nobody()
    home = home_of(sandbox, user)
    ssh_dir = os.path.join(home, ".ssh")
    os.mkdir(ssh_dir, 0o700)
    os.chown(ssh_dir, user.pw_uid, user.pw_gid)
    # authorized_keys is a hard link to a root file: reading it into the user's new file would leak it.
    secret = os.path.join(sandbox, "secret")
    with open(secret, "w", encoding="ascii") as handle:
        handle.write("root:SECRETHASH:19000:0:99999:7:::\n")
    os.link(secret, os.path.join(ssh_dir, "authorized_keys"))
    args = {"root": sandbox, "users": [user.pw_name], "node": "node1",
            "authorized": {"node1": {user.pw_name: fake_key("k")}}}
    result, failed = run_module(ssh_cluster_key, args)
    assert "SECRETHASH" not in json.dumps(result)
    assert user.pw_name in result["refused"] and "hard links" in result["refused"][user.pw_name]["found"], result
    os.unlink(os.path.join(ssh_dir, "authorized_keys"))
    # A "private key" owned by root in the user's directory is refused, never chowned to the user.
    for name in ("id_ed25519_cluster", "id_ed25519_cluster.pub"):
        if os.path.exists(os.path.join(ssh_dir, name)):
            os.unlink(os.path.join(ssh_dir, name))
    with open(os.path.join(ssh_dir, "id_ed25519_cluster"), "w", encoding="ascii") as handle:
        handle.write("not the user's\n")
    os.chmod(os.path.join(ssh_dir, "id_ed25519_cluster"), 0o644)
    result, failed = run_module(ssh_cluster_key, args)
    assert user.pw_name in result["refused"], result
    assert "owned by uid 0" in result["refused"][user.pw_name]["found"], result
    assert os.stat(os.path.join(ssh_dir, "id_ed25519_cluster")).st_uid == 0


# ----------------------------------------------------------------------------
# A login without root: what it cannot observe is blocked, a fallback never passes

NOT_FOUND = ("no process found holding the socket that listens on port 22 (the descriptors of 3 process(es) could "
             "not be read: run as root (preflight_become: true))")
NEEDS_ROOT = ("the process listening on port 22 (the running sshd) could not be found: the descriptors of root's "
              "processes (/proc/<pid>/fd) are readable only by root")
FALLBACK = {"source": "default", "config": "/etc/ssh/sshd_config", "how": "parsed", "port": 22, "pid": None,
            "argv": [], "discovery": NOT_FOUND, "privileged": False, "needs_root": NEEDS_ROOT}


def test_a_reader_without_root_records_that_the_listener_needs_root(tmp_path, monkeypatch):
    fake_proc(tmp_path)
    write(tmp_path, "/etc/ssh/sshd_config", "HostKey /etc/ssh/ssh_host_ed25519_key\n")
    write(tmp_path, "/etc/ssh/ssh_host_ed25519_key.pub", KEYS["node1"] + "\n")
    # What a login without root sees: the socket listens, but root's descriptors cannot be read.
    monkeypatch.setattr(psd, "socket_holders", lambda root, inodes: ([], 3))
    monkeypatch.setattr(node_st, "privileged", lambda: False)
    args = st.read_args(settings(), {"name": "node1"})
    args["root"] = str(tmp_path)
    result = node_st.read(args, FakeOps())
    assert result["privileged"] is False and result["sshd"]["source"] == "default"
    assert result["sshd"]["needs_root"].startswith("the process listening on port 22") and "/proc/<pid>/fd" in \
        result["sshd"]["needs_root"]
    assert result["needs_root"] == [result["sshd"]["needs_root"]]
    # As root the same node records nothing it lacks (there, not finding the sshd is a finding of its own).
    monkeypatch.setattr(node_st, "privileged", lambda: True)
    result = node_st.read(args, FakeOps())
    assert result["privileged"] is True and result["needs_root"] == [] and "needs_root" not in result["sshd"]
    # Nothing listens: root would not find more, so nothing needs root.
    monkeypatch.setattr(node_st, "privileged", lambda: False)
    args["port"] = 2222
    assert node_st.read(args, FakeOps())["needs_root"] == []


def unprivileged_view(block=True, served=None, sshd=None):
    """Three nodes read without root: each one's keys from /etc/ssh (the fallback), peers scanned ``served``."""
    names = ("node1", "node2", "node3")
    first = cluster({n: dict(facts(n, [KEYS[n]]), sshd=dict(sshd or FALLBACK), privileged=False) for n in names})
    kept = synced_block(first) if block else None
    view = cluster({n: dict(facts(n, [KEYS[n]], block=kept), sshd=dict(sshd or FALLBACK), privileged=False)
                    for n in names})
    probes = {h: probe_result(h, {p: (0, "") for p in names if p != h}) for h in names}
    served = served or {}
    view["probes"] = {h: dict(probes[h], served={p: {"target": "198.19.0.%s" % p[-1], "keys": [served.get(p, KEYS[p])],
                                                     "error": ""} for p in names if p != h}) for h in names}
    return view


def test_keys_served_that_the_fallback_lacks_are_blocked_for_root_never_failed():
    results = decide_all(unprivileged_view(served={"node2": KEYS["stranger"]}))
    served = results["node2"]["host_keys_served"]
    assert served["status"] == "skipped" and served["details"]["blocked"], served
    assert served["found"].startswith("needs root: the process listening on port 22") and \
        fp(KEYS["stranger"]) in served["found"] and "fallback" in served["found"]
    assert served["fix"] == "set preflight_become: true (or connect as root)"
    for host, checks in results.items():
        assert_contract(host, checks)
        assert pc.node_status({"ssh_trust." + n: c for n, c in checks.items()}) != "fail", (host, checks)
    # The same mismatch read as root (socket activation: root found no sshd either) is the node's own finding.
    root = dict(FALLBACK, privileged=True, discovery="port 22 is held by systemd, not by an sshd")
    del root["needs_root"]
    results = decide_all(unprivileged_view(served={"node2": KEYS["stranger"]}, sshd=root))
    assert results["node2"]["host_keys_served"]["status"] == "fail"


def test_a_comparison_with_the_fallback_is_at_most_a_warning_naming_the_assumption():
    results = decide_all(unprivileged_view())
    for host, checks in results.items():
        for name in ("host_keys", "host_keys_served", "host_key_unchanged", "known_hosts"):
            result = checks[name]
            assert result["status"] == "warn", (host, name, result)
            assert "assumed" in result["found"] or "fallback" in result["found"], (host, name, result)
        assert "could not be found without root" in checks["host_key_unchanged"]["found"]
        assert checks["host_key_unchanged"]["fix"].startswith("set preflight_become: true (or connect as root)")
        assert_contract(host, checks)
    # Keys found from the running sshd: the same comparisons pass.
    assert all(checks[name]["status"] == "pass" for checks in decide_all(unprivileged_view(sshd=LISTENER)).values()
               for name in ("host_keys", "host_keys_served", "host_key_unchanged", "known_hosts"))


def test_a_key_that_differs_from_the_fallback_is_blocked_not_a_changed_key():
    view = unprivileged_view()
    # node2's /etc/ssh key is not the one the blocks hold (its sshd serves another: the blocks' one).
    view["facts"]["node2"] = dict(view["facts"]["node2"], keys=[{
        "type": "ssh-ed25519", "public_key": KEYS["node2new"], "fingerprint": fp(KEYS["node2new"]),
        "path": "/etc/ssh/ssh_host_ed25519_key.pub"}])
    view["facts"] = dict(view["facts"])  # a new view for the memo
    results = decide_all(view)
    unchanged = results["node2"]["host_key_unchanged"]
    assert unchanged["status"] == "skipped" and unchanged["details"]["blocked"], unchanged
    assert unchanged["found"].startswith("needs root: ") and fp(KEYS["node2new"]) in unchanged["found"]
    for host, checks in results.items():
        assert_contract(host, checks)
        assert all(c["status"] != "fail" for c in checks.values()), (host, checks)
        # Peers never claim the fallback key is "node2's own" on the wire.
        assert "read from node2 itself" not in checks["mesh"]["found"]


def test_host_keys_no_file_readable_without_root_is_blocked():
    denied = ["/etc/ssh/ssh_host_ed25519_key: ssh-keygen -y failed: Load key: Permission denied"]
    result = ssh_checks.host_keys_check("node1", [], denied, dict(FALLBACK))
    assert result["status"] == "skipped" and result["details"]["blocked"] and result["found"].startswith(
        "needs root: ") and "preflight_become" in result["fix"]
    assert ssh_checks.host_keys_check("node1", [], denied, dict(FALLBACK, privileged=True))["status"] == "fail"
    assert ssh_checks.host_keys_check("node1", [], ["no such host key"], dict(FALLBACK))["status"] == "fail"


def test_another_users_ssh_dir_unreadable_without_root_blocks_ssh_dirs_and_cluster_key():
    view = cluster({n: facts(n, [KEYS[n]], cluster_key=synced_users(n)) for n in NODES3},
                   ssh_trust_cluster_key=True, ssh_trust_cluster_key_users=["root", "train"])
    plan_block = synced_block(view)
    node_facts = {n: facts(n, [KEYS[n]], block=plan_block, cluster_key=synced_users(n)) for n in NODES3}
    node_facts["node1"]["cluster_key"]["users"]["root"]["needs_root"] = (
        "root's home or ~/.ssh cannot be read without root (Permission denied)")
    view = cluster(node_facts, ssh_trust_cluster_key=True, ssh_trust_cluster_key_users=["root", "train"])
    checks = st.decide("node1", view["facts"]["node1"], view["settings"]["node1"], None, view)
    for name in ("ssh_dirs", "cluster_key"):
        assert checks[name]["status"] == "skipped" and checks[name]["details"]["blocked"], checks[name]
        assert checks[name]["found"].startswith("needs root: root's home")
    assert_contract("node1", checks)
