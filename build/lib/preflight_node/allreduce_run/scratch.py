# -*- coding: utf-8 -*-
"""The all-reduce's scratch directory on a node, and how root reads back what the job's user wrote there.

Root makes the whole layout before anything of the job runs, then hands only ``job/`` over::

    <scratch>/               root, 0711 (0700 when the job runs as this module's own user): only root changes it
      allreduce_worker.py    root, 0644: the worker the ranks run
      torchrun.log           root, 0600: torchrun's output, written through the descriptor root opened
      job/                   the job's user, 0700, chowned through its descriptor: torchrun's working
        ranks/rank<N>.json   directory and TMPDIR; the ranks' results (``--out``)
        torchrun-logs/...    torchrun's per-rank logs (``--log-dir``)

Root never opens a path inside ``job/``.  It reads through directory descriptors, every component opened with
``O_NOFOLLOW`` (a symbolic link is refused, never followed), every file with ``O_NONBLOCK`` (a FIFO cannot
block it) and checked with ``fstat``: a regular file, owned by the job's user, one link; and read up to a cap.
What it refuses is said (:class:`Refused`), never silently dropped.  The directory is removed with
``shutil.rmtree``, which does not follow links either.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import tempfile

# A rank's result file is a few KiB; anything much larger is not the worker's.
RANK_FILE_MAX = 1 << 20
# Entries looked at in one directory of the job's, and rank log files read in all.
MAX_ENTRIES = 4096
MAX_LOG_FILES = 512
JOB_DIR = "job"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class Refused(Exception):
    """A file or directory of the job's that root does not read; the message says which and why."""


class Scratch(object):
    """The scratch directory of one run, made in ``parent`` (None: the system's temp directory); ``account``
    (a pwd entry, or None for this module's own user) gets ``job/``.  Close it; ``path`` is removed by the
    caller (``shutil.rmtree``)."""

    def __init__(self, parent, account):
        self.path = tempfile.mkdtemp(prefix="preflight-allreduce-", dir=parent)
        self.fd = os.open(self.path, _DIR_FLAGS)
        self.account = account
        self.uid = account.pw_uid if account is not None else os.geteuid()
        self.job_path = os.path.join(self.path, JOB_DIR)

    def write(self, name, text, mode):
        """A file of root's in the scratch directory (before the hand-over); its path."""
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                     dir_fd=self.fd)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        return os.path.join(self.path, name)

    def open_log(self, name="torchrun.log"):
        """A new file of root's (0600) for torchrun's output, open for writing and reading: the descriptor."""
        return os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                       dir_fd=self.fd)

    def hand_over(self):
        """Make ``job/`` and give it to the job's user through its descriptor; the path of ``job/``."""
        os.mkdir(JOB_DIR, 0o700, dir_fd=self.fd)
        fd = os.open(JOB_DIR, _DIR_FLAGS, dir_fd=self.fd)
        try:
            if self.account is not None:
                os.fchown(fd, self.account.pw_uid, self.account.pw_gid)
                # The job's user reaches its directory and the worker; it lists and changes nothing else here.
                os.fchmod(self.fd, 0o711)
        finally:
            os.close(fd)
        return self.job_path

    def job(self):
        """:class:`JobView` of ``job/`` (close it)."""
        return JobView(_open_dir(JOB_DIR, self.fd, JOB_DIR), self.uid, owner_checked=False)

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _open_dir(name, dir_fd, shown):
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
            except OSError:
                link = exc.errno == errno.ELOOP
            raise Refused("%s is %s: not read" % (shown, "a symbolic link" if link else "not a directory"))
        raise


def _checked(fd, shown, uid, directory):
    info = os.fstat(fd)
    if not directory and not stat.S_ISREG(info.st_mode):
        raise Refused("%s is not a regular file (mode %06o): not read" % (shown, info.st_mode))
    if info.st_uid != uid:
        raise Refused("%s belongs to uid %d, not to the job's user (uid %d): not read" % (shown, info.st_uid, uid))
    if not directory and info.st_nlink != 1:
        raise Refused("%s has %d hard links: not read" % (shown, info.st_nlink))
    return info


