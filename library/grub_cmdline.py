#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ensure kernel arguments in the grub defaults (drop-in or in-place edit)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: grub_cmdline
short_description: Ensure kernel arguments are present or absent in the grub defaults
description:
  - Works out the effective value of C(GRUB_CMDLINE_LINUX) and C(GRUB_CMDLINE_LINUX_DEFAULT) the way
    grub-mkconfig does, by evaluating O(grub_default) and then every C(*.cfg) of O(dropin_dir) in order.
    The evaluation understands plain shell assignments, single and double quotes, C($VAR) and C(${VAR})
    of variables assigned earlier, comments, C(export) and line continuations. Nothing is executed;
    statements it does not understand are skipped and listed in RV(notes).
  - Adds the arguments of O(args) to O(variable) and removes the arguments named by O(absent) from every
    variable of O(absent_variables).
  - Additions go to a drop-in file of its own (mode C(dropin)) or into the last assignment of O(variable) in
    O(grub_default) (mode C(inplace)). Removals edit, in place, the assignments whose text reaches the
    effective value, in whichever file they are. An edit changes only the value being edited; quote style,
    other arguments, trailing comments and every other line stay byte-for-byte.
  - When a file changed, regenerates grub.cfg with O(update_command) (never in check mode).
  - Compares the result with the running kernel's command line (O(proc_cmdline)) and reports whether a reboot
    is needed. Reports findings as check results in RV(checks) and never fails the task for a finding.
version_added: "1.0.0"
author:
  - Cluster preflight maintainers
options:
  args:
    description:
      - Kernel arguments that must be in O(variable), such as C(iommu=soft).
      - An argument may not contain blanks, quotes, C($), backslashes or shell operators.
    type: list
    elements: str
    default: []
  absent:
    description:
      - Kernel arguments that must not be in any variable of O(absent_variables).
      - An entry with C(=) names that exact argument (C(amd_iommu=off)); an entry without C(=) names every
        argument with that key (C(amd_iommu) matches C(amd_iommu=off) and C(amd_iommu=on)).
      - An entry may not name an argument of O(args).
    type: list
    elements: str
    default: []
  variable:
    description:
      - The grub variable that receives O(args). C(GRUB_CMDLINE_LINUX_DEFAULT) applies to normal boot entries
        only; C(GRUB_CMDLINE_LINUX) applies to every entry, recovery included.
    type: str
    choices: [GRUB_CMDLINE_LINUX_DEFAULT, GRUB_CMDLINE_LINUX]
    default: GRUB_CMDLINE_LINUX_DEFAULT
  absent_variables:
    description:
      - The grub variables O(absent) is enforced in. Both make up the kernel command line.
    type: list
    elements: str
    choices: [GRUB_CMDLINE_LINUX_DEFAULT, GRUB_CMDLINE_LINUX]
    default: [GRUB_CMDLINE_LINUX, GRUB_CMDLINE_LINUX_DEFAULT]
  root:
    description:
      - Prefix for O(grub_default), O(dropin_dir) and O(proc_cmdline), for testing against a fake root.
      - When it is not C(/), O(update_command) is never detected automatically.
    type: path
    default: /
  grub_default:
    description: The grub defaults file, sourced first by grub-mkconfig.
    type: path
    default: /etc/default/grub
  dropin_dir:
    description: Directory whose C(*.cfg) files grub-mkconfig sources after O(grub_default) (Debian, Ubuntu).
    type: path
    default: /etc/default/grub.d
  dropin_name:
    description:
      - File name of this module's drop-in inside O(dropin_dir); it must end in C(.cfg), as grub-mkconfig
        sources only those. The file belongs to this module and is rewritten whole; use one name per set of
        arguments.
    type: str
    default: 90-preflight-cmdline.cfg
  mode:
    description:
      - C(dropin) writes additions to O(dropin_name); C(inplace) edits O(grub_default).
      - C(auto) picks C(dropin) when O(dropin_dir) exists, else C(inplace).
    type: str
    choices: [auto, dropin, inplace]
    default: auto
  backup:
    description: Keep a timestamped copy of every file before changing it.
    type: bool
    default: false
  update_command:
    description:
      - Command (argv list, no shell) that regenerates grub.cfg after a change.
      - When omitted, the first found of C(update-grub), C(grub2-mkconfig -o /boot/grub2/grub.cfg) and
        C(grub-mkconfig -o /boot/grub/grub.cfg) is used. An empty list never regenerates.
      - Not run in check mode, nor when nothing changed. When no tool is found, the result says so in
        RV(checks) instead of failing.
    type: list
    elements: str
  proc_cmdline:
    description: The running kernel's command line.
    type: path
    default: /proc/cmdline
  check_prefix:
    description: Prefix of the check names in RV(checks) (C(<prefix>_grub), C(<prefix>_cmdline)).
    type: str
    default: grub_cmdline
  drift_status:
    description: Status of the C(<prefix>_grub) check when the grub defaults differ from what is asked.
    type: str
    choices: [warn, fail]
    default: warn
