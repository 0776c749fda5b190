#!/usr/bin/python
# -*- coding: utf-8 -*-
"""From this node, ssh to every peer with host-key checking on and classify what happens."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: ssh_mesh
short_description: Check node-to-node ssh with strict host-key checking, every peer in parallel
description:
  - From this node, runs C(ssh -n -o BatchMode=yes -o StrictHostKeyChecking=yes -o ConnectTimeout=N
    TARGET true) to every target of every peer (typically the peer's inter-node address and its
    hostname), all at once in threads, each call bounded by C(timeout). The ssh client reads the
    node's own configuration, so this is what pdsh, mpirun or a launcher on this node would get.
  - Each (source, destination, target) is classified as C(ok), C(host_key_unknown),
    C(host_key_changed), C(auth_denied) (host key verified, login refused), C(refused), C(timeout),
    C(dns), C(unreachable) or C(error).
  - Host-key trust and login are reported as separate checks per peer, C(ssh_host_key_<peer>) and
    C(ssh_login_<peer>), so "host key verified but login denied" never looks like an unknown key.
    A changed key names the old fingerprint (from the known_hosts line ssh calls offending) and the
    new one (the key the peer presented).
  - Reads the client's effective configuration for every target with C(ssh -G) (no connection) and
    reports in C(ssh_client_config) whether StrictHostKeyChecking is off or accept-new for a peer
    (the seeds' C(~/.ssh/config) relaxation), whether the cluster known-hosts file is read, and
    whether the cluster key is offered.
  - When pdsh is installed, also runs C(PDSH_RCMD_TYPE=ssh pdsh -w HOSTS date) as the multi-node
    debugging recipes do (check C(ssh_pdsh)); when it is not, that check is not applicable.
  - C(UpdateHostKeys=no) keeps ssh from writing any known_hosts file; nothing on the node changes.
  - Never fails for a finding.
version_added: "1.0.0"
author: Cluster preflight maintainers
options:
  peers:
    description: The nodes to ssh to.
    type: list
    elements: dict
    required: true
    suboptions:
      node:
        description: The peer's inventory name (used in check names).
        type: str
        required: true
      targets:
        description: Names or addresses to ssh to, each tried separately.
        type: list
        elements: str
        required: true
      port:
        description: sshd port of the peer.
        type: int
        default: 22
  source:
    description: This node's name in the results; defaults to its host name.
    type: str
  user:
    description: Login user on the peers; empty means the user this module runs as.
    type: str
    default: ""
  connect_timeout:
    description: ssh ConnectTimeout in seconds.
    type: int
    default: 5
  timeout:
    description: Bound of one ssh (or the pdsh run) in seconds; it is killed after that.
    type: int
    default: 20
  parallel:
    description: Most ssh processes at once.
    type: int
    default: 32
  ssh_options:
    description: Extra C(-o) options (C(Key=Value)), for example C(IdentityFile=...); they cannot relax host-key checking.
    type: list
    elements: str
    default: []
  unknown_policy:
    description:
      - Status of C(ssh_host_key_<peer>) when this node does not know the peer's host key (not yet
        brought up). A changed key always fails.
    type: str
    choices: [warn, fail]
    default: fail
  login_policy:
    description: Status of a C(ssh_login_*) or pdsh finding that is not about the host key (auth denied, refused, timeout, dns).
    type: str
    choices: [warn, fail]
    default: fail
  pdsh:
    description: V(auto) runs the pdsh check when pdsh is installed; V(never) reports it as skipped.
    type: str
    choices: [auto, never]
    default: auto
  pdsh_hosts:
    description: Hosts for C(pdsh -w); empty skips the pdsh check.
    type: list
    elements: str
    default: []
  known_hosts_file:
    description: The cluster known-hosts file; C(ssh -G) must list it as a global or user known-hosts file.
    type: str
    default: /etc/ssh/ssh_known_hosts
  identity_file:
    description: An identity C(ssh -G) must list for every target (the cluster key); empty checks none.
    type: str
    default: ""
  relaxed:
    description:
      - The operator chose C(StrictHostKeyChecking no) for cluster peers (ssh_trust_strict_host_key_checking_no);
        it is then reported as a warning instead of a failure.
    type: bool
    default: false
  ssh_bin:
    description: The ssh client; tests point it at a stand-in.
    type: str
    default: ssh
  pdsh_bin:
    description: The pdsh executable.
    type: str
    default: pdsh
  root:
    description: Prefix for reading the known_hosts file ssh names as offending; tests point it at a sandbox tree.
    type: path
    default: /
attributes:
  check_mode:
    support: full
    description: Only connects and reads; runs the same in check mode.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Check ssh from this node to every other node with host-key checking on.
  ssh_mesh:
    source: "{{ inventory_hostname }}"
    peers:
      - {node: gpu02, targets: [198.18.0.12, gpu02]}
      - {node: gpu03, targets: [198.18.0.13, gpu03]}
    pdsh_hosts: [gpu02, gpu03]
  register: ssh_trust_mesh
"""

