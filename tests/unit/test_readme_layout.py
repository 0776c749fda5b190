"""The layout README.md's "The first five minutes" tells an operator to make (tests/readme_steps.py reads its
commands at test time): the cluster's inventory copied from the example where the embedded default never reads it,
and the profile and group_vars ``baseline`` writes beside it, checked with ``ansible-inventory --graph`` on exactly
that layout.  Neither swallows the other: the default is this machine alone, the cluster is its nodes alone."""

import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from cluster_preflight.cli import baseline_wire
from cluster_preflight.capabilities.profile import known_good as profiles
from readme_steps import ROOT, inventory_of, readme_steps

COPIED = ("ansible.cfg", "inventory", "inventory_plugins", "clusters/example")


def graph(root, *args):
    """``ansible-inventory --graph`` run in ``root`` with its ansible.cfg: ``(stdout, stderr)``."""
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-inventory"), "--graph"] + list(args),
                          cwd=str(root), capture_output=True, text=True, timeout=120, check=True,
                          env=dict(os.environ, ANSIBLE_CONFIG=str(root / "ansible.cfg")))
    return done.stdout, done.stderr


def members(text, group="cluster"):
    """The hosts under ``@group:`` of a graph (nested groups included), without the tree's drawing."""
    hosts, inside, depth = [], False, 0
    for line in text.splitlines():
        prefix = re.match(r"^[\s|]*(?:--)?", line).group(0)
        name, indent = line[len(prefix):].strip(), len(prefix)
        if name == "@%s:" % group:
            inside, depth = True, indent
            continue
        if inside and indent <= depth:
            break
        if inside and not name.startswith("@"):
            hosts.append(name)
    return hosts


@pytest.fixture
def layout(tmp_path):
    """A copy of the project's inventory files, then the README's step 2 copy, then what step 5's baseline writes."""
    for item in COPIED:
        source, target = os.path.join(ROOT, item), tmp_path / item
        if os.path.isdir(source):
            shutil.copytree(source, str(target))
        else:
            shutil.copy(source, str(target))
    steps = readme_steps()
    copy = [command for command in steps[2] if command.startswith("cp ")]
    assert copy, "README step 2 no longer copies the example: %r" % steps[2]
    subprocess.run(["bash", "-c", copy[0]], cwd=str(tmp_path), check=True, timeout=30)
    inventory = tmp_path / inventory_of(steps[2])
    assert inventory.is_file(), "README step 2's copy does not give %s" % inventory
    # What `baseline -i <that inventory>` writes (step 5): the profile beside it, the group pointed at it.
    profile = inventory.parent / "profiles" / "cluster.yml"
    profile.parent.mkdir()
    profile.write_text(profiles.dump({"torch.version": "2.13.0", "allreduce.busbw_gbps": 0.5}, "cluster",
                                     "/results/x/verdict.json", ["gpu-node-1", "gpu-node-2"], "2026-11-26T00:00:00Z"))
    assert baseline_wire.wire(str(inventory), "cluster", str(profile))[0] == "written"
    return tmp_path, inventory


def test_the_default_inventory_is_this_machine_alone_whatever_sits_beside_it(layout):
    root, _inventory = layout
    # An operator's file put where the old README said (inventory/cluster.yml) is not read either.
    shutil.copy(str(root / "clusters" / "example" / "hosts.yml"), str(root / "inventory" / "cluster.yml"))
    out, err = graph(root)
    assert members(out) == ["localhost"]
    assert "[WARNING]" not in err, err


def test_the_cluster_inventory_is_its_nodes_alone_and_its_profile_is_no_inventory(layout):
    root, inventory = layout
    out, err = graph(root, "-i", str(inventory.relative_to(root)))
    assert members(out) == ["gpu-node-1", "gpu-node-2"]
    assert "localhost" not in out and "@fields" not in out and "profile" not in out
    assert "[WARNING]" not in err, err
    shown = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-inventory"), "-i", str(inventory),
                            "--host", "gpu-node-1"], capture_output=True, text=True, timeout=120, check=True,
                           env=dict(os.environ, ANSIBLE_CONFIG=str(root / "ansible.cfg")))
    assert yaml.safe_load(shown.stdout)["profile_file"] == "{{ inventory_dir }}/profiles/cluster.yml"


def test_the_readme_steps_are_commands_from_the_repository_root():
    steps = readme_steps()
    assert sorted(steps) == [1, 2, 3, 4, 5, 6]
    inventory = inventory_of(steps[2])
    for number in (2, 3, 4, 5):
        assert steps[number], "README step %d has no command block" % number
        for command in steps[number]:
            assert "StrictHostKeyChecking" not in command
            if " -i " in command:
                assert inventory_of([command]) == inventory, command
    assert os.path.isdir(os.path.join(ROOT, os.path.dirname(steps[2][0].split()[-2])))