class JobView(object):
    """Read-only access to the job's directory by descriptor: every path below it is a tuple of names."""

    def __init__(self, fd, uid, owner_checked=True):
        self.fd = fd
        self.uid = uid
        if not owner_checked:
            try:
                _checked(fd, JOB_DIR, uid, directory=True)
            except Refused:
                os.close(fd)
                raise

    @classmethod
    def at(cls, path, uid=None):
        """A view of the directory ``path`` (its last component not followed), files owned by ``uid`` (this
        process's by default)."""
        return cls(_open_dir(path, None, path), os.geteuid() if uid is None else uid, owner_checked=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _walk(self, parts):
        """A descriptor of the directory ``parts`` (the caller closes it)."""
        fd = os.dup(self.fd)
        try:
            for index, name in enumerate(parts):
                child = _open_dir(name, fd, "/".join(parts[:index + 1]))
                os.close(fd)
                fd = child
                _checked(fd, "/".join(parts[:index + 1]), self.uid, directory=True)
            return fd
        except BaseException:
            os.close(fd)
            raise

    def listdir(self, parts=()):
        """Names in the directory ``parts`` (at most :data:`MAX_ENTRIES`); [] when it does not exist."""
        try:
            fd = self._walk(tuple(parts))
        except FileNotFoundError:
            return []
        try:
            names = []
            with os.scandir(fd) as entries:
                for entry in entries:
                    names.append(entry.name)
                    if len(names) >= MAX_ENTRIES:
                        break
            return names
        finally:
            os.close(fd)

    def read(self, parts, max_bytes, whole=False):
        """``(bytes, size)`` of the file ``parts``: all of it when it fits in ``max_bytes``; else (``whole``) the
        file is refused, or its first quarter and its last three quarters with the cut marked."""
        parts = tuple(parts)
        shown = "/".join(parts)
        directory = self._walk(parts[:-1])
        try:
            try:
                fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=directory)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise Refused("%s is a symbolic link: not read" % shown)
                raise
        finally:
            os.close(directory)
        try:
            size = _checked(fd, shown, self.uid, directory=False).st_size
            if size <= max_bytes:
                return os.pread(fd, max(size, 0), 0), size
            if whole:
                raise Refused("%s is %d bytes, over the %d-byte cap: not read" % (shown, size, max_bytes))
            return head_and_tail(fd, size, max_bytes), size
        finally:
            os.close(fd)


def head_and_tail(fd, size, max_bytes):
    """The first quarter of ``max_bytes`` (where NCCL says which transport it chose, at init; cut at a line end)
    and the last bytes, with the cut marked."""
    head = os.pread(fd, max_bytes // 4, 0)
    head = head[:head.rfind(b"\n") + 1] or head
    want = max(0, max_bytes - len(head))
    tail = os.pread(fd, want, max(0, size - want))
    return head + b"[... %d bytes cut ...]\n" % (size - len(head) - len(tail)) + tail


def read_log(fd, max_bytes):
    """``(text of the last max_bytes bytes, full size)`` of root's own log, read through its descriptor."""
    size = os.fstat(fd).st_size
    return os.pread(fd, min(size, max_bytes), max(0, size - max_bytes)).decode(errors="replace"), size


def read_rank_files(job, out="ranks"):
    """``({rank: result}, {rank: why not read})`` of the ranks' result files ``<out>/rank<N>.json``."""
    results, refused = {}, {}
    try:
        names = job.listdir((out,))
    except Refused as exc:
        return results, {None: str(exc)}
    for name in names:
        match = re.match(r"rank(\d{1,9})\.json$", name)
        if not match:
            continue
        rank = int(match.group(1))
        try:
            data = json.loads(job.read((out, name), RANK_FILE_MAX, whole=True)[0].decode(errors="replace"))
        except Refused as exc:
            refused[rank] = "%s (in the job's scratch directory)" % exc
            continue
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(data, dict):
            results[rank] = data
    return results, refused


def read_rank_logs(job, first_rank, max_bytes, logs_dir="torchrun-logs"):
    """Head and tail of the files torchrun writes per rank: ``<logs_dir>/<run_id>_*/attempt_<n>/<local>/std*.log``.
    A file or directory root refuses is listed with ``refused`` and a text saying why, in place of its content."""
    logs, refused = [], []

    def listing(parts):
        try:
            return job.listdir(parts)
        except Refused as exc:
            refused.append(str(exc))
            return []

    files = []
    for run in listing((logs_dir,)):
        for attempt_dir in listing((logs_dir, run)):
            attempt = attempt_dir[len("attempt_"):]
            if not (attempt_dir.startswith("attempt_") and attempt.isdigit()):
                continue
            for local in listing((logs_dir, run, attempt_dir)):
                if local.isdigit():
                    files += [((logs_dir, run, attempt_dir, local, name), int(attempt), int(local))
                              for name in listing((logs_dir, run, attempt_dir, local))
                              if name in ("stdout.log", "stderr.log")]
    for parts, attempt, local in files[:MAX_LOG_FILES]:
        logs.append(_rank_log(job, parts, attempt, first_rank + local, local, max_bytes))
    logs.sort(key=lambda entry: (entry["attempt"], entry["rank"], entry["stream"]))
    if refused:
        text = "".join("preflight: %s\n" % why for why in refused)
        logs.append({"rank": -1, "local_rank": -1, "stream": "stderr", "attempt": 0, "name": "ranks.refused.log",
                     "bytes": 0, "truncated": False, "refused": "; ".join(refused), "text": text})
    return logs


def _rank_log(job, parts, attempt, rank, local, max_bytes):
    stream = parts[-1][:-len(".log")]
    entry = {"rank": rank, "local_rank": local, "stream": stream, "attempt": attempt,
             "name": "rank%d.%s%s.log" % (rank, stream, ".attempt%d" % attempt if attempt else "")}
    try:
        data, size = job.read(parts, max_bytes)
    except Refused as exc:
        return dict(entry, bytes=0, truncated=False, refused=str(exc), text="preflight: %s\n" % exc)
    except OSError as exc:
        return dict(entry, bytes=0, truncated=False, text="preflight: cannot read %s: %s\n" % (
            "/".join(parts), exc.strerror or exc))
    return dict(entry, bytes=size, truncated=size > max_bytes, text=data.decode(errors="replace"))