attributes:
  check_mode:
    support: full
    details: Computes the same result and diff; writes no file, takes no backup, runs no command.
  diff_mode:
    support: full
    details: One before/after pair per changed file (a list when more than one file changes).
  platform:
    platforms: posix
notes:
  - A reboot is needed for a new kernel command line to take effect; this module never reboots.
  - On RHEL 8 and later with BLS entries, grub2-mkconfig also rewrites the kernel options of the entries when
    run with C(--update-bls-cmdline) (RHEL 9.3+); otherwise use C(grubby --update-kernel=ALL --args=...).
seealso:
  - name: Kernel parameters
    description: The kernel's documentation of its command line arguments.
    link: https://docs.kernel.org/admin-guide/kernel-parameters.html
"""

EXAMPLES = r"""
- name: Ensure the IOMMU is in passthrough-soft mode for AMD Instinct GPUs.
  grub_cmdline:
    args: [iommu=soft]
    absent: [amd_iommu=off]
    variable: GRUB_CMDLINE_LINUX_DEFAULT
    dropin_name: 90-preflight-iommu.cfg
    check_prefix: iommu
  register: iommu_grub

- name: Disable the AMD IOMMU instead, editing /etc/default/grub in place.
  grub_cmdline:
    args: [amd_iommu=off]
    absent: [iommu=soft]
    variable: GRUB_CMDLINE_LINUX
    mode: inplace
    backup: true
"""

RETURN = r"""
changed:
  description: Whether a grub defaults file was (or, in check mode, would be) changed.
  returned: always
  type: bool
mode:
  description: The mode used, C(dropin) or C(inplace) (C(auto) resolved).
  returned: always
  type: str
files:
  description: Files changed (or to be changed in check mode).
  returned: always
  type: list
  elements: str
effective_args:
  description: The arguments of O(variable) after the change (as they would be in check mode).
  returned: always
  type: list
  elements: str
  sample: [quiet, splash, iommu=soft]
effective:
  description: The arguments of every kernel command line variable after the change.
  returned: always
  type: dict
  sample: {GRUB_CMDLINE_LINUX: [], GRUB_CMDLINE_LINUX_DEFAULT: [quiet, iommu=soft]}
added:
  description: Arguments of O(args) that were missing and are added.
  returned: always
  type: list
  elements: str
removed:
  description: Arguments removed because O(absent) names them.
  returned: always
  type: list
  elements: str
converged:
  description: Whether the grub defaults (after the change) carry every O(args) and none of O(absent).
  returned: always
  type: bool
reboot_required:
  description: Whether the running kernel lacks an argument of O(args) or carries one named by O(absent).
  returned: always
  type: bool
regenerated:
  description: Whether O(update_command) ran (successfully) in this run.
  returned: always
  type: bool
