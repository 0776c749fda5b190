"""The capability registry (module_utils/preflight_node/registry.py) is the single source of truth: what each kind of
run applies, reads and probes is derived from it; the code that implements a trait agrees with it (node modules,
controller halves, roles, the modules' imports); and no playbook keeps a list of capabilities that disagrees with
it -- proven by a drifted list in a scratch copy of the playbooks."""

import ast
import glob
import os
import re
import shutil

import pytest
import yaml

from cluster_preflight import capabilities as controller
from cluster_preflight.plays import stage_results
from cluster_preflight.settings import role_files
from preflight_node import probes, readers, registry
from test_settings_inputs import _settings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NODE = os.path.join(ROOT, "module_utils", "preflight_node")
# The capability halves of the node layer: <name>.py (read), <name>_probe.py (probe).
HALVES = os.path.join(NODE, "capabilities")
# Roles that are no capability: the run's own settings, and the diagnosis of a hung job.
NOT_CAPABILITIES = {"preflight", "diagnose"}


# --- the derived lists ----------------------------------------------------------------------------------------


@pytest.fixture
def table(monkeypatch):
    """A registry of four made-up capabilities, in this order."""
    declare = registry._declare  # pylint: disable=protected-access
    declared = (declare("a", reader=True, local=True), declare("b", stages=("launch",)),
                declare("c", reader=True, probe=True, after_job=True, local=True),
                declare("d", reader=True, probe=True, bringup=("Apply d", "Write d")))
    monkeypatch.setattr(registry, "CAPABILITIES", declared)
    monkeypatch.setattr(registry, "BY_NAME", {item.name: item for item in declared})
    monkeypatch.setattr(registry, "NAMES", tuple(item.name for item in declared))


def test_each_kind_of_run_applies_reads_and_probes_what_the_traits_say(table):  # pylint: disable=unused-argument
    assert registry.names_for("preflight") == ("a", "b", "c", "d")
    assert registry.readers_for("preflight") == ("a", "c", "d") and registry.probes_for("preflight") == ("c", "d")
    assert registry.names_for("healthcheck") == registry.readers_for("healthcheck") == ("a", "c")
    assert registry.probes_for("healthcheck") == ("c",)
    assert registry.names_for("bringup") == registry.readers_for("bringup") == ("d",)
    assert registry.probes_for("bringup") == ()
    assert [name for name in "abcd" if registry.after_job(name)] == ["c"] and not registry.after_job("z")
    assert [item.stages for item in registry.CAPABILITIES] == [(), ("launch",), ("probes",), ("probes",)]
    assert registry.bringup_steps(["d", "a"]) == [{"name": "d", "what": "Apply d (d).", "how": "Write d."}]


def test_the_health_check_probes_nothing_that_needs_a_peer():
    assert "ssh_trust" not in registry.probes_for("healthcheck")
    assert "port_mesh" not in registry.names_for("healthcheck")
    assert set(registry.probes_for("healthcheck")) <= set(registry.probes_for("preflight"))


def test_the_controller_lists_are_the_registry_s():
    assert controller.NAMES == registry.NAMES == tuple(module.CAPABILITY for module in controller.ORDER)
    assert controller.BRINGUP_NAMES == registry.names_for("bringup")
    assert controller.LOCAL_NAMES == registry.names_for("healthcheck")
    assert controller.readers_for is registry.readers_for and controller.probes_for is registry.probes_for
    assert controller.DEPENDS == {item.name: item.stages for item in registry.CAPABILITIES}
    assert all(set(stages) <= set(stage_results.STAGE_REGISTERS) for stages in controller.DEPENDS.values())
    assert all("probes" in controller.DEPENDS[name] for name in registry.probes_for("preflight"))


def test_bringup_steps_follow_the_verdict_order_and_skip_what_writes_nothing():
    steps = registry.bringup_steps(["ssh_trust", "allreduce", "kernel_debug"])
    assert [step["name"] for step in steps] == ["kernel_debug", "ssh_trust"]
    assert steps[0]["what"] == "Apply the kernel settings for debuggers (kernel_debug)."
    assert steps[0]["how"].endswith(".") and not steps[0]["how"].endswith("..")


def test_a_declaration_that_contradicts_itself_or_a_kind_no_run_has_is_refused():
    with pytest.raises(ValueError, match="after_job is a trait of a probe"):
        registry._declare("x", after_job=True)  # pylint: disable=protected-access
    assert registry._declare("x", probe=True).stages == ("probes",)  # pylint: disable=protected-access
    with pytest.raises(ValueError, match="unknown kind of run 'gate'"):
        registry.names_for("gate")
    with pytest.raises(KeyError, match="known: nic_discovery"):
        registry.get("nope")


