# -*- coding: utf-8 -*-
"""What a run leaves besides its verdict: JUnit, Prometheus and host lists (``formats``), the summary
(``summary``), ``report.html`` (``report``, ``templates/``) and the run history (``history``, ``cluster_names``)."""
