"""Unit tests of the ssh_trust module known_hosts_block and the node helpers
(module_utils/preflight_node/ssh/primitives.py, sshd.py, ssh_mesh.py).  Files live in a sandbox root; keys are
made with ssh-keygen so fingerprints are compared with what ssh-keygen -lf prints."""

import base64
import hashlib
import os
import shutil
import stat
import subprocess
import textwrap

import pytest

import known_hosts_block
from cluster_preflight.capabilities.ssh_trust import cluster_plan as ssh_trust_plan
from preflight_node.ssh import primitives as ps
from preflight_node.ssh import mesh as psm
from preflight_node.ssh import sshd as psd

KH = "/etc/ssh/ssh_known_hosts"
BEGIN, END = ps.markers()

needs_keygen = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="ssh-keygen not installed")


def keygen(tmp_path, name, key_type="ed25519"):
    """A real key pair; returns (public 'TYPE BASE64', private path, ssh-keygen -lf fingerprint)."""
    path = tmp_path / "keys" / name
    path.parent.mkdir(exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", key_type, "-N", "", "-C", name, "-f", str(path)],
                   check=True, timeout=30, capture_output=True)
    with open(str(path) + ".pub", encoding="ascii") as handle:
        public = " ".join(handle.read().split()[:2])
    fp = subprocess.run(["ssh-keygen", "-lf", str(path) + ".pub"], check=True, timeout=30,
                        capture_output=True, text=True).stdout.split()[1]
    return public, str(path), fp


def kh_path(root):
    return os.path.join(str(root), KH.lstrip("/"))


def write_kh(root, data):
    path = kh_path(root)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data)
    return path


def read_kh(root):
    with open(kh_path(root), "rb") as handle:
        return handle.read()


def sha(path):
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


@pytest.fixture
def keys(tmp_path):
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen not installed")
    return {name: keygen(tmp_path, name) for name in ("pfn1", "pfn2", "pfn2new", "pfn3")}


def entries(keys, pfn2="pfn2"):
    return [
        {"node": "pfn1", "names": ["pfn1.cluster.test", "pfn1", "198.19.7.1", "198.18.7.1"], "keys": [keys["pfn1"][0]]},
        {"node": "pfn2", "names": ["pfn2.cluster.test", "pfn2", "198.19.7.2", "198.18.7.2"], "keys": [keys[pfn2][0]]},
    ]


# Foreign content: a comment, a CRLF line, a hashed entry, a CA line, bytes that are not
# UTF-8, and no newline at the end.
def foreign(keys):
    hashed = ps_hashed_line("pfn2", keys["pfn3"][0])
    return (b"# operator's own entries\n"
            b"gw.example.org " + keys["pfn3"][0].encode() + b" gw\r\n"
            + hashed.encode() + b"\n"
            b"@cert-authority *.example.org " + keys["pfn3"][0].encode() + b"\n"
            b"caf\xe9.example.org " + keys["pfn1"][0].encode() + b"\n"
            b"last.example.org " + keys["pfn3"][0].encode())


def ps_hashed_line(name, key):
    """A HashKnownHosts line as ssh-keygen -H writes it: |1|base64(salt)|base64(hmac-sha1)."""
    import hmac  # pylint: disable=import-outside-toplevel
    salt = bytes(range(20))
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return "|1|%s|%s %s" % (base64.b64encode(salt).decode(), base64.b64encode(digest).decode(), key)


# ----------------------------------------------------------------------------
# known_hosts_block


