"""The preflight_summary callback at the end of real runs on localhost: from ansible-playbook, and
under ansible-runner (which replaces the stdout callback and ANSIBLE_CALLBACK_PLUGINS)."""

import json
import os
import re
import socket
import subprocess
import sys

import pytest

from playbook import ROOT, run_playbook

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
BIN = os.path.dirname(sys.executable)


def free_port():
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return sock.getsockname()[1]


def plain(text):
    """Output without colour codes (ansible colours the rows by node status)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def check_matrix(output, label):
    """The summary block in ``output``: every line there, and it agrees with the verdict file it names."""
    lines = plain(output).splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("%s SUMMARY: " % label))
    at = next(index for index in range(start + 1, start + 3) if lines[index].startswith("node"))
    # A header split at its first underscore: the word above a column starts where the column does.
    above = {match.start(): match.group(0) for match in re.finditer(r"\S+", lines[at - 1])} if at > start + 1 else {}
    header = [above[match.start()] + "_" + match.group(0) if match.start() in above else match.group(0)
              for match in re.finditer(r"\S+", lines[at])]
    assert header[:2] == ["node", "status"]
    path = next(line for line in lines[start:] if line.startswith("verdict: ")).split(" ", 1)[1]
    with open(path) as handle:
        verdict = json.load(handle)
    assert lines[start] == "%s SUMMARY: %s, %d/%d nodes healthy" % (
        label, verdict["status"].upper(), len(verdict["healthy_hosts"]), len(verdict["hosts"]))
    left_out = next((line.split(": ", 1)[1].split(", ") for line in lines[start:]
                     if line.startswith("not applicable on any node (not shown): ")), [])
    assert set(header[2:]) | set(left_out) == {name.split(".")[0] for name in verdict["nodes"]["localhost"]["checks"]}
    localhost = lines[at + 1].split()
    assert localhost[:2] == ["localhost", verdict["nodes"]["localhost"]["status"]]
    assert all(cell in ("pass", "warn", "fail", "n/a", "unverified") for cell in localhost[2:])
    assert "run directory: %s" % verdict["run_dir"] in lines
    return lines[start:], verdict


def test_preflight_prints_the_matrix_allreduce_and_run_dir(tmp_path):
    results = str(tmp_path / "results")
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""), ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    done = subprocess.run([os.path.join(BIN, "ansible-playbook"), "preflight.yml",
                           "-e", "preflight_results_dir=%s" % results, "-e", "preflight_master_port=%d" % free_port()],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=540, check=False)
    # Whatever the verdict (a failing one is when the matrix matters most), the summary follows it.
    block, verdict = check_matrix(done.stdout, "PREFLIGHT")
    assert (done.returncode == 0) == (verdict["status"] == "pass"), done.stdout[-3000:] + done.stderr[-2000:]
    gate = verdict["allreduce"]
    expected = (r"all-reduce: skipped \(" if gate["status"] == "skipped" else
                r"all-reduce: %s, world size 2 of 2 planned, backend gloo, busbw [0-9.]+ GB/s" % gate["status"])
    assert any(re.match(expected, line) for line in block), block
    # After the recap: the last thing an operator sees.
    assert done.stdout.index("PLAY RECAP") < done.stdout.index("PREFLIGHT SUMMARY")


def test_summary_survives_ansible_runner(tmp_path):
    """ansible-runner's own stdout callback and callback path; the project's ansible.cfg and playbook dir."""
    result = run_playbook(tmp_path, playbook="healthcheck.yml")
    block, verdict = check_matrix(result.stdout, "HEALTH CHECK")
    assert (result.rc == 0) == (verdict["status"] == "pass"), result.stdout[-3000:]
    assert "all-reduce: not part of this playbook" in block
    assert os.path.basename(block[-1]) == "healthcheck.json"
    assert verdict["run_dir"].startswith(result.results_dir)
