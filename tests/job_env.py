"""A training Python an unprivileged test user can run, for the tests that run job-side code as that user.

The project's ``.venv`` may sit on an interpreter no other account can reach (a pyenv build under
``/root``, mode 0700), so a job user could not start it.  This builds, once, a venv at
:data:`JOB_PYTHON_DIR` on the system's own ``/usr/bin/python3`` (same minor version) that sees
``.venv``'s packages (torch): through a ``.pth`` file when the user can read them, else through a
hard-linked copy (same file system, no extra space).  ``/opt`` is shared with the test bed's nodes.
"""

import os
import pwd
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_SITE = os.path.join(ROOT, ".venv", "lib", "python%d.%d" % sys.version_info[:2], "site-packages")
JOB_PYTHON_DIR = "/opt/preflight-test-job-python"
JOB_USER = "nobody"


def _runs_as(user, python):
    try:
        return subprocess.run(["runuser", "-u", user, "--", python, "-c", "import torch"], cwd="/",
                              capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def account_exists(name):
    """Whether ``name`` is an account on this machine."""
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def job_python(user=JOB_USER):
    """Path of a Python with torch that ``user`` can run; None when this machine cannot make one
    (not root, or no system Python of this minor version)."""
    if os.geteuid() != 0:
        return None
    python = os.path.join(JOB_PYTHON_DIR, "bin", "python")
    if os.path.exists(python) and _runs_as(user, python):
        return python
    system = "/usr/bin/python%d.%d" % sys.version_info[:2]
    if not os.access(system, os.X_OK):
        return None
    shutil.rmtree(JOB_PYTHON_DIR, ignore_errors=True)
    subprocess.run([system, "-m", "venv", "--without-pip", JOB_PYTHON_DIR], check=True, timeout=120)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    with open(os.path.join(site, "preflight-test.pth"), "w") as handle:
        handle.write(VENV_SITE + "\n")
    if not _runs_as(user, python):
        os.unlink(os.path.join(site, "preflight-test.pth"))
        subprocess.run(["cp", "-al", VENV_SITE + "/.", site], check=True, timeout=300)
    os.chmod(JOB_PYTHON_DIR, 0o755)
    return python if _runs_as(user, python) else None

