# -*- coding: utf-8 -*-
"""The command line (``python -m cluster_preflight``, ``main``) and what it runs: the playbooks through
ansible-runner (``playbooks``) with live progress (``progress``), ``baseline`` (``baseline``, ``baseline_wire``),
``history``, ``known-hosts`` and ``scripts/gpu-check`` (``gpu_check``, ``gpu_check_capture``).  Only
``cluster_preflight/__main__.py`` exits the process."""
