"""What the capability unit tests share: a role's settings as preflight_settings hands them over,
files written under a sandbox root, and the check contract every decider must keep."""

import json
import os

import yaml
from preflight_node import checks as preflight_checks
from preflight_node import facts as node_halves
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from fake_ops import FakeOps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def role_yaml(role, *parts):
    with open(os.path.join(ROOT, "roles", role, *parts), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def role_settings(role, **overrides):
    """The role's defaults with ``overrides``: what preflight_settings hands a capability."""
    values = role_yaml(role, "defaults", "main.yml")
    values.update(overrides)
    return values


def typed_settings(role, **overrides):
    """The defaults with ``overrides`` as ``-e`` passes them (text), typed by the role's argument specs."""
    options = role_yaml(role, "meta", "argument_specs.yml")["argument_specs"]["main"]["options"]
    spec = {name: {key: value for key, value in option.items() if key != "description"}
            for name, option in options.items()}
    checked = ArgumentSpecValidator(spec).validate(dict(role_yaml(role, "defaults", "main.yml"), **overrides))
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
    args = capability.read_args(settings, node)
    if args is None:  # switched off: the node is not read at all
        return None
    ops = FakeOps()
    facts = node_halves.get(capability.CAPABILITY).read(json.loads(json.dumps(args)), ops)
    assert ops.calls == []
    return json.loads(json.dumps(facts))
