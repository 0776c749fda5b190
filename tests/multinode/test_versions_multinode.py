"""Versions drift across real nodes of the namespace test bed: one playbook run of preflight.yml.

Node 2's training Python is a wrapper around the real one that reports another torch: the reader's
torch probe (FIND_TORCH, which reads torch's version.py without importing torch) gets its answer
rewritten, and the ranks import a sitecustomize that sets ``torch.__version__`` once torch is
imported.  The gate must name exactly that node in ``allreduce.versions`` (with three nodes the
other two are the majority)."""

import os
import stat

import pytest

from playbook import run_playbook
from testbed import TRAINING_PYTHON, testbed_fixture

pytestmark = pytest.mark.timeout(900)

NODES = 3
ODD_VERSION = "9.9.9"
SITECUSTOMIZE = '''
import builtins, sys
_import = builtins.__import__
def _patched(name, *args, **kwargs):
    module = _import(name, *args, **kwargs)
    torch = sys.modules.get("torch")
    # Only once torch has finished importing: torch itself reads its version while it imports.
    if torch is not None and not getattr(getattr(torch, "__spec__", None), "_initializing", True):
        version = getattr(torch, "__version__", None)
        if version is not None and version != "%s":
            torch.__version__ = type(version)("%s")
    return module
builtins.__import__ = _patched
''' % (ODD_VERSION, ODD_VERSION)
WRAPPER = '''#!/bin/sh
case "$2" in
  *find_spec*) "%(python)s" "$@" | sed 's/"version": "[^"]*"/"version": "%(version)s"/'; exit ;;
esac
PYTHONPATH="%(site)s${PYTHONPATH:+:$PYTHONPATH}"; export PYTHONPATH
exec "%(python)s" "$@"
'''


def odd_python(directory):
    """A training Python that reports torch ODD_VERSION (readable and runnable by every node's user)."""
    site = directory / "site"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    wrapper = directory / "python"
    wrapper.write_text(WRAPPER % {"python": TRAINING_PYTHON, "version": ODD_VERSION, "site": site})
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    for path in (directory, site, site / "sitecustomize.py"):
        path.chmod(path.stat().st_mode | stat.S_IROTH | stat.S_IXOTH)
    return str(wrapper)


@pytest.fixture(scope="module")
def bed(request):
    return testbed_fixture(request, nodes=NODES)


def test_a_node_with_another_torch_is_named_by_the_versions_check(bed, tmp_path):
    python = odd_python(tmp_path / "odd")
    odd = bed.nodes[1].name
    inventory = bed.write_inventory(path=str(tmp_path / "inventory.yml"),
                                    host_vars={odd: {"preflight_training_python": python}})
    result = run_playbook(tmp_path, inventory=inventory, timeout=600, extravars={"ssh_trust_mesh": False})
    verdict = result.verdict
    assert verdict is not None, result.stdout[-3000:]
    checks = {node.name: verdict["nodes"][node.name]["checks"]["allreduce.versions"] for node in bed.nodes}
    failing = sorted(name for name, check in checks.items() if check["status"] == "fail")
    assert failing == [odd], {name: check["found"] for name, check in checks.items()}
    assert "torch %s on %s, but " % (ODD_VERSION, odd) in checks[odd]["found"]
    assert odd in checks[odd]["fix"]
    for node in bed.nodes:
        if node.name != odd:
            assert checks[node.name]["status"] == "pass"
            assert "differs on %s" % odd in checks[node.name]["found"]
    # The all-reduce itself ran (gloo does not care about the version string): the ranks reported it too.
    ranks = verdict.get("allreduce", {}).get("ranks") or []
    assert any((row.get("versions") or {}).get("torch") == ODD_VERSION for row in ranks if row.get("host") == odd), (
        "the odd node's ranks ran the wrapper", verdict.get("allreduce", {}).get("status"),
        [(row.get("host"), row.get("status"), row.get("versions"), row.get("error")) for row in ranks], checks)
    assert os.path.exists(python)