RETURN = r"""
results:
  description: One row per (source, destination, target).
  returned: always
  type: list
  elements: dict
  sample:
    - {source: gpu01, destination: gpu02, target: 198.18.0.12, status: host_key_changed, rc: 255,
       key_type: ED25519, new_fingerprint: "SHA256:fUa/...", old_fingerprint: "SHA256:8mbU...",
       offending: "/etc/ssh/ssh_known_hosts:3", stderr: "..."}
client_config:
  description: Per target, what C(ssh -G) says (stricthostkeychecking, known-hosts files, identity files).
  returned: always
  type: dict
pdsh:
  description: The pdsh run, when it ran (argv, rc, ok hosts, failed hosts with their stderr).
  returned: always
  type: dict
checks:
  description: C(ssh_host_key_<peer>) and C(ssh_login_<peer>) per peer, C(ssh_client_config) and C(ssh_pdsh).
  returned: always
  type: dict
"""

import concurrent.futures
import os
import socket

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_checks import check, failed, not_applicable, passed, skipped, worst
from ansible.module_utils.preflight_ssh import (classify_ssh, host_key_verified, parse_known_hosts_line, read_text,
                                                rooted, safe_fingerprint, split_lines)

ENV = {"LANG": "C", "LC_ALL": "C"}
# Options that would turn the check into something else than what it measures.
FORBIDDEN = ("stricthostkeychecking", "userknownhostsfile", "globalknownhostsfile", "batchmode",
             "checkhostip", "updatehostkeys", "knownhostscommand", "proxycommand", "localcommand",
             "permitlocalcommand")
TIMEOUT_RC = 124


def ssh_argv(timeout_bin, ssh_bin, target, port, user, connect_timeout, timeout, extra):
    argv = [timeout_bin, "-k", "2", str(timeout), ssh_bin, "-n",
            "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=%d" % connect_timeout,
            "-o", "UpdateHostKeys=no", "-o", "ControlMaster=no", "-o", "ControlPath=none"]
    for option in extra:
        argv += ["-o", option]
    if int(port) != 22:
        argv += ["-p", str(port)]
    if user:
        argv += ["-l", user]
    return argv + ["--", target, "true"]


def old_fingerprint(root, detail):
    """Fingerprint of the known_hosts line ssh named as offending, or ``None``."""
    path, number = detail.get("offending_file"), detail.get("offending_line")
    if not path:
        return None
    lines = split_lines(read_text(rooted(root, path)) or "")
    if not 0 < number <= len(lines):
        return None
    entry = parse_known_hosts_line(lines[number - 1])
    return safe_fingerprint(entry["blob"]) if entry else None


