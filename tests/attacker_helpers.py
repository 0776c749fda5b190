"""What the tests that play an unprivileged account against root share: small shell programs (a job's "training
Python", a fake tool) owned by whom the test says.  The directory such an account can enter is the ``public_dir``
fixture of tests/unit/conftest.py."""

import os


def write_script(path, body, owner=None):
    """``path``, a ``#!/bin/sh`` program running ``body``, mode 0755, owned by ``owner`` (a pwd entry; None:
    this process's user)."""
    with open(path, "w") as handle:
        handle.write("#!/bin/sh\n" + body)
    os.chmod(path, 0o755)
    if owner is not None:
        os.chown(path, owner.pw_uid, owner.pw_gid)
    return path
