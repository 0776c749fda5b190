# -*- coding: utf-8 -*-
"""Slurm, owned by the preflight: drain and resume (``drain``) and the node-local modes a Slurm node runs
(``local``: the health check and the prolog)."""
