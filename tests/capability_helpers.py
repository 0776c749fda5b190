"""What the capability unit tests share: a role's settings as preflight_settings hands them over,
files written under a sandbox root, and the check contract every decider must keep."""

import hashlib
import json
import os

import yaml
from preflight_node import checks as preflight_checks
from preflight_node import readers as node_halves
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from cluster_preflight.settings import role_files
from fake_ops import FakeOps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def role_yaml(role, *parts):
    with open(os.path.join(ROOT, "roles", role, *parts), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def role_inputs(role):
    """``(defaults, options)`` of ``role`` as the settings pipeline reads them (cluster_preflight/settings/role_files.py:
    ``defaults/main.yml``, or the defaults its argument specs hold)."""
    def load(path, _templated):
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    defaults, options, _main = role_files.role_inputs(role_path(role), load)
    return dict(defaults), options


def role_settings(role, **overrides):
    """The role's defaults with ``overrides``: what preflight_settings hands a capability."""
    values = role_inputs(role)[0]
    values.update(overrides)
    return values


def typed_settings(role, **overrides):
    """The defaults with ``overrides`` as ``-e`` passes them (text), typed by the role's argument specs."""
    defaults, options = role_inputs(role)
    spec = {name: {key: value for key, value in option.items() if key != "description"}
            for name, option in options.items()}
    checked = ArgumentSpecValidator(spec).validate(dict(defaults, **overrides))
    assert not checked.error_messages, checked.error_messages
    return checked.validated_parameters


def write(root, path, text, mode=None):
    """Write ``text`` at ``path`` under the sandbox ``root``; returns the full path."""
    full = os.path.join(str(root), path.lstrip("/"))
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as handle:
        handle.write(text)
    if mode is not None:
        os.chmod(full, mode)
    return full


def assert_contract(capability, checks, host):
    """Names inside the contract, no duplicate, every check well formed, every warn/fail with a fix
    and naming the node it is about.  Returns the checks as the verdict names them."""
    flat = preflight_checks.flatten({capability: checks}, host)
    for name, result in checks.items():
        assert preflight_checks.NAME_RE.match(name), name
        assert preflight_checks.normalize(result, name) == result, (name, result)
        if result["status"] in ("warn", "fail"):
            assert result["found"] and result["expected"] and result["fix"], (name, result)
            assert host in result["found"] + result["fix"], (name, result)
    return flat


def read_as_the_node_does(capability, settings, node):
    """``capability``'s reader on ``settings`` the way the node call runs it: arguments and facts
    through JSON, file reads only (no command).  None when the capability is switched off."""
    facts, calls = read_with_commands(capability, settings, node)
    assert calls == [], "the reader ran commands: use read_with_commands and answer them"
    return facts


def read_with_commands(capability, settings, node, programs=None, commands=None):
    """``capability``'s reader on ``settings`` the way the node call runs it (arguments and facts through JSON),
    every command it runs answered by a fake of the node's ``ops`` (preflight_node.host.ops.Ops): ``programs`` maps
    a program's name to its path (``ops.which``), ``commands`` an argv prefix (a tuple) to ``(rc, stdout, stderr)``
    or to a function of the argv (the longest prefix wins; anything else is rc 127, a missing program).  Returns
    ``(facts, calls)``: the facts (None when the capability is switched off) and each argv it ran, in order.

        facts, calls = read_with_commands(clock, role_settings("clock"), NODE, programs={"chronyc": "/usr/bin/chronyc"},
                                          commands={("/usr/bin/chronyc", "-c", "tracking"): (0, TRACKING, "")})
    """
    args = capability.read_args(settings, node)
    if args is None:  # switched off: the node is not read at all
        return None, []
    ops = FakeOps(programs=programs, commands=commands)
    facts = node_halves.get(capability.CAPABILITY).read(json.loads(json.dumps(args)), ops)
    return json.loads(json.dumps(facts)), ops.calls


def role_path(role):
    """The role's folder under roles/."""
    return os.path.join(ROOT, "roles", role)


def inventory_node(host, addr):
    """The inventory entry of ``host`` at ``addr`` as the controller hands it to ``read_args``."""
    return {"name": host, "ansible_host": addr, "node_addr": addr, "user": "root", "ssh_port": 22}


def capability_under_test(role, host, addr):
    """``(ROLE, HOST, NODE)`` of a capability's test module: the role's folder, the host the tests decide
    for, and its inventory entry at ``addr``."""
    return role_path(role), host, inventory_node(host, addr)


def switched_off_cases(role, host):
    """The decide-table cases of ``<role>_enabled`` false, as a boolean and as text: the capability is
    skipped (the first naming ``host``)."""
    flag = role + "_enabled"
    return [("switched-off", {}, {flag: False}, {"enabled": ("skipped", "%s is false on %s" % (flag, host), "")}),
            ("switched-off-as-text", {}, {flag: "false"}, {"enabled": ("skipped", "%s is false" % flag, "")})]


def statuses(checks):
    return {name: result["status"] for name, result in checks.items()}


def write_files(root, files):
    """Write every ``{path: text}`` of ``files`` (may be None) under the sandbox ``root``."""
    for path, text in (files or {}).items():
        write(root, path, text)


def read_text(root, path):
    """The text at ``path`` under the sandbox ``root``."""
    with open(os.path.join(str(root), path.lstrip("/"))) as handle:
        return handle.read()


def deny_reading(monkeypatch, module, suffix):
    """A reader without root (``module.privileged`` false) refused every file whose path ends in ``suffix``."""
    real_open = open

    def deny(path, *args, **kwargs):
        if str(path).endswith(suffix):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(module, "privileged", lambda: False)
    monkeypatch.setattr("builtins.open", deny)


def assert_table(checks, expected):
    """``checks`` are exactly ``expected``'s names, each with its ``(status, found, fix)`` (found and fix as parts)."""
    assert sorted(checks) == sorted(expected)
    for name, (status, found, fix) in expected.items():
        result = checks[name]
        assert result["status"] == status, (name, result)
        assert found in result["found"], (name, result)
        assert fix in result["fix"], (name, result)


def saved_umask():
    """A fixture body: sets umask 022, yields a setter, puts the umask back."""
    saved = os.umask(0o022)
    yield lambda value: os.umask(value)
    os.umask(saved)


def sysctl_tree(root):
    """The sandbox's sysctl tree: /etc/sysctl.conf with one site setting and an empty /etc/sysctl.d."""
    write(root, "/etc/sysctl.conf", "# site settings\nvm.swappiness = 10\n")
    os.makedirs(str(root / "etc/sysctl.d"), exist_ok=True)


def sandbox_reader(capability, node, settings_of):
    """``(read_node, assert_contract)`` for a capability's tests on a sandbox root: ``read_node(root,
    **overrides)`` is ``(facts, settings)``, the settings ``settings_of(root, **overrides)`` and the facts
    read from them the way the node does; ``assert_contract(checks, host=<node's name>)`` is
    :func:`assert_contract` for the capability."""
    def read_node(root, **overrides):
        wanted = settings_of(root, **overrides)
        return read_as_the_node_does(capability, wanted, node), wanted

    def contract(checks, host=node["name"]):
        return assert_contract(capability.CAPABILITY, checks, host)
    return read_node, contract


def link_hashes(root):
    """Content hash of every file under ``root``, symlinks by target (``link:<target>``)."""
    found = {}
    for directory, _dirs, files in os.walk(str(root)):
        for name in files:
            full = os.path.join(directory, name)
            if os.path.islink(full):
                found[full] = "link:" + os.readlink(full)
            else:
                with open(full, "rb") as handle:
                    found[full] = hashlib.sha256(handle.read()).hexdigest()
    return found


def assert_one_problem(problems, name, found):
    """``problems`` (what ``validate`` returned) is one problem, naming ``name``, ``found`` in its found,
    well formed: name, found, expected and fix, all but found non-empty text."""
    assert [problem["name"] for problem in problems] == [name], problems
    problem = problems[0]
    assert found in problem["found"], problem
    assert set(problem) == {"name", "found", "expected", "fix"}
    assert all(isinstance(value, str) and value for key, value in problem.items() if key != "found"), problem
