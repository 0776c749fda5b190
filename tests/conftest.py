"""Shared pytest set-up.

The node layer is one package imported under two names: modules in ``library/`` import it as Ansible ships
it (``ansible.module_utils.preflight_node.<name>``), the controller and the tests as the installed package
``preflight_node.<name>``. In the tests' one process both names must be the same module objects (a test
that patches ``preflight_node.host.proc`` patches what a module under test calls), so the Ansible name is an
alias of the installed one. ``library/`` is on sys.path so a test imports a module by name.
"""

import importlib
import importlib.abc
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY = os.path.join(ROOT, "library")
ALIAS = "ansible.module_utils.preflight_node"


class _SameModule(importlib.abc.Loader):
    def __init__(self, target):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module):
        pass


class _NodeLayerAlias(importlib.abc.MetaPathFinder):
    """``ansible.module_utils.preflight_node[.x]`` -> the module object of ``preflight_node[.x]``."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != ALIAS and not fullname.startswith(ALIAS + "."):
            return None
        real = "preflight_node" + fullname[len(ALIAS):]
        module = importlib.import_module(real)
        return importlib.util.spec_from_loader(fullname, _SameModule(real),
                                               is_package=hasattr(module, "__path__"))


sys.meta_path.insert(0, _NodeLayerAlias())
if LIBRARY not in sys.path:
    sys.path.insert(0, LIBRARY)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
