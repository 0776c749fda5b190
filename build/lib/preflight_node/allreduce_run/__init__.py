# -*- coding: utf-8 -*-
"""The all-reduce as it runs on a node: torchrun under a hard bound (``gate_run``), one rank started by Slurm
(``rank_run``), its scratch directory (``scratch``) and which py-spy root may run for the ranks' stacks
(``py_spy_choice``).  Ansible ships this file with every module call that imports one of its modules, so it stays
empty."""
