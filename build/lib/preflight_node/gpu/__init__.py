# -*- coding: utf-8 -*-
"""What the GPU tools of a node print, parsed: ``nvidia-smi`` (``nvidia_gpus``, ``nvidia_smi_xml``, ``nvlink``),
``amd-smi`` (``amd_smi``), ``dcgmi diag`` (``dcgm``) and the kernel log's Xid lines (``xid_log``).  Ansible ships this
file with every module call that imports one of its modules, so it stays empty."""
