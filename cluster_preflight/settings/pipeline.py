# -*- coding: utf-8 -*-
"""Every capability's settings for a node, loaded and validated before anything runs on it: the settings pipeline
that ``action_plugins/preflight_settings.py`` runs on the controller (its documentation:
``library/preflight_settings.py``).

For every capability role (and the run-wide role ``preflight``) it reads ``defaults/main.yml`` and
``meta/argument_specs.yml``, takes each variable from the node's variables (inventory, ``-e``, play) or else the
role default, renders it, converts it to the type the spec names (so ``-e debug_tools_enabled=false`` is the boolean
false), checks what holds for every setting (``checks.py``: ranges, node names, unknown variables) and runs the
capability's ``validate``; then the node's reader arguments (``read_args``) and, for the health check, its
node-local probes' arguments.  :func:`load` is the whole step; :class:`SettingsPipeline` keeps what one task reads
once (each role's files, renderings shared by the nodes).
"""

from __future__ import annotations

import json
import os

import jinja2
import jinja2.meta

from ansible.errors import AnsibleError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from cluster_preflight import capabilities
from cluster_preflight import engine
from cluster_preflight.stages.view import run_started
from cluster_preflight.settings.checks import SWITCH, host_problems, number_problems, ranges_of, unknown_variables
from cluster_preflight.settings.role_files import role_inputs

PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROLES = os.path.join(PROJECT, "roles")


# A plain environment only to find the variables a template reads (jinja2.meta): it renders nothing.
_PARSER = jinja2.Environment()
_MISSING = object()


def _problem(role, name, found, expected, fix):
    return {"capability": role, "name": name, "found": str(found), "expected": expected, "fix": fix}