@pytest.mark.parametrize("check_mode", [True, False])
def test_a_symlinked_known_hosts_file_is_refused_naming_its_target_and_nothing_is_written(run_module, tmp_path,
                                                                                         keys, check_mode):
    target = tmp_path / "elsewhere"
    target.write_bytes(foreign(keys))
    path = kh_path(tmp_path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(str(target), path)
    args = {"root": str(tmp_path), "entries": entries(keys), "keep_nodes": ["pfn1", "pfn2", "pfn3"]}
    result, failed = run_module(known_hosts_block, args, check_mode=check_mode)
    assert failed and result["link_target"] == str(target) and str(target) in result["found"]
    assert result["fix"] and os.path.islink(path) and target.read_bytes() == foreign(keys)


def test_four_steps_check_apply_reapply_diff(run_module, tmp_path, keys):
    original = foreign(keys)
    path = write_kh(tmp_path, original)
    before_hash, before_mtime = sha(path), os.stat(path).st_mtime_ns
    args = {"root": str(tmp_path), "entries": entries(keys), "keep_nodes": ["pfn1", "pfn2", "pfn3"]}

    result, failed = run_module(known_hosts_block, args, check_mode=True)
    assert not failed and result["changed"] is True
    assert sha(path) == before_hash and os.stat(path).st_mtime_ns == before_mtime
    assert result["before_sha256"] == before_hash and result["after_sha256"] != before_hash
    assert result["checks"]["ssh_known_hosts"]["status"] == "fail"
    assert "pfn2 (pfn2.cluster.test, pfn2, 198.19.7.2, 198.18.7.2)" in result["checks"]["ssh_known_hosts"]["found"]
    assert result["checks"]["ssh_known_hosts"]["fix"]

    result, failed = run_module(known_hosts_block, args)
    assert not failed and result["changed"] is True
    assert sha(path) == result["after_sha256"]
    data = read_kh(tmp_path).decode("utf-8", "surrogateescape")
    block = data[data.index(BEGIN):]
    assert block.splitlines()[1:3] == [
        "pfn1.cluster.test,pfn1,198.19.7.1,198.18.7.1 %s node=pfn1" % keys["pfn1"][0],
        "pfn2.cluster.test,pfn2,198.19.7.2,198.18.7.2 %s node=pfn2" % keys["pfn2"][0]]
    assert result["checks"]["ssh_known_hosts"]["status"] == "pass"

    after_hash = sha(path)
    result, failed = run_module(known_hosts_block, args)
    assert not failed and result["changed"] is False and sha(path) == after_hash
    result, failed = run_module(known_hosts_block, args, check_mode=True)
    assert result["changed"] is False and result["checks"]["ssh_known_hosts"]["status"] == "pass"

    args["entries"] = entries(keys) + [{"node": "pfn3", "names": ["pfn3"], "keys": [keys["pfn3"][0]]}]
    result, failed = run_module(known_hosts_block, args, check_mode=True, diff=True)
    assert not failed and result["changed"] is True
    assert result["diff"]["before"] == data
    assert "pfn3 %s node=pfn3" % keys["pfn3"][0] in result["diff"]["after"]
    assert "pfn3 %s node=pfn3" % keys["pfn3"][0] not in read_kh(tmp_path).decode("utf-8", "surrogateescape")


def test_foreign_lines_survive_byte_for_byte(run_module, tmp_path, keys):
    original = foreign(keys)
    write_kh(tmp_path, original)
    args = {"root": str(tmp_path), "entries": entries(keys)}
    run_module(known_hosts_block, args)
    data = read_kh(tmp_path)
    # No newline at the end of the foreign text: exactly one is added before the block.
    assert data.startswith(original + b"\n" + BEGIN.encode() + b"\n")
    # A block in the middle of the file: the lines after it stay too.
    tail = b"after.example.org " + keys["pfn3"][0].encode() + b"\r\n\n# the end"
    write_kh(tmp_path, data + tail)
    args["entries"] = entries(keys, pfn2="pfn2") + [{"node": "pfn3", "names": ["pfn3"], "keys": [keys["pfn3"][0]]}]
    result, _ = run_module(known_hosts_block, args)
    assert result["changed"] is True
    data2 = read_kh(tmp_path)
    assert data2.startswith(original + b"\n" + BEGIN.encode() + b"\n")
    assert data2.endswith(END.encode() + b"\n" + tail)
    # state=absent removes only the block.
    result, _ = run_module(known_hosts_block, {"root": str(tmp_path), "state": "absent"})
    assert result["changed"] is True
    assert read_kh(tmp_path) == original + b"\n" + tail


def test_hashed_entries_are_left_alone_and_still_matched(run_module, tmp_path, keys):
    hashed = ps_hashed_line("pfn2", keys["pfn3"][0])
    write_kh(tmp_path, hashed.encode() + b"\n")
    result, _ = run_module(known_hosts_block, {"root": str(tmp_path), "entries": entries(keys)})
    assert result["changed"] is True and result["changed_keys"] == []
    data = read_kh(tmp_path).decode()
    assert data.startswith(hashed + "\n" + BEGIN + "\n")
    assert data.count("|1|") == 1
    # The hashed line is still recognised for what it is.
    entry = ps.parse_known_hosts_line(hashed)
    assert entry["hashed"] and ps.patterns_match(entry["patterns"], "pfn2")
    assert not ps.patterns_match(entry["patterns"], "pfn3")
    found = ps.keys_for(data, "pfn2")
    assert [number for number, _ in found][:1] == [1]
    assert {e["blob"] for _, e in found} == {keys["pfn3"][0].split()[1], keys["pfn2"][0].split()[1]}


def test_changed_key_is_named_with_both_fingerprints_and_kept_until_accepted(run_module, tmp_path, keys):
    write_kh(tmp_path, b"")
    base = {"root": str(tmp_path), "keep_nodes": ["pfn1", "pfn2"]}
    run_module(known_hosts_block, dict(base, entries=entries(keys)))
    old_file = read_kh(tmp_path)

    # pfn2 was reinstalled (new key); pfn1 gained a name at the same time.
    changed_entries = entries(keys, pfn2="pfn2new")
    changed_entries[0]["names"].append("pfn1-ib0")
    result, failed = run_module(known_hosts_block, dict(base, entries=changed_entries), check_mode=True)
    assert not failed
    assert result["held_back"] == ["pfn2"]
    [change] = result["changed_keys"]
    assert change["node"] == "pfn2" and change["key_type"] == "ssh-ed25519" and change["accepted"] is False
    assert change["old_fingerprint"] == keys["pfn2"][2]
    assert change["new_fingerprint"] == keys["pfn2new"][2]
    assert "ssh-keygen -R pfn2 -f /etc/ssh/ssh_known_hosts" in change["fix"]
    assert "-e ssh_trust_accept_changed=pfn2" in change["fix"]
    assert keys["pfn2new"][2] in change["fix"]
    assert read_kh(tmp_path) == old_file

    result, _ = run_module(known_hosts_block, dict(base, entries=changed_entries))
    data = read_kh(tmp_path).decode()
    assert result["changed"] is True  # pfn1's new name is written ...
    assert "pfn1-ib0" in data
    assert keys["pfn2"][0] in data and keys["pfn2new"][0] not in data  # ... pfn2's old key stays
    assert "pfn2" in result["msg"] and result["missing"] == [{"node": "pfn1", "names": ["pfn1-ib0"]}]

    result, _ = run_module(known_hosts_block, dict(base, entries=changed_entries, accept_changed=["pfn2"]))
    data = read_kh(tmp_path).decode()
    assert result["changed"] is True and result["held_back"] == []
    assert result["changed_keys"][0]["accepted"] is True
    assert keys["pfn2new"][0] in data and keys["pfn2"][0] not in data
    result, _ = run_module(known_hosts_block, dict(base, entries=changed_entries))
    assert result["changed"] is False and result["changed_keys"] == []


def test_unreachable_nodes_keep_their_lines_and_departed_nodes_go(run_module, tmp_path, keys):
    write_kh(tmp_path, b"")
    three = entries(keys) + [{"node": "pfn3", "names": ["pfn3"], "keys": [keys["pfn3"][0]]}]
    run_module(known_hosts_block, {"root": str(tmp_path), "entries": three})
    # pfn2 did not answer this run: its lines stay; pfn3 left the inventory: its lines go.
    result, _ = run_module(known_hosts_block, {"root": str(tmp_path), "entries": entries(keys)[:1],
                                               "keep_nodes": ["pfn1", "pfn2"]})
    data = read_kh(tmp_path).decode()
    assert keys["pfn2"][0] in data and keys["pfn3"][0] not in data
    assert result["dropped"] == ["pfn3"]


def test_drift_policy_backup_and_bad_input(run_module, tmp_path, keys):
    path = write_kh(tmp_path, b"old.example.org " + keys["pfn3"][0].encode() + b"\n")
    args = {"root": str(tmp_path), "entries": entries(keys), "drift_policy": "warn"}
    result, _ = run_module(known_hosts_block, args, check_mode=True)
    assert result["checks"]["ssh_known_hosts"]["status"] == "warn"
    result, _ = run_module(known_hosts_block, dict(args, backup=True))
    assert os.path.exists(result["backup_file"])
    with open(result["backup_file"], "rb") as handle:
        assert handle.read() == b"old.example.org " + keys["pfn3"][0].encode() + b"\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644

    # Two nodes claiming one name, a broken key, broken markers: refused, file untouched.
    before = read_kh(tmp_path)
    bad = entries(keys)
    bad[1]["names"].append("pfn1")
    result, failed = run_module(known_hosts_block, dict(args, entries=bad))
    assert failed and "pfn1 is a name of both pfn1 and pfn2" in result["msg"]
    bad = entries(keys)
    bad[0]["keys"] = ["ssh-ed25519 AAAAB3NzaC1yc2EAAAADAQABAAABAQ"]
    result, failed = run_module(known_hosts_block, dict(args, entries=bad))
    assert failed and "pfn1" not in result.get("block", []) and read_kh(tmp_path) == before
    write_kh(tmp_path, before.replace(END.encode() + b"\n", b""))
    result, failed = run_module(known_hosts_block, args)
    assert failed and "markers are broken" in result["msg"]


def test_new_file_is_created_with_mode_0644(run_module, tmp_path, keys):
    result, failed = run_module(known_hosts_block, {"root": str(tmp_path), "entries": entries(keys)})
    assert not failed and result["changed"] and result["before_sha256"] is None
    assert stat.S_IMODE(os.stat(kh_path(tmp_path)).st_mode) == 0o644
    assert read_kh(tmp_path).decode().startswith(BEGIN + "\n")


# ----------------------------------------------------------------------------
# preflight_ssh helpers


def test_fingerprint_matches_ssh_keygen(keys):
    for public, _private, fp in keys.values():
        assert ps.fingerprint(public.split()[1]) == fp
        assert ps.parse_public_key(public + " a comment")["fingerprint"] == fp
    with pytest.raises(ps.SshTrustError):
        ps.parse_public_key("ssh-rsa " + keys["pfn1"][0].split()[1])  # type does not match the blob
    with pytest.raises(ps.SshTrustError):
        ps.parse_public_key("ssh-ed25519 not*base64")


def test_host_tokens_and_patterns():
    assert ps.host_token("pfn1", 22) == "pfn1"
    assert ps.host_token("pfn1", 2222) == "[pfn1]:2222"
    assert ps.patterns_match(["*.cluster.test", "!bad.cluster.test"], "PFN1.cluster.test")
    assert not ps.patterns_match(["*.cluster.test", "!bad.cluster.test"], "bad.cluster.test")


def test_sshd_host_key_paths_follow_includes_until_match(tmp_path):
    etc = tmp_path / "etc" / "ssh"
    (etc / "sshd_config.d").mkdir(parents=True)
    (etc / "sshd_config").write_text(textwrap.dedent("""\
        Include /etc/ssh/sshd_config.d/*.conf
        HostKey /etc/ssh/ssh_host_ed25519_key
        hostkey=/srv/keys/rsa_key
        Match User backup
            HostKey /never/read
        """))
    (etc / "sshd_config.d" / "10-extra.conf").write_text("HostKey /etc/ssh/extra_key\n")
    assert psd.sshd_host_key_paths(str(tmp_path)) == ["/etc/ssh/extra_key", "/etc/ssh/ssh_host_ed25519_key",
                                                     "/srv/keys/rsa_key"]
    (etc / "sshd_config").write_text("Port 22\n")
    assert psd.sshd_host_key_paths(str(tmp_path)) == list(psd.DEFAULT_HOST_KEYS)


# ----------------------------------------------------------------------------
# ssh_mesh: classification of real ssh messages (OpenSSH 9.2)

UNKNOWN = ("No ED25519 host key is known for pfn2 and you have requested strict checking.\n"
           "Host key verification failed.\n")
CHANGED = textwrap.dedent("""\
    @@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
    @    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @
    @@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
    IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!
    Someone could be eavesdropping on you right now (man-in-the-middle attack)!
    It is also possible that a host key has just been changed.
    The fingerprint for the ED25519 key sent by the remote host is
    SHA256:fUa/fqJnEiaXctTa9x4o/GHfpTYL1WrhGoelAiJdjik.
    Please contact your system administrator.
    Add correct host key in /etc/ssh/ssh_known_hosts to get rid of this message.
    Offending ED25519 key in /etc/ssh/ssh_known_hosts:3
      remove with:
      ssh-keygen -f "/etc/ssh/ssh_known_hosts" -R "pfn2"
    Host key for pfn2 has changed and you have requested strict checking.
    Host key verification failed.
    """)
SAMPLES = [
    (0, "", False, "ok"),
    (255, UNKNOWN, False, "host_key_unknown"),
    (255, CHANGED, False, "host_key_changed"),
    (255, "root@pfn2: Permission denied (publickey).\n", False, "auth_denied"),
    (255, "ssh: connect to host 198.18.7.2 port 22: Connection refused\n", False, "refused"),
    (255, "ssh: connect to host 198.18.7.2 port 22: Connection timed out\n", False, "timeout"),
    (255, "Connection timed out during banner exchange\n", False, "timeout"),
    (124, "", True, "timeout"),
    (255, "ssh: Could not resolve hostname pfn9: Name or service not known\n", False, "dns"),
    (255, "ssh: Could not resolve hostname pfn9: Temporary failure in name resolution\n", False, "dns"),
    (255, "ssh: connect to host 198.18.7.2 port 22: No route to host\n", False, "unreachable"),
    (255, "kex_exchange_identification: read: Connection reset by peer\n", False, "error"),
]


def test_parse_pdsh_attributes_a_name_pdsh_cannot_resolve():
    ok, errors = psm.parse_pdsh(["pfn2", "pfn9"], "pfn2: Thu Jan  1 00:00:00 UTC 2026\n",
                               'pdsh@pfn1: gethostbyname("pfn9") failed\n')
    assert ok == ["pfn2"] and list(errors) == ["pfn9"]
    assert psm.classify_ssh(255, errors["pfn9"][0])[0] == "dns"


def test_the_pdsh_leg_forces_host_key_checking_whatever_ssh_config_says():
    """pdsh runs ssh with PDSH_SSH_ARGS_APPEND: StrictHostKeyChecking=yes there, as for every audit ssh."""
    seen = {}

    class Ops(object):
        def run(self, argv, timeout=20.0, env=None, cwd=None, data=None, user=None):
            seen.update(argv=argv, env=env)
            return 0, "pfn2: Thu Jan  1 00:00:00 UTC 2026\n", ""

    result = psm._pdsh(Ops(), "/usr/bin/pdsh", ["pfn2"], "", 5, 20)  # pylint: disable=protected-access
    assert result["ok"] == ["pfn2"] and seen["env"]["PDSH_RCMD_TYPE"] == "ssh"
    options = seen["env"]["PDSH_SSH_ARGS_APPEND"].split()
    assert "StrictHostKeyChecking=yes" in options and "BatchMode=yes" in options
    assert options[options.index("StrictHostKeyChecking=yes") - 1] == "-o"


@pytest.mark.parametrize("rc,stderr,timed_out,status", SAMPLES)
def test_classify_ssh_messages(rc, stderr, timed_out, status):
    assert psm.classify_ssh(rc, stderr, timed_out)[0] == status


def test_classify_changed_key_details():
    status, detail = psm.classify_ssh(255, CHANGED)
    assert status == "host_key_changed"
    assert detail == {"key_type": "ED25519", "new_fingerprint": "SHA256:fUa/fqJnEiaXctTa9x4o/GHfpTYL1WrhGoelAiJdjik",
                      "offending_file": "/etc/ssh/ssh_known_hosts", "offending_line": 3}
    assert psm.host_key_verified("auth_denied") and not psm.host_key_verified("host_key_unknown")


# ----------------------------------------------------------------------------
# The role: client drop-in (rendered by the capability, written by the role) and the
# defaults/argument_specs mirror

ROLE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    "roles", "ssh_trust")


