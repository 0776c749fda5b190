# -*- coding: utf-8 -*-
"""The node layer of cluster preflight: what runs on a node inside a module call.

Readers, probes and bring-up writers, the node's command runner (``ops``) and process helpers. Modules in
``library/`` import it as ``ansible.module_utils.preflight_node.<name>`` and Ansible ships only what they
import; inside the package every import is relative, so the controller imports the same files as
``preflight_node.<name>``. Nothing here imports the controller package ``cluster_preflight``.
"""
