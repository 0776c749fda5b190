# -*- coding: utf-8 -*-
"""The ssh_trust check builders shared by the preflight and the bring-up module ``known_hosts_block``.

Node layer (``module_utils/preflight_node/ssh/checks.py``, shipped in module calls): the checks for
one peer (:func:`peer_host_key_check`, :func:`peer_login_check`), the client configuration, pdsh,
the known-hosts block, the host keys and the keys an sshd serves.  The bring-up module
``known_hosts_block`` (``library/known_hosts_block.py``) builds the known-hosts check on the node,
which keeps this file in the node layer; the controller half (``cluster_preflight/capabilities/ssh_trust*.py``)
builds the others, so the audit and bring-up judge alike.
"""

from __future__ import annotations

from ..checks import check, failed, not_applicable, passed, skipped, warned, worst
from ..privilege import denied, needs_root
from .primitives import safe_fingerprint
from .mesh import host_key_verified
from .sshd import SSHD_CONFIG

BRINGUP = "run bringup.yml (role ssh_trust)"
# How many peers a found text names before it summarises.
LIST_LIMIT = 8


def describe_sshd(sshd):
    """Where the host key files came from, in words (the ``sshd`` fact of :func:`read`)."""
    sshd = sshd or {}
    source = sshd.get("source")
    how = (" (%s)" % sshd["how"]) if sshd.get("how") else ""
    if source == "ssh_trust_host_key_files":
        return "the files of ssh_trust_host_key_files"
    if source == "ssh_trust_sshd_config":
        return "the HostKeys of ssh_trust_sshd_config %s%s" % (sshd.get("config"), how)
    if source == "listener":
        return "the HostKeys of the sshd listening on port %s (pid %s: %s)%s" % (
            sshd.get("port"), sshd.get("pid"), " ".join(sshd.get("argv") or []), how)
    if source == "default":
        return "the HostKeys of %s, assumed because %s%s" % (sshd.get("config"), sshd.get("discovery"), how)
    return "the node's sshd configuration"


def impostor_check(node, keys, sshd, expected):
    """The ssh port held by a process that is not root's sshd (an account's own listener): nothing of it was run
    or read; the keys, if any, are the default configuration's."""
    found = sshd["impostor"]
    keys_text = ("%d host key(s) read from %s instead (%s)" % (len(keys), sshd.get("config"), ", ".join(
        "%s %s" % (k["type"], k["fingerprint"]) for k in keys))) if keys else "no host key read"
    return warned("%s on %s; %s" % (sshd.get("discovery"), node, keys_text), expected,
                  "find what holds port %s on %s (ss -ltnp 'sport = :%s'; pid %s: %s) and stop it: only root's sshd "
                  "may listen there; then re-run" % (sshd.get("port"), node, sshd.get("port"), found.get("pid"),
                                                     " ".join(found.get("argv") or []) or found.get("exe")))


def host_keys_check(node, keys, problems, sshd=None):
    """Whether host keys were read on ``node`` and from the sshd that really runs there."""
    sshd = sshd if isinstance(sshd, dict) else {"source": "ssh_trust_sshd_config", "config": sshd or SSHD_CONFIG}
    expected = "at least one readable host public key on %s, from the sshd that listens on its ssh port" % node
    fix = ("point ssh_trust_sshd_config at the configuration %s's running sshd uses (see its command line: "
           "ps -o args= -C sshd; empty finds it from the process listening on ssh_trust_port) or list its key "
           "files in ssh_trust_host_key_files; a node without openssh-server needs it installed (ssh-keygen -A "
           "creates the default keys)" % node)
    where = describe_sshd(sshd)
    if sshd.get("impostor"):
        return impostor_check(node, keys, sshd, expected)
    if keys and sshd.get("refused"):
        return warned("%d host key(s) on %s read from %s; %s" % (len(keys), node, where, sshd["refused"]), expected,
                      "run sshd from a root-owned program no other account can change (the packaged /usr/sbin/sshd)")
    if keys and sshd.get("source") == "default" and sshd.get("discovery"):
        return warned("%d host key(s) on %s: %s, read from %s; the running sshd was not found, so they may not be "
                      "the keys it serves (ssh_trust.host_keys_served compares them with ssh-keyscan)" % (
                          len(keys), node, ", ".join("%s %s" % (k["type"], k["fingerprint"]) for k in keys), where),
                      expected, "run the preflight as root (preflight_become: true) so the sshd listening on "
                      "ssh_trust_port is found, set ssh_trust_port to its port, or " + fix)
    if keys:
        return passed("%d host key(s) on %s: %s, read from %s" % (len(keys), node, ", ".join(
            "%s %s" % (k["type"], k["fingerprint"]) for k in keys), where), expected)
    if sshd.get("privileged") is False and problems and all(denied(problem) for problem in problems):
        return needs_root("no host public key on %s could be read without root (%s; looked at %s)" % (
            node, "; ".join(problems), where), expected)
    return failed("no readable host public key on %s (%s; looked at %s)" % (
        node, "; ".join(problems) or "none named", where), expected, fix)