def render_dropin(**overrides):
    values = {"names": ["pfn%d" % i for i in range(1, 21)] + ["198.19.7.1"], "cluster_key": True,
              "key_name": "id_ed25519_cluster", "relaxed": False}
    values.update(overrides)
    return ssh_trust_plan.render_dropin(**values)


def test_dropin_scopes_settings_to_cluster_names_only():
    text = render_dropin()
    hosts = [line.split()[1:] for line in text.splitlines() if line.startswith("Host ")]
    assert sum(hosts, []) == ["pfn%d" % i for i in range(1, 21)] + ["198.19.7.1"]
    assert "*" not in sum(hosts, [])
    assert text.count("IdentityFile ~/.ssh/id_ed25519_cluster") == len(hosts)
    assert "StrictHostKeyChecking" not in text
    relaxed = render_dropin(relaxed=True, cluster_key=False)
    assert relaxed.count("    StrictHostKeyChecking no") == len(hosts) and "IdentityFile" not in relaxed
    assert "Host *" not in relaxed


def test_defaults_are_mirrored_by_argument_specs():
    import yaml  # pylint: disable=import-outside-toplevel
    with open(os.path.join(ROLE, "defaults", "main.yml"), encoding="utf-8") as handle:
        defaults = yaml.safe_load(handle)
    with open(os.path.join(ROLE, "meta", "argument_specs.yml"), encoding="utf-8") as handle:
        options = yaml.safe_load(handle)["argument_specs"]["main"]["options"]
    assert set(defaults) == set(options)
    assert "SECURITY COST" in " ".join(options["ssh_trust_strict_host_key_checking_no"]["description"])
    assert defaults["ssh_trust_strict_host_key_checking_no"] is False and defaults["ssh_trust_cluster_key"] is False
