#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ensure a directory with a mode and an owner without following a link (the core directory)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: safe_directory
short_description: Ensure a directory with a mode and an owner, never through a link or a path others control
description:
  - Creates O(path) (and missing parents, C(0755) root's) and sets its mode and owner, as root, for a directory
    that may live under a world-writable parent, such as the sticky C(1777) core directory under C(/var/tmp).
  - Every component is opened from C(/) down with C(O_NOFOLLOW), so a symbolic link anywhere on the path (one
    a user planted, C(/var/tmp/cores -> /etc)) is refused, never followed; each existing parent must be owned
    by root (or the wanted owner) and not writable by others unless sticky; an existing O(path) owned by
    another account is refused. The owner and mode are set through the open directory (C(fchown),
    C(fchmod)), so nothing is resolved again between the check and the change.
  - A path that cannot be made safely fails the task with what was found there, in check mode too (the real
    run would fail); nothing is created or changed then.
version_added: "1.0.0"
extends_documentation_fragment: [preflight]
options:
  path:
    description: The directory, an absolute path.
    type: path
    required: true
  mode:
    description: Its mode, an octal string such as C("1777").
    type: str
    required: true
  owner:
    description: Its owner, a user name or uid.
    type: str
    default: root
  group:
    description: Its group, a group name or gid.
    type: str
    default: root
  root:
    description: Prefix of O(path); tests point it at a sandbox tree. Reported paths stay logical.
    type: path
    default: /
attributes:
  check_mode:
    support: full
    description: Reports whether the directory would be created or changed; creates and changes nothing.
  diff_mode:
    support: full
    description: Before/after of the directory's state, mode and owner.
notes:
  - Needs root to set an owner other than the connecting user.
"""

EXAMPLES = r"""
- name: Ensure the core directory exists, sticky and writable by every job user.
  safe_directory:
    path: /var/tmp/cores
    mode: "1777"
    owner: root
    group: root
"""

RETURN = r"""
changed:
  description: Whether the directory was (or in check mode would be) created or changed.
  returned: always
  type: bool
path:
  description: The directory.
  returned: always
  type: str
state:
  description: What the directory is after the task, with C(mode), C(uid), C(gid) (before it, in check mode).
  returned: always
  type: dict
  sample: {state: directory, mode: "1777", uid: 0, gid: 0}
diff:
  description: Before/after of the directory's state, mode and owner.
  returned: diff mode
  type: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_node.host import safe_dir


def _fail(module, path, found, **result):
    module.fail_json(msg="Refusing to create or change %s on %s. Found: %s. Expected: a path whose every part is "
                         "a real directory of root's (or the wanted owner's), none of them writable by others "
                         "unless sticky. Fix: look at what is there, remove it (or choose another directory), "
                         "then re-run." % (path, os.uname().nodename, found), found=found, path=path, **result)


def main():
    module = AnsibleModule(
        argument_spec=dict(path=dict(type="path", required=True), mode=dict(type="str", required=True),
                           owner=dict(type="str", default="root"), group=dict(type="str", default="root"),
                           root=dict(type="path", default="/")),
        supports_check_mode=True,
    )
    params = module.params
    path = os.path.normpath(params["path"])
    try:
        mode = int(str(params["mode"]), 8)
        if not 0 <= mode <= 0o7777:
            raise ValueError(params["mode"])
    except ValueError:
        module.fail_json(msg="Found mode %r. Expected: an octal mode such as \"1777\". Fix: quote the mode as an "
                             "octal string." % params["mode"])
    try:
        uid, gid = safe_dir.ids(params["owner"], params["group"])
    except KeyError as exc:
        module.fail_json(msg="Found owner %s, group %s: %s is not an account or group on %s. Expected: a user and "
                             "a group that exist there. Fix: create them first, or name others."
                             % (params["owner"], params["group"], exc, os.uname().nodename))
    try:
        before = safe_dir.inspect(path, mode, uid, gid, params["root"])
    except safe_dir.Refused as exc:
        _fail(module, path, str(exc))
    result = dict(changed=before["changed"], path=path, state=before["before"])
    if before["changed"] and not module.check_mode:
        try:
            result["state"] = safe_dir.ensure(path, mode, uid, gid, params["root"])
        except safe_dir.Refused as exc:
            _fail(module, path, str(exc))
        except OSError as exc:
            module.fail_json(msg="Found: %s could not be made on %s: %s. Expected: a writable file system. Fix: "
                                 "fix what the error names, then re-run." % (path, os.uname().nodename,
                                                                           exc.strerror or exc))
    if module._diff:
        after = dict(before["before"], state="directory", mode="%04o" % mode, uid=uid, gid=gid)
        result["diff"] = dict(before=before["before"], after=after if before["changed"] else before["before"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