def served_keys_check(source, node, keys, row):
    """Whether the keys ``node``'s sshd presented to ``source``'s ssh-keyscan (``row``: ``{target,
    keys, error}``) are among ``keys``, the ones read from ``node``'s own files (``TYPE BASE64``)."""
    expected = "the sshd of %s presents only host keys read from its own key files" % node
    if not row:
        return skipped("%s did not scan %s's sshd" % (source, node), expected)
    if not row.get("keys"):
        return skipped("ssh-keyscan from %s to %s (%s) got no key: %s" % (source, node, row.get("target"),
                                                                          row.get("error") or "no answer"), expected)
    read = {text.split()[1] for text in keys or [] if len(text.split()) >= 2}
    unknown = [text for text in row["keys"] if text.split()[1] not in read]
    if unknown:
        return failed("the sshd of %s (%s, scanned from %s) serves %s, which none of the key files read on %s holds"
                      % (node, row.get("target"), source, ", ".join("%s %s" % (text.split()[0], safe_fingerprint(
                          text.split()[1])) for text in unknown), node), expected,
                      "find the configuration the sshd on %s runs with (ps -o args= -C sshd: its -f and -h) and read "
                      "the keys from there (ssh_trust_sshd_config / ssh_trust_host_key_files empty finds it)" % node)
    return passed("the sshd of %s serves %s, read from its files too" % (node, ", ".join(
        "%s %s" % (text.split()[0], safe_fingerprint(text.split()[1])) for text in row["keys"])), expected)


def _describe_missing(missing):
    shown = ["%s (%s)" % (item["node"], ", ".join(item["names"])) for item in missing[:LIST_LIMIT]]
    more = len(missing) - len(shown)
    return "; ".join(shown) + ("; and %d more" % more if more > 0 else "")


def known_hosts_check(node, path, result, drift_policy, applied=False, held_back=(), changed=None):
    """The ``known_hosts`` check from a :func:`.ssh.plan_block` result.

    ``changed``: whether the file differs from what it should be (default: the block does);
    ``applied``: the writer has just written it (bring-up), so a difference is done, not drift."""
    where = " on %s" % node if node else ""
    expected = "%s%s holds the current host keys of every node in its managed block" % (path, where)
    if changed is None:
        changed = result["block"] != result.get("old_block")
    held = set(held_back)
    missing = [m for m in result["missing"] if m["node"] not in held] if held else result["missing"]
    note = ""
    if held_back:
        note = "; old lines of %s kept: their host key changed and is not accepted" % ", ".join(held_back)
    if not changed:
        return passed("%s%s is up to date (%d line(s) in the block)%s" % (path, where, len(result["block"]), note),
                      expected)
    if applied:
        return passed("%s%s updated: %s%s" % (path, where, _describe_missing(missing) or "block rewritten", note),
                      expected)
    parts = []
    if missing:
        parts.append("lacks the current key for " + _describe_missing(missing))
    if result["dropped"]:
        parts.append("still lists nodes no longer in the inventory: " + ", ".join(result["dropped"]))
    if not parts:
        parts.append("its managed block differs from the cluster's host keys")
    return check(drift_policy, "%s%s %s%s" % (path, where, "; ".join(parts), note), expected,
                 "%s to rewrite the managed block; nothing outside its markers is touched" % BRINGUP)


