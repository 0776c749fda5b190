# -*- coding: utf-8 -*-
"""What the GPU tools of a node print, parsed: ``nvidia-smi`` (``nvidia_gpus``, ``nvidia_smi_xml``, ``nvlink``),
``amd-smi`` (``amd_smi``), ``dcgmi diag`` (``dcgm``) and the kernel log's Xid lines and lost-GPU messages
(``xid_log``); and the NVSwitches on the PCI bus with their fabric manager (``nvswitch``).  Ansible ships this file with
every module call that imports one of its modules, so it stays empty."""
