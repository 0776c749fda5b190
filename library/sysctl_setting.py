#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ensure or audit one kernel setting: now (/proc/sys) and at every boot."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sysctl_setting
short_description: Ensure or audit one sysctl, at run time and in its own sysctl.d drop-in
description:
  - "Reads the running value from C(/proc/sys/<name with . replaced by />) and the persisted value from
    a drop-in file that holds only this key, compares both with O(value) and, with O(state=present),
    writes what differs: the drop-in atomically (temp file in the same directory, then rename), with a
    managed header comment, and the running value by writing the C(/proc/sys) file."
  - Works out which file wins at boot the way systemd-sysctl does (every C(*.conf) of the sysctl.d
    directories, a basename in an earlier directory hiding its namesakes, applied in lexical order of
    basename so the last file wins) and, like procps C(sysctl --system), applies C(/etc/sysctl.conf)
    last. Any other file that would set a different value after the drop-in is reported as a conflict
    with the file and line to change; other files are only read, never written.
  - A key the running kernel does not have (for example C(kernel.yama.ptrace_scope) without the Yama
    LSM) is reported as C(not_applicable) with the reason; nothing is written and the task does not fail.
    A sysctl file that cannot be read makes the boot finding say so instead of failing.
  - "C(kernel.core_pattern) gets extra care: a pipe (C(|program)) as the desired value is refused with
    the reason, a pattern without C(%p) is a warning (ranks of one job would overwrite each other's
    cores) unless C(kernel.core_uses_pid=1), and a running pipe pattern is reported with where its
    cores go (apport, systemd-coredump) and how to override it."
  - "Reads the node (C(preflight_sysctl.read_setting)), works out what to write (C(plan_setting)), writes
    only outside check mode, then judges what is there with C(decide_setting) - the same reader and decider
    the preflight audit (capabilities C(kernel_debug), C(core_dumps)) uses, so the writer and the audit never
    disagree. In check mode RV(checks) are the audit's findings for the node as it is."
  - Findings never fail the task; they are returned in RV(checks). The task fails only for bad arguments,
    when a drop-in cannot be written (read-only C(/etc), no permission) or is a symlink (see O(dropin)), or
    when the kernel refuses the new value, each with found, expected and fix.
version_added: "1.0.0"
extends_documentation_fragment: [preflight, preflight.dropin]
options:
  name:
    description: Key, dotted (C(kernel.yama.ptrace_scope)) or with slashes (C(kernel/yama/ptrace_scope)).
    type: str
    required: true
  value:
    description:
      - Desired value. Compared word by word (C(/proc/sys) separates fields with tabs).
    type: str
    required: true
  state:
    description:
      - V(present) applies the value (running and persisted); V(audit) only reads and reports (the preflight
        itself audits through its capabilities, not through this option).
    type: str
    choices: [present, audit]
    default: present
  dropin:
    description:
      - The drop-in that holds only this key. It must end in C(.conf) and live in one of the
        directories of O(sysctl_dirs), otherwise no boot would read it.
      - Any other content of this file is replaced (use O(backup) to keep a copy).
      - It must be a regular file or absent. A symlink there is someone else's (on Debian C(99-sysctl.conf)
        links to C(/etc/sysctl.conf); a link to C(/dev/null) masks a file on purpose), so when the drop-in
        would change the task fails naming the link and its target, in check mode too; nothing is written over
        or through it.
    type: path
    default: /etc/sysctl.d/60-preflight-ptrace.conf
  proc_root:
    description: Mount point of procfs; the running value is read from C(<proc_root>/sys/...).
    type: path
    default: /proc
  sysctl_dirs:
    description:
      - The sysctl search list in priority order. Directories are read for C(*.conf); entries ending in
        C(.conf) that are not directories are plain files applied after all directory files, in the
        order given.
    type: list
    elements: path
    default: [/etc/sysctl.d, /run/sysctl.d, /usr/local/lib/sysctl.d, /usr/lib/sysctl.d, /lib/sysctl.d, /etc/sysctl.conf]
  root:
    description:
      - Prefix for every path above (O(dropin), O(proc_root), O(sysctl_dirs)); tests point it at a
        sandbox tree. Reported paths stay the logical ones.
    type: path
    default: /
  reload:
    description:
      - Set the running value too. With V(false) only the drop-in is written and a running value that
        differs is reported as a warning until the next boot or C(sysctl -p <dropin>).
    type: bool
    default: true
  policy:
    description:
      - Status of a finding that means the desired value does not hold (drift in check mode or with
        O(state=audit), a conflicting file that wins at boot, a file that cannot be read).
    type: str
    choices: [warn, fail]
    default: fail
  check_name:
    description:
      - Prefix of the names in RV(checks). Defaults to the last component of O(name)
        (C(ptrace_scope), C(core_pattern)).
    type: str
attributes:
  diff_mode:
    support: full
    description: Before/after of the drop-in and of the running value.
notes:
  - Needs root to write C(/proc/sys) and C(/etc/sysctl.d).
  - C(kernel.yama.ptrace_scope=3) cannot be lowered again without a reboot; setting it warns.
