# -*- coding: utf-8 -*-
"""The base of the project's action plugins: each runs on the controller only, so it opens no connection to a
node and transfers no file (``action_plugins/preflight_*.py`` set their own ``_VALID_ARGS``)."""

from __future__ import annotations

from ansible.plugins.action import ActionBase


class ControllerAction(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
