# -*- coding: utf-8 -*-
"""The settings of a run: the checks that hold for every capability alike (``checks``) and the variable reference
generated from every role's argument specs (``variables_doc``)."""
