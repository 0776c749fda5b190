# -*- coding: utf-8 -*-
"""The running sshd and its host keys, and the ssh client configuration's Includes.

Node layer (``module_utils/preflight_node/ssh/sshd.py``, shipped in module calls): used by the reader of
``module_utils/preflight_node/capabilities/ssh_trust.py`` (a node's own host keys).
Commands run through an ``ops`` object (``module_utils/preflight_node/host/ops.py``) as argv lists;
nothing here decides a check.
"""

from __future__ import annotations

import fnmatch
import getopt
import glob
import os
import re

from ..host.proc import socket_owners
from .primitives import ENCODING, SshTrustError, parse_public_key, read_file, read_text, rooted, split_lines
from ..host.ownership import allowed_prefixes, untrusted

SSHD_CONFIG = "/etc/ssh/sshd_config"
# sshd's host keys when its configuration names none (sshd_config(5), HostKey).
DEFAULT_HOST_KEYS = ("/etc/ssh/ssh_host_rsa_key", "/etc/ssh/ssh_host_ecdsa_key", "/etc/ssh/ssh_host_ed25519_key")


# --------------------------------------------------------------------------
# sshd's host keys


def _sshd_config_words(line):
    line = line.strip()
    if not line or line.startswith("#"):
        return None, []
    match = re.match(r"^(\S+?)(?:\s*=\s*|\s+)(.*)$", line)
    if not match:
        return line.lower(), []
    return match.group(1).lower(), match.group(2).split()


def sshd_host_key_paths(root, config=SSHD_CONFIG, depth=0, defaults=True):
    """HostKey paths of an sshd configuration (with its Includes), in order; the sshd default
    list when none is named (and ``defaults``: sshd adds them only when no -h key was given
    either).  Stops at the first Match block, where HostKey is not allowed."""
    paths = []
    full = rooted(root, config)
    text = read_text(full)
    if text is None:
        if depth == 0:
            raise SshTrustError("sshd configuration %s does not exist" % config)
        return paths
    for line in split_lines(text):
        keyword, args = _sshd_config_words(line)
        if keyword == "match":
            break
        if keyword == "hostkey" and args:
            paths.append(args[0])
        elif keyword == "include" and depth < 8:
            for pattern in args:
                if not pattern.startswith("/"):
                    pattern = os.path.join("/etc/ssh", pattern)
                for match in sorted(glob.glob(rooted(root, pattern))):
                    logical = "/" + os.path.relpath(match, root).lstrip("/") if root not in ("", "/") else match
                    paths.extend(sshd_host_key_paths(root, logical, depth + 1))
    if depth == 0 and not paths and defaults:
        paths = list(DEFAULT_HOST_KEYS)
    seen = []
    for path in paths:
        if path not in seen:
            seen.append(path)
    return seen



# --------------------------------------------------------------------------
# The running sshd: the process listening on the port, its -f / -h / -o, and `sshd -T`
#
# The keys to distribute are the ones the running sshd serves.  Assuming /etc/ssh/sshd_config
# is wrong for an sshd started with -f elsewhere (the test bed's, a container's, a second sshd
# on another port): every peer would then hold keys the daemon never presents, and strict ssh
# between nodes fails right after bring-up.

# sshd(8)'s getopt string (OpenSSH 9): the options that take an argument are followed by ':'.
SSHD_GETOPT = "C:E:b:c:f:g:h:k:o:p:u:46DQRTdeiqrtV"
# What `sshd -T` needs to evaluate Match blocks on versions that insist on a connection spec.
SSHD_TEST_CONNECTION = "user=root,host=localhost,addr=127.0.0.1"
_TCP_LISTEN = "0A"


def listening_inodes(root, port):
    """Socket inodes listening on TCP ``port`` (IPv4 and IPv6) in this network namespace."""
    inodes = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        text, _problem = read_file(rooted(root, table))
        for line in (text or "").splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _TCP_LISTEN:
                continue
            try:
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
            except (IndexError, ValueError):
                continue
            if local_port == int(port) and fields[9] != "0" and fields[9] not in inodes:
                inodes.append(fields[9])
    return inodes