seealso:
  - name: sysctl.d(5)
    description: File format and boot order.
    link: https://man7.org/linux/man-pages/man5/sysctl.d.5.html
  - name: core(5)
    description: kernel.core_pattern and its specifiers.
    link: https://man7.org/linux/man-pages/man5/core.5.html
"""

EXAMPLES = r"""
- name: Ensure ptrace_scope 0 so py-spy can attach to hung ranks without root.
  sysctl_setting:
    name: kernel.yama.ptrace_scope
    value: "0"
    dropin: /etc/sysctl.d/60-preflight-ptrace.conf
    comment: "Security relaxation: any process may ptrace others of the same user."

- name: Ensure core files land in /tmp, one per process.
  sysctl_setting:
    name: kernel.core_pattern
    value: /tmp/core-%e.%p.%h.%t
    dropin: /etc/sysctl.d/60-preflight-core.conf
    policy: warn

- name: Audit the core pattern without changing anything.
  sysctl_setting:
    name: kernel.core_pattern
    value: /tmp/core-%e.%p.%h.%t
    dropin: /etc/sysctl.d/60-preflight-core.conf
    state: audit
  register: core_pattern_audit
"""

RETURN = r"""
changed:
  description: Whether the drop-in or the running value was (or in check mode would be) changed.
  returned: always
  type: bool
checks:
  description:
    - "Check results (status, found, expected, fix): C(<check_name>) for the running value,
      C(<check_name>_persisted) for the drop-in, C(<check_name>_boot) for the value the next boot
      applies, and for kernel.core_pattern C(<check_name>_pid). Only C(<check_name>) (not_applicable)
      when the kernel has no such key."
  returned: always
  type: dict
  sample:
    ptrace_scope: {status: pass, found: "0", expected: "0", fix: ""}
runtime:
  description: The running value after this task (before it in check mode); null when the key does not exist
    or cannot be read.
  returned: always
  type: str
runtime_before:
  description: The running value before this task.
  returned: always
  type: str
persisted:
  description: The value the drop-in sets after this task (before it in check mode); null if none.
  returned: always
  type: str
effective_at_boot:
  description: The assignment the next boot applies last (value, file, line); null when no file sets the key.
  returned: always
  type: dict
  sample: {value: "0", file: /etc/sysctl.d/60-preflight-ptrace.conf, line: 3}
conflicts:
  description: Assignments in other files that override the drop-in at boot with a different value.
  returned: always
  type: list
  elements: dict
  sample: [{file: /etc/sysctl.d/99-x.conf, line: 1, value: "|/usr/share/apport/apport %p"}]
not_applicable:
  description: True when the kernel has no such key.
  returned: always
  type: bool
reason:
  description: Why the setting is not applicable.
  returned: when not_applicable
  type: str
dropin:
  description: Logical path of the drop-in.
  returned: always
  type: str
backup_file:
  description: Path of the backup copy of the drop-in.
  returned: when backup was made
  type: str
diff:
  description: Before/after of the drop-in and of the running value.
  returned: diff mode, state=present
  type: list
