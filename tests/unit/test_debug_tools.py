"""The debug_tools capability: validate, read (fake os-release and bin dirs, FakeOps), decide (tables), the role."""

import functools
import glob
import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from preflight_node import checks as preflight_checks
from preflight_node.capabilities import debug_tools as node_tools
from cluster_preflight.capabilities import debug_tools as tools
from fake_ops import FakeOps
from capability_helpers import (ROOT, assert_contract as check_contract, assert_table, capability_under_test,
                                role_settings, role_yaml, switched_off_cases, typed_settings)

ROLE_NAME = "debug_tools"
ROLE, HOST, NODE = capability_under_test(ROLE_NAME, "node3", "198.18.0.3")

DEBIAN = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\nID=debian\n'
UBUNTU = 'NAME="Ubuntu"\nVERSION_ID="22.04"\nID=ubuntu\nID_LIKE=debian\n'
ROCKY = 'NAME="Rocky Linux"\nVERSION_ID="9.3"\nID="rocky"\nID_LIKE="rhel centos fedora"\n'
AMAZON = 'NAME="Amazon Linux"\nID="amzn"\nID_LIKE="centos rhel fedora"\nVERSION_ID="2"\n'
SLES = 'NAME="SLES"\nID="sles"\nID_LIKE="suse"\n'
GENTOO = 'NAME=Gentoo\nID=gentoo\nPRETTY_NAME="Gentoo Linux"\n'


load_yaml = functools.partial(role_yaml, ROLE_NAME)


# The role's defaults, typed, with overrides: what preflight_settings hands a capability.
settings = functools.partial(role_settings, ROLE_NAME)


def executable(path, text="#!/bin/sh\nexit 0\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


class Node(object):
    """A sandbox node: an os-release file and bin directories under tmp_path."""

    def __init__(self, tmp_path, os_release=DEBIAN, programs=("gdb", "strace", "pdsh", "nmap", "py-spy")):
        self.tmp = tmp_path
        self.os_release = tmp_path / "etc" / "os-release"
        self.fallback = tmp_path / "usr" / "lib" / "os-release"
        self.usr_bin = tmp_path / "usr" / "bin"
        self.local_bin = tmp_path / "usr" / "local" / "bin"
        self.venv = tmp_path / "opt" / "preflight-tools"
        self.usr_bin.mkdir(parents=True)
        self.local_bin.mkdir(parents=True)
        if os_release is not None:
            self.os_release.parent.mkdir(parents=True)
            self.os_release.write_text(os_release)
        for program in programs:
            if program == "py-spy":
                executable(self.venv / "bin" / "py-spy")
                os.symlink(str(self.venv / "bin" / "py-spy"), str(self.local_bin / "py-spy"))
            else:
                executable(self.usr_bin / program)

    def settings(self, **overrides):
        values = dict(debug_tools_search_paths=[str(self.local_bin), str(self.usr_bin)],
                      debug_tools_pyspy_venv=str(self.venv), debug_tools_pyspy_link=str(self.local_bin / "py-spy"))
        values.update(overrides)
        return settings(**values)

    def read(self, **overrides):
        wanted = self.settings(**overrides)
        args = tools.read_args(wanted, NODE)
        if args is None:
            return None, wanted
        args["os_release"] = [str(self.os_release), str(self.fallback)]
        ops = FakeOps()
        facts = node_tools.read(args, ops)
        assert ops.calls == []  # file reads only
        return json.loads(json.dumps(facts)), wanted  # facts travel from the node as JSON

    def decide(self, **overrides):
        facts, wanted = self.read(**overrides)
        checks = tools.decide(HOST, facts, wanted)
        assert_contract(checks)
        return checks


# Names inside the contract; every warn/fail has found/expected/fix and names the node.
assert_contract = functools.partial(check_contract, ROLE_NAME, host=HOST)


# --- read --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, family, os_id", [
    (DEBIAN, "Debian", "debian"),
    (UBUNTU, "Debian", "ubuntu"),
    (ROCKY, "RedHat", "rocky"),
    (AMAZON, "RedHat", "amzn"),
    (SLES, "Suse", "sles"),
    (GENTOO, "other", "gentoo"),
    ("", "other", ""),
])
def test_os_family_from_os_release(tmp_path, text, family, os_id):
    facts, _wanted = Node(tmp_path, os_release=text).read()
    assert facts["os"]["family"] == family and facts["os"]["id"] == os_id
    assert facts["os"]["error"] is None