def peer_host_key_check(source, node, rows, unknown_policy="fail", own_fingerprints=None):
    """Whether ``source`` verified ``node``'s host key on every target (rows of the mesh)."""
    expected = "every target of %s presents the host key %s's known_hosts holds for it" % (node, source)
    changed = [r for r in rows if r["status"] == "host_key_changed"]
    unknown = [r for r in rows if r["status"] == "host_key_unknown"]
    verified = [r for r in rows if host_key_verified(r["status"])]
    if changed:
        parts = []
        for row in changed:
            parts.append("%s presented %s key %s where %s holds %s" % (
                row["target"], row.get("key_type", "its"), row.get("new_fingerprint", "(new key)"),
                row.get("offending", "known_hosts"), row.get("old_fingerprint", "(old key)")))
        first = changed[0]
        offending_file = first.get("offending", "/etc/ssh/ssh_known_hosts:").split(":")[0]
        found = "REMOTE HOST IDENTIFICATION HAS CHANGED from %s to %s: %s" % (source, node, "; ".join(parts))
        if own_fingerprints is not None and first.get("new_fingerprint"):
            if first["new_fingerprint"] in own_fingerprints:
                found += (" (the key presented is %s's own, read from %s itself: the stale line is in %s on %s)"
                          % (node, node, offending_file, source))
            else:
                found += (" (the key presented is none of the host keys read from %s itself: something else "
                          "answers at %s)" % (node, first["target"]))
        fix = ("find out why %s's host key changed (reinstall, or something worse); once "
               "%s is verified on its console (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), run "
               "`ansible-playbook bringup.yml -e ssh_trust_accept_changed=%s` "
               "(or by hand on %s: ssh-keygen -R %s -f %s)"
               % (node, first.get("new_fingerprint", "the new key"), node, source, first["target"], offending_file))
        return failed(found, expected, fix, old_fingerprint=first.get("old_fingerprint", ""),
                      new_fingerprint=first.get("new_fingerprint", ""))
    if unknown:
        return check(unknown_policy, "%s does not know %s's host key for %s (Host key verification failed)"
                     % (source, node, ", ".join(r["target"] for r in unknown)),
                     expected, "%s so the known-hosts file on %s lists %s under every name; never turn "
                     "StrictHostKeyChecking off for it" % (BRINGUP, source, node))
    if verified:
        return passed("%s verified %s's host key for %s" % (source, node, ", ".join(r["target"] for r in verified)),
                      expected)
    return skipped("%s never reached %s's host key: %s" % (
        source, node, "; ".join("%s %s" % (r["target"], r["status"]) for r in rows) or "no target"), expected)


LOGIN_FIX = {
    "auth_denied": "the host key is fine; give %(source)s's user a key %(node)s accepts (ssh_trust_cluster_key: true "
                   "distributes one) or fix the user's authorized_keys on %(node)s",
    "refused": "start sshd on %(node)s or open port %(port)s to it from %(source)s (if sshd listens elsewhere, set "
               "ssh_trust_port for %(node)s)",
    "timeout": "check the route and firewall from %(source)s to %(node)s (%(targets)s); is %(node)s up?",
    "unreachable": "check the route from %(source)s to %(node)s (%(targets)s)",
    "dns": "make %(targets)s resolvable on %(source)s (/etc/hosts or DNS)",
    "error": "run the ssh command of this result by hand on %(source)s and read its error",
}
NOT_LOGIN = ("ok", "host_key_unknown", "host_key_changed")


def _last_line(row):
    return row["stderr"].splitlines()[-1] if row.get("stderr") else "rc %s" % row.get("rc")


def peer_login_check(source, node, rows, policy_name, port):
    """Whether ``source`` logged in to ``node`` on every target, host-key problems aside."""
    expected = "%s logs in to %s on every target without a prompt" % (source, node)
    bad = [r for r in rows if r["status"] not in NOT_LOGIN]
    if not bad:
        logged_in = [r["target"] for r in rows if r["status"] == "ok"]
        if logged_in:
            return passed("%s logged in to %s on %s" % (source, node, ", ".join(logged_in)), expected)
        return skipped("%s -> %s not tried past the host key check (%s)" % (source, node, ", ".join(
            "%s %s" % (r["target"], r["status"]) for r in rows) or "no target"), expected)
    kinds = list(dict.fromkeys(r["status"] for r in bad))
    found = "%s -> %s: %s" % (source, node, "; ".join(
        "%s %s (%s)" % (r["target"], r["status"], _last_line(r)) for r in bad))
    fix = "; ".join(LOGIN_FIX.get(k, LOGIN_FIX["error"]) % {
        "source": source, "node": node, "port": port, "targets": ", ".join(r["target"] for r in bad)} for k in kinds)
    return check(policy_name, found, expected, fix)