def short_stderr(text, limit=600):
    text = (text or "").strip()
    banner = [line for line in text.splitlines() if not line.startswith("@")]
    text = "\n".join(banner)
    return text if len(text) <= limit else "..." + text[-limit:]


def probe(module, argv, root, row):
    rc, _out, err = module.run_command(argv, environ_update=ENV)
    timed_out = rc in (TIMEOUT_RC, 128 + 9)
    status, detail = classify_ssh(rc, err, timed_out)
    row.update(status=status, rc=rc, stderr=short_stderr(err))
    if timed_out and status == "timeout":
        row["stderr"] = (row["stderr"] + "\n" if row["stderr"] else "") + "killed after %ss" % argv[3]
    for key in ("key_type", "new_fingerprint"):
        if key in detail:
            row[key] = detail[key]
    if "offending_file" in detail:
        row["offending"] = "%s:%d" % (detail["offending_file"], detail["offending_line"])
        fp = old_fingerprint(root, detail)
        if fp:
            row["old_fingerprint"] = fp
    return row


def host_key_check(source, node, rows, unknown_policy="fail", accept_var="ssh_trust_accept_changed"):
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
        fix = ("find out why %s's host key changed (reinstall, or something worse); once "
               "%s is verified on its console (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), run "
               "`ansible-playbook bringup.yml -e %s=%s` (or by hand: ssh-keygen -R %s -f %s)"
               % (node, first.get("new_fingerprint", "the new key"), accept_var, node, first["target"],
                  first.get("offending", "/etc/ssh/ssh_known_hosts:").split(":")[0]))
        return failed("REMOTE HOST IDENTIFICATION HAS CHANGED from %s to %s: %s" % (source, node, "; ".join(parts)),
                      expected, fix, old_fingerprint=first.get("old_fingerprint", ""),
                      new_fingerprint=first.get("new_fingerprint", ""))
    if unknown:
        return check(unknown_policy, "%s does not know %s's host key for %s (Host key verification failed)"
                     % (source, node, ", ".join(r["target"] for r in unknown)),
                     expected, "run bringup.yml (role ssh_trust) so /etc/ssh/ssh_known_hosts on %s lists "
                     "%s under every name; never turn StrictHostKeyChecking off for it" % (source, node))
    if verified:
        return passed("%s verified %s's host key for %s" % (source, node, ", ".join(r["target"] for r in verified)),
                      expected)
    return skipped("%s never reached %s's host key: %s" % (
        source, node, "; ".join("%s %s" % (r["target"], r["status"]) for r in rows)), expected)


LOGIN_FIX = {
    "auth_denied": "the host key is fine; give %(source)s's user a key %(node)s accepts (ssh_trust_cluster_key: true "
                   "distributes one) or fix the user's authorized_keys on %(node)s",
    "refused": "start sshd on %(node)s or open port %(port)s from %(source)s",
    "timeout": "check the route and firewall from %(source)s to %(node)s (%(targets)s); is %(node)s up?",
    "unreachable": "check the route from %(source)s to %(node)s (%(targets)s)",
    "dns": "make %(targets)s resolvable on %(source)s (/etc/hosts or DNS)",
    "error": "run the ssh command of this result by hand on %(source)s and read its error",
}


def login_check(source, node, rows, policy, port):
    expected = "%s logs in to %s on every target without a prompt" % (source, node)
    bad = [r for r in rows if r["status"] not in ("ok", "host_key_unknown", "host_key_changed")]
    if not bad:
        logged_in = [r["target"] for r in rows if r["status"] == "ok"]
        if logged_in:
            return passed("%s logged in to %s on %s" % (source, node, ", ".join(logged_in)), expected)
        return skipped("not tried past the host key check (%s)" % ", ".join(
            "%s %s" % (r["target"], r["status"]) for r in rows), expected)
    kinds = []
    for row in bad:
        if row["status"] not in kinds:
            kinds.append(row["status"])
    found = "%s -> %s: %s" % (source, node, "; ".join(
        "%s %s (%s)" % (r["target"], r["status"], r["stderr"].splitlines()[-1] if r["stderr"] else "rc %s" % r["rc"])
        for r in bad))
    fix = "; ".join(LOGIN_FIX[k] % {"source": source, "node": node, "port": port,
                                    "targets": ", ".join(r["target"] for r in bad)} for k in kinds)
    return check(policy, found, expected, fix)


