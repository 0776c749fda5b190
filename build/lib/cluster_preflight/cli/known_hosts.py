# -*- coding: utf-8 -*-
"""``python -m cluster_preflight known-hosts``: first contact with a cluster's host keys, host-key checking kept on
(controller layer).

Ansible connects with host-key checking on, so the controller must know every node's host key before the first
ping.  This scans each node of the inventory (``ssh-keyscan``, each bounded), shows every key's SHA256 fingerprint
next to the node, and records the keys in the controller's known-hosts file only once the operator has compared
them with what the nodes show themselves (``ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`` on a console or a
channel already trusted) and answered yes.  A key that differs from the one already known for a node is never
replaced: that is the warning host-key checking exists for.  Nothing here turns checking off.
"""

from __future__ import annotations

import base64
import binascii
import concurrent.futures
import hashlib
import os
import subprocess
import sys

from ..verdict.accounting import atomic_write
from ..outputs.cluster_names import GROUP, load_inventory

KEY_TYPES = "ed25519,ecdsa,rsa"
SCAN_TIMEOUT = 5
PARALLEL = 32
# Exit codes of this command.
EXIT_RECORDED = 0
EXIT_DECLINED = 1
EXIT_CHANGED = 2
EXIT_UNANSWERED = 3
EXIT_USAGE = 4


def add_parser(commands):
    """The ``known-hosts`` subcommand on ``commands`` (an argparse subparsers object)."""
    text = ("scan every node's ssh host keys, show their fingerprints, and record them in the controller's known "
            "hosts once you confirm they are the nodes' own (host-key checking stays on)")
    sub = commands.add_parser("known-hosts", help=text, description=text + ". Exit 0 recorded (or already known), "
                              "1 not confirmed, 2 a node's key differs from the one known, 3 a node did not answer, "
                              "4 bad arguments.", allow_abbrev=False)
    sub.add_argument("-i", "--inventory", required=True, metavar="INVENTORY", help="the cluster's inventory")
    sub.add_argument("--known-hosts", default=os.path.join("~", ".ssh", "known_hosts"), metavar="FILE",
                     help="the controller's known-hosts file (default ~/.ssh/known_hosts, the one ssh reads)")
    return sub


def fingerprint(blob):
    """``SHA256:...`` of a base64 public key, as ``ssh-keygen -l`` prints it."""
    digest = hashlib.sha256(base64.b64decode(blob)).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def targets(inventory, group=GROUP):
    """``[(name, address, port)]`` of the group's nodes as Ansible connects to them (ansible_host, ansible_port)."""
    manager, variables = load_inventory(inventory)
    hosts = manager.get_hosts(group) or manager.get_hosts("all")
    found = []
    for host in hosts:
        values = variables.get_vars(host=host)
        found.append((host.name, str(values.get("ansible_host") or host.name), int(values.get("ansible_port") or 22)))
    return found


def pattern(address, port):
    """How known_hosts names ``address`` on ``port``."""
    return address if port == 22 else "[%s]:%d" % (address, port)


def scan(address, port, run=subprocess.run):
    """``[(key type, base64 key)]`` the sshd at ``address:port`` presents, or a text saying why there is none."""
    argv = ["ssh-keyscan", "-T", str(SCAN_TIMEOUT), "-p", str(port), "-t", KEY_TYPES, address]
    try:
        done = run(argv, capture_output=True, text=True, timeout=SCAN_TIMEOUT * 4 + 5, check=False)
    except FileNotFoundError:
        return "ssh-keyscan is not installed (apt-get install openssh-client)"
    except subprocess.TimeoutExpired:
        return "ssh-keyscan did not finish within %d s" % (SCAN_TIMEOUT * 4 + 5)
    keys = []
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and not line.startswith("#"):
            try:
                base64.b64decode(parts[2], validate=True)
            except (binascii.Error, ValueError):
                continue
            keys.append((parts[1], parts[2]))
    if not keys:
        last = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("#")]
        return "no host key from %s (%s)" % (pattern(address, port), last[-1] if last else "no answer: sshd down, a "
                                             "firewall, or the wrong address or port")
    return keys


def known_keys(path, name, run=subprocess.run):
    """``{key type: base64 key}`` known for ``name`` in ``path`` (hashed entries too, through ``ssh-keygen -F``)."""
    if not os.path.isfile(path):
        return {}
    done = run(["ssh-keygen", "-F", name, "-f", path], capture_output=True, text=True, timeout=30, check=False)
    known = {}
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and not line.startswith("#"):
            known[parts[1]] = parts[2]
    return known


