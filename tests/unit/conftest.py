"""Helpers for running a module's main() in-process under patch_module_args."""

import json

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args


class ModuleExit(Exception):
    """Raised instead of exit_json/fail_json; ``result`` holds what was returned."""

    def __init__(self, result, failed):
        super().__init__(json.dumps(result, default=str))
        self.result = result
        self.failed = failed


@pytest.fixture
def run_module(monkeypatch):
    """run_module(module, args, check_mode=False, diff=False) -> (result, failed)."""

    def _exit_json(self, **kwargs):
        raise ModuleExit(kwargs, False)

    def _fail_json(self, msg, **kwargs):
        kwargs["msg"] = msg
        raise ModuleExit(kwargs, True)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", _exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", _fail_json)

    def _run(module, args, check_mode=False, diff=False):
        args = dict(args)
        args["_ansible_check_mode"] = check_mode
        args["_ansible_diff"] = diff
        with patch_module_args(args):
            try:
                module.main()
            except ModuleExit as exc:
                return exc.result, exc.failed
        raise AssertionError("module returned without exit_json/fail_json")

    return _run


@pytest.fixture
def public_dir():
    """A directory of root's in /tmp that every account can enter (pytest's tmp_path cannot be), removed after."""
    import os
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="pf-public-", dir="/tmp")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)
