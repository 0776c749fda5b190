# -*- coding: utf-8 -*-
"""What the controller shares with the plays: the names under which their tasks register the stage results
(``stage_results``) and the base class of the project's action plugins (``action``).  Everything else in the
controller imports from here; nothing here imports the rest of the controller."""
