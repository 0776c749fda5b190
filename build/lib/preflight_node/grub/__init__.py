# -*- coding: utf-8 -*-
"""The grub defaults: read (``defaults``, evaluated as the shell would: ``shell``), judged (``checks``) and
edited (``plan``).  Ansible ships this file with every module call that imports one of its modules, so it stays
empty."""