def _comm(proc, entry):
    try:
        with open(os.path.join(proc, entry, "comm"), encoding=ENCODING, errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def socket_holders(root, inodes):
    """``(pids, denied)``: the processes holding one of the socket ``inodes`` (from their
    ``/proc/<pid>/fd`` links), and how many processes' descriptors could not be read (not root).
    The processes called sshd are looked at first; every process only when none of them holds it
    (a node with thousands of processes then costs one pass over their descriptors)."""
    proc = rooted(root, "/proc")
    try:
        entries = [entry for entry in os.listdir(proc) if entry.isdigit()]
    except OSError:
        return [], 0
    sshd = [entry for entry in entries if _comm(proc, entry) == "sshd"]
    pids, denied = _holders(proc, sshd, inodes)
    if pids:
        return pids, denied
    return _holders(proc, entries, inodes)


def _holders(proc, entries, inodes):
    owners, denied = socket_owners(proc, entries, inodes)
    return sorted({pid for pids in owners.values() for pid in pids}), denied


def sshd_command_line(text):
    """sshd's argv from ``/proc/<pid>/cmdline``.  sshd rewrites its title to one string,
    ``sshd: /usr/sbin/sshd -D -f CFG [listener] 0 of 10-100 startups``: split that back."""
    parts = [part for part in (text or "").split("\0") if part]
    if len(parts) == 1 and " " in parts[0]:
        title = parts[0]
        if title.startswith("sshd: "):
            title = title[len("sshd: "):]
        parts = title.split(" [listener]")[0].split()
    return parts


def sshd_options(argv):
    """``(config, host_keys, options, problem)`` from sshd's argv: ``-f FILE`` (None: the
    default), every ``-h KEY`` and every ``-o OPTION``, in order."""
    try:
        pairs, _rest = getopt.getopt(list(argv[1:]), SSHD_GETOPT)
    except getopt.GetoptError as exc:
        return None, [], [], "cannot parse sshd's options %r: %s" % (" ".join(argv), exc)
    config, keys, options = None, [], []
    for flag, value in pairs:
        if flag == "-f":
            config = value
        elif flag == "-h":
            keys.append(value)
        elif flag == "-o":
            options.append(value)
    return config, keys, options, None


def _proc_text(root, pid, name):
    try:
        with open(rooted(root, "/proc/%d/%s" % (pid, name)), "rb") as handle:
            return handle.read().decode(ENCODING, "replace")
    except OSError:
        return ""


def _proc_exe(root, pid):
    try:
        exe = os.readlink(rooted(root, "/proc/%d/exe" % pid))
    except OSError:
        return ""
    return exe[:-len(" (deleted)")] if exe.endswith(" (deleted)") else exe


def discover_sshd(root, port, ops=None):
    """The sshd listening on TCP ``port``, found from ``/proc/net/tcp{,6}`` (socket inode) and
    ``/proc/<pid>/fd`` (the process holding it).

    Returns ``{port, pid, exe, argv, config, host_key_args, options, problem}``; ``problem`` says
    why no sshd was found (nothing listens, descriptors unreadable without root, the socket is
    held by something else such as systemd's socket activation).  Never raises."""
    found = {"port": int(port), "pid": None, "exe": "", "argv": [], "config": SSHD_CONFIG, "host_key_args": [],
             "options": [], "problem": ""}
    inodes = listening_inodes(root, port)
    if not inodes:
        found["problem"] = "no process listens on TCP port %d (/proc/net/tcp, /proc/net/tcp6)" % int(port)
        return found
    pids, denied = socket_holders(root, inodes)
    if not pids:
        found["problem"] = ("no process found holding the socket that listens on port %d (%s)" % (int(port), (
            "the descriptors of %d process(es) could not be read: run as root (preflight_become: true)" % denied)
            if denied else "it is held outside this node's process table"))
        return found
    holders = []
    for pid in pids:
        argv = sshd_command_line(_proc_text(root, pid, "cmdline"))
        exe = _proc_exe(root, pid)
        holders.append((pid, argv, exe))
    sshd = [h for h in holders if os.path.basename(h[2]) == "sshd"
            or (h[1] and os.path.basename(h[1][0]) == "sshd")]
    if not sshd:
        found["problem"] = ("port %d is held by %s, not by an sshd (socket activation? then each connection's "
                            "sshd reads its unit's -f, by default %s)" % (int(port), ", ".join(
                                "pid %d (%s)" % (pid, " ".join(argv) or exe or "?") for pid, argv, exe in holders),
                                SSHD_CONFIG))
        return found
    pid, argv, exe = sshd[0]
    why = impostor(root, pid, exe)
    if why:
        # Root runs nothing of it and reads nothing it names (its -f, -h): another account chose them.
        found["problem"] = ("port %d is held by pid %d (%s), which is not root's sshd: %s; neither its program nor "
                            "its configuration was used" % (int(port), pid, " ".join(argv) or exe, why))
        found["impostor"] = {"pid": pid, "argv": argv, "exe": exe, "why": why}
        return found
    config, keys, options, problem = sshd_options(argv)
    found.update(pid=pid, exe=exe, argv=argv, config=config or SSHD_CONFIG, host_key_args=keys, options=options,
                 problem=problem or "")
    if len(sshd) > 1:
        found["other_pids"] = [h[0] for h in sshd[1:]]
    return found


def _uids(root, pid):
    """Real, effective, saved and file-system uids of ``pid`` (``/proc/<pid>/status``); [] when unreadable."""
    for line in _proc_text(root, pid, "status").splitlines():
        if line.startswith("Uid:"):
            return [int(part) for part in line.split()[1:] if part.isdigit()]
    return []


def impostor(root, pid, exe):
    """Why the process ``pid`` (program ``exe``) holding the ssh port is not root's sshd ("" when it is): a real
    sshd listener runs as root, and its program is called sshd (a title or argv[0] anyone can set is not enough)."""
    uids = _uids(root, pid)
    if not uids or any(uid != 0 for uid in uids):
        return "it runs as uid %s, not root" % (", ".join(str(uid) for uid in sorted(set(uids))) or "unknown")
    if os.path.basename(exe or "") != "sshd":
        return "its program is %s, not sshd" % (exe or "unknown")
    return ""


def _program(root, exe, sshd_bin):
    """``(program to run sshd -T with, why the listener's own was refused)``: the listener's program when root
    alone can change it, else the packaged one (module_utils/preflight_node/host/ownership.py)."""
    if not exe or not os.path.exists(rooted(root, exe)):
        return sshd_bin, ""
    why = untrusted(rooted(root, exe), prefixes=[rooted(root, prefix) for prefix in allowed_prefixes()])
    if not why:
        return exe, ""
    return sshd_bin, "the running sshd's program %s was not run as root: %s; %s" % (
        exe, why, "sshd -T ran with %s instead" % sshd_bin if sshd_bin else "no packaged sshd to run instead")


def packaged_sshd(ops):
    """The packaged sshd on PATH or in /usr/sbin, /sbin; None when there is none root alone controls."""
    sshd_bin = ops.which("sshd", ["/usr/sbin", "/sbin"]) if ops is not None else None
    if sshd_bin and os.path.exists(sshd_bin) and untrusted(sshd_bin):
        return None
    return sshd_bin


def sshd_test_host_keys(ops, sshd_bin, config, host_key_args=(), options=(), timeout=10):
    """``(paths, problem)``: the HostKey files of ``sshd -T -f CONFIG [-h KEY]... [-o OPT]...``,
    sshd's own reading of its configuration (Includes, defaults, the -h keys), retried with
    ``-C user=root,host=localhost,addr=127.0.0.1`` for versions that need it with Match blocks."""
    argv = [sshd_bin, "-T", "-f", config]
    for key in host_key_args or ():
        argv += ["-h", key]
    for option in options or ():
        argv += ["-o", option]
    problem = None
    for attempt in (argv, argv + ["-C", SSHD_TEST_CONNECTION]):
        rc, out, err = ops.run(attempt, timeout=timeout)
        if rc == 0:
            paths = []
            for line in (out or "").splitlines():
                fields = line.split(None, 1)
                if len(fields) == 2 and fields[0].lower() == "hostkey" and fields[1].strip() not in paths:
                    paths.append(fields[1].strip())
            if paths:
                return paths, None
            problem = "%s listed no HostKey" % " ".join(attempt[:4])
        else:
            problem = "%s failed (rc %s): %s" % (" ".join(attempt[:4]), rc, (err or "").strip()[-300:])
    return [], problem


def _configured_paths(root, config, host_key_args, options, ops, sshd_bin):
    """``(paths, how, problem)`` for an sshd started with ``-f config -h ... -o ...``."""
    if ops is not None and sshd_bin:
        paths, problem = sshd_test_host_keys(ops, sshd_bin, rooted(root, config), host_key_args, options)
        if paths:
            return paths, "sshd -T", None
    else:
        problem = "no sshd binary to run sshd -T"
    # No usable sshd -T (not root, no binary): read the file as sshd would, -h and -o HostKey first.
    explicit = list(host_key_args or ())
    for option in options or ():
        keyword, args = _sshd_config_words(option)
        if keyword == "hostkey" and args:
            explicit.append(args[0])
    try:
        parsed = sshd_host_key_paths(root, config, defaults=not explicit)
    except (SshTrustError, OSError, UnicodeError) as exc:
        return [], "parsed", "sshd configuration %s cannot be read: %s (%s)" % (
            config, getattr(exc, "strerror", None) or exc, problem)
    seen = []
    for path in explicit + parsed:
        if path not in seen:
            seen.append(path)
    return seen, "parsed (%s)" % problem, None


def host_key_sources(root, sshd_config="", host_key_files=(), ops=None, port=22):
    """``(paths, problem, sshd)``: the host key files to read, why there are none, and where they
    were found (``sshd``: ``{source, config, how, port, pid, argv, discovery}``).

    In order: ``host_key_files`` (ssh_trust_host_key_files); ``sshd_config``
    (ssh_trust_sshd_config, an explicit override); else the sshd listening on ``port``
    (:func:`discover_sshd`), whose ``-f``/``-h``/``-o`` go to ``sshd -T``; else, when no sshd could
    be found, the default configuration, with ``discovery`` saying why.  A missing or unreadable
    configuration is a problem to report, never an exception."""
    sshd = {"source": "", "config": "", "how": "", "port": int(port or 22), "pid": None, "argv": [],
            "discovery": ""}
    if host_key_files:
        sshd.update(source="ssh_trust_host_key_files", how="listed")
        return list(host_key_files), None, sshd
    sshd_bin = packaged_sshd(ops)
    if sshd_config:
        sshd.update(source="ssh_trust_sshd_config", config=sshd_config)
        if not os.path.exists(rooted(root, sshd_config)):
            return [], "sshd configuration %s does not exist (ssh_trust_sshd_config)" % sshd_config, sshd
        paths, how, problem = _configured_paths(root, sshd_config, (), (), ops, sshd_bin)
        sshd["how"] = how
        return paths, problem, sshd
    found = discover_sshd(root, port, ops)
    sshd.update(pid=found["pid"], argv=found["argv"], config=found["config"])
    if found["pid"] and not found["problem"]:
        sshd["source"] = "listener"
        if found.get("other_pids"):
            sshd["other_pids"] = found["other_pids"]
        exe, refused = _program(root, found["exe"], sshd_bin)
        if refused:
            sshd["refused"] = refused
        if not os.path.exists(rooted(root, found["config"])):
            return [], ("sshd configuration %s (sshd pid %d: %s) does not exist" % (
                found["config"], found["pid"], " ".join(found["argv"]))), sshd
        paths, how, problem = _configured_paths(root, found["config"], found["host_key_args"], found["options"],
                                                ops, exe)
        sshd["how"] = how
        return paths, problem, sshd
    sshd.update(source="default", config=SSHD_CONFIG, discovery=found["problem"])
    if found.get("impostor"):
        sshd["impostor"] = found["impostor"]
    if not os.path.exists(rooted(root, SSHD_CONFIG)):
        return [], ("sshd configuration %s does not exist (no openssh-server, or sshd runs with another -f) and "
                    "%s" % (SSHD_CONFIG, found["problem"])), sshd
    paths, how, problem = _configured_paths(root, SSHD_CONFIG, (), (), ops, sshd_bin)
    sshd["how"] = how
    return paths, problem, sshd


def read_host_key(root, path, ops, timeout=10):
    """``(key or None, problem or None)`` for one host key path (private or ``.pub``).

    key is ``{type, public_key, fingerprint, path}``.  A key without its ``.pub`` is derived
    with ``ssh-keygen -y``, which reads the private half itself; it is never read here."""
    private = path[:-4] if path.endswith(".pub") else path
    public = private + ".pub"
    text, problem = read_file(rooted(root, public))
    if problem:
        return None, problem
    source = public
    if text is None:
        if not os.path.exists(rooted(root, private)):
            return None, "%s: no such host key (neither it nor %s exists)" % (private, public)
        keygen = ops.which("ssh-keygen")
        if not keygen:
            return None, "%s has no .pub and ssh-keygen is not installed to derive it" % private
        rc, out, err = ops.run([keygen, "-y", "-f", rooted(root, private)], timeout=timeout)
        if rc != 0:
            return None, "%s: ssh-keygen -y failed: %s" % (private, (err or "rc %s" % rc).strip()[:200])
        text, source = out, private + " (public half derived with ssh-keygen -y)"
    try:
        key = parse_public_key(text)
    except SshTrustError as exc:
        return None, "%s: %s" % (public, exc)
    return {"type": key["type"], "public_key": "%s %s" % (key["type"], key["blob"]),
            "fingerprint": key["fingerprint"], "path": source}, None


def read_host_keys(root, paths, ops):
    """``(keys, problems)``: one key per type, in the order of ``paths``."""
    keys, problems = [], []
    for path in paths:
        key, problem = read_host_key(root, path, ops)
        if problem:
            problems.append(problem)
        elif key["type"] not in [k["type"] for k in keys]:
            keys.append(key)
    return keys, problems


# --------------------------------------------------------------------------
# The ssh client configuration


def ssh_config_includes(root, ssh_config):
    """Include patterns of an ssh client configuration, as absolute logical paths, in order.

    Relative patterns are relative to /etc/ssh for a system configuration (ssh_config(5))."""
    text, _problem = read_file(rooted(root, ssh_config))
    patterns = []
    for line in split_lines(text or ""):
        keyword, args = _sshd_config_words(line)
        if keyword != "include":
            continue
        for pattern in args:
            if pattern.startswith("~"):
                continue
            patterns.append(pattern if pattern.startswith("/") else os.path.join("/etc/ssh", pattern))
    return patterns


def included(patterns, path):
    """Whether the file ``path`` is read through one of the Include ``patterns``."""
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)