# --- the code that implements each trait agrees with it -------------------------------------------------------


def _node_module(name):
    path = os.path.join(HALVES, "%s.py" % name)
    return path if os.path.isfile(path) else None


def _defines(path, function):
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    return any(isinstance(node, ast.FunctionDef) and node.name == function for node in tree.body)


@pytest.mark.parametrize("name", registry.NAMES)
def test_every_trait_is_implemented_where_it_is_declared(name):
    declared = registry.get(name)
    half = controller.get(name)
    reader, probe = _node_module(name), _node_module("%s_probe" % name)
    assert bool(reader and _defines(reader, "read")) == declared.reader, \
        "%s: reader=%s in the registry, module_utils/preflight_node/capabilities/%s.py read()" % (name, declared.reader, name)
    assert not declared.reader or hasattr(half, "read_args"), "%s reads: its controller half needs read_args" % name
    assert bool(probe and _defines(probe, "probe")) == declared.probe == hasattr(half, "probe_args"), \
        "%s: probe=%s in the registry; %s_probe.py probe() and probe_args must agree" % (name, declared.probe, name)
    tasks = os.path.join(ROOT, "roles", name, "tasks", "main.yml")
    assert os.path.isfile(tasks) == bool(declared.bringup), \
        "%s: bringup=%r in the registry, roles/%s/tasks/main.yml exists: %s" % (
            name, declared.bringup, name, os.path.isfile(tasks))
    role = os.path.join(ROOT, "roles", name)
    assert role_files.specs_path(role), "roles/%s declares its inputs: meta/main.yml's argument_specs" % name
    # A role that writes in bring-up is run as a role: Ansible needs its defaults file then, and it says how.
    if declared.bringup:
        for part in (("defaults", "main.yml"), ("README.md",)):
            assert os.path.isfile(os.path.join(role, *part)), "roles/%s/%s" % (name, "/".join(part))
    assert os.path.isfile(os.path.join(ROOT, "tests", "unit", "test_%s.py" % name))


def test_every_profile_field_is_measured_by_a_capability_that_returns_it():
    """``profile_fields`` is declared by defining it: the fields it returns are the capability's to measure, so a
    failure of its checks (not the profile) is why such a field went unmeasured."""
    from cluster_preflight.capabilities.profile import known_good as profiles  # pylint: disable=import-outside-toplevel
    from cluster_preflight.capabilities import profile  # pylint: disable=import-outside-toplevel
    measured = profile.measured_by()
    assert measured["gpu"] == ("gpu_health",) and measured["rdma"] == ("fabric",)
    for field in profiles.FIELDS:
        assert measured.get(field.name.split(".")[0]), "nothing measures %s" % field.name
    for module in controller.ORDER:
        if hasattr(module, "profile_fields"):
            assert set(module.profile_fields(None)) <= set(profiles.BY_NAME), module.CAPABILITY


def test_every_role_with_a_capability_s_shape_is_in_the_registry():
    roles = {os.path.basename(path) for path in glob.glob(os.path.join(ROOT, "roles", "*"))}
    assert roles - NOT_CAPABILITIES == set(registry.NAMES)


def _imported(path):
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    return {alias.name for node in tree.body if isinstance(node, ast.ImportFrom) and node.level == 1
            and node.module == "capabilities" for alias in node.names}


def test_the_node_calls_import_by_name_every_half_the_registry_declares():
    """Ansible ships with a module call only the modules it imports by name: a reader the registry declares but
    readers.py does not import would be missing on the node."""
    assert _imported(os.path.join(NODE, "readers.py")) == set(registry.readers_for("preflight"))
    assert _imported(os.path.join(NODE, "probes.py")) == {"%s_probe" % name
                                                          for name in registry.probes_for("preflight")}
    assert tuple(readers.READERS) == registry.readers_for("preflight")
    assert tuple(probes.PROBES) == registry.probes_for("preflight")
    assert all(module.CAPABILITY == name
               for bound in (readers.READERS, probes.PROBES) for name, module in bound.items())


