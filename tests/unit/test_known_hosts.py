"""``python -m cluster_preflight known-hosts`` (cluster_preflight/cli/known_hosts.py): the nodes' host keys scanned,
shown with their fingerprints, recorded only when confirmed, never replacing a key already known."""

import base64
import hashlib
import os
import subprocess

import pytest

from cluster_preflight.cli import main as cli, known_hosts

KEY1 = base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + b"1" * 32).decode()
KEY2 = base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + b"2" * 32).decode()


@pytest.fixture
def inventory(tmp_path):
    path = tmp_path / "hosts.yml"
    path.write_text("cluster:\n  hosts:\n    gpu-node-1: {ansible_host: 198.18.9.1}\n"
                    "    gpu-node-2: {ansible_host: 198.18.9.2, ansible_port: 2222}\n")
    return str(path)


@pytest.fixture
def keys(monkeypatch):
    """The keys each address presents (what ssh-keyscan would print)."""
    presented = {"198.18.9.1": [("ssh-ed25519", KEY1)], "198.18.9.2": [("ssh-ed25519", KEY2)]}
    monkeypatch.setattr(known_hosts, "scan", lambda address, port: presented.get(address, "no answer"))
    return presented


def run(inventory, path, answer, capsys):
    args = cli.build_parser().parse_args(["known-hosts", "-i", inventory, "--known-hosts", str(path)])
    asked = []
    code = known_hosts.run(args, lambda text, stream=None: print(text), ask=lambda prompt: asked.append(prompt) or answer)
    return code, capsys.readouterr().out, asked


def test_fingerprints_are_shown_and_recorded_only_when_confirmed(tmp_path, inventory, keys, capsys):
    path = tmp_path / "ssh" / "known_hosts"
    code, out, asked = run(inventory, path, "no", capsys)
    assert code == known_hosts.EXIT_DECLINED and not path.exists()
    expected = "SHA256:" + base64.b64encode(hashlib.sha256(base64.b64decode(KEY1)).digest()).decode().rstrip("=")
    assert expected in out and "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub" in out
    assert asked == ["Record these 2 keys in %s? [yes/no] " % path]
    code, out, _asked = run(inventory, path, "yes\n", capsys)
    assert code == known_hosts.EXIT_RECORDED and "recorded 2 keys of 2 nodes" in out
    assert path.read_text() == ("198.18.9.1,gpu-node-1 ssh-ed25519 %s\n[198.18.9.2]:2222,[gpu-node-2]:2222 ssh-ed25519 "
                                "%s\n" % (KEY1, KEY2))
    assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(path.parent.stat().st_mode & 0o777) == "0o700"
    # ssh itself finds them there, under the address Ansible connects to.
    found = subprocess.run(["ssh-keygen", "-F", "[198.18.9.2]:2222", "-f", str(path)], capture_output=True, text=True,
                           check=False)
    assert KEY2 in found.stdout
    code, out, asked = run(inventory, path, "", capsys)
    assert code == 0 and asked == [] and "nothing new to record" in out


def test_a_key_that_differs_from_the_known_one_is_never_replaced(tmp_path, inventory, keys, capsys):
    path = tmp_path / "known_hosts"
    path.write_text("# kept\n198.18.9.1 ssh-ed25519 %s\n" % KEY2)
    code, out, asked = run(inventory, path, "yes", capsys)
    assert code == known_hosts.EXIT_CHANGED and asked == []
    assert "CHANGED gpu-node-1 (198.18.9.1)" in out
    assert path.read_text() == "# kept\n198.18.9.1 ssh-ed25519 %s\n" % KEY2


def test_a_node_that_does_not_answer_is_named_and_the_others_recorded(tmp_path, inventory, keys, capsys):
    del keys["198.18.9.2"]
    path = tmp_path / "known_hosts"
    code, out, _asked = run(inventory, path, "y", capsys)
    assert code == known_hosts.EXIT_UNANSWERED and "NO ANSWER gpu-node-2: no answer" in out
    assert path.read_text() == "198.18.9.1,gpu-node-1 ssh-ed25519 %s\n" % KEY1


def test_the_scan_is_bounded_and_says_why_nothing_came(monkeypatch):
    seen = {}

    def fake_run(argv, **kwargs):
        seen.update(argv=argv, timeout=kwargs["timeout"])
        return subprocess.CompletedProcess(argv, 1, "", "connect to 198.18.9.9 port 22: Connection refused\n")

    assert known_hosts.scan("198.18.9.9", 22, run=fake_run) == (
        "no host key from 198.18.9.9 (connect to 198.18.9.9 port 22: Connection refused)")
    assert seen["argv"][:3] == ["ssh-keyscan", "-T", "5"] and seen["timeout"] == 25
