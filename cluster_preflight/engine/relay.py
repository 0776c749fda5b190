# -*- coding: utf-8 -*-
"""A step's ``srun`` output copied into the controller's files, bounded per task (a process of its own).

Every line a step's task prints reaches the controller through ``srun --label``, so it starts with the task's
number (``12: ...``), which srun adds and the task cannot choose.  What a node prints is not the controller's to
keep without limit: a task (root on its node) could print at network speed until the step's bound, filling the
controller's memory or disk.  So ``srun``'s standard output and standard error go through this relay, started with
``srun`` by ``cluster_preflight/engine/step.py`` (``start``), which appends them to the step's files (root's
alone), keeping of each task at most ``per_task`` bytes per stream and of srun's own (unlabelled) lines at most
``unlabelled`` bytes, and cutting a line longer than :data:`LINE_MAX`.  A task past its share gets one line
``PFRCUT <task> <bytes kept>`` where its output stops, and at the end ``PFRCUT <task> total <bytes printed>``
(``PFRCUT srun ...`` for srun's own): lines no task can print (every task's line starts with its label), from
which the collector says whose output was cut and how much.

Run as ``python -I -S relay.py OUT ERR PER_TASK UNLABELLED ERR_FD`` with srun's standard output as its standard
input and srun's standard error as its descriptor ``ERR_FD``; the standard library only.
"""

from __future__ import annotations

import os
import re
import sys
import threading

LABEL = re.compile(rb"^\s*(\d+): ")
# Bytes of one line kept (a protocol line is under 1 KiB); the rest of a longer line still counts, unkept.
LINE_MAX = 65536


def copy(source, sink, per_task, unlabelled):
    """Copy the lines of ``source`` (a binary file) to ``sink`` (a binary file, flushed per line), each task's
    and srun's own within their share; returns ``{task or "srun": bytes printed}`` of those cut."""
    printed, cut = {}, set()
    while True:
        line = source.readline(LINE_MAX)
        if not line:
            break
        size = len(line)
        if not line.endswith(b"\n"):
            # Longer than LINE_MAX (or a last line without its end): the rest counts, and is not kept.
            while True:
                more = source.readline(LINE_MAX)
                size += len(more)
                if not more or more.endswith(b"\n"):
                    break
            line += b"\n"
        match = LABEL.match(line)
        key = match.group(1).decode() if match else "srun"
        printed[key] = printed.get(key, 0) + size
        if key in cut:
            continue
        if printed[key] > (per_task if match else unlabelled):
            cut.add(key)
            sink.write(b"PFRCUT %s %d\n" % (key.encode(), printed[key] - size))
        else:
            sink.write(line)
        sink.flush()
    for key in sorted(cut):
        sink.write(b"PFRCUT %s total %d\n" % (key.encode(), printed[key]))
    sink.flush()
    return {key: printed[key] for key in cut}


def _copy_file(source, path, per_task, unlabelled):
    with open(path, "ab", buffering=0) as sink:
        copy(source, sink, per_task, unlabelled)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    out, err, per_task, unlabelled, err_fd = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    stdout = os.fdopen(0, "rb", buffering=65536)
    stderr = os.fdopen(err_fd, "rb", buffering=65536)
    other = threading.Thread(target=_copy_file, args=(stderr, err, per_task, unlabelled), daemon=True)
    other.start()
    _copy_file(stdout, out, per_task, unlabelled)
    other.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