def test_a_half_a_node_call_does_not_import_by_name_is_named_at_import():
    with pytest.raises(ImportError, match=r"readers.py does not import gpu_health: add it to its import line"):
        registry.bind(("nic_discovery", "gpu_health"), {"nic_discovery": readers}, "", "readers.py")
    with pytest.raises(ImportError, match=r"probes.py does not import fabric_probe"):
        registry.bind(("fabric",), {"fabric": readers}, "_probe", "probes.py")


# --- the playbooks keep no list of their own ------------------------------------------------------------------

PLAYBOOK_YAML = ("*.yml", "playbooks/*.yml", "roles/*/tasks/*.yml", "roles/*/defaults/*.yml", "roles/*/vars/*.yml",
                 "inventory/*.yml", "clusters/*/*.yml", "clusters/*/group_vars/*.yml")
_WORD = re.compile(r"""['"]?([a-z_]+)['"]?""")


def _lists(value):
    """Every list of capability names in a YAML document: a sequence of names (or of ``{name: ...}`` items, as a
    loop's), and a ``[...]`` of names inside a Jinja expression."""
    if isinstance(value, dict):
        for item in value.values():
            yield from _lists(item)
    elif isinstance(value, list):
        names = [item.get("name") if isinstance(item, dict) else item for item in value]
        if len(names) >= 2 and all(isinstance(name, str) and name in registry.NAMES for name in names):
            yield names
        for item in value:
            yield from _lists(item)
    elif isinstance(value, str):
        for inner in re.findall(r"\[([^\[\]]*)\]", value):
            names = [_WORD.fullmatch(part.strip()) for part in inner.split(",")]
            names = [match.group(1) for match in names if match]
            if len(names) >= 2 and all(name in registry.NAMES for name in names):
                yield names


def _kinds(document):
    """The kinds of run a playbook's plays are, from their ``preflight_settings``/``preflight_verdict`` tasks."""
    kinds = set()

    def walk(value):
        if isinstance(value, dict):
            for key in ("preflight_settings", "preflight_verdict"):
                if key in value:
                    kinds.add(((value[key] or {}).get("kind")) or "preflight")
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
    walk(document)
    return kinds


def playbook_disagreements(root):
    """Every list of capabilities in the project's YAML under ``root`` that is not the registry's for its file's
    kind of run (any kind's for a file that is no playbook), and every play whose settings and verdict are of two
    kinds: ``["path: what"]``."""
    found = []
    for pattern in PLAYBOOK_YAML:
        for path in sorted(glob.glob(os.path.join(root, pattern))):
            relative = os.path.relpath(path, root)
            with open(path, encoding="utf-8") as handle:
                document = yaml.safe_load(handle)
            kinds = _kinds(document)
            if len(kinds) > 1:
                found.append("%s: its preflight_settings and preflight_verdict are of kinds %s"
                             % (relative, sorted(kinds)))
            allowed = [list(registry.names_for(kind)) for kind in (kinds or registry.KINDS)]
            for names in _lists(document):
                if names not in allowed:
                    found.append("%s: lists %s; the registry's %s: %s" % (
                        relative, names, "/".join(sorted(kinds or registry.KINDS)),
                        " or ".join(str(item) for item in allowed)))
    return found


def test_no_playbook_keeps_a_list_of_capabilities_that_disagrees_with_the_registry():
    assert playbook_disagreements(ROOT) == []


def test_each_playbook_asks_the_registry_for_its_own_kind():
    for name, kind in (("preflight", "preflight"), ("bringup", "bringup"), ("healthcheck", "healthcheck")):
        with open(os.path.join(ROOT, "playbooks", "%s.yml" % name), encoding="utf-8") as handle:
            assert _kinds(yaml.safe_load(handle)) == {kind}, name


def _scratch(tmp_path):
    for pattern in ("*.yml", "playbooks/*.yml", "roles/*/tasks/*.yml"):
        for path in glob.glob(os.path.join(ROOT, pattern)):
            target = os.path.join(tmp_path, os.path.relpath(path, ROOT))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy(path, target)
    return tmp_path


def _edit(path, old, new):
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    assert old in text, old
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text.replace(old, new, 1))


