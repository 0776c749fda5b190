#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
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
    is needed. Reports findings as check results in RV(checks) and never fails the task for a finding (no grub
    defaults, a file grub-mkconfig could not parse, an unreadable O(proc_cmdline)). It fails only when it cannot
    do its job - a grub file that exists but cannot be read or written, or O(update_command) failing - with a
    message that says what was found, what was expected and the fix.
  - A file that would change and is a symlink is refused before anything is written, in check mode too; the
    task fails naming the link and its target, and nothing is written over the link (which would replace it)
    or through it (its target may be shared or managed elsewhere).
  - Reads, decides and judges with the functions of C(module_utils/preflight_node/grub/plan.py) that the preflight
    audit's C(iommu) decider also runs, so an audit reports exactly what bring-up would change; the files are written
    only outside check mode.
version_added: "1.0.0"
extends_documentation_fragment: [preflight]
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
    description: Computes the same result and diff; writes no file, takes no backup, runs no command.
  diff_mode:
    support: full
    description: One before/after pair per changed file (a list when more than one file changes).
  platform:
    support: full
    platforms: posix
    description: Linux with GRUB 2 (C(/etc/default/grub) and its C(grub.d) drop-ins).
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
written:
  description: Files already written (or removed) when writing a later one failed.
  returned: when writing a file failed
  type: list
  elements: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_node.host.files import fail_write, refuse_symlinks, write_atomic
from ansible.module_utils.preflight_node.grub.defaults import read_cmdline, read_files, rooted
from ansible.module_utils.preflight_node.grub.plan import (AUTO_UPDATE_COMMANDS, CMDLINE_VARIABLES, argument_problems,
                                                           plan, wanted_args)
from ansible.module_utils.preflight_node.grub.checks import cmdline_check, grub_check, reboot_required, running_args


def find_update_command(module, root):
    if root not in ("", "/"):
        return None
    for name, extra in AUTO_UPDATE_COMMANDS:
        path = module.get_bin_path(name)
        if path:
            return [path] + extra
    return None


def link_fix(path):
    """What to do about a grub file that is a symlink: the edit is in place, so the file is the
    operator's to choose (its target may be shared by other nodes or managed elsewhere)."""
    return ("if %s should be managed on this node, replace the link with a regular copy of what it points to "
            "(cp --remove-destination \"$(readlink -f %s)\" %s), or make the change in the link's target by hand; "
            "a stale link can be removed (rm %s); then re-run" % (path, path, path, path))


def refuse_linked_files(module, paths, result):
    """Fail, before anything is written, when a file that would change is a symlink."""
    for path in paths:
        refuse_symlinks(module, [(path, path)], link_fix(path), **dict(result, changed=False))


def write_files(module, outcome, backup, result):
    """Write (or remove) every changed file; a file that cannot be written fails the task naming it
    (found / expected / fix), ``changed`` and ``written`` saying what was already done."""
    files = outcome["files"]
    written = []
    for path in outcome["changed_paths"]:
        failure = dict(result, changed=bool(written), written=list(written))
        if backup and outcome["original"].get(path) is not None:
            try:
                result["backup_files"].append(module.backup_local(path))
            except Exception as exc:  # pylint: disable=broad-except  # backup_local raises a plain Exception
                fail_write(module, exc, path, "back up", **failure)
        text = files.contents.get(path)
        if text is None:
            try:
                os.unlink(path)
            except OSError as exc:
                fail_write(module, exc, path, "remove", **failure)
        else:
            write_atomic(module, path, text, fix=link_fix(path), result=failure)
        written.append(path)


