"""The README's main command on a machine as fresh as a new Debian install: no sshd configuration
(an empty /etc/ssh), no gdb, pdsh or nmap.  What the node lacks is a finding with a fix; the
embedded default (one node, no peers) still passes."""

import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HIDDEN = ("gdb", "pdsh", "nmap", "sshd")
# Runs in a private mount namespace: the mounts vanish with it, nothing on this machine changes.
FRESH = r"""
set -e
mount -t tmpfs -o size=1m fresh-etc-ssh /etc/ssh
for program in "$@"; do
  for path in /usr/bin/$program /usr/sbin/$program; do
    [ -e "$path" ] && mount --bind "$BLANK" "$path"
  done
done
exec ansible-playbook preflight.yml -i inventory -e "preflight_results_dir=$RESULTS"
"""


def _reason():
    if os.geteuid() != 0:
        return "needs root for a private mount namespace"
    if not shutil.which("unshare"):
        return "unshare is not installed"
    return None


@pytest.mark.skipif(_reason() is not None, reason=str(_reason()))
def test_main_command_passes_without_sshd_config_gdb_pdsh_or_nmap(tmp_path):
    blank = tmp_path / "blank"
    blank.write_text("")
    blank.chmod(0o644)
    results = tmp_path / "results"
    env = dict(os.environ, BLANK=str(blank), RESULTS=str(results),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
               ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", FRESH, "fresh"]
                          + list(HIDDEN), cwd=ROOT, env=env, capture_output=True, text=True, timeout=540,
                          check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "PREFLIGHT PASS" in output and "Traceback" not in output
    with open(results / "latest" / "verdict.json", encoding="utf-8") as handle:
        verdict = json.load(handle)
    checks = verdict["nodes"]["localhost"]["checks"]
    assert verdict["status"] == "pass" and verdict["healthy_hosts"] == ["localhost"]
    assert checks["ssh_trust.peers"]["status"] == "not_applicable"
    for program in ("gdb", "pdsh", "nmap"):
        tool = checks["debug_tools.tool_%s" % program]
        assert tool["status"] == "warn" and program in tool["found"] and "bringup.yml" in tool["fix"], tool
    assert not [name for name in checks if name.endswith(".error") or name.endswith(".no_result")]
    assert verdict["allreduce"]["status"] == "pass" and verdict["allreduce"]["world_size"] == 2