def config_argv(timeout_bin, ssh_bin, target, port, user, timeout, extra):
    argv = [timeout_bin, "-k", "2", str(timeout), ssh_bin, "-G"]
    for option in extra:
        argv += ["-o", option]
    if int(port) != 22:
        argv += ["-p", str(port)]
    if user:
        argv += ["-l", user]
    return argv + ["--", target]


def parse_ssh_g(text):
    """The settings of ``ssh -G`` output this check reads."""
    config = {"stricthostkeychecking": "", "globalknownhostsfile": [], "userknownhostsfile": [], "identityfile": []}
    for line in (text or "").splitlines():
        fields = line.split()
        if not fields:
            continue
        key = fields[0].lower()
        if key == "stricthostkeychecking" and len(fields) > 1:
            config[key] = fields[1].lower()
        elif key in ("globalknownhostsfile", "userknownhostsfile"):
            config[key].extend(fields[1:])
        elif key == "identityfile" and len(fields) > 1:
            config[key].append(" ".join(fields[1:]))
    return config


def read_config(module, argv):
    rc, out, err = module.run_command(argv, environ_update=ENV)
    if rc != 0:
        return {"error": short_stderr(err) or "ssh -G exited %s" % rc}
    return parse_ssh_g(out)


def client_config_check(source, configs, params):
    expected = ("StrictHostKeyChecking yes or ask for every cluster peer, %s read as a known-hosts file%s"
                % (params["known_hosts_file"],
                   ", identity %s offered" % params["identity_file"] if params["identity_file"] else ""))
    problems, warnings, fixes = [], [], []
    off = [t for t, c in configs.items() if c.get("stricthostkeychecking") in ("false", "no", "off")]
    accept_new = [t for t, c in configs.items() if c.get("stricthostkeychecking") == "accept-new"]
    errors = ["%s (%s)" % (t, c["error"]) for t, c in configs.items() if "error" in c]
    unread = [t for t, c in configs.items() if "error" not in c
              and params["known_hosts_file"] not in c["globalknownhostsfile"] + c["userknownhostsfile"]]
    identity = params["identity_file"]
    no_identity = [t for t, c in configs.items() if identity and "error" not in c and identity not in c["identityfile"]]
    if off and params["relaxed"]:
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
                        % (params["known_hosts_file"], ", ".join(unread)))
        fixes.append("remove the GlobalKnownHostsFile/UserKnownHostsFile override that leaves out %s"
                     % params["known_hosts_file"])
    if no_identity:
        problems.append("the cluster key %s is not offered to %s" % (identity, ", ".join(no_identity)))
        fixes.append("re-run bringup.yml so the ssh_config.d drop-in names %s for every cluster name" % identity)
    if errors:
        problems.append("ssh -G failed for %s" % "; ".join(errors))
        fixes.append("fix the ssh client configuration on %s (ssh -G prints the error)" % source)
    if problems:
        return failed("%s: %s" % (source, "; ".join(problems + warnings)), expected, "; ".join(fixes))
    if warnings:
        return check("warn", "%s: %s" % (source, "; ".join(warnings)), expected, "; ".join(fixes))
    if not configs:
        return skipped("no peers", expected)
    return passed("%s: host-key checking on for every peer (%s), %s read" % (
        source, ", ".join(sorted({c["stricthostkeychecking"] for c in configs.values()})),
        params["known_hosts_file"]), expected)


