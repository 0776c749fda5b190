# -*- coding: utf-8 -*-
"""A node's network: its interfaces (``interfaces``), who holds a TCP port (``port_holder``), ARP (``arp``), the
port mesh probe with its checks (``port_probe``, ``port_checks``), and what an RDMA fabric needs beyond its ports: the
RoCE GID table (``roce_gid``), GPUDirect RDMA (``gpudirect``, with ``lspci``'s ACS) and NCCL's network plugin
(``nccl_plugin``).  Ansible ships this file with every module call that imports one of its modules, so it stays
empty."""
