"""Shared pytest set-up: make the project's module_utils importable the way
modules import them (``ansible.module_utils.<name>``) and expose the library
directory on sys.path so modules can be imported by name."""

import os
import sys

import ansible.module_utils

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE_UTILS = os.path.join(ROOT, "module_utils")
LIBRARY = os.path.join(ROOT, "library")

if MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(MODULE_UTILS)
for path in (LIBRARY, ROOT):
    if path not in sys.path:
        sys.path.insert(0, path)