class SettingsPipeline(object):
    """The settings of one task's nodes: ``loader`` reads the roles' files (Ansible's DataLoader), ``templar`` renders
    the variables (Ansible's Templar), ``args`` are the task's (``capabilities``, ``kind``, ``engine``)."""

    def __init__(self, loader, templar, args=None):
        self._loader, self._templar, self._args = loader, templar, dict(args or {})

    def _role_files(self, role):
        """``(defaults, argument spec options)`` of ``role``, each file read once per task."""
        cache = self.__dict__.setdefault("_role_cache", {})
        if role not in cache:
            cache[role] = self._read_role_files(role)
        return cache[role]

    def _read_role_files(self, role):
        defaults, options, _main = role_inputs(os.path.join(ROLES, role), lambda path, templated: (
            self._loader.load_from_file(path, trusted_as_template=templated)))
        return defaults, options

    def _validated(self, role, spec, values):
        """``values`` checked against ``spec`` (the role's argument spec), once per distinct set of values in a task:
        the nodes of a cluster mostly share them, and the check deep-copies every value."""
        memo = self.__dict__.setdefault("_validated_memo", {})
        try:
            key = (role, json.dumps(values, sort_keys=True, default=repr))
        except (TypeError, ValueError):
            return ArgumentSpecValidator(spec).validate(values)
        if key not in memo:
            memo[key] = ArgumentSpecValidator(spec).validate(values)
        return memo[key]

    def _rendered(self, templar, raw, variables):
        """``raw`` rendered with one node's ``variables``; once per task for the same template and the same values
        of every variable it reads (through the templates it reads), as most nodes of a cluster share them: plain
        values by value, lists and mappings (``groups``, shared by every node) by identity, each held by the memo
        so that no other object takes its identity."""
        keep = []
        key = self._render_key(raw, variables, keep) if isinstance(raw, str) else None
        memo = self.__dict__.setdefault("_rendered_memo", {})
        if key is not None and key in memo:
            return memo[key][0]
        value = templar.template(raw)
        if key is not None:
            memo[key] = (value, keep)
        return value

    def _render_key(self, text, variables, keep, depth=0):
        """What the rendering of the template ``text`` depends on: ``text`` and the value of every variable it
        reads (a template by its own key, a list or a mapping that holds no template by identity, added to
        ``keep``); None when that cannot be told."""
        names = self._references(text)
        if names is None or depth > 8:
            return None
        key = [text]
        for name in sorted(names):
            value = variables.get(name, _MISSING)
            if value is _MISSING:
                key.append((name,))
            elif isinstance(value, str) and self._templar.is_possibly_template(value):
                inner = self._render_key(value, variables, keep, depth + 1)
                if inner is None:
                    return None
                key.append((name, inner))
            elif value is None or isinstance(value, (str, int, float, bool)):
                key.append((name, type(value).__name__, value))
            elif not self._holds_template(value):
                keep.append(value)
                key.append((name, "id", id(value)))
            else:
                return None
        return tuple(key)

    def _holds_template(self, value):
        """Whether the list or mapping ``value`` holds a template (it renders per node), looked at once per task."""
        memo = self.__dict__.setdefault("_holds_memo", {})
        if id(value) not in memo:
            memo[id(value)] = (_templated(self._templar, value), value)
        return memo[id(value)][0]

    def _references(self, text):
        """The variables the template ``text`` reads (jinja2's own analysis, once per text), or None."""
        memo = self.__dict__.setdefault("_references_memo", {})
        if text not in memo:
            try:
                memo[text] = frozenset(jinja2.meta.find_undeclared_variables(_PARSER.parse(str(text))))
            except jinja2.TemplateError:
                memo[text] = None
        return memo[text]

    def _unknown(self, task_vars, settings, errors):
        """Variables with a role's prefix that nothing reads: added to ``errors``, or returned as warnings under
        ``preflight_unknown_variables: warn``."""
        inputs = set()
        for role in os.listdir(ROLES):
            try:
                inputs.update(self._role_files(role)[1])
            except (AnsibleError, OSError):
                continue
        found = [dict(item, capability=capabilities.RUN_ROLE, found=str(item["found"]))
                 for item in unknown_variables(task_vars, inputs, PROJECT)]
        if (settings.get(capabilities.RUN_ROLE) or {}).get(SWITCH) == "warn":
            return found
        errors.extend(found)
        return []

    def _first_engine(self, task_vars, defaults, own, first_of_run=False):
        """The engine the run's first node names (one engine for the whole run, cluster_preflight/engine): ``own``
        (this node's run-wide settings) when this node is the first, else the first node's variable or the role's
        default (``first_of_run``: read from the variables even on the first node)."""
        hosts = task_vars.get("ansible_play_hosts_all") or []
        if not first_of_run and (not hosts or hosts[0] == task_vars.get("inventory_hostname")):
            return engine.engine_of(own)
        if not hosts or hosts[0] == task_vars.get("inventory_hostname"):
            value = task_vars[engine.SETTING] if engine.SETTING in task_vars else defaults.get(engine.SETTING)
            return engine.engine_of({engine.SETTING: value})
        try:
            first = task_vars["hostvars"][hosts[0]]
            value = first[engine.SETTING] if engine.SETTING in first else defaults.get(engine.SETTING)
        except (KeyError, AnsibleError):
            value = defaults.get(engine.SETTING)
        return engine.engine_of({engine.SETTING: value})

    def run_engine(self, task_vars):
        """The engine of the run's node stages (``preflight_engine``), read once, before any node's settings, so the
        playbook can choose its stages' shape (one task per node, or one for every node) from a validated value:
        the run's first node's (one engine for the whole run), else the role's default.  A value the role's
        argument specs refuse stops the run at its inputs (every node's settings say why); its node stages are then
        those of the first engine of :data:`cluster_preflight.engine.ENGINES`, every node call skipped."""
        defaults, options = self._role_files(capabilities.RUN_ROLE)
        chosen = self._first_engine(task_vars, defaults, None, first_of_run=True)
        valid = chosen in (options.get(engine.SETTING) or {}).get("choices", engine.ENGINES)
        return {"engine": chosen if valid else engine.ENGINES[0], "valid": valid, "changed": False}

    def every_node(self, task_vars, kind):
        """Every targeted node's result, registered at once (:func:`cluster_preflight.engine.by_node`)."""
        return dict(engine.by_node("settings", self._every_node(task_vars, kind)), changed=False)

    def one(self, task_vars, kind):
        """This node's result (``task_vars``: its variables)."""
        return self._one(task_vars, kind)

    def _every_node(self, task_vars, kind):
        """Every targeted node's result, in this one task (each role's files read once): a node's variables are
        its own (inventory, group and extra variables) over the play's (groups, hostvars, playbook_dir)."""
        hosts = list(task_vars.get("ansible_play_hosts_all") or [])
        hostvars = task_vars.get("hostvars")
        own = hostvars.raw_get(task_vars.get("inventory_hostname")) if hostvars is not None else {}
        play = {key: value for key, value in task_vars.items() if key not in own}
        results, first = {}, None
        for host in hosts:
            node_vars = dict(play, **(hostvars.raw_get(host) if hostvars is not None else {}))
            results[host] = self._one(node_vars, kind, first)
            if first is None:
                first = engine.engine_of((results[host].get("settings") or {}).get(capabilities.RUN_ROLE))
        return results

    def _one(self, task_vars, kind, first_engine=None):
        """One node's result (``task_vars``: its variables); ``first_engine``: the run's first node's engine."""
        result = {}
        wanted, errors = _wanted(self._args.get("capabilities"), kind)
        roles = [capabilities.RUN_ROLE] + wanted
        loaded, all_defaults = {}, {}
        for role in roles:
            try:
                loaded[role] = self._role_files(role)
            except (AnsibleError, OSError) as exc:
                errors.append(_problem(role, "%s role" % role, exc, "roles/%s with defaults and argument specs"
                                       % role, "restore roles/%s from the project" % role))
                continue
            all_defaults.update(loaded[role][0])
        # Role defaults are the lowest layer, as when the roles themselves run.
        variables = dict(all_defaults, **task_vars)
        templar = self._templar.copy_with_new_env(available_variables=variables)
        settings = {}
        for role, (defaults, options) in loaded.items():
            values = {}
            for name in options:
                raw = task_vars[name] if name in task_vars else defaults.get(name)
                if not _templated(templar, raw):
                    # Most values are plain data: taken as they are (rendering copies them, per node).
                    values[name] = raw
                    continue
                try:
                    values[name] = self._rendered(templar, raw, variables)
                except AnsibleError as exc:
                    errors.append(_problem(role, name, "cannot be rendered: %s" % str(exc).splitlines()[0],
                                           "a value or an expression over defined variables",
                                           "correct %s in the inventory or the -e option" % name))
            spec = {name: {key: value for key, value in option.items() if key != "description"}
                    for name, option in options.items() if name in values}
            checked = self._validated(role, spec, values)
            for message in checked.error_messages:
                errors.append(_problem(role, _variable_in(message, spec), message,
                                       "the type and choices of roles/%s/meta/argument_specs.yml" % role,
                                       "correct the value in the inventory or the -e option"))
            settings[role] = dict(checked.validated_parameters)
            errors.extend(_problem(role, item["name"], item["found"], item["expected"], item["fix"])
                          for item in number_problems(options, settings[role], ranges_of(role)))
        errors.extend(_problem(capabilities.RUN_ROLE, item["name"], item["found"], item["expected"], item["fix"])
                      for item in host_problems(task_vars.get("inventory_hostname")))
        warnings = self._unknown(task_vars, settings, errors)
        if not errors:
            run = settings[capabilities.RUN_ROLE]
            errors.extend(_problem(capabilities.RUN_ROLE, item["name"], item["found"], item["expected"], item["fix"])
                          for item in capabilities.validate_run(run) + engine.problems(
                              run, task_vars.get("inventory_hostname"),
                              first_engine or self._args.get("engine") or self._first_engine(task_vars, all_defaults,
                                                                                              run),
                              os.environ))
            for name in wanted:
                for item in capabilities.get(name).validate(settings[name]):
                    errors.append(_problem(name, item["name"], item["found"], item["expected"], item["fix"]))
        # The run-wide settings every capability reads as its own (the job's environment), copied in this one place.
        run_shared = capabilities.shared(settings.get(capabilities.RUN_ROLE) or {})
        for name in wanted:
            if name in settings:
                settings[name].update(run_shared)
        node = capabilities.node_info(task_vars.get("inventory_hostname"), {
            key: templar.template(task_vars.get(key)) for key in
            ("ansible_host", "ansible_user", "ansible_port", "preflight_node_addr") if task_vars.get(key)})
        read_args = {}
        if not errors:
            for name in wanted:
                args = (capabilities.get(name).read_args(settings[name], node)
                        if name in capabilities.readers_for(kind) else None)
                if args is not None:
                    read_args[name] = args
        local_probes = {}
        if not errors and kind == "healthcheck":
            # A node-local run (healthcheck.yml): the probes that need no peer, run in the reader call.
            alone = {"hosts": [node["name"]], "nodes": {node["name"]: node}}
            for name in wanted:
                if name in capabilities.probes_for(kind):
                    args = capabilities.get(name).probe_args(settings[name], node, alone)
                    if args is not None:
                        local_probes[name] = args
        run = settings.get(capabilities.RUN_ROLE) or {}
        python = (settings.get("allreduce") or {}).get("allreduce_python")
        result.update(job=capabilities.job_user_wanted(run, node, python), changed=False,
                      ok=not errors, errors=errors, input_warnings=warnings, settings=settings, node=node, read_args=read_args,
                      local_probes=local_probes, capabilities=wanted, started=run_started(),
                      bringup=capabilities.bringup_steps(wanted) if kind == "bringup" else [],
                      healthcheck_budget=run.get("preflight_healthcheck_budget") or 30,
                      selftest_error=run.get("preflight_selftest_error") or "",
                      facts_timeout=run.get("preflight_facts_timeout") or 60,
                      probes_timeout=run.get("preflight_probes_timeout") or 120)
        if errors:
            result["msg"] = "invalid settings on %s: %s" % (task_vars.get("inventory_hostname"), "; ".join(
                "%s=%s (expected %s)" % (item["name"], item["found"], item["expected"]) for item in errors))
        return result


