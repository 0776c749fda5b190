# -*- coding: utf-8 -*-
"""The newest core file of a directory and gdb's backtrace of it, for ``diagnose`` (``library/diagnose_stacks.py``).

A core directory is usually writable by every account (cores of every job land there), so a core in it may be
anyone's, planted on purpose.  Root never reads one as root on another account's behalf: the chosen file is opened
without following a link and checked to be the file chosen, and gdb reads it as the core's owner (its ids and a
minimal environment); a core of root's only where no other account can swap it (docs/security.md).
"""

from __future__ import annotations

import fnmatch
import os
import pwd
import stat
import struct

# Bytes of one backtrace kept in the result.
TEXT_LIMIT = 200000


def _listdir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


def newest_core(core_dir, glob="core*"):
    """``{path, name, mtime, size, uid, links}`` of the newest regular file in ``core_dir`` matching ``glob``
    (links are never followed), or None."""
    best = None
    for name in _listdir(core_dir):
        if not fnmatch.fnmatch(name, glob or "*"):
            continue
        path = os.path.join(core_dir, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode):
            continue
        if best is None or info.st_mtime > best["mtime"]:
            best = {"path": path, "name": name, "mtime": info.st_mtime, "size": info.st_size, "uid": info.st_uid,
                    "links": info.st_nlink, "ino": info.st_ino}
    return best


NT_PRPSINFO = 3
NT_FILE = 0x46494C45


def core_program(path):
    """``(command, executable)`` recorded in an ELF64 little-endian core: the NT_PRPSINFO arguments and
    the mapped file that is the program (its name starts like the process name; else the first one).
    ``path`` may be an open descriptor (read from, left open)."""
    try:
        with (os.fdopen(os.dup(path), "rb") if isinstance(path, int) else open(path, "rb")) as handle:
            header = handle.read(64)
            if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1 or struct.unpack_from("<H", header, 16)[0] != 4:
                return "", ""
            phoff, = struct.unpack_from("<Q", header, 32)
            phentsize, phnum = struct.unpack_from("<HH", header, 54)
            notes = []
            for index in range(phnum):
                handle.seek(phoff + index * phentsize)
                ptype, _flags, offset, _vaddr, _paddr, filesz = struct.unpack("<IIQQQQ", handle.read(40))
                if ptype == 4:  # PT_NOTE
                    handle.seek(offset)
                    notes.append(handle.read(min(filesz, 16 << 20)))
    except (OSError, struct.error):
        return "", ""
    fname, psargs, files = "", "", []
    for blob in notes:
        position = 0
        while position + 12 <= len(blob):
            namesz, descsz, ntype = struct.unpack_from("<III", blob, position)
            desc_at = position + 12 + ((namesz + 3) & ~3)
            desc = blob[desc_at:desc_at + descsz]
            position = desc_at + ((descsz + 3) & ~3)
            if ntype == NT_PRPSINFO and len(desc) >= 136:
                fname = desc[40:56].split(b"\0")[0].decode(errors="replace")
                psargs = desc[56:136].split(b"\0")[0].decode(errors="replace").strip()
            elif ntype == NT_FILE and len(desc) >= 16:
                count, = struct.unpack_from("<Q", desc, 0)
                names = desc[16 + 24 * count:].split(b"\0")
                files = [name.decode(errors="replace") for name in names[:count] if name]
    executable = next((name for name in files if fname and os.path.basename(name).startswith(fname[:15])),
                      files[0] if files else "")
    return psargs, executable


def _open_core(core_dir, core):
    """A descriptor of the chosen core, the very file that was chosen (no link followed, no FIFO waited on)."""
    fd = os.open(os.path.join(core_dir, core["name"]), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_ino != core["ino"]:
        os.close(fd)
        raise OSError("%s changed while it was chosen" % core["name"])
    return fd


def core_reader(core_dir, core, euid=None):
    """``(user to run gdb as: a name, None for this process's own; or None and why not)``.  gdb reads a core as
    the core's owner, never as root on another account's file; a core of root's only where no other account can
    swap the file (one link, in a directory others cannot write, or can only with the sticky bit)."""
    euid = os.geteuid() if euid is None else euid
    if euid != 0 or core["uid"] == euid:
        if core["uid"] == 0 and core["links"] != 1:
            return None, "%s is root's but has %d links (another account's link to root's file?)" % (
                core["path"], core["links"])
        if core["uid"] == 0:
            parent = os.stat(core_dir)
            if parent.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not parent.st_mode & stat.S_ISVTX:
                return None, ("%s is root's, in %s, which other accounts can write without the sticky bit: the "
                              "file gdb would open could be swapped" % (core["path"], core_dir))
        return "", ""
    try:
        return pwd.getpwuid(core["uid"]).pw_name, ""
    except KeyError:
        return None, "%s belongs to uid %d, which has no account here to read it as" % (core["path"], core["uid"])


def core_backtrace(core_dir, glob, gdb, timeout, ops):
    """gdb's ``thread apply all bt`` of the newest core in ``core_dir``, bounded by ``timeout`` seconds, run as the
    core's owner (:func:`core_reader`)."""
    core = newest_core(core_dir, glob)
    if core is None:
        return {"path": "", "found": False, "error": "no file matching %s in %s" % (glob, core_dir)}
    result = {key: core[key] for key in ("path", "mtime", "size", "uid")}
    result.update(found=True, command="", executable="", error="", backtrace="")
    try:
        fd = _open_core(core_dir, core)
    except OSError as exc:
        result["error"] = "%s was not read: %s" % (core["path"], exc.strerror or exc)
        return result
    try:
        command, executable = core_program(fd)
    finally:
        os.close(fd)
    result.update(command=command, executable=executable)
    user, why = core_reader(core_dir, core)
    if user is None:
        result["error"] = "gdb was not run: %s" % why
        return result
    result["gdb_user"] = user or _me()
    if not gdb:
        result["error"] = "gdb not found on this node (install it: bringup.yml, role debug_tools)"
        return result
    argv = [gdb, "-batch", "-nx", "-ex", "set pagination off", "-ex", "thread apply all bt"]
    argv += [executable, core["path"]] if executable and os.path.exists(executable) else ["-c", core["path"]]
    rc, out, err = ops.run(argv, timeout=timeout, user=user or None)
    result.update(rc=rc, backtrace=(out + ("\n" + err if err.strip() else ""))[:TEXT_LIMIT])
    if rc == 124:
        result["error"] = "gdb did not finish within %g s" % float(timeout)
    elif rc != 0:
        result["error"] = "gdb exited %d: %s" % (rc, (err.strip().splitlines() or [""])[-1][:300])
    return result


def _me():
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())