update_command:
  description: The command that regenerates grub.cfg, as found or given; null when none.
  returned: always
  type: list
  elements: str
backup_files:
  description: Backup copies made.
  returned: always
  type: list
  elements: str
notes:
  description: Statements of the grub files that were skipped by the evaluation, and similar remarks.
  returned: always
  type: list
  elements: str
checks:
  description:
    - C(<prefix>_grub) (grub defaults) and C(<prefix>_cmdline) (running kernel) check results, each with
      status, found, expected and fix.
  returned: always
  type: dict
diff:
  description: Before/after text of each changed file.
  returned: when diff mode is on and a file changed
  type: raw
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_files import write_atomic
from ansible.module_utils.preflight_checks import check, passed, warned
from ansible.module_utils.preflight_grub import (
    CMDLINE_VARIABLES, GrubFiles, ShellParseError, append_args, contributing, dropin_text, is_safe_arg,
    matches_absent, new_assignment, parse_proc_cmdline, remove_args, replace_value, split_args)

DROPIN_HEADER = (
    "Managed by Ansible (grub_cmdline module of the cluster preflight); rewritten whole on every run.",
    "grub-mkconfig sources this file after /etc/default/grub.",
)
AUTO_UPDATE_COMMANDS = (
    ("update-grub", []),
    ("grub2-mkconfig", ["-o", "/boot/grub2/grub.cfg"]),
    ("grub-mkconfig", ["-o", "/boot/grub/grub.cfg"]),
)


def under_root(root, path):
    if not root or root == "/":
        return path
    return os.path.join(root, path.lstrip("/"))


def read_text(path):
    """The file's text (bytes kept through surrogateescape), or None if absent."""
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", "surrogateescape")
    except FileNotFoundError:
        return None


def describe_args(words):
    return " ".join(words) if words else "(none)"


def find_update_command(module, root):
    if root not in ("", "/"):
        return None
    for name, extra in AUTO_UPDATE_COMMANDS:
        path = module.get_bin_path(name)
        if path:
            return [path] + extra
    return None


def plan(params, grub_default, dropin_dir, dropin_path, mode):
    """Work out the new contents of every file; touches nothing."""
    order = [grub_default]
    dropins = []
    if os.path.isdir(dropin_dir):
        dropins = [os.path.join(dropin_dir, name) for name in os.listdir(dropin_dir)
                   if name.endswith(".cfg") and os.path.isfile(os.path.join(dropin_dir, name))]
    if mode == "dropin" and dropin_path not in dropins:
        dropins.append(dropin_path)
    order.extend(sorted(dropins))
    contents = dict((path, read_text(path)) for path in order)
    files = GrubFiles(order, contents)
    exclude = (dropin_path,) if mode == "dropin" else ()

    # Removals: edit the assignments that reach each variable's final value.
    _env, assignments, _notes = files.evaluate(exclude=exclude)
    edits = {}
    removed = []
    for name in params["absent_variables"]:
        for item in contributing(assignments, name):
            new_value, gone = remove_args(files.contents[item.path], item, params["absent"])
            if gone:
                edits.setdefault(item.path, []).append((item, new_value))
                removed.extend(gone)
    for path, path_edits in edits.items():
        text = files.contents[path]
        for item, new_value in sorted(path_edits, key=lambda edit: edit[0].value_start, reverse=True):
            text = replace_value(text, item, new_value)
        files.contents[path] = text

    # Additions: the drop-in, or the last assignment in the grub defaults file.
    env, assignments, _notes = files.evaluate(exclude=exclude)
    current = split_args(env.get(params["variable"], ""))
    added = []
    for arg in params["args"]:
        if arg not in current and arg not in added:
            added.append(arg)
    if mode == "dropin":
        files.contents[dropin_path] = (
            dropin_text(params["variable"], added, DROPIN_HEADER) if added else None)
    elif added:
        text = files.contents[grub_default]
        own = [item for item in assignments if item.name == params["variable"] and item.path == grub_default]
        if own:
            files.contents[grub_default] = replace_value(text, own[-1], append_args(text, own[-1], added))
        else:
            files.contents[grub_default] = new_assignment(text, params["variable"], added)

    env, assignments, notes = files.evaluate()
    effective = dict((name, split_args(env.get(name, ""))) for name in CMDLINE_VARIABLES)
    return {
        "original": contents,
        "files": files,
        "effective": effective,
        "added": added,
        "removed": removed,
        "notes": notes,
        "assignments": assignments,
    }