"""

import errno
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_node.cores import pattern as corepattern
from ansible.module_utils.preflight_node.sysctl import values as sysctl
from ansible.module_utils.preflight_node.sysctl import write as sysctl_write
from ansible.module_utils.preflight_node.host.files import DROPIN_OPTIONS, refuse_symlinks


def _validate(module, key, desired, dropin, search):
    problem = sysctl_write.key_problem(key)
    if problem:
        module.fail_json(msg="Found name %s. Expected a sysctl key. Fix: set name to a dotted key such as "
                             "kernel.yama.ptrace_scope." % problem)
    if "\n" in str(module.params["value"]).strip():
        module.fail_json(msg="Found a value for %s with several lines. Expected one line. Fix: set value to the "
                             "single line /proc/sys/%s takes." % (key, key.replace(".", "/")))
    problem = sysctl_write.dropin_problem(dropin, search)
    if problem:
        module.fail_json(msg="Found %s. Fix: set dropin to a file of its own such as /etc/sysctl.d/60-%s.conf."
                             % (problem, key.split(".")[-1].replace("_", "-")))
    if key == sysctl.CORE_PATTERN:
        errors = corepattern.validate_desired(desired)
        if errors:
            module.fail_json(msg="Refusing kernel.core_pattern: " + "; ".join(errors), errors=errors)
    if key == sysctl.PTRACE_SCOPE and desired == "3":
        module.warn("kernel.yama.ptrace_scope=3 disables ptrace entirely and cannot be lowered again "
                    "without a reboot.")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            value=dict(type="str", required=True),
            state=dict(type="str", default="present", choices=["present", "audit"]),
            dropin=dict(type="path", default="/etc/sysctl.d/60-preflight-ptrace.conf"),
            proc_root=dict(type="path", default="/proc"),
            sysctl_dirs=dict(type="list", elements="path", default=list(sysctl.DEFAULT_SYSCTL_DIRS)),
            reload=dict(type="bool", default=True),
            **DROPIN_OPTIONS
        ),
        supports_check_mode=True,
    )
    params = module.params
    key = sysctl.normalize_key(params["name"])
    desired = sysctl.normalize_value(params["value"])
    dropin = os.path.normpath(params["dropin"])
    search = [os.path.normpath(entry) for entry in params["sysctl_dirs"]]
    root = params["root"]
    short = params["check_name"] or key.split(".")[-1]
    present = params["state"] == "present"
    _validate(module, key, desired, dropin, search)

    # Read, decide what to write, write only outside check mode, then judge what
    # is there now with the same decider the audit uses.
    before = sysctl.read_setting(root, params["proc_root"], key, dropin, search)
    if before["runtime"] is None and not before["runtime_error"]:
        reason = before["missing_reason"]
        module.exit_json(
            changed=False, not_applicable=True, reason=reason,
            checks=sysctl_write.decide_setting(before, desired, params["policy"], short),
            runtime=None, runtime_before=None, persisted=before["dropin_value"],
            effective_at_boot=sysctl_write.effective(before), conflicts=sysctl_write.conflicts(before, desired),
            dropin=dropin, msg=reason)
    if before["runtime_error"] and present and params["reload"]:
        module.fail_json(msg="Found: %s. Expected: a readable %s. Fix: run the bring-up as root "
                             "(preflight_become: true)." % (before["runtime_error"], before["runtime_path"]))

    plan = sysctl_write.plan_setting(before, desired, params["comment"], present, params["reload"])
    changed = plan["write_file"] or plan["set_runtime"]
    applied = changed and not module.check_mode
    if plan["write_file"]:
        # Decided before anything is written (and in check mode, where the real run would fail).
        refuse_symlinks(module, [(sysctl.rooted(root, dropin), dropin)], sysctl_write.dropin_link_fix(dropin))

    result = dict(changed=changed, not_applicable=False, dropin=dropin, runtime_before=before["runtime"])
    if applied:
        if plan["write_file"]:
            backup_file = _write_dropin(module, root, dropin, plan["dropin_after"], params["backup"])
            if backup_file:
                result["backup_file"] = backup_file
        if plan["set_runtime"]:
            _write_runtime(module, root, before["runtime_path"], key, desired, before["runtime"], dropin,
                           plan["write_file"])
    after = sysctl.read_setting(root, params["proc_root"], key, dropin, search) if applied else before

    checks = sysctl_write.decide_setting(after, desired, params["policy"], short, reload=params["reload"])
    pid = checks.get(short + "_pid")
    if pid and pid["status"] == "warn":
        module.warn(pid["found"])
    result.update(
        checks=checks, runtime=after["runtime"], persisted=after["dropin_value"],
        effective_at_boot=sysctl_write.effective(after), conflicts=sysctl_write.conflicts(after, desired))
    if present and module._diff:
        runtime = before["runtime"] or ""
        result["diff"] = [
            dict(before_header=dropin, after_header=dropin, before=before["dropin_text"] or "",
                 after=plan["dropin_after"]),
            dict(before_header="%s (running)" % before["runtime_path"],
                 after_header="%s (running)" % before["runtime_path"],
                 before=runtime + "\n", after=(desired if plan["set_runtime"] else runtime) + "\n"),
        ]
    result["msg"] = "%s: %s" % (key, "would change" if changed and module.check_mode else
                                ("changed" if changed else "unchanged"))
    module.exit_json(**result)


def _write_dropin(module, root, dropin, text, backup):
    # A read-only /etc, no permission or a symlink ends the task in write_atomic with found / expected / fix.
    return sysctl_write.write_dropin(module, sysctl.rooted(root, dropin), text, backup, logical=dropin,
                               fix=sysctl_write.dropin_link_fix(dropin))


def _write_runtime(module, root, path, key, desired, before, dropin, wrote_dropin):
    full = sysctl.rooted(root, path)
    try:
        handle = os.open(full, os.O_WRONLY | os.O_TRUNC)
        try:
            # One write() call: the kernel parses each write to a sysctl on its own.
            os.write(handle, desired.encode("utf-8"))
        finally:
            os.close(handle)
    except OSError as exc:
        hint = ""
        if key == sysctl.PTRACE_SCOPE and before == "3":
            hint = " kernel.yama.ptrace_scope=3 can only be lowered by a reboot;"
        elif exc.errno == errno.EROFS:
            hint = " /proc/sys is mounted read-only here (a container): set the key on the host;"
        module.fail_json(
            changed=wrote_dropin,
            msg="The kernel refused %s=%s. Found: %s (%s). Expected: %s. Fix:%s %s is %s, so the next boot "
                "applies it; check dmesg and the key's allowed range." % (
                    key, desired, before, exc.strerror or exc, desired, hint, dropin,
                    "written" if wrote_dropin else "already in place"))
    after = _reread(root, path)
    if after != desired:
        module.fail_json(
            changed=True,
            msg="%s reads back %r after writing %r. Expected: %s. Fix: check the key's format in the kernel "
                "documentation (sysctl/kernel.rst)." % (path, after, desired, desired))


def _reread(root, path):
    text = sysctl.read_text(root, path)
    return None if text is None else sysctl.normalize_value(text)


if __name__ == "__main__":
    main()