def parse_pdsh(hosts, out, err):
    """``(ok_hosts, {host: stderr lines})`` from pdsh's ``host: line`` output."""
    ok = []
    for line in (out or "").splitlines():
        host = line.split(":", 1)[0].strip()
        if host in hosts and host not in ok:
            ok.append(host)
    errors = {}
    for line in (err or "").splitlines():
        text = line
        if text.startswith("pdsh@"):
            text = text.split(":", 1)[1].strip() if ":" in text else text
        host = text.split(":", 1)[0].strip()
        if host in hosts:
            errors.setdefault(host, []).append(text.split(":", 1)[1].strip() if ":" in text else text)
    return ok, errors


def pdsh_check(module, params, timeout_bin, source):
    hosts = [h for h in params["pdsh_hosts"] if h]
    expected = "PDSH_RCMD_TYPE=ssh pdsh -w %s date answers from every host" % ",".join(hosts)
    if params["pdsh"] == "never":
        return {}, skipped("pdsh check switched off (pdsh: never)", expected)
    if not hosts:
        return {}, skipped("no peers to pdsh to", expected)
    pdsh_bin = module.get_bin_path(params["pdsh_bin"]) if not os.path.isabs(params["pdsh_bin"]) else (
        params["pdsh_bin"] if os.access(params["pdsh_bin"], os.X_OK) else None)
    if not pdsh_bin:
        return {}, not_applicable("pdsh is not installed on %s" % source, expected)
    timeout = params["timeout"]
    argv = [timeout_bin, "-k", "2", str(timeout), pdsh_bin, "-t", str(params["connect_timeout"]),
            "-u", str(max(timeout - 2, 1)), "-w", ",".join(hosts), "date"]
    env = dict(ENV, PDSH_RCMD_TYPE="ssh",
               PDSH_SSH_ARGS_APPEND="-o BatchMode=yes -o ConnectTimeout=%d -o UpdateHostKeys=no"
               % params["connect_timeout"])
    rc, out, err = module.run_command(argv, environ_update=env)
    ok, errors = parse_pdsh(hosts, out, err)
    report = {"argv": argv[4:], "rc": rc, "ok": ok, "failed": {}}
    statuses = []
    for host in hosts:
        if host in ok:
            continue
        text = "\n".join(errors.get(host, [])) or ("pdsh killed after %ss" % timeout if rc == TIMEOUT_RC
                                                   else "no output")
        status, _detail = classify_ssh(255, text, rc == TIMEOUT_RC)
        report["failed"][host] = {"status": status, "stderr": text}
        statuses.append(status)
    if not report["failed"] and rc == 0:
        return report, passed("pdsh from %s reached %s" % (source, ", ".join(ok)), expected)
    if not report["failed"]:
        return report, check(params["login_policy"], "pdsh from %s exited %s: %s" % (source, rc, short_stderr(err)),
                             expected, "run the pdsh command by hand on %s and read its error" % source)
    host_key = [s for s in statuses if s in ("host_key_unknown", "host_key_changed")]
    found = "pdsh from %s failed for %s" % (source, "; ".join(
        "%s %s (%s)" % (h, r["status"], r["stderr"].splitlines()[-1]) for h, r in report["failed"].items()))
    fix = "see the ssh_host_key_* and ssh_login_* checks of %s for each host; pdsh uses the same ssh client" % source
    # A changed key always fails; an unknown one (not brought up yet) follows unknown_policy.
    if "host_key_changed" in statuses:
        status = "fail"
    elif host_key:
        status = params["unknown_policy"]
    else:
        status = params["login_policy"]
    return report, check(status, found, expected, fix)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            peers=dict(type="list", elements="dict", required=True, options=dict(
                node=dict(type="str", required=True),
                targets=dict(type="list", elements="str", required=True),
                port=dict(type="int", default=22),
            )),
            source=dict(type="str"),
            user=dict(type="str", default=""),
            connect_timeout=dict(type="int", default=5),
            timeout=dict(type="int", default=20),
            parallel=dict(type="int", default=32),
            ssh_options=dict(type="list", elements="str", default=[]),
            login_policy=dict(type="str", choices=["warn", "fail"], default="fail"),
            unknown_policy=dict(type="str", choices=["warn", "fail"], default="fail"),
            pdsh=dict(type="str", choices=["auto", "never"], default="auto"),
            pdsh_hosts=dict(type="list", elements="str", default=[]),
            ssh_bin=dict(type="str", default="ssh"),
            pdsh_bin=dict(type="str", default="pdsh"),
            root=dict(type="path", default="/"),
            known_hosts_file=dict(type="str", default="/etc/ssh/ssh_known_hosts"),
            identity_file=dict(type="str", default=""),
            relaxed=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    params = module.params
    source = params["source"] or socket.gethostname()
    if params["connect_timeout"] < 1 or params["timeout"] <= params["connect_timeout"] or params["parallel"] < 1:
        module.fail_json(msg="need connect_timeout >= 1, timeout > connect_timeout and parallel >= 1 (got %s, %s, %s)"
                         % (params["connect_timeout"], params["timeout"], params["parallel"]))
    for option in params["ssh_options"]:
        key = option.replace("=", " ").split()[0].lower() if option.strip() else ""
        if not key or key in FORBIDDEN:
            module.fail_json(msg="ssh_options may not set %r: the check measures the node's own host-key checking"
                             % option)
    timeout_bin = module.get_bin_path("timeout", required=True)
    ssh_bin = params["ssh_bin"] if os.path.isabs(params["ssh_bin"]) else module.get_bin_path(params["ssh_bin"])
    if not ssh_bin:
        module.fail_json(msg="no ssh client (%s) on %s; install openssh-client" % (params["ssh_bin"], source))

    jobs = []
    for peer in params["peers"]:
        for target in dict.fromkeys(t for t in peer["targets"] if t):
            row = {"source": source, "destination": peer["node"], "target": target}
            argv = ssh_argv(timeout_bin, ssh_bin, target, peer["port"], params["user"], params["connect_timeout"],
                            params["timeout"], params["ssh_options"])
            jobs.append((argv, row))
    config_jobs = {}
    for peer in params["peers"]:
        for target in peer["targets"]:
            if target and target not in config_jobs:
                config_jobs[target] = config_argv(timeout_bin, ssh_bin, target, peer["port"], params["user"],
                                                  params["timeout"], params["ssh_options"])
    results, configs = [], {}
    if jobs:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(params["parallel"], len(jobs))) as pool:
            config_futures = {target: pool.submit(read_config, module, argv) for target, argv in config_jobs.items()}
            futures = [pool.submit(probe, module, argv, params["root"], row) for argv, row in jobs]
            for future in futures:
                results.append(future.result())
            for target, future in config_futures.items():
                configs[target] = future.result()

    checks = {}
    for peer in params["peers"]:
        rows = [r for r in results if r["destination"] == peer["node"]]
        if not rows:
            continue
        checks["ssh_host_key_%s" % peer["node"]] = host_key_check(source, peer["node"], rows, params["unknown_policy"])
        checks["ssh_login_%s" % peer["node"]] = login_check(source, peer["node"], rows, params["login_policy"],
                                                            peer["port"])
    checks["ssh_client_config"] = client_config_check(source, configs, params)
    report, checks["ssh_pdsh"] = pdsh_check(module, params, timeout_bin, source)

    counts = {}
    for row in results:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    status = worst(c["status"] for c in checks.values())
    module.exit_json(changed=False, source=source, results=results, client_config=configs, pdsh=report, checks=checks, counts=counts,
                     msg="%s: %d ssh target(s), %s; worst check %s" % (
                         source, len(results), ", ".join("%s %d" % kv for kv in sorted(counts.items())) or "none",
                         status))


if __name__ == "__main__":
    main()
