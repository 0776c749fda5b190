# -*- coding: utf-8 -*-
"""The fixed program every srun task starts with, before any code of the node-code archive runs.

The srun engine's tasks run the node code as root from an archive on the node (``preflight_srun_dir``, or the
operator's ``preflight_srun_archive``).  A check of where the archive lies written *inside* the archive would judge
itself: whoever could replace the file would replace the check with it.  So the controller hands each task this
program's text on its command line (``python -I -S -c <this file> ARCHIVE SHA256 CALL``, ``step.srun_argv``), and
it, not the archive, decides whether the archive may run:

1. the archive is opened once, without following a link (``O_NOFOLLOW``, ``O_NONBLOCK``: a FIFO cannot hold it),
   and that descriptor must be a regular file of this account's (root's), written by no one else (not group or
   other writable), with one link, at most :data:`MAX_BYTES`;
2. every directory on its path must be this account's or root's and writable by no other account (a sticky one
   excepted), and every symbolic link on the way this account's or root's;
3. its bytes, read from that descriptor, must have the SHA-256 the controller computed for its own node code;
4. then the node code is imported from those bytes in memory (never from the path again, which another account
   might change in between) and ``preflight_node.srun_task.main`` runs the call.

Anything else is refused before one line of the archive runs: the task prints a failed result in the step's
protocol (``module_utils/preflight_node/srun_task.py``) naming what it found, and the node is failed for the call,
never run.  The standard library only; this file is never imported by the node code.
"""

import base64
import hashlib
import importlib.abc
import importlib.util
import io
import json
import os
import stat
import sys
import zipfile
import zlib

MAX_BYTES = 64 * 1024 * 1024
PACKAGE = "preflight_node"


def _owner_ok(info):
    return info.st_uid in (0, os.geteuid())


def path_problem(path):
    """Why the directories and links on the way to ``path`` let another account change what it names, or ""."""
    checked = "/"
    for part in [item for item in os.path.dirname(os.path.abspath(path)).split("/") if item]:
        checked = os.path.join(checked, part)
        try:
            info = os.lstat(checked)
        except OSError as exc:
            return "%s: %s" % (checked, exc.strerror or exc)
        if stat.S_ISLNK(info.st_mode):
            if not _owner_ok(info):
                return "%s is a symbolic link of uid %d, which that account can point elsewhere" % (checked,
                                                                                                    info.st_uid)
            continue
        if not stat.S_ISDIR(info.st_mode):
            return "%s is not a directory" % checked
    real = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    parts = [item for item in real.split("/") if item]
    for directory in ["/"] + ["/" + "/".join(parts[:index + 1]) for index in range(len(parts))]:
        try:
            info = os.lstat(directory)
        except OSError as exc:
            return "%s: %s" % (directory, exc.strerror or exc)
        if not _owner_ok(info):
            return "the directory %s belongs to uid %d, which could replace the node code" % (directory, info.st_uid)
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
            return "the directory %s is writable by other accounts (mode %04o)" % (directory,
                                                                                  stat.S_IMODE(info.st_mode))
    return ""


def load(path, digest):
    """``(bytes, "")`` of the archive at ``path`` when it may run, else ``(None, why)``."""
    problem = path_problem(path)
    if problem:
        return None, problem
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        return None, "%s cannot be opened without following a link: %s" % (path, exc.strerror or exc)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, "%s is not a regular file" % path
        if not _owner_ok(info):
            return None, "%s belongs to uid %d, not root" % (path, info.st_uid)
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return None, "%s is writable by other accounts (mode %04o)" % (path, stat.S_IMODE(info.st_mode))
        if info.st_nlink != 1:
            return None, "%s has %d links (another name for it could be changed)" % (path, info.st_nlink)
        if info.st_size > MAX_BYTES:
            return None, "%s is %d bytes, more than the node code ever is" % (path, info.st_size)
        chunks, left = [], MAX_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    found = hashlib.sha256(data).hexdigest()
    if found != digest:
        return None, ("%s is not this controller's node code (sha256 %s, expected %s): another version, or changed "
                      "since it was written" % (path, found[:16], digest[:16]))
    return data, ""


class NodeCode(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The node code's modules, imported from the archive's verified bytes in memory."""

    def __init__(self, data):
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            self.files = {name: archive.read(name) for name in archive.namelist()
                          if name.startswith(PACKAGE + "/") and name.endswith(".py")}

    def _key(self, name):
        """``(file in the archive, whether it is a package)`` of the module ``name``, or ``(None, False)``."""
        if name != PACKAGE and not name.startswith(PACKAGE + "."):
            return None, False
        base = name.replace(".", "/")
        if base + "/__init__.py" in self.files:
            return base + "/__init__.py", True
        if base + ".py" in self.files:
            return base + ".py", False
        return None, False

    def find_spec(self, name, path=None, target=None):  # pylint: disable=unused-argument
        key, package = self._key(name)
        if key is None:
            return None
        return importlib.util.spec_from_loader(name, self, origin="<node code>/" + key, is_package=package)

    def create_module(self, spec):  # pylint: disable=unused-argument
        return None

    def exec_module(self, module):
        key, _package = self._key(module.__name__)
        exec(compile(self.files[key], "<node code>/" + key, "exec"), module.__dict__)  # pylint: disable=exec-used

    def get_source(self, name):
        key, _package = self._key(name)
        return self.files[key].decode("utf-8") if key else None


def refuse(why):
    """The step's protocol (srun_task.Protocol) with a failed result, from this program alone."""
    node = os.environ.get("SLURMD_NODENAME") or os.uname()[1].split(".")[0]
    tag = "PFR %s %d" % (node, int(os.environ.get("SLURM_LOCALID") or 0))
    result = {"failed": True, "msg": "refused to run the node code on %s: %s (preflight_srun_dir and "
                                     "preflight_srun_archive must be root's alone, holding this controller's node "
                                     "code: python -m cluster_preflight.engine.archive PATH writes it)" % (node, why)}
    text = base64.b64encode(zlib.compress(json.dumps(result).encode("utf-8"))).decode("ascii")
    lines = ["%s +" % tag] + ["%s r %d 1 %s" % (tag, 0, text)] + [
        "%s end %s" % (tag, hashlib.sha256(text.encode("ascii")).hexdigest())]
    os.write(1, ("\n".join(lines) + "\n").encode("ascii"))
    return 0


def main(argv):
    if len(argv) != 3:
        return refuse("the task's command line is not ARCHIVE SHA256 CALL")
    path, digest, call = argv
    data, why = load(path, digest)
    if data is None:
        return refuse(why)
    sys.meta_path.insert(0, NodeCode(data))
    from preflight_node.srun_task import main as task_main  # pylint: disable=import-outside-toplevel
    return task_main([call])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