def test_os_release_quotes_and_escapes():
    values = node_tools.parse_os_release('A="x \\"y\\""\nB=\'single $z\'\n# comment\nC=plain\nbroken line\n')
    assert values == {"A": 'x "y"', "B": "single $z", "C": "plain"}


def test_os_release_falls_back_to_usr_lib(tmp_path):
    node = Node(tmp_path, os_release=None)
    node.fallback.parent.mkdir(parents=True, exist_ok=True)
    node.fallback.write_text(ROCKY)
    facts, _wanted = node.read()
    assert facts["os"]["family"] == "RedHat" and facts["os"]["path"] == str(node.fallback)


def test_no_os_release_is_a_fact_and_a_warning(tmp_path):
    node = Node(tmp_path, os_release=None)
    facts, _wanted = node.read()
    assert facts["os"]["family"] == "other" and "does not exist" in facts["os"]["error"]
    checks = node.decide()
    assert checks["packages"]["status"] == "warn"
    assert "the OS is unknown" in checks["packages"]["found"] and HOST in checks["packages"]["found"]
    assert set(checks) == {"packages", "tool_py_spy"}


def test_unreadable_os_release_is_a_fact(tmp_path):
    node = Node(tmp_path, os_release=None)
    node.os_release.mkdir(parents=True)  # a directory: open() fails
    facts, _wanted = node.read()
    assert "cannot read" in facts["os"]["error"]


def test_read_finds_programs_and_says_why_one_is_unusable(tmp_path):
    node = Node(tmp_path, programs=("gdb",))
    (node.usr_bin / "strace").write_text("not executable")
    os.symlink(str(node.venv / "bin" / "py-spy"), str(node.local_bin / "py-spy"))  # dangling: no venv
    facts, _wanted = node.read()
    programs = facts["programs"]
    assert sorted(programs) == ["gdb", "nmap", "pdsh", "py-spy", "strace"]  # every family's, plus py-spy
    assert programs["gdb"] == {"path": str(node.usr_bin / "gdb"), "unusable": []}
    assert programs["strace"]["path"] is None and "not executable" in programs["strace"]["unusable"][0]
    assert programs["py-spy"]["path"] is None and "which does not exist" in programs["py-spy"]["unusable"][0]
    assert facts["venv_program"] == {"path": str(node.venv / "bin" / "py-spy"), "exists": False}


def test_read_without_any_search_directory_is_a_fact(tmp_path):
    node = Node(tmp_path, programs=())
    facts, _wanted = node.read(debug_tools_search_paths=[str(tmp_path / "nowhere")])
    assert all(entry["path"] is None for entry in facts["programs"].values())


# --- decide: a table ---------------------------------------------------------------------------------------

