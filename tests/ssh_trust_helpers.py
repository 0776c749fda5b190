"""Shared helpers of the ssh_trust unit tests (tests/unit/test_ssh_trust_capability.py,
tests/unit/test_ssh_trust_mesh_checks.py, tests/unit/test_ssh_trust_keys.py): role defaults as
settings, fake host keys, node facts tables, cluster views for decide() of
cluster_preflight/capabilities/ssh_trust/, the check-contract assertion, per-user cluster key
facts, and probe() results from FakeOps ssh answers.  Test-side, not shipped."""

import base64
import hashlib
import struct

from cluster_preflight.capabilities import ssh_trust as st
from preflight_node.ssh import known_hosts_plan, primitives as ps
from preflight_node.capabilities import ssh_trust_probe
from fake_ops import FakeOps
from capability_helpers import assert_contract as check_contract, role_path, role_yaml

ROLE = role_path("ssh_trust")
KH = "/etc/ssh/ssh_known_hosts"
DROPIN = "/etc/ssh/ssh_config.d/60-preflight-cluster.conf"
NO_LISTENER = "no process listens on TCP port 22 (/proc/net/tcp, /proc/net/tcp6)"
NO_SSHD = ("sshd configuration /etc/ssh/sshd_config does not exist (no openssh-server, or sshd runs with another -f) "
           "and " + NO_LISTENER)
LISTENER = {"source": "listener", "config": "/etc/ssh/sshd_config", "how": "sshd -T", "port": 22, "pid": 812,
            "argv": ["/usr/sbin/sshd", "-D"], "discovery": ""}


def load_yaml(*parts):
    return role_yaml("ssh_trust", *parts)


def settings(**overrides):
    """The role's defaults, typed, with ``overrides``: what preflight_settings hands the capability."""
    values = {k: v for k, v in load_yaml("defaults", "main.yml").items() if not isinstance(v, str) or "{{" not in v}
    values["ssh_trust_login_policy"] = "fail" if overrides.get("ssh_trust_cluster_key") else "warn"
    values.update(overrides)
    return values


def fake_key(seed, key_type="ssh-ed25519"):
    """A well-formed public key (``TYPE BASE64``); no ssh-keygen needed."""
    raw = (struct.pack(">I", len(key_type)) + key_type.encode() + struct.pack(">I", 32)
           + hashlib.sha256(seed.encode()).digest())
    return "%s %s" % (key_type, base64.b64encode(raw).decode())


def fp(key):
    return ps.fingerprint(key.split()[1])


def node(name, index):
    return {"name": name, "ansible_host": "198.18.0.%d" % index, "node_addr": "198.19.0.%d" % index, "user": "root",
            "ssh_port": 22}


def facts(name, keys=(), block=None, problems=None, hostname=None, dropin_text=None, included=True,
          cluster_key=None, known_error=None):
    hostname = hostname or name
    return {
        "hostname": hostname, "fqdn": hostname, "short_name": hostname.split(".")[0],
        "sshd": dict(LISTENER),
        "sshd_config": {"path": "/etc/ssh/sshd_config", "exists": bool(keys)},
        "host_key_files": ["/etc/ssh/ssh_host_ed25519_key"] if keys else [],
        "keys": [{"type": k.split()[0], "public_key": k, "fingerprint": fp(k),
                  "path": "/etc/ssh/ssh_host_ed25519_key.pub"} for k in keys],
        "problems": list(problems) if problems is not None else ([] if keys else [NO_SSHD]),
        "known_hosts": {"path": KH, "exists": block is not None, "present": bool(block), "block": list(block or []),
                        "error": known_error},
        "client": {"ssh_config": "/etc/ssh/ssh_config", "ssh_config_exists": True,
                   "includes": ["/etc/ssh/ssh_config.d/*.conf"] if included else [], "dropin": DROPIN,
                   "dropin_included": included, "dropin_text": dropin_text, "problem": None},
        "cluster_key": cluster_key,
    }


KEYS = {name: fake_key(name) for name in ("node1", "node2", "node3", "node2new", "stranger")}


def cluster(node_facts, probes=None, all_hosts=None, node_settings=None, **common):
    """The view decide() gets: the hosts of ``node_facts`` targeted, each with ``common`` settings."""
    hosts = sorted(node_facts)
    all_hosts = all_hosts or hosts
    return {"hosts": hosts, "all_hosts": all_hosts,
            "nodes": {h: node(h, all_hosts.index(h) + 1) for h in all_hosts},
            "facts": dict(node_facts),
            "settings": {h: settings(**dict(common, **(node_settings or {}).get(h, {}))) for h in hosts},
            "probes": dict(probes or {})}


