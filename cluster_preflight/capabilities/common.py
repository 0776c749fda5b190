# -*- coding: utf-8 -*-
"""What the controller halves of the capabilities share: typed switches, the port rule, and the first two
answers of a decider (switched off, or nothing read on the node)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ansible.module_utils.parsing.convert_bool import boolean

from preflight_node.checks import failed, skipped

# The shapes the controller halves exchange (capabilities/__init__.py: the interface each implements).
# A role's settings as the settings pipeline typed them: variable name -> value.
Settings = Dict[str, Any]
# A reader's result on one node (JSON-safe), None when it did not read.
Facts = Optional[Dict[str, Any]]
# An inventory node as the controller knows it (capabilities.node_info): name, ansible_host, node_addr, user, ssh_port.
Node = Dict[str, Any]
# A node call's arguments for one capability (JSON-safe), None when it is switched off.
Args = Optional[Dict[str, Any]]
# An input problem: {name, found, expected, fix}.
Problem = Dict[str, Any]
# A decider's findings on one node: check name -> {status, found, expected, fix, details}.
Checks = Dict[str, Dict[str, Any]]
Problems = List[Problem]


def switched_on(value):
    """A switch as typed on the command line (``-e core_dumps_enabled=false`` is the string "false")."""
    return boolean(value, strict=False)


def port_problems(name, port, fix):
    """``[problem]`` when ``port`` is not a TCP port, else ``[]``."""
    if isinstance(port, int) and 1 <= port <= 65535:
        return []
    return [{"name": name, "found": port, "expected": "a TCP port 1-65535", "fix": fix}]


def off_or_unread(capability, host, enabled, facts, what, read_on_node):
    """``{enabled: skipped}`` when the capability is switched off on ``host``, ``{no_facts: fail}`` when its
    reader gave nothing there, else None (the decider goes on). ``what`` says what is not checked when off;
    ``read_on_node`` what the reader reads."""
    if not switched_on(enabled):
        return {"enabled": skipped("%s_enabled is false on %s: %s are not checked" % (capability, host, what),
                                   "%s_enabled true to check them" % capability)}
    if not facts:
        return {"no_facts": failed(
            "no %s facts were read on %s" % (capability, host), read_on_node,
            "see the %s.error or preflight checks of %s for why the reader gave no result, then re-run"
            % (capability, host))}
    return None
