"""The slurm_nodes inventory plugin (inventory_plugins/slurm_nodes.py) and inventory/slurm.yml.

No Slurm here: the allocation is SLURM_JOB_NODELIST, and sinfo is a stand-in script on PATH that
records its arguments.
"""

import json
import os
import subprocess
import sys

import pytest
from ansible.errors import AnsibleParserError
from ansible.inventory.data import InventoryData
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import inventory_loader

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
inventory_loader.add_directory(os.path.join(ROOT, "inventory_plugins"))
slurm_nodes = sys.modules[type(inventory_loader.get("slurm_nodes")).__module__]

CASES = [
    ("gpu01", ["gpu01"]),
    ("gpu[01-03]", ["gpu01", "gpu02", "gpu03"]),
    ("node-[1-4,8]", ["node-1", "node-2", "node-3", "node-4", "node-8"]),
    ("gpu[01-03],cpu[1-2]", ["gpu01", "gpu02", "gpu03", "cpu1", "cpu2"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("gpu[098-101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),
    ("a[1-2],b,a1", ["a1", "a2", "b"]),
    (" gpu[1-2]\n", ["gpu1", "gpu2"]),
    ("", []),
]


@pytest.mark.parametrize("nodelist, names", CASES)
def test_expand(nodelist, names):
    assert slurm_nodes.expand(nodelist) == names


@pytest.mark.parametrize("nodelist", ["gpu[01-", "gpu[3-1]", "gpu[a-b]"])
def test_expand_refuses_a_bad_list_naming_it(nodelist):
    with pytest.raises(ValueError, match="is not a Slurm node list"):
        slurm_nodes.expand(nodelist)


@pytest.mark.parametrize("name, accepted", [
    ("slurm.yml", True), ("slurm.yaml", True), ("lab.slurm.yml", True), ("lab.slurm.yaml", True),
    ("hosts.yml", False), ("slurm.ini", False), ("myslurm.yml", False), ("slurm.yml.orig", False),
])
def test_verify_file_accepts_only_slurm_names(tmp_path, name, accepted):
    path = tmp_path / name
    path.write_text("plugin: slurm_nodes\n")
    assert inventory_loader.get("slurm_nodes").verify_file(str(path)) is accepted


def test_verify_file_refuses_a_missing_file(tmp_path):
    assert not inventory_loader.get("slurm_nodes").verify_file(str(tmp_path / "slurm.yml"))


@pytest.fixture
def slurm_env(monkeypatch, tmp_path):
    """No Slurm variables, and a PATH without sinfo unless a test adds the stand-in."""
    for name in slurm_nodes.ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    return monkeypatch


def fake_sinfo(tmp_path, lines="gpu01\ngpu02\ngpu02\n", rc=0, sleep=0):
    """An ``sinfo`` that records its argv in ``sinfo.args`` and prints ``lines`` (a node per
    partition, so a node may come twice)."""
    directory = tmp_path / "bin"
    directory.mkdir(exist_ok=True)
    script = directory / "sinfo"
    script.write_text("#!/bin/sh\necho \"$@\" > %s\n/bin/sleep %s\nprintf '%s'\n%s\n" % (
        tmp_path / "sinfo.args", sleep, lines, "echo 'slurm_load_partitions: Unable to contact slurm "
        "controller' >&2; exit %d" % rc if rc else "exit 0"))
    script.chmod(0o755)
    return str(directory)


def parse(tmp_path, config="plugin: slurm_nodes\n", inventory=None, name="slurm.yml"):
    path = tmp_path / name
    path.write_text(config)
    inventory = inventory or InventoryData()
    inventory_loader.get("slurm_nodes").parse(inventory, DataLoader(), str(path), cache=False)
    return inventory


def members(inventory, group="cluster"):
    found = inventory.groups.get(group)
    return [host.name for host in found.get_hosts()] if found else None


def test_job_nodelist_goes_into_cluster(slurm_env, tmp_path):
    slurm_env.setenv("SLURM_JOB_NODELIST", "gpu[01-03]")
    inventory = parse(tmp_path)
    assert members(inventory) == ["gpu01", "gpu02", "gpu03"]
    inventory.reconcile_inventory()
    assert "cluster" in [group.name for group in inventory.groups["all"].child_groups]


def test_sources_in_order(slurm_env, tmp_path):
    slurm_env.setenv("PATH", fake_sinfo(tmp_path, "sinfo1\n"))
    assert members(parse(tmp_path)) == ["sinfo1"]
    slurm_env.setenv("SLURM_NODELIST", "old[1-2]")
    assert members(parse(tmp_path)) == ["old1", "old2"]
    slurm_env.setenv("SLURM_JOB_NODELIST", "job[1-2]")
    assert members(parse(tmp_path)) == ["job1", "job2"]
    assert members(parse(tmp_path, "plugin: slurm_nodes\nnodelist: opt[7-8]\n")) == ["opt7", "opt8"]


def test_nothing_at_all_adds_nothing(slurm_env, tmp_path):
    inventory = parse(tmp_path)
    assert "cluster" not in inventory.groups
    assert list(inventory.hosts) == []


def test_sinfo_filters_and_duplicates(slurm_env, tmp_path):
    slurm_env.setenv("PATH", fake_sinfo(tmp_path))
    inventory = parse(tmp_path, "plugin: slurm_nodes\ngroup: gpus\npartitions: [a100, h100]\nstates: [idle, mix]\n")
    assert members(inventory, "gpus") == ["gpu01", "gpu02"]
    assert (tmp_path / "sinfo.args").read_text().split() == ["-h", "-N", "-o", "%N", "-p", "a100,h100",
                                                             "-t", "idle,mix"]


def test_sinfo_failure_names_the_command_and_its_error(slurm_env, tmp_path):
    slurm_env.setenv("PATH", fake_sinfo(tmp_path, rc=1))
    with pytest.raises(AnsibleParserError, match="sinfo -h -N -o %N failed with rc 1: slurm_load_partitions"):
        parse(tmp_path)


def test_sinfo_that_hangs_is_bounded(slurm_env, tmp_path):
    slurm_env.setenv("PATH", fake_sinfo(tmp_path, sleep=5))
    with pytest.raises(AnsibleParserError, match="took more than 1 s"):
        parse(tmp_path, "plugin: slurm_nodes\nsinfo_timeout: 1\n")


def test_bad_nodelist_names_its_source(slurm_env, tmp_path):
    slurm_env.setenv("SLURM_JOB_NODELIST", "gpu[01-")
    with pytest.raises(AnsibleParserError, match=r"'gpu\[01-' is not a Slurm node list.*SLURM_JOB_NODELIST"):
        parse(tmp_path)


def test_a_group_filled_before_is_left_alone_unless_merge(slurm_env, tmp_path):
    slurm_env.setenv("SLURM_JOB_NODELIST", "gpu[01-02]")
    before = InventoryData()
    before.add_group("cluster")
    before.add_host("localhost", group="cluster")
    assert members(parse(tmp_path, inventory=before)) == ["localhost"]
    merged = parse(tmp_path, "plugin: slurm_nodes\nmerge: true\n", inventory=before)
    assert members(merged) == ["localhost", "gpu01", "gpu02"]


def test_constructed_options_set_variables_and_groups(slurm_env, tmp_path):
    slurm_env.setenv("SLURM_JOB_NODELIST", "rack[1-2]-n01")
    inventory = parse(tmp_path, "plugin: slurm_nodes\ncompose:\n  preflight_training_python: \"'/opt/venv/bin/python'\"\n"
                                "keyed_groups:\n  - key: inventory_hostname[:5]\n    prefix: ''\n    separator: ''\n")
    assert inventory.get_host("rack1-n01").vars["preflight_training_python"] == "/opt/venv/bin/python"
    assert members(inventory, "rack2") == ["rack2-n01"]


def ansible_inventory(*args, env=None):
    """``ansible-inventory --list`` from the project root with the project's ansible.cfg."""
    environ = {key: value for key, value in os.environ.items() if key not in slurm_nodes.ENVIRONMENT}
    environ.update({"ANSIBLE_CONFIG": os.path.join(ROOT, "ansible.cfg"), "PATH": BIN + os.pathsep + "/usr/bin:/bin"})
    environ.update(env or {})
    done = subprocess.run([os.path.join(BIN, "ansible-inventory"), "--list"] + list(args), cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_ansible_inventory_with_job_nodelist():
    listed, stderr = ansible_inventory("-i", "inventory/slurm.yml", env={"SLURM_JOB_NODELIST": "gpu[01-03]"})
    assert listed["cluster"]["hosts"] == ["gpu01", "gpu02", "gpu03"]
    assert "cluster" in listed["all"]["children"]
    assert "WARNING" not in stderr


def test_default_inventory_is_unchanged_by_slurm(tmp_path):
    """The default directory parses inventory/slurm.yml too: localhost alone, quietly, with or without Slurm."""
    plain, stderr = ansible_inventory()
    assert plain["cluster"]["hosts"] == ["localhost"] and stderr == ""
    assert sorted(plain["_meta"]["hostvars"]) == ["localhost"]
    inside, stderr = ansible_inventory(env={"SLURM_JOB_NODELIST": "gpu[01-03]",
                                            "PATH": fake_sinfo(tmp_path) + os.pathsep + BIN + ":/usr/bin:/bin"})
    assert inside == plain and stderr == ""
    assert not (tmp_path / "sinfo.args").exists(), "sinfo is not even asked"
