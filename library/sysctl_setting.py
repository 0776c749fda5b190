#!/usr/bin/python
# -*- coding: utf-8 -*-
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
  - "C(kernel.core_pattern) gets extra care: a pipe (C(|program)) as the desired value is refused with
    the reason, a pattern without C(%p) is a warning (ranks of one job would overwrite each other's
    cores) unless C(kernel.core_uses_pid=1), and a running pipe pattern is reported with where its
    cores go (apport, systemd-coredump) and how to override it."
  - Findings never fail the task; they are returned in RV(checks) for the verdict. The task fails only
    for bad arguments or when the kernel refuses the new value.
version_added: "1.0.0"
author: Cluster preflight maintainers
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
      - V(present) applies the value (running and persisted); V(audit) only reads and reports.
    type: str
    choices: [present, audit]
    default: present
  dropin:
    description:
      - The drop-in that holds only this key. It must end in C(.conf) and live in one of the
        directories of O(sysctl_dirs), otherwise no boot would read it.
      - Any other content of this file is replaced (use O(backup) to keep a copy).
    type: path
    default: /etc/sysctl.d/10-ptrace.conf
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
  backup:
    description: Keep a timestamped copy of an existing drop-in before replacing it.
    type: bool
    default: false
  policy:
    description:
      - Status of a finding that means the desired value does not hold (drift in check mode or with
        O(state=audit), a conflicting file that wins at boot).
    type: str
    choices: [warn, fail]
    default: fail
  check_name:
    description:
      - Prefix of the names in RV(checks). Defaults to the last component of O(name)
        (C(ptrace_scope), C(core_pattern)).
    type: str
  comment:
    description: Extra comment lines for the drop-in header (why the value is what it is).
    type: str
    default: ""
attributes:
  check_mode:
    support: full
    description: Reports what would change and the resulting drift findings; writes nothing.
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
    dropin: /etc/sysctl.d/10-ptrace.conf
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
  description: The running value after this task (before it in check mode); null when the key does not exist.
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
  sample: {value: "0", file: /etc/sysctl.d/10-ptrace.conf, line: 3}
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

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_checks import check, not_applicable, passed, warned
from ansible.module_utils import preflight_corepattern as corepattern
from ansible.module_utils import preflight_sysctl as sysctl

CORE_PATTERN = "kernel.core_pattern"
PTRACE_SCOPE = "kernel.yama.ptrace_scope"


def _fix_command(key, value, dropin):
    return "sysctl -w %s='%s' and persist it as '%s = %s' in %s (the node bring-up does both)" % (
        key, value, key, value, dropin)


def _describe_value(key, value):
    if value is None:
        return "unset"
    if key == CORE_PATTERN:
        return "%s (%s)" % (value, corepattern.describe(value))
    return value


def _validate(module, key, desired, dropin, search):
    if not key or any(char.isspace() for char in key):
        module.fail_json(msg="name %r is not a sysctl key; expected something like kernel.yama.ptrace_scope" % key)
    if "\n" in str(module.params["value"]).strip():
        module.fail_json(msg="value for %s must be one line" % key)
    directories = [entry.rstrip("/") for entry in search if not entry.endswith(".conf")]
    plain = [entry for entry in search if entry.endswith(".conf")]
    if not dropin.endswith(".conf") or dropin in plain or os.path.dirname(dropin) not in directories:
        module.fail_json(
            msg="dropin %s would never be read at boot or is a shared file: expected a *.conf file of its "
                "own in one of %s" % (dropin, ", ".join(directories)))
    if key == CORE_PATTERN:
        errors = corepattern.validate_desired(desired)
        if errors:
            module.fail_json(msg="Refusing kernel.core_pattern: " + "; ".join(errors), errors=errors)
    if key == PTRACE_SCOPE and desired == "3":
        module.warn("kernel.yama.ptrace_scope=3 disables ptrace entirely and cannot be lowered again "
                    "without a reboot.")