CASES = [
    # id, node kwargs, settings, {check: (status, text in found, text in fix)}
    ("debian-all-present", {}, {},
     {"tool_gdb": ("pass", "gdb at ", ""), "tool_strace": ("pass", "", ""), "tool_pdsh": ("pass", "", ""),
      "tool_nmap": ("pass", "", ""), "tool_py_spy": ("pass", "py-spy at ", "")}),
    ("debian-gdb-missing", {"programs": ("strace", "pdsh", "nmap", "py-spy")}, {},
     {"tool_gdb": ("warn", "gdb not found in ", "on node3: apt-get install -y gdb"), "tool_strace": ("pass", "", ""),
      "tool_pdsh": ("pass", "", ""), "tool_nmap": ("pass", "", ""), "tool_py_spy": ("pass", "", "")}),
    ("fail-policy", {"programs": ("gdb", "strace", "nmap", "py-spy")}, {"debug_tools_drift_policy": "fail"},
     {"tool_gdb": ("pass", "", ""), "tool_strace": ("pass", "", ""), "tool_nmap": ("pass", "", ""),
      "tool_pdsh": ("fail", "pdsh not found", "apt-get install -y pdsh"), "tool_py_spy": ("pass", "", "")}),
    ("rocky-pdsh-needs-epel", {"os_release": ROCKY, "programs": ("gdb", "strace", "nmap", "py-spy")}, {},
     {"tool_gdb": ("pass", "", ""), "tool_strace": ("pass", "", ""), "tool_nmap": ("pass", "", ""),
      "tool_pdsh": ("warn", "pdsh not found", "dnf install -y pdsh; on RHEL, Rocky and Alma pdsh comes from EPEL"),
      "tool_py_spy": ("pass", "", "")}),
    ("unknown-family", {"os_release": GENTOO}, {},
     {"packages": ("warn", "no package list for OS family other on node3 (ID=gentoo", "by hand"),
      "tool_py_spy": ("pass", "", "")}),
    ("suse-without-a-list", {"os_release": SLES}, {},
     {"packages": ("warn", "OS family Suse", "set debug_tools_packages.Suse"), "tool_py_spy": ("pass", "", "")}),
    ("binaries-map-a-package", {"programs": ("nc", "py-spy")},
     {"debug_tools_packages": {"Debian": ["netcat-openbsd"]}},
     {"tool_nc": ("pass", "nc at ", ""), "tool_py_spy": ("pass", "", "")}),
    ("pyspy-pip-missing", {"programs": ("gdb",)}, {"debug_tools_packages": {"Debian": ["gdb"]}},
     {"tool_gdb": ("pass", "", ""),
      "tool_py_spy": ("warn", "py-spy not found", "bin/pip install py-spy==0.4.3 && ln -sfn ")}),
    ("pyspy-pip-from-a-wheel-directory", {"programs": ()},
     {"debug_tools_packages": {"Debian": []}, "debug_tools_pyspy_find_links": "/srv/wheels"},
     {"tool_py_spy": ("warn", "", "pip install --no-index --find-links /srv/wheels py-spy==0.4.3")}),
    ("pyspy-pip-from-a-local-index", {"programs": ()},
     {"debug_tools_packages": {"Debian": []}, "debug_tools_pyspy_index_url": "http://mirror/simple",
      "debug_tools_pyspy_version": ""},
     {"tool_py_spy": ("warn", "", "pip install --index-url http://mirror/simple py-spy &&")}),
    ("pyspy-package", {"programs": ()},
     {"debug_tools_packages": {"Debian": []}, "debug_tools_pyspy_method": "package"},
     {"tool_py_spy": ("warn", "py-spy not found", "on node3: apt-get install -y py-spy")}),
    ("pyspy-off", {"programs": ("gdb",)}, {"debug_tools_packages": {"Debian": ["gdb"]}, "debug_tools_pyspy": False},
     {"tool_gdb": ("pass", "", "")}),
    ("pyspy-off-as-text-and-no-packages", {"programs": ()},
     {"debug_tools_packages": {"Debian": []}, "debug_tools_pyspy": "no"},
     {"tools": ("not_applicable", "no debug tools asked for on node3", "")}),
] + switched_off_cases(ROLE_NAME, HOST)


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_decide(tmp_path, case):
    _name, node_kwargs, overrides, expected = case
    checks = Node(tmp_path, **node_kwargs).decide(**overrides)
    assert_table(checks, expected)


def test_missing_pyspy_without_a_local_source_says_what_to_do_offline(tmp_path):
    checks = Node(tmp_path, programs=()).decide(debug_tools_packages={"Debian": []})
    fix = checks["tool_py_spy"]["fix"]
    assert "pip download py-spy==0.4.3" in fix and "debug_tools_pyspy_find_links" in fix
    assert "debug_tools_pyspy_index_url" in fix