def load(loader, templar, task_vars: dict, args: dict, all_nodes: bool = False, engine_only: bool = False) -> dict:
    """The settings task's result: this node's settings (``task_vars``: its variables), or every targeted node's at
    once (``all_nodes``, the srun engine's single task), for a run of ``args["kind"]``; ``engine_only``: only the
    engine of the run's node stages (:meth:`SettingsPipeline.run_engine`), which the playbook reads first."""
    kind = args.get("kind") or "preflight"
    if kind not in capabilities.KINDS:
        raise AnsibleError("preflight_settings: kind %r is not one of %s" % (kind, ", ".join(capabilities.KINDS)))
    pipeline = SettingsPipeline(loader, templar, args)
    if engine_only:
        return pipeline.run_engine(task_vars)
    return pipeline.every_node(task_vars, kind) if all_nodes else pipeline.one(task_vars, kind)


# The variable that names the capabilities of a run of each kind, when its playbook reads one.
LIST_VARIABLES = {"bringup": "preflight_bringup_capabilities", "healthcheck": "preflight_local_capabilities"}


def _wanted(given, kind):
    """The capabilities to load, in the order given (a list, or a comma-separated text as ``-e`` passes it), and a
    problem for each name that a run of ``kind`` does not apply; the registry's for ``kind`` when none is given."""
    known = capabilities.names_for(kind)
    if isinstance(given, str):
        given = [item.strip() for item in given.split(",") if item.strip()]
    wanted = [str(name) for name in (given or known)]
    errors = [_problem(capabilities.RUN_ROLE, LIST_VARIABLES.get(kind, "capabilities"), name,
                       "one of %s (what a %s run applies: module_utils/preflight_node/capabilities.py)"
                       % (", ".join(known), kind), "name only those, or leave the variable unset for all of them")
              for name in wanted if name not in known]
    return [name for name in dict.fromkeys(wanted) if name in known], errors


def _templated(templar, value):
    """Whether ``value`` holds a template anywhere (a string that looks like one, in any list or mapping)."""
    if isinstance(value, str):
        return templar.is_possibly_template(value)
    if isinstance(value, (list, tuple)):
        return any(_templated(templar, item) for item in value)
    if isinstance(value, dict):
        return any(_templated(templar, key) or _templated(templar, item) for key, item in value.items())
    return False


def _variable_in(message, spec):
    """The variable an ArgumentSpecValidator message is about."""
    for name in sorted(spec, key=len, reverse=True):
        if name in message:
            return name
    return "?"
