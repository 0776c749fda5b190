# -*- coding: utf-8 -*-
"""A node's network: its interfaces (``interfaces``), who holds a TCP port (``port_holder``), ARP (``arp``) and the
port mesh probe with its checks (``port_probe``, ``port_checks``).  Ansible ships this file with every module call that
imports one of its modules, so it stays empty."""