def client_config_check(source, configs, known_hosts_file, identity_file="", relaxed=False):
    """Whether ``ssh -G`` on ``source`` keeps host-key checking on for every peer target."""
    expected = ("StrictHostKeyChecking yes or ask for every cluster peer, %s read as a known-hosts file%s"
                % (known_hosts_file, ", identity %s offered" % identity_file if identity_file else ""))
    problems, warnings, fixes = [], [], []
    off = [t for t, c in configs.items() if c.get("stricthostkeychecking") in ("false", "no", "off")]
    accept_new = [t for t, c in configs.items() if c.get("stricthostkeychecking") == "accept-new"]
    errors = ["%s (%s)" % (t, c["error"]) for t, c in configs.items() if "error" in c]
    unread = [t for t, c in configs.items() if "error" not in c
              and known_hosts_file not in c["globalknownhostsfile"] + c["userknownhostsfile"]]
    no_identity = [t for t, c in configs.items() if identity_file and "error" not in c
                   and identity_file not in c["identityfile"]]
    if off and relaxed:
        warnings.append("StrictHostKeyChecking no for %s (ssh_trust_strict_host_key_checking_no: true): a spoofed "
                        "or reinstalled peer is not detected by pdsh, mpirun or ssh" % ", ".join(off))
        fixes.append("set ssh_trust_strict_host_key_checking_no: false and re-run bringup.yml; the cluster "
                     "known-hosts block makes the relaxation unnecessary")
    elif off:
        problems.append("StrictHostKeyChecking no applies to %s, set outside the ssh_trust role" % ", ".join(off))
        fixes.append("remove that line (find it with: ssh -G %s | grep -i stricthostkeychecking; grep -ri "
                     "StrictHostKeyChecking ~/.ssh/config /etc/ssh/ssh_config /etc/ssh/ssh_config.d); the cluster "
                     "known-hosts block makes it unnecessary" % off[0])
    if accept_new:
        warnings.append("StrictHostKeyChecking accept-new for %s: an unknown key is trusted on first use"
                        % ", ".join(accept_new))
        fixes.append("remove StrictHostKeyChecking accept-new for cluster peers; their keys are known in advance")
    if unread:
        problems.append("%s is not read for %s (GlobalKnownHostsFile/UserKnownHostsFile point elsewhere)"
                        % (known_hosts_file, ", ".join(unread)))
        fixes.append("remove the GlobalKnownHostsFile/UserKnownHostsFile override that leaves out %s"
                     % known_hosts_file)
    if no_identity:
        problems.append("the cluster key %s is not offered to %s" % (identity_file, ", ".join(no_identity)))
        fixes.append("re-run bringup.yml so the ssh_config.d drop-in names %s for every cluster name" % identity_file)
    if errors:
        problems.append("ssh -G failed for %s" % "; ".join(errors))
        fixes.append("fix the ssh client configuration on %s (ssh -G prints the error)" % source)
    if problems:
        return failed("%s: %s" % (source, "; ".join(problems + warnings)), expected, "; ".join(fixes))
    if warnings:
        return warned("%s: %s" % (source, "; ".join(warnings)), expected, "; ".join(fixes))
    if not configs:
        return skipped("%s has no peers" % source, expected)
    return passed("%s: host-key checking on for every peer (%s), %s read" % (
        source, ", ".join(sorted({c["stricthostkeychecking"] for c in configs.values()})), known_hosts_file),
        expected)


def pdsh_check(source, report, hosts, unknown_policy="fail", login_policy="fail", collateral=None,
               off_reason="pdsh check switched off (ssh_trust_pdsh: never)"):
    """The seeds' ``PDSH_RCMD_TYPE=ssh pdsh -w HOSTS date`` from ``source``.

    ``collateral`` maps a host to why its failure is its own (its peers are not blamed)."""
    collateral = collateral or {}
    expected = "PDSH_RCMD_TYPE=ssh pdsh -w %s date answers from every host" % ",".join(hosts)
    state = (report or {}).get("state")
    if state == "off":
        return skipped(off_reason, expected)
    if state == "no_ssh":
        return skipped("no ssh client on %s (see the mesh check)" % source, expected)
    if state == "not_installed":
        return not_applicable("pdsh is not installed on %s" % source, expected)
    if state == "no_hosts" or (state == "ran" and not hosts):
        return skipped("%s has no peers to pdsh to" % source, expected)
    if state != "ran":
        return skipped("pdsh did not run on %s" % source, expected)
    failed_hosts = report.get("failed") or {}
    ok = report.get("ok") or []
    if not failed_hosts and report.get("rc") == 0:
        return passed("pdsh from %s reached %s" % (source, ", ".join(ok)), expected)
    if not failed_hosts:
        return check(login_policy, "pdsh from %s exited %s: %s" % (source, report.get("rc"), report.get("stderr")),
                     expected, "run the pdsh command by hand on %s and read its error" % source)
    found = "pdsh from %s failed for %s" % (source, "; ".join(
        "%s %s (%s)" % (h, r["status"], (r["stderr"].splitlines() or [""])[-1]) for h, r in failed_hosts.items()))
    fix = "see the host-key and login checks of %s for each host; pdsh uses the same ssh client" % source
    statuses = [r["status"] for h, r in failed_hosts.items() if h not in collateral]
    if not statuses:
        return warned(found + " (collateral: %s)" % "; ".join(collateral[h] for h in failed_hosts), expected,
                      "fix %s first (named in their own checks)" % ", ".join(failed_hosts))
    # A changed key always fails; an unknown one (not brought up yet) follows unknown_policy.
    if "host_key_changed" in statuses:
        status = "fail"
    elif any(s == "host_key_unknown" for s in statuses):
        status = worst([unknown_policy] + [login_policy for s in statuses if s != "host_key_unknown"])
    else:
        status = login_policy
    return check(status, found, expected, fix)
