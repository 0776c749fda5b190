"""Shared set-up for the multi-node tests: the real playbooks over real SSH
against the namespace test bed (tests/testbed.py).

Makes ``testbed`` and ``playbook`` (in tests/) importable and marks every test
of this directory ``multinode``; the bed itself skips a test, with the reason,
where it cannot run (not root, tools missing)."""

import os
import sys

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(items):
    for item in items:
        if str(item.fspath).startswith(HERE + os.sep):
            item.add_marker(pytest.mark.multinode)