def test_pyspy_in_the_venv_but_not_linked(tmp_path):
    node = Node(tmp_path)
    os.unlink(str(node.local_bin / "py-spy"))
    checks = node.decide()
    result = checks["tool_py_spy"]
    assert result["status"] == "warn" and "exists but is not linked" in result["found"]
    assert result["fix"] == "run bringup.yml, or on node3: ln -sfn %s %s" % (
        node.venv / "bin" / "py-spy", node.local_bin / "py-spy")


def test_dangling_link_is_named_in_the_finding(tmp_path):
    node = Node(tmp_path)
    os.unlink(str(node.venv / "bin" / "py-spy"))
    result = node.decide()["tool_py_spy"]
    assert result["status"] == "warn" and "which does not exist" in result["found"]


def test_pyspy_in_the_package_lists_is_checked_once(tmp_path):
    checks = Node(tmp_path).decide(debug_tools_packages={"Debian": ["gdb", "py-spy"]})
    assert sorted(checks) == ["tool_gdb", "tool_py_spy"]
    assert "linked from" in checks["tool_py_spy"]["expected"]


def test_decide_without_facts_is_a_failure_naming_the_node():
    checks = tools.decide(HOST, None, settings())
    assert_contract(checks)
    assert checks["no_facts"]["status"] == "fail"


def test_switched_off_reads_nothing():
    for value in (False, "false", "no", "off"):
        assert tools.read_args(settings(debug_tools_enabled=value), NODE) is None
    assert tools.read_args(settings(debug_tools_enabled="yes"), NODE) is not None


def test_check_names_qualify_in_the_verdict(tmp_path):
    flat = preflight_checks.flatten({tools.CAPABILITY: Node(tmp_path).decide()})
    assert sorted(flat) == ["debug_tools.tool_gdb", "debug_tools.tool_nmap", "debug_tools.tool_pdsh",
                            "debug_tools.tool_py_spy", "debug_tools.tool_strace"]


# --- validate ----------------------------------------------------------------------------------------------


def test_defaults_are_valid():
    assert tools.validate(settings()) == []


@pytest.mark.parametrize("overrides, name, text", [
    ({"debug_tools_packages": {"Debian": "gdb strace"}}, "debug_tools_packages.Debian", "gdb strace"),
    ({"debug_tools_packages": {"Debian": ["gdb", "-oDebug::pkgProblemResolver=1"]}}, "debug_tools_packages.Debian",
     "-oDebug"),
    ({"debug_tools_packages": ["gdb"]}, "debug_tools_packages", "gdb"),
    ({"debug_tools_binaries": {"nmap-ncat": "/usr/bin/nc"}}, "debug_tools_binaries.nmap-ncat", "/usr/bin/nc"),
    ({"debug_tools_search_paths": []}, "debug_tools_search_paths", "[]"),
    ({"debug_tools_search_paths": ["/usr/bin", "bin"]}, "debug_tools_search_paths", "bin"),
    ({"debug_tools_install_timeout": 0}, "debug_tools_install_timeout", "0"),
    ({"debug_tools_package_cache_valid_time": -1}, "debug_tools_package_cache_valid_time", "-1"),
    ({"debug_tools_pyspy_venv": "opt/tools"}, "debug_tools_pyspy_venv", "opt/tools"),
    ({"debug_tools_pyspy_link": "/opt/preflight-tools/bin/py-spy"}, "debug_tools_pyspy_link", "inside the venv"),
    ({"debug_tools_pyspy_python": "python3 -I"}, "debug_tools_pyspy_python", "python3 -I"),
    ({"debug_tools_pyspy_version": ">=0.4"}, "debug_tools_pyspy_version", ">=0.4"),
    ({"debug_tools_pyspy_find_links": "wheels"}, "debug_tools_pyspy_find_links", "wheels"),
    ({"debug_tools_pyspy_index_url": "mirror.local/simple"}, "debug_tools_pyspy_index_url", "mirror.local"),
    ({"debug_tools_pyspy_find_links": "/srv/wheels", "debug_tools_pyspy_index_url": "http://mirror/simple"},
     "debug_tools_pyspy_find_links", "both"),
    ({"debug_tools_pyspy_method": "package", "debug_tools_pyspy_package": ""}, "debug_tools_pyspy_package", "''"),
    ({"debug_tools_pyspy_method": "package", "debug_tools_pyspy_find_links": "/srv/wheels"},
     "debug_tools_pyspy_find_links", "debug_tools_pyspy_method is package"),
    ({"debug_tools_pyspy_prerequisites": {"Debian": ["python3-venv", "bad name"]}},
     "debug_tools_pyspy_prerequisites.Debian", "bad name"),
])
def test_validate_names_the_variable_with_found_expected_fix(overrides, name, text):
    problems = tools.validate(settings(**overrides))
    assert [problem["name"] for problem in problems] == [name], problems
    problem = problems[0]
    assert text in problem["found"] and problem["expected"] and problem["fix"]