@pytest.mark.parametrize("playbook, old, new, words", [
    # A hand-kept health-check list that forgot a node-local capability.
    ("healthcheck.yml", 'capabilities: "{{ preflight_local_capabilities | default(omit) }}"',
     "capabilities: %s" % list(registry.names_for("healthcheck")[:-1]),
     "playbooks/healthcheck.yml: lists %s" % list(registry.names_for("healthcheck")[:-1])),
    # A bring-up loop kept by hand with one capability that writes nothing.
    ("bringup.yml", 'loop: "{{ preflight_settings.bringup | default([]) }}"',
     "loop:\n        - {name: kernel_debug}\n        - {name: allreduce}",
     "playbooks/bringup.yml: lists ['kernel_debug', 'allreduce']"),
    # A condition over an inline list.
    ("bringup.yml", "when: preflight_applying\n",
     "when: preflight_applying and preflight_capability.name in %s\n" % list(registry.names_for("bringup")[1:]),
     "playbooks/bringup.yml: lists %s" % list(registry.names_for("bringup")[1:])),
    # Settings of one kind, a verdict of another.
    ("healthcheck.yml", "kind: healthcheck\n        capabilities", "kind: bringup\n        capabilities",
     "playbooks/healthcheck.yml: its preflight_settings and preflight_verdict are of kinds"),
])
def test_a_playbook_list_that_drifted_from_the_registry_fails(tmp_path, playbook, old, new, words):
    root = _scratch(tmp_path)
    assert playbook_disagreements(root) == []
    _edit(os.path.join(root, "playbooks", playbook), old, new)
    found = playbook_disagreements(root)
    assert found and words in found[0], found


def test_a_playbook_list_that_agrees_with_the_registry_passes(tmp_path):
    root = _scratch(tmp_path)
    _edit(os.path.join(root, "playbooks", "bringup.yml"), 'loop: "{{ preflight_settings.bringup | default([]) }}"',
          "loop: %s" % list(registry.names_for("bringup")))
    assert playbook_disagreements(root) == []


# --- the settings action hands each playbook the registry's lists ---------------------------------------------


def _action(kind, capabilities=None):
    args = {"kind": kind}
    if capabilities is not None:
        args["capabilities"] = capabilities
    return _settings(_args=args)


def test_the_health_check_gets_the_node_local_capabilities_and_their_probes():
    result = _action("healthcheck")
    assert result["ok"], result["errors"]
    assert tuple(result["capabilities"]) == registry.names_for("healthcheck")
    assert set(result["read_args"]) <= set(registry.readers_for("healthcheck"))
    assert set(result["local_probes"]) == set(registry.probes_for("healthcheck")) and result["bringup"] == []


def test_bring_up_gets_the_capabilities_that_write_and_their_apply_steps():
    result = _action("bringup")
    assert result["ok"], result["errors"]
    assert [step["name"] for step in result["bringup"]] == list(registry.names_for("bringup"))
    assert result["local_probes"] == {}
    only = _action("bringup", "ssh_trust, core_dumps")
    assert only["capabilities"] == ["ssh_trust", "core_dumps"]
    assert [step["name"] for step in only["bringup"]] == ["core_dumps", "ssh_trust"]


def test_the_gate_gets_every_capability():
    result = _action("preflight")
    assert tuple(result["capabilities"]) == registry.NAMES and result["bringup"] == []
    assert set(result["read_args"]) <= set(registry.readers_for("preflight"))


def test_a_capability_the_run_does_not_apply_stops_it_with_found_expected_fix():
    result = _action("bringup", ["ssh_trust", "allreduce"])
    assert not result["ok"]
    (error,) = result["errors"]
    assert error["name"] == "preflight_bringup_capabilities" and error["found"] == "allreduce"
    assert "kernel_debug, core_dumps, iommu, debug_tools, ssh_trust" in error["expected"] and error["fix"]


# --- the documentation ---------------------------------------------------------------------------------------


def test_no_page_keeps_a_list_of_capabilities_of_its_own():
    """The capabilities are one table generated from the registry (docs/variables.md); the README, the architecture
    and the gate's page point to it instead of keeping lists that drift."""
    from cluster_preflight.settings import variables_doc  # pylint: disable=import-outside-toplevel
    table = variables_doc.capabilities_table(ROOT)
    assert [line.split("`")[1] for line in table.splitlines() if line.startswith("| [`")] == list(registry.NAMES)
    for page in ("README.md", os.path.join("docs", "architecture.md"), os.path.join("docs", "gate.md")):
        with open(os.path.join(ROOT, page), encoding="utf-8") as handle:
            text = handle.read()
        assert "variables.md" in text, page
        rows = [line for line in text.splitlines() if line.startswith("| `") and line.split("`")[1] in registry.NAMES
                + tuple("%s_" % name for name in registry.NAMES)]
        assert len(rows) < 3, (page, rows)
