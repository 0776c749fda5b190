# -*- coding: utf-8 -*-
"""The checks judging the grub defaults and the running kernel's command line; node layer.

``grub_check`` turns a :func:`module_utils/preflight_node/grub/plan.py <plan>` outcome into the grub defaults
check, ``cmdline_check`` the running kernel's arguments into the command line check.  The writer
(``library/grub_cmdline.py``, on the node) and the iommu decider (``cluster_preflight/capabilities/iommu/``,
on the controller) both build their checks here, so an audit and a bring-up report the same.
"""

from __future__ import annotations

from ..checks import check, passed, warned
from .plan import matches_absent, parse_proc_cmdline

REGENERATE_HINT = "update-grub (grub2-mkconfig -o /boot/grub2/grub.cfg on RHEL)"


def describe_args(words):
    return " ".join(words) if words else "(none)"


def _on(host):
    return " on %s" % host if host else ""


def expected_text(wanted):
    text = "%s has %s" % (wanted["variable"], describe_args(wanted["args"]))
    if wanted["absent"]:
        text += "; %s carry none of %s" % ("/".join(wanted["absent_variables"]), describe_args(wanted["absent"]))
    return text


def manual_fix(wanted):
    by_hand = []
    if wanted["args"]:
        by_hand.append("add %s to %s in %s" % (" ".join(wanted["args"]), wanted["variable"], wanted["grub_default"]))
    if wanted["absent"]:
        by_hand.append("remove %s from %s" % (" ".join(wanted["absent"]), " and ".join(wanted["absent_variables"])))
    return "run bringup.yml, or %s, then run %s and reboot the node" % (" and ".join(by_hand), REGENERATE_HINT)


def describe_effective(wanted):
    text = "%s has %s" % (wanted["variable"], describe_args(wanted["args"]))
    if wanted["absent"]:
        text += ", and no %s" % " ".join(wanted["absent"])
    return text


def grub_check(outcome, wanted, drift_status, host=None, applied=False, regenerate_problem=None):
    """The grub defaults check for a :func:`plan` outcome.

    ``applied``: the planned change was written (bring-up); otherwise a
    pending change is drift, reported with ``drift_status`` (audit, check mode).
    """
    expected = expected_text(wanted)
    if outcome["state"] == "unreadable":
        return check(
            drift_status, "cannot read %s%s: %s" % (outcome["path"], _on(host), outcome["error"]), expected,
            "make %s readable to the preflight (connect as root or set preflight_become), then re-run"
            % outcome["path"])
    if outcome["state"] == "no_grub":
        return check(
            drift_status, "no %s%s: grub does not appear to be its boot loader" % (
                wanted["grub_default"], _on(host) or " on this node"),
            expected, "add %s to the kernel command line of the node's boot loader and reboot"
            % describe_args(wanted["args"]))
    if outcome["state"] == "parse_error":
        exc = outcome["error"]
        return check(
            "fail", "cannot evaluate the grub defaults%s: %s" % (_on(host), exc), expected,
            "fix the shell syntax of %s line %d (grub-mkconfig fails on it too)" % (exc.path, exc.line))
    changed = outcome["changed_paths"]
    if outcome["findings_after"]:
        return check(
            drift_status,
            "%s%s even after this module's edits (arguments built from variables or glued to other text are not "
            "edited, and a later file can override an earlier one)" % ("; ".join(outcome["findings_after"]), _on(host)),
            expected, "edit the lines named by hand: %s" % manual_fix(wanted))
    if changed and not applied:
        before = outcome["findings_before"] or ["%s need rewriting" % ", ".join(changed)]
        return check(drift_status, "%s%s" % ("; ".join(before), _on(host)), expected, manual_fix(wanted),
                     files=changed)
    if regenerate_problem:
        return warned(
            "grub defaults%s now carry the change but %s" % (_on(host), regenerate_problem),
            "%s in grub.cfg" % expected,
            "regenerate grub.cfg (%s) and reboot the node" % REGENERATE_HINT)
    return passed("%s (%s)%s" % (describe_effective(wanted), "changed: " + ", ".join(changed) if changed
                                 else "no change needed", _on(host)), expected)


def running_args(cmdline):
    """The running kernel's arguments from ``{text, error}``, or None when unreadable."""
    if not cmdline or cmdline.get("text") is None:
        return None
    return parse_proc_cmdline(cmdline["text"])


def reboot_required(running, wanted):
    """Whether the running kernel lacks a wanted argument or carries an unwanted one (None: unknown)."""
    if running is None:
        return None
    return (any(arg not in running for arg in wanted["args"])
            or any(matches_absent(arg, wanted["absent"]) for arg in running))


def cmdline_check(cmdline, wanted, grub_ready, host=None):
    """The running kernel check; ``grub_ready``: a reboot alone would fix it."""
    without = ", without %s" % " ".join(wanted["absent"]) if wanted["absent"] else ""
    expected = "running kernel booted with %s%s" % (describe_args(wanted["args"]), without)
    running = running_args(cmdline)
    if running is None:
        return warned("cannot read %s%s: %s" % (cmdline["path"], _on(host), cmdline.get("error")), expected,
                      "check that %s is readable on the node (procfs mounted)" % cmdline["path"])
    not_running = [arg for arg in wanted["args"] if arg not in running]
    unwanted = [arg for arg in running if matches_absent(arg, wanted["absent"])]
    if not not_running and not unwanted:
        return passed("running kernel command line has %s%s%s" % (describe_args(wanted["args"]), without, _on(host)),
                      expected)
    found = []
    if not_running:
        found.append("running kernel command line lacks %s" % " ".join(not_running))
    if unwanted:
        found.append("running kernel command line carries %s" % " ".join(unwanted))
    if grub_ready:
        fix = "reboot the node so it boots with the new kernel command line"
    else:
        fix = "run bringup.yml to fix the grub defaults and regenerate grub.cfg, then reboot the node"
    return warned("; ".join(found) + _on(host), expected, fix)