def _conflicts(files, shadowed, key, desired, dropin, root):
    """Other files that would override the drop-in (holding the desired value) at boot."""
    found = []
    for entry in shadowed:
        if entry["path"] == dropin:
            found.append({"file": entry["shadowed_by"], "line": 0, "value": None, "target": entry["shadowed_by"],
                          "reason": "%s has the same basename in a directory read first, so %s is never read"
                                    % (entry["shadowed_by"], dropin)})
    order = next((index for index, entry in enumerate(files) if entry["path"] == dropin), None)
    if order is None:
        return found
    seen = {}
    for item in sysctl.assignments(root, files, key):
        if item["path"] == dropin or item["order"] <= order:
            continue
        # The same file read twice (99-sysctl.conf -> ../sysctl.conf, then sysctl.conf) counts once.
        seen[(item["target"], item["line"])] = item
    for item in seen.values():
        if item["value"] != desired:
            found.append({"file": item["path"], "line": item["line"], "value": item["value"],
                          "target": item["target"],
                          "reason": "%s=%s in %s overrides %s at boot" % (
                              key, item["value"], sysctl.location(item), os.path.basename(dropin))})
    return found


def _effective(files, key, root, contents):
    found = sysctl.assignments(root, files, key, contents)
    if not found:
        return None
    last = found[-1]
    return {"value": last["value"], "file": last["path"], "line": last["line"]}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            value=dict(type="str", required=True),
            state=dict(type="str", default="present", choices=["present", "audit"]),
            dropin=dict(type="path", default="/etc/sysctl.d/10-ptrace.conf"),
            proc_root=dict(type="path", default="/proc"),
            sysctl_dirs=dict(type="list", elements="path", default=list(sysctl.DEFAULT_SYSCTL_DIRS)),
            root=dict(type="path", default="/"),
            reload=dict(type="bool", default=True),
            backup=dict(type="bool", default=False),
            policy=dict(type="str", default="fail", choices=["warn", "fail"]),
            check_name=dict(type="str"),
            comment=dict(type="str", default=""),
        ),
        supports_check_mode=True,
    )
    params = module.params
    key = sysctl.normalize_key(params["name"])
    desired = sysctl.normalize_value(params["value"])
    dropin = os.path.normpath(params["dropin"])
    search = [os.path.normpath(entry) for entry in params["sysctl_dirs"]]
    root = params["root"]
    policy = params["policy"]
    short = params["check_name"] or key.split(".")[-1]
    present = params["state"] == "present"
    _validate(module, key, desired, dropin, search)

    runtime_path, runtime = sysctl.read_runtime(root, params["proc_root"], key)
    dropin_before = sysctl.read_text(root, dropin)
    persisted_before = sysctl.dropin_value(dropin_before, key)
    files, shadowed = sysctl.boot_files(root, search, extra=dropin)
    conflicts = _conflicts(files, shadowed, key, desired, dropin, root)

    if runtime is None:
        reason = sysctl.missing_reason(key, runtime_path)
        module.exit_json(
            changed=False, not_applicable=True, reason=reason,
            checks={short: not_applicable(reason, "%s = %s" % (key, desired))},
            runtime=None, runtime_before=None, persisted=persisted_before,
            effective_at_boot=_effective(files, key, root, {}), conflicts=conflicts, dropin=dropin,
            msg=reason)

    dropin_after = sysctl.render_dropin(key, desired, params["comment"]) if present else dropin_before
    write_file = present and dropin_before != dropin_after
    set_runtime = present and params["reload"] and runtime != desired
    changed = write_file or set_runtime
    applied = changed and not module.check_mode

    result = dict(changed=changed, not_applicable=False, dropin=dropin, runtime_before=runtime)
    if applied:
        if write_file:
            backup_file = sysctl.write_dropin(module, sysctl.rooted(root, dropin), dropin_after, params["backup"])
            if backup_file:
                result["backup_file"] = backup_file
        if set_runtime:
            _write_runtime(module, root, runtime_path, key, desired, runtime, dropin, write_file)

    runtime_now = desired if (applied and set_runtime) else runtime
    persisted_now = sysctl.dropin_value(dropin_after, key) if applied or not write_file else persisted_before
    contents = {dropin: dropin_after} if applied else {}
    effective = _effective(files, key, root, contents)

    checks = {}
    fix = _fix_command(key, desired, dropin)
    if runtime_now == desired:
        checks[short] = passed(_describe_value(key, runtime_now), desired)
    elif present and not params["reload"] and not module.check_mode:
        checks[short] = warned(
            "running %s (reload=false: the drop-in applies at the next boot)" % _describe_value(key, runtime_now),
            desired, "sysctl -p %s" % dropin)
    else:
        runtime_fix = fix
        if key == CORE_PATTERN and corepattern.is_pipe(runtime_now):
            runtime_fix = corepattern.destination(runtime_now)["override"]
        checks[short] = check(policy, "running %s" % _describe_value(key, runtime_now), desired, runtime_fix)

    expected_persisted = "%s = %s in %s" % (key, desired, dropin)
    if persisted_now == desired:
        checks[short + "_persisted"] = passed("%s sets %s" % (dropin, desired), expected_persisted)
    else:
        if persisted_now is not None:
            found = "%s sets %s" % (dropin, persisted_now)
        elif dropin_before is not None:
            found = "%s has no %s" % (dropin, key)
        else:
            found = "%s does not exist" % dropin
        checks[short + "_persisted"] = check(policy, found, expected_persisted, fix)

    expected_boot = "%s = %s applied last at boot" % (key, desired)
    if conflicts:
        checks[short + "_boot"] = check(
            policy, "; ".join(item["reason"] for item in conflicts), expected_boot,
            "remove or change %s in %s, or give %s a name that sorts after it" % (
                key, ", ".join("%s:%s" % (item["file"], item["line"]) for item in conflicts), dropin))
    elif effective is None:
        checks[short + "_boot"] = check(
            policy, "no sysctl file sets %s: the kernel default applies at boot" % key, expected_boot, fix)
    elif effective["value"] != desired:
        checks[short + "_boot"] = check(
            policy, "%s from %s:%s at boot" % (_describe_value(key, effective["value"]), effective["file"],
                                              effective["line"]), expected_boot, fix)
    else:
        checks[short + "_boot"] = passed("%s from %s:%s" % (effective["value"], effective["file"], effective["line"]),
                                         expected_boot)

    if key == CORE_PATTERN:
        checks[short + "_pid"] = _pid_check(module, root, params["proc_root"], desired)

    result.update(
        checks=checks, runtime=runtime_now, persisted=persisted_now, effective_at_boot=effective,
        conflicts=conflicts)
    if present and module._diff:
        result["diff"] = [
            dict(before_header=dropin, after_header=dropin, before=dropin_before or "", after=dropin_after),
            dict(before_header="%s (running)" % runtime_path, after_header="%s (running)" % runtime_path,
                 before=runtime + "\n", after=(desired if set_runtime else runtime) + "\n"),
        ]
    result["msg"] = "%s: %s" % (key, "would change" if changed and module.check_mode else
                                ("changed" if changed else "unchanged"))
    module.exit_json(**result)


def _pid_check(module, root, proc_root, desired):
    expected = "%p in kernel.core_pattern (or kernel.core_uses_pid = 1)"
    if corepattern.has_pid(desired):
        return passed("%s has %%p" % desired, expected)
    _path, uses_pid = sysctl.read_runtime(root, proc_root, "kernel.core_uses_pid")
    if uses_pid == "1":
        return passed("%s has no %%p but kernel.core_uses_pid = 1 appends .PID" % desired, expected)
    message = ("kernel.core_pattern %s has no %%p and kernel.core_uses_pid is %s: the ranks of one job that "
               "crash together overwrite each other's core files" % (desired, uses_pid or "unset"))
    module.warn(message)
    return warned(message, expected, "add %p to the pattern, e.g. /tmp/core-%e.%p.%h.%t")


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
        if key == PTRACE_SCOPE and before == "3":
            hint = " kernel.yama.ptrace_scope=3 can only be lowered by a reboot;"
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
