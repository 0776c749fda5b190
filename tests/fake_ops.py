"""Stand-ins for the node's ``ops`` (the Protocol ``Ops`` of module_utils/preflight_node/host/ops.py, which NodeOps
implements on a node) in reader and probe unit tests.

    ops = FakeOps(programs={"ssh-keygen": "/usr/bin/ssh-keygen"},
                  commands={("/usr/bin/ssh-keygen", "-y"): (0, "ssh-ed25519 AAAA...\n", "")})
    facts = preflight_ssh_trust.read(args, ops)
    assert ops.calls[0][0] == "/usr/bin/ssh-keygen"

``commands`` maps an argv prefix (tuple) to ``(rc, out, err)`` or to a callable
``argv -> (rc, out, err)``; the longest matching prefix wins; an argv nothing
matches returns rc 127 as a missing program would.  ``LocalOps`` runs real
commands, for readers tested against this machine.
"""

import os
import shutil


CONNECTING_USER = {"name": "trainer", "uid": 1000, "run_as": None, "how": "connecting", "note": ""}


class FakeOps(object):
    def __init__(self, programs=None, commands=None):
        self.programs = dict(programs or {})
        self.commands = dict(commands or {})
        self.calls = []
        self.users = []  # the user each call ran as (None: the module's own)
        # As node_call resolves it for a module connected as an unprivileged user.
        self.job, self.job_user = dict(CONNECTING_USER), None

    def which(self, name, paths=()):
        return self.programs.get(name)

    def run(self, argv, timeout=20.0, env=None, cwd=None, data=None, user=None):
        argv = [str(part) for part in argv]
        self.calls.append(argv)
        self.users.append(user)
        best = None
        for prefix in self.commands:
            if tuple(argv[:len(prefix)]) == tuple(prefix) and (best is None or len(prefix) > len(best)):
                best = prefix
        if best is None:
            return 127, "", "%s: not found (FakeOps)" % argv[0]
        answer = self.commands[best]
        return answer(argv) if callable(answer) else answer


class LocalOps(object):
    """Real commands on this machine (as NodeOps runs them), for readers tested against this machine."""

    def __init__(self, missing=()):
        self.missing = set(missing)
        self.calls = []
        # As node_call resolves it for a module connected as an unprivileged user.
        self.job, self.job_user = dict(CONNECTING_USER), None

    def which(self, name, paths=()):
        if name in self.missing:
            return None
        return shutil.which(name, path=":".join(list(paths) + [os.environ.get("PATH", "")]))

    def run(self, argv, timeout=20.0, env=None, cwd=None, data=None, user=None):
        from preflight_node.host.ops import run_bounded_command

        argv = [str(part) for part in argv]
        self.calls.append(argv)
        return run_bounded_command(argv, timeout, env=env, cwd=cwd, data=data, user=user)