def grub_findings(params, effective, assignments):
    """Text of what the grub defaults lack or carry, empty when they match."""
    findings = []
    variable = params["variable"]
    lacking = [arg for arg in params["args"] if arg not in effective[variable]]
    if lacking:
        findings.append("%s lacks %s" % (variable, " ".join(lacking)))
    for name in params["absent_variables"]:
        unwanted = [arg for arg in effective[name] if matches_absent(arg, params["absent"])]
        if unwanted:
            where = ["%s line %d" % (item.path, item.line) for item in reversed(contributing(assignments, name))]
            findings.append("%s carries %s (from %s)" % (name, " ".join(unwanted), ", ".join(where)))
    return findings


def main():
    module = AnsibleModule(
        argument_spec=dict(
            args=dict(type="list", elements="str", default=[]),
            absent=dict(type="list", elements="str", default=[]),
            variable=dict(type="str", choices=list(CMDLINE_VARIABLES[::-1]), default="GRUB_CMDLINE_LINUX_DEFAULT"),
            absent_variables=dict(type="list", elements="str", choices=list(CMDLINE_VARIABLES),
                                  default=list(CMDLINE_VARIABLES)),
            root=dict(type="path", default="/"),
            grub_default=dict(type="path", default="/etc/default/grub"),
            dropin_dir=dict(type="path", default="/etc/default/grub.d"),
            dropin_name=dict(type="str", default="90-preflight-cmdline.cfg"),
            mode=dict(type="str", choices=["auto", "dropin", "inplace"], default="auto"),
            backup=dict(type="bool", default=False),
            update_command=dict(type="list", elements="str"),
            proc_cmdline=dict(type="path", default="/proc/cmdline"),
            check_prefix=dict(type="str", default="grub_cmdline"),
            drift_status=dict(type="str", choices=["warn", "fail"], default="warn"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    for arg in params["args"] + params["absent"]:
        if not is_safe_arg(arg):
            module.fail_json(msg="kernel argument %r is not allowed: it must not contain blanks, quotes, '$', "
                                 "backslashes or shell operators" % arg)
    clashes = [arg for arg in params["args"] if matches_absent(arg, params["absent"])]
    if clashes:
        module.fail_json(msg="absent names %s, which args asks to add; drop it from one of the two"
                             % ", ".join(clashes))
    if "/" in params["dropin_name"] or not params["dropin_name"].endswith(".cfg"):
        module.fail_json(msg="dropin_name %r must be a file name ending in .cfg (grub-mkconfig sources only "
                             "*.cfg from the drop-in directory)" % params["dropin_name"])

    root = params["root"]
    grub_default = under_root(root, params["grub_default"])
    dropin_dir = under_root(root, params["dropin_dir"])
    dropin_path = os.path.join(dropin_dir, params["dropin_name"])
    proc_cmdline = under_root(root, params["proc_cmdline"])
    mode = params["mode"]
    if mode == "auto":
        mode = "dropin" if os.path.isdir(dropin_dir) else "inplace"
    grub_name = "%s_grub" % params["check_prefix"]
    cmdline_name = "%s_cmdline" % params["check_prefix"]
    variable = params["variable"]
    wanted = "%s has %s" % (variable, describe_args(params["args"]))
    if params["absent"]:
        wanted += "; %s carry none of %s" % ("/".join(params["absent_variables"]), describe_args(params["absent"]))
    by_hand = []
    if params["args"]:
        by_hand.append("add %s to %s in %s" % (" ".join(params["args"]), variable, params["grub_default"]))
    if params["absent"]:
        by_hand.append("remove %s from %s" % (" ".join(params["absent"]), " and ".join(params["absent_variables"])))
    manual_fix = "run bringup.yml, or %s, then run update-grub (grub2-mkconfig -o /boot/grub2/grub.cfg on RHEL) " \
                 "and reboot the node" % " and ".join(by_hand)

    result = dict(changed=False, mode=mode, files=[], effective_args=[], effective={}, added=[], removed=[],
                  converged=False, reboot_required=False, regenerated=False, update_command=None,
                  backup_files=[], notes=[], checks={})

    # The running kernel.
    running = None
    try:
        with open(proc_cmdline, "r") as handle:
            running = parse_proc_cmdline(handle.read())
    except (IOError, OSError) as exc:
        result["checks"][cmdline_name] = warned(
            "cannot read %s: %s" % (proc_cmdline, exc), "running kernel booted with %s" % wanted,
            "check that %s is readable on the node" % proc_cmdline)
    if running is not None:
        result["reboot_required"] = (any(arg not in running for arg in params["args"])
                                     or any(matches_absent(arg, params["absent"]) for arg in running))

    if read_text(grub_default) is None and not (mode == "dropin" and os.path.isdir(dropin_dir)):
        result["checks"][grub_name] = check(
            params["drift_status"], "no %s on this node: grub does not appear to be its boot loader" % grub_default,
            wanted, "add %s to the kernel command line of the node's boot loader and reboot"
            % describe_args(params["args"]))
        finish_cmdline_check(result, running, params, cmdline_name, grub_ready=False)
        module.exit_json(**result)

    try:
        outcome = plan(params, grub_default, dropin_dir, dropin_path, mode)
    except ShellParseError as exc:
        result["checks"][grub_name] = check(
            "fail", "cannot evaluate the grub defaults: %s" % exc, wanted,
            "fix the shell syntax of %s line %d (grub-mkconfig fails on it too)" % (exc.path, exc.line))
        finish_cmdline_check(result, running, params, cmdline_name, grub_ready=False)
        module.exit_json(**result)
    except (IOError, OSError) as exc:
        module.fail_json(msg="cannot read the grub defaults: %s" % exc)

    files = outcome["files"]
    original = outcome["original"]
    changed_paths = [path for path in files.order if files.contents.get(path) != original.get(path)]
    effective = outcome["effective"]
    findings_after = grub_findings(params, effective, outcome["assignments"])
    converged = not findings_after
    result.update(changed=bool(changed_paths), files=changed_paths, effective=effective,
                  effective_args=effective[variable], added=outcome["added"], removed=outcome["removed"],
                  converged=converged, notes=outcome["notes"])

    if changed_paths and module._diff:
        diffs = [dict(before_header=path, after_header=path, before=original.get(path) or "",
                      after=files.contents.get(path) or "") for path in changed_paths]
        result["diff"] = diffs[0] if len(diffs) == 1 else diffs

    update_command = params["update_command"]
    if update_command is None:
        update_command = find_update_command(module, root)
    elif not update_command:
        update_command = None
    result["update_command"] = update_command

    regenerate_problem = None
    if changed_paths and not module.check_mode:
        for path in changed_paths:
            if params["backup"] and original.get(path) is not None:
                result["backup_files"].append(module.backup_local(path))
            text = files.contents.get(path)
            try:
                if text is None:
                    os.unlink(path)
                else:
                    if not os.path.isdir(os.path.dirname(path)):
                        os.makedirs(os.path.dirname(path), 0o755)
                    write_atomic(module, path, text)
            except (IOError, OSError) as exc:
                module.fail_json(msg="cannot write %s: %s" % (path, exc), **result)
        if update_command:
            rc, out, err = module.run_command(update_command, environ_update=dict(LANG="C", LC_ALL="C"))
            if rc != 0:
                result.update(rc=rc, stdout=out, stderr=err)
                module.fail_json(msg="%s failed (rc %d) after changing %s: %s" % (
                    " ".join(update_command), rc, ", ".join(changed_paths), (err or out).strip()), **result)
            result["regenerated"] = True
        elif params["update_command"] is not None and not params["update_command"]:
            regenerate_problem = "grub.cfg was not regenerated (update_command is empty)"
        elif root not in ("", "/"):
            regenerate_problem = "grub.cfg was not regenerated (root is %s and no update_command was given)" % root
        else:
            regenerate_problem = ("grub.cfg was not regenerated: none of update-grub, grub2-mkconfig, grub-mkconfig "
                                  "was found")

    # The grub defaults check.
    if not converged:
        result["checks"][grub_name] = check(
            params["drift_status"],
            "%s even after this module's edits (arguments built from variables or glued to other text are not "
            "edited, and a later file can override an earlier one)" % "; ".join(findings_after),
            wanted, "edit the lines named by hand: %s" % manual_fix)
    elif changed_paths and module.check_mode:
        before, before_assignments = evaluate_original(original, files.order)
        findings_before = (grub_findings(params, before, before_assignments)
                           or ["%s need rewriting" % ", ".join(changed_paths)])
        result["checks"][grub_name] = check(
            params["drift_status"], "; ".join(findings_before), wanted, manual_fix,
            files=changed_paths)
    elif regenerate_problem:
        result["checks"][grub_name] = warned(
            "grub defaults now carry the change but %s" % regenerate_problem, "%s in grub.cfg" % wanted,
            "regenerate grub.cfg (update-grub, or grub2-mkconfig -o /boot/grub2/grub.cfg) and reboot the node")
    else:
        result["checks"][grub_name] = passed(
            "%s (%s)" % (describe_effective(params), "changed: " + ", ".join(changed_paths)
                         if changed_paths else "no change needed"), wanted)
    grub_ready = result["checks"][grub_name]["status"] == "pass"
    finish_cmdline_check(result, running, params, cmdline_name, grub_ready)
    module.exit_json(**result)


def evaluate_original(original, order):
    """Effective arguments and assignments of the files as they are on disk."""
    files = GrubFiles(order, original)
    env, assignments, _notes = files.evaluate()
    return dict((name, split_args(env.get(name, ""))) for name in CMDLINE_VARIABLES), assignments


def describe_effective(params):
    text = "%s has %s" % (params["variable"], describe_args(params["args"]))
    if params["absent"]:
        text += ", and no %s" % " ".join(params["absent"])
    return text


def finish_cmdline_check(result, running, params, name, grub_ready):
    """The running kernel check; ``grub_ready``: a reboot alone would fix it."""
    if running is None:
        return
    not_running = [arg for arg in params["args"] if arg not in running]
    unwanted = [arg for arg in running if matches_absent(arg, params["absent"])]
    without = ", without %s" % " ".join(params["absent"]) if params["absent"] else ""
    expected = "running kernel booted with %s%s" % (describe_args(params["args"]), without)
    if not not_running and not unwanted:
        result["checks"][name] = passed(
            "running kernel command line has %s%s" % (describe_args(params["args"]), without), expected)
        return
    found = []
    if not_running:
        found.append("running kernel command line lacks %s" % " ".join(not_running))
    if unwanted:
        found.append("running kernel command line carries %s" % " ".join(unwanted))
    if grub_ready:
        fix = "reboot the node so it boots with the new kernel command line"
    else:
        fix = "run bringup.yml to fix the grub defaults and regenerate grub.cfg, then reboot the node"
    result["checks"][name] = warned("; ".join(found), expected, fix)


if __name__ == "__main__":
    main()