def plan(nodes, known_hosts, scan_node=None, lookup=None):
    """``{new, known, changed, unanswered}``: what scanning ``nodes`` (with ``scan_node``, default :func:`scan`)
    found against ``known_hosts``.  ``new``: ``[(name, address, port, type, key)]`` to record; ``changed``:
    texts; ``unanswered``: texts."""
    scan_node, lookup = scan_node or scan, lookup or known_keys
    found = {"new": [], "known": [], "changed": [], "unanswered": []}
    # Every node at once (each scan is bounded), so a large cluster takes one bound, not one per node.
    with concurrent.futures.ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        scanned = list(pool.map(lambda node: scan_node(node[1], node[2]), nodes))
    for (name, address, port), keys in zip(nodes, scanned):
        if isinstance(keys, str):
            found["unanswered"].append("%s: %s" % (name, keys))
            continue
        known = lookup(known_hosts, pattern(address, port))
        for kind, key in keys:
            if kind in known and known[kind] != key:
                found["changed"].append("%s (%s): its %s key is %s, the known one %s" % (
                    name, pattern(address, port), kind, fingerprint(key), fingerprint(known[kind])))
            elif kind in known:
                found["known"].append((name, address, port, kind, key))
            else:
                found["new"].append((name, address, port, kind, key))
    return found


def entry(name, address, port, kind, key):
    """The known_hosts line of one key: the address Ansible connects to, and the inventory name."""
    names = [pattern(address, port)] + ([pattern(name, port)] if name != address else [])
    return "%s %s %s" % (",".join(names), kind, key)


def record(path, lines):
    """Append ``lines`` to the known-hosts file at ``path`` atomically (its mode kept, 0600 for a new one; its
    directory made 0700 when missing)."""
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o700)
    old = ""
    mode = 0o600
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            old = handle.read()
        mode = os.stat(path).st_mode & 0o777
    text = old + ("" if not old or old.endswith("\n") else "\n") + "".join(line + "\n" for line in lines)
    atomic_write(path, text, mode=mode)


def run(args, out, ask=None):
    """The command: ``out(text, stream=None)`` prints, ``ask(prompt)`` returns the operator's answer (default: a line
    of stdin); returns the exit code."""
    path = os.path.abspath(os.path.expanduser(args.known_hosts))
    try:
        nodes = targets(args.inventory)
    except Exception as exc:  # pylint: disable=broad-except  # Ansible's own inventory errors, whatever their class
        out("known-hosts: cannot read the inventory %s: %s" % (args.inventory, exc), "stderr")
        return EXIT_USAGE
    if not nodes:
        out("known-hosts: the inventory %s has no node" % args.inventory, "stderr")
        return EXIT_USAGE
    found = plan(nodes, path)
    for text in found["unanswered"]:
        out("NO ANSWER %s" % text)
    for text in found["changed"]:
        out("CHANGED %s" % text)
    if found["changed"]:
        out("known-hosts: nothing recorded: a node's host key differs from the one %s knows. Either the node was "
            "reinstalled, or something else answers at its address. Check on the node itself (ssh-keygen -lf "
            "/etc/ssh/ssh_host_ed25519_key.pub); only then remove the old key (ssh-keygen -R ADDRESS -f %s) and run "
            "this again" % (path, path), "stderr")
        return EXIT_CHANGED
    for name, address, port, kind, key in found["known"]:
        out("known     %-20s %-22s %-20s %s" % (name, pattern(address, port), kind, fingerprint(key)))
    for name, address, port, kind, key in found["new"]:
        out("new       %-20s %-22s %-20s %s" % (name, pattern(address, port), kind, fingerprint(key)))
    if found["new"]:
        out("Compare each fingerprint with what the node shows itself, on its console or a channel you already "
            "trust: ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub (and _ecdsa_, _rsa_).")
        answer = (ask or _ask)("Record these %d keys in %s? [yes/no] " % (len(found["new"]), path))
        if str(answer).strip().lower() not in ("y", "yes"):
            out("known-hosts: nothing recorded (not confirmed)", "stderr")
            return EXIT_DECLINED
        record(path, [entry(*item) for item in found["new"]])
        out("recorded %d keys of %d nodes in %s" % (len(found["new"]), len({item[0] for item in found["new"]}), path))
    else:
        out("nothing new to record: %s knows every key the nodes presented" % path)
    return EXIT_UNANSWERED if found["unanswered"] else EXIT_RECORDED


def _ask(prompt):
    sys.stdout.write(prompt)
    sys.stdout.flush()
    return sys.stdin.readline()