def regenerate(module, params, update_command, changed_paths, result):
    """Run the update command; returns why grub.cfg was not regenerated, or None."""
    if update_command:
        rc, out, err = module.run_command(update_command, environ_update=dict(LANG="C", LC_ALL="C"))
        if rc != 0:
            result.update(rc=rc, stdout=out, stderr=err)
            module.fail_json(msg="%s failed (rc %d) after changing %s: %s. Expected: grub.cfg regenerated. Fix: "
                                 "repair the boot loader set-up the message names, then re-run bring-up" % (
                                     " ".join(update_command), rc, ", ".join(changed_paths), (err or out).strip()),
                             **result)
        result["regenerated"] = True
        return None
    if params["update_command"] is not None and not params["update_command"]:
        return "grub.cfg was not regenerated (update_command is empty)"
    if params["root"] not in ("", "/"):
        return "grub.cfg was not regenerated (root is %s and no update_command was given)" % params["root"]
    return "grub.cfg was not regenerated: none of update-grub, grub2-mkconfig, grub-mkconfig was found"


def report_plan(module, outcome, variable, result):
    """Put what a planned outcome will change into ``result`` (and the diff when asked for)."""
    changed_paths = outcome["changed_paths"]
    effective = outcome["effective"]
    result.update(changed=bool(changed_paths), files=changed_paths, effective=effective,
                  effective_args=effective[variable], added=outcome["added"], removed=outcome["removed"],
                  converged=not outcome["findings_after"], notes=outcome["notes"])
    if changed_paths and module._diff:
        diffs = [dict(before_header=path, after_header=path, before=outcome["original"].get(path) or "",
                      after=outcome["files"].contents.get(path) or "") for path in changed_paths]
        result["diff"] = diffs[0] if len(diffs) == 1 else diffs


def chosen_update_command(module, update_command, root):
    """The argv that regenerates grub.cfg: as given, found on the node (None given), or None ([] given)."""
    if update_command is None:
        return find_update_command(module, root)
    return update_command or None


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
    wanted = wanted_args(params["args"], params["absent"], params["variable"], params["absent_variables"],
                         params["dropin_name"], params["grub_default"])
    problems = argument_problems(wanted)
    if problems:
        module.fail_json(msg="; ".join("%s. Expected: %s. Fix: %s" % problem for problem in problems))

    root = params["root"]
    grub_name = "%s_grub" % params["check_prefix"]
    cmdline_name = "%s_cmdline" % params["check_prefix"]
    result = dict(changed=False, mode=params["mode"], files=[], effective_args=[], effective={}, added=[],
                  removed=[], converged=False, reboot_required=False, regenerated=False, update_command=None,
                  backup_files=[], notes=[], checks={})

    # Read, then decide what to write: the same functions the audit's decider uses.
    snapshot = read_files(rooted(root, params["grub_default"]), rooted(root, params["dropin_dir"]))
    cmdline = read_cmdline(rooted(root, params["proc_cmdline"]))
    outcome = plan(snapshot, wanted, params["mode"])
    result["mode"] = outcome["mode"]
    result["reboot_required"] = bool(reboot_required(running_args(cmdline), wanted))
    if outcome["state"] == "unreadable":
        module.fail_json(msg="cannot read the grub defaults %s: %s. Expected: readable grub defaults. Fix: run as "
                             "root (become)" % (outcome["path"], outcome["error"]), **result)
    if outcome["state"] != "planned":
        result["checks"][grub_name] = grub_check(outcome, wanted, params["drift_status"])
        result["checks"][cmdline_name] = cmdline_check(cmdline, wanted, grub_ready=False)
        module.exit_json(**result)

    changed_paths = outcome["changed_paths"]
    report_plan(module, outcome, params["variable"], result)
    update_command = chosen_update_command(module, params["update_command"], root)
    result["update_command"] = update_command

    # Decided before anything is written (and in check mode, where the real run would fail).
    refuse_linked_files(module, changed_paths, result)

    # Act only outside check mode.
    regenerate_problem = None
    applied = bool(changed_paths) and not module.check_mode
    if applied:
        write_files(module, outcome, params["backup"], result)
        regenerate_problem = regenerate(module, params, update_command, changed_paths, result)

    result["checks"][grub_name] = grub_check(outcome, wanted, params["drift_status"], applied=applied,
                                             regenerate_problem=regenerate_problem)
    grub_ready = result["checks"][grub_name]["status"] == "pass"
    result["checks"][cmdline_name] = cmdline_check(cmdline, wanted, grub_ready)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