def decide_all(view):
    return {h: st.decide(h, view["facts"][h], view["settings"][h], view["probes"].get(h), view)
            for h in view["hosts"]}


def synced_block(view):
    """The block every node holds after bring-up: the plan's entries through the writer's function."""
    plan = st.plan(view)
    return known_hosts_plan.plan_block("", plan["entries"], plan["keep_nodes"])["block"]


def in_sync(names=("node1", "node2", "node3"), **common):
    """A cluster after bring-up: every node's block holds every node's current key."""
    first = cluster({n: facts(n, [KEYS[n]]) for n in names}, **common)
    block = synced_block(first)
    return cluster({n: facts(n, [KEYS[n]], block=block) for n in names}, **common)


def assert_contract(host, checks):
    """Names within the contract, every warn/fail with a fix and naming the node it is about."""
    return check_contract(st.CAPABILITY, checks, host)


def ssh_state(home="/root", home_mode=0o700, ssh_mode=0o700, uid=0, ssh_kind="dir"):
    return {"home": home, "home_state": {"exists": True, "kind": "dir", "mode": home_mode, "uid": uid},
            "ssh_dir": home + "/.ssh", "ssh_dir_state": {"exists": True, "kind": ssh_kind, "mode": ssh_mode, "uid": uid,
                                                         "target": "/srv/shared/.ssh"},
            "authorized_keys_state": {"exists": True, "kind": "file", "mode": 0o600, "uid": uid}}


USERS = {"root": (0, "/root"), "train": (1000, "/home/train")}


def key_state(user="root", pub=None, authorized=(), private=True, exists=True, options="", mode=0o600, ssh=None):
    """One user's cluster key facts; ``authorized`` is [(node, public key)]."""
    if not exists:
        return {"exists": False, "problem": "no user %s" % user}
    uid, home = USERS[user]
    return {"exists": True, "uid": uid, "gid": uid, "home": home, "path": home + "/.ssh/id_ed25519_cluster",
            "ssh": ssh or ssh_state(home, uid=uid), "private": private, "private_mode": mode if private else None,
            "private_uid": uid if private else None, "public_key": pub or "", "fingerprint": fp(pub) if pub else "",
            "problem": "", "authorized": [
                {"options": options, "type": k.split()[0], "public_key": k, "fingerprint": fp(k),
                 "comment": ("node=%s " % n if n else "") + "preflight-ssh-trust-cluster-key", "node": n}
                for n, k in authorized]}


NODES3 = ("node1", "node2", "node3")
UKEY = {(n, u): fake_key("%s-%s" % (n, u)) for n in NODES3 for u in USERS}


def synced_users(node, users=("root", "train"), **changes):
    """Every user on ``node`` with its own key, authorizing its own keys from every node."""
    return {"users": {u: key_state(u, UKEY[(node, u)], **dict({"authorized": [(n, UKEY[(n, u)]) for n in NODES3]},
                                                               **changes.get(u, {})))
                      for u in users}}



def ssh_answers(table):
    """A FakeOps command for ssh: ``table`` maps a target to (rc, stderr); -G answers a safe configuration."""
    def answer(argv):
        if "-G" in argv:
            return 0, ("stricthostkeychecking true\nglobalknownhostsfile /etc/ssh/ssh_known_hosts "
                       "/etc/ssh/ssh_known_hosts2\nuserknownhostsfile ~/.ssh/known_hosts\n"
                       "identityfile ~/.ssh/id_ed25519_cluster\n"), ""
        target = argv[argv.index("--") + 1]
        rc, err = table.get(target, (255, "ssh: Could not resolve hostname %s: Name or service not known\n" % target))
        return rc, "", err
    return answer


def probe_result(source, by_peer, **kwargs):
    """What probe() returns on ``source`` when ssh to each peer (both targets) answers (rc, stderr)."""
    table = {}
    for peer, answer in by_peer.items():
        index = int(peer[-1])
        table["198.19.0.%d" % index] = answer
        table[peer] = answer
    ops = FakeOps(programs={"ssh": "/usr/bin/ssh"}, commands={("/usr/bin/ssh",): ssh_answers(table)})
    hosts = sorted(set(by_peer) | {source})
    view_nodes = {h: node(h, int(h[-1])) for h in hosts}
    args = st.probe_args(settings(**kwargs), view_nodes[source], {"hosts": hosts, "nodes": view_nodes})
    return ssh_trust_probe.probe(args, ops)