def test_validate_accepts_local_sources_and_ignores_pyspy_settings_when_it_is_off():
    assert tools.validate(settings(debug_tools_pyspy_find_links="/srv/wheels")) == []
    assert tools.validate(settings(debug_tools_pyspy_find_links="file:///srv/wheels")) == []
    assert tools.validate(settings(debug_tools_pyspy_index_url="https://mirror.local/pypi/simple",
                                   debug_tools_pyspy_version="")) == []
    assert tools.validate(settings(debug_tools_pyspy_method="package")) == []
    assert tools.validate(settings(debug_tools_pyspy=False, debug_tools_pyspy_venv="relative")) == []


# --- the role --------------------------------------------------------------------------------------------------


def test_defaults_are_mirrored_by_the_argument_specs():
    options = load_yaml("meta", "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert sorted(options) == sorted(load_yaml("defaults", "main.yml"))


def all_tasks(tasks):
    for task in tasks:
        yield task
        for key in ("block", "rescue", "always"):
            for inner in all_tasks(task.get(key, [])):
                yield inner


def test_role_tasks_are_writers_with_timeouts_and_typed_switches():
    for path in glob.glob(os.path.join(ROLE, "tasks", "*.yml")):
        with open(path) as handle:
            text = handle.read()
        assert "preflight_audit" not in text and "debug_tools_checks" not in text and "set_fact" not in text, path
        for task in all_tasks(yaml.safe_load(text)):
            if "block" not in task:
                assert "timeout" in task, (path, task.get("name"))
            conditions = task.get("when", [])
            for condition in conditions if isinstance(conditions, list) else [conditions]:
                if re.search(r"\b(debug_tools_enabled|debug_tools_pyspy)\b(?!_)", condition):
                    assert "| bool" in condition, (path, condition)


def run_role(tmp_path, extra, check=False):
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        "- hosts: localhost\n  connection: local\n  gather_facts: false\n  roles:\n    - role: debug_tools\n")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    command = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
               str(playbook), "-e", "ansible_python_interpreter=%s" % sys.executable]
    for item in extra:
        command += ["-e", item]
    if check:
        command.append("--check")
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=str(tmp_path))


