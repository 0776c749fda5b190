"""The two layers: node code (shipped in module calls) never imports the controller.

import-linter checks the packages (the contract in pyproject.toml: ``preflight_node`` must not import
``cluster_preflight``); the modules in ``library/`` are not a package, so their imports are read here with
the ``ast`` module: a module may import the standard library, ``ansible.module_utils`` and the node layer,
never the controller, which is not on a node.
"""

import ast
import glob
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINT_IMPORTS = os.path.join(os.path.dirname(sys.executable), "lint-imports")


def imported_modules(path):
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def test_the_node_layer_never_imports_the_controller():
    done = subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "The node layer never imports the controller KEPT" in done.stdout


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "library", "*.py"))),
                         ids=os.path.basename)
def test_a_module_imports_only_what_is_shipped_with_it(path):
    bad = [name for name in imported_modules(path)
           if name.split(".")[0] in ("cluster_preflight", "preflight_node")
           or name.startswith("ansible.") and not name.startswith("ansible.module_utils")]
    assert not bad, "%s imports %s: a node gets only ansible.module_utils (the node layer is " \
                    "ansible.module_utils.preflight_node.*)" % (os.path.basename(path), bad)


def test_node_code_imports_its_own_package_relatively():
    """Inside the node package an absolute import of itself would name a package a node may not have
    under that name; relative imports work as shipped and as installed."""
    offenders = []
    for path in glob.glob(os.path.join(ROOT, "module_utils", "preflight_node", "**", "*.py"), recursive=True):
        offenders += ["%s: %s" % (os.path.relpath(path, ROOT), name) for name in imported_modules(path)
                      if name.startswith(("preflight_node", "ansible.module_utils.preflight_node"))]
    assert not offenders, offenders


def test_the_install_takes_every_package_of_both_layers():
    """setuptools installs the packages pyproject.toml's find settings give: every folder of both layers that is a
    package (a subpackage missed would be absent from a plain install while every test here still passed)."""
    import tomllib  # pylint: disable=import-outside-toplevel
    from setuptools import find_packages  # pylint: disable=import-outside-toplevel
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        find = tomllib.load(handle)["tool"]["setuptools"]["packages"]["find"]
    installed = set()
    for where in find["where"]:
        installed.update(find_packages(os.path.join(ROOT, where), include=find["include"]))
    found = set()
    for top, name in (("cluster_preflight", "cluster_preflight"),
                      (os.path.join("module_utils", "preflight_node"), "preflight_node")):
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            if "__init__.py" in files:
                relative = os.path.relpath(folder, os.path.join(ROOT, top))
                found.add(name if relative == "." else "%s.%s" % (name, relative.replace(os.sep, ".")))
            elif any(name.endswith(".py") for name in files):
                found.add("(no __init__.py) %s" % os.path.relpath(folder, ROOT))
    assert installed == found, "installed: missing %s, extra %s" % (sorted(found - installed), sorted(installed - found))