def test_role_switched_off_from_the_command_line_does_nothing(tmp_path):
    proc = run_role(tmp_path, ["debug_tools_enabled=false"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "changed=0" in proc.stdout and "failed=0" in proc.stdout


def pyspy_only(tmp_path, **overrides):
    values = {"debug_tools_packages": {}, "debug_tools_pyspy_prerequisites": {},
              "debug_tools_pyspy_venv": str(tmp_path / "venv"),
              "debug_tools_pyspy_link": str(tmp_path / "bin" / "py-spy")}
    values.update(overrides)
    return json.dumps(values)


def test_role_check_mode_installs_nothing(tmp_path):
    proc = run_role(tmp_path, [pyspy_only(tmp_path, debug_tools_pyspy_find_links=str(tmp_path))], check=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (tmp_path / "venv").exists() and not (tmp_path / "bin").exists()


def test_role_install_failure_says_found_expected_fix(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    proc = run_role(tmp_path, [pyspy_only(tmp_path, debug_tools_pyspy_find_links=str(wheels),
                                          debug_tools_pyspy_version="0.0.1")])
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "Found: task 'Ensure py-spy is installed in the tools venv.' failed on localhost" in output
    assert "Expected: py-spy==0.0.1 from the wheel directory %s" % wheels in output
    assert "Fix: check that %s on the node holds a py-spy wheel" % wheels in output


LOCAL_WHEELS = sorted(glob.glob("/opt/pypi/files/py_spy-*.whl"))


@pytest.mark.skipif(not LOCAL_WHEELS, reason="no local py-spy wheel on this machine (/opt/pypi/files)")
def test_role_installs_pyspy_offline_from_a_wheel_directory_and_the_audit_passes(tmp_path):
    wheel = LOCAL_WHEELS[-1]
    version = os.path.basename(wheel).split("-")[1]
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    os.symlink(wheel, str(wheels / os.path.basename(wheel)))
    extra = pyspy_only(tmp_path, debug_tools_pyspy_find_links=str(wheels), debug_tools_pyspy_version=version)
    proc = run_role(tmp_path, [extra])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert os.path.realpath(str(tmp_path / "bin" / "py-spy")) == str(tmp_path / "venv" / "bin" / "py-spy")
    # Re-apply: nothing changes.
    proc = run_role(tmp_path, [extra])
    assert proc.returncode == 0 and "changed=0" in proc.stdout, proc.stdout + proc.stderr
    # And the audit's reader and decider find it.
    wanted = settings(**json.loads(extra))
    wanted["debug_tools_search_paths"] = [str(tmp_path / "bin")]
    facts = node_tools.read(tools.read_args(wanted, NODE), FakeOps())
    result = tools.decide(HOST, facts, wanted)["tool_py_spy"]
    assert result["status"] == "pass" and str(tmp_path / "bin" / "py-spy") in result["found"]


def debian_with_python_apt():
    """This machine is Debian-family (by the capability's own reader) and Ansible's apt module can run."""
    return node_tools.read_os(node_tools.OS_RELEASE)["family"] == "Debian" and os.path.exists("/usr/bin/python3") and \
        subprocess.run(["/usr/bin/python3", "-c", "import apt"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(not debian_with_python_apt(), reason="needs a Debian-family machine with python3-apt")
def test_role_package_failure_says_found_expected_fix(tmp_path):
    # A package no mirror has, with the lists used as they are: apt fails without installing anything.
    proc = run_role(tmp_path, [json.dumps({"debug_tools_packages": {"Debian": ["preflight-no-such-package"]},
                                           "debug_tools_pyspy": False, "debug_tools_package_update_cache": False})])
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "Found: task 'Ensure the debug tool packages are installed (Debian family).' failed on localhost" in output
    assert "Expected: the packages preflight-no-such-package installed from the node's configured package" in output
    assert "on an air-gapped cluster point the package sources at a local mirror" in output


def typed(**overrides):
    """The defaults with ``overrides`` as ``-e`` passes them, typed by the role's argument specs."""
    return typed_settings(ROLE_NAME, **overrides)


def test_settings_typed_from_the_command_line_validate_and_switch_off():
    assert tools.validate(typed()) == []
    assert tools.validate(typed(debug_tools_install_timeout="60", debug_tools_pyspy_find_links="/srv/wheels")) == []
    assert tools.read_args(typed(debug_tools_enabled="false"), NODE) is None
    assert "tool_py_spy" not in tools.decide(HOST, {"os": {"family": "Debian"}, "programs": {}},
                                             typed(debug_tools_pyspy="false"))
