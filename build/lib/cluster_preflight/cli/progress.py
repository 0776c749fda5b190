# -*- coding: utf-8 -*-
"""Live progress of a run from ansible-runner's events: per stage (task), nodes done of the total.

Feed every event to a :class:`Progress` (it is an ``event_handler``-style callable that returns
``None``). On a terminal it keeps one line up to date (and ticks the seconds while a stage waits);
otherwise it prints one plain line per play and per finished stage, which reads well in a log.

The total of a stage is the hosts of its play: every host that started a task of the play
(``runner_on_start``; the first task of a play starts on every targeted host at once, ``forks``
being larger than the cluster). A task that started on one host only while its play has more is a
``run_once`` controller step, and counts 1.
"""

from __future__ import annotations

import threading
import time

DONE_EVENTS = ("runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable")
TASK_EVENTS = ("playbook_on_task_start", "playbook_on_handler_task_start")


class _Stage:
    def __init__(self, name, started_at):
        self.name = name
        self.started_at = started_at
        self.started = set()
        self.done = set()
        self.failed = set()
        self.unreachable = set()


class Progress:
    """Render runner events as progress on ``stream``.

    ``tty`` True: one line rewritten in place (``\\r``, clear to the end of line), cut to ``width``;
    False: plain lines. ``clock`` is injectable for tests.
    """

    def __init__(self, stream, tty=False, width=100, clock=time.monotonic):
        self.stream = stream
        self.tty = tty
        self.width = max(int(width or 100), 20)
        self.clock = clock
        self.began = clock()
        self.play_hosts = set()
        self.stage = None
        self.shown = False  # a TTY line is on screen
        self.lock = threading.Lock()
        self._ticker = None
        self._stop = threading.Event()

    # The stage's total: see the module docstring.
    def total(self, stage=None):
        stage = stage or self.stage
        if stage is None:
            return 0
        if len(stage.started) == 1 and len(self.play_hosts) > 1:
            return max(1, len(stage.done))
        return max(len(self.play_hosts), len(stage.started), len(stage.done))

    def line(self, stage=None, final=False):
        """The text of a stage's line (``final``: as it is printed when the stage ends)."""
        stage = stage or self.stage
        now = self.clock()
        extra = []
        if stage.failed:
            extra.append("%d failed" % len(stage.failed))
        if stage.unreachable:
            extra.append("%d unreachable" % len(stage.unreachable))
        counts = "%d/%s nodes" % (len(stage.done), self.total(stage) or "?")  # ?: no host has started yet
        if extra:
            counts += " (%s)" % ", ".join(extra)
        verb = "done in" if final else "for"
        return "[%6.1fs] %s %s %.1fs: %s" % (now - self.began, counts, verb, now - stage.started_at, stage.name)

    def __call__(self, event):
        with self.lock:
            self._handle(event)

    def _handle(self, event):
        kind = event.get("event")
        data = event.get("event_data") or {}
        if kind == "playbook_on_play_start":
            self._finish()
            self.play_hosts = set()
            if not self.tty:
                self._print("[%6.1fs] play: %s" % (self.clock() - self.began, data.get("name") or data.get("pattern")))
        elif kind in TASK_EVENTS:
            self._finish()
            self.stage = _Stage(str(data.get("task") or data.get("task_action") or "task").strip(), self.clock())
            self._draw()
        elif kind == "runner_on_start" and self.stage is not None and data.get("host"):
            self.stage.started.add(data["host"])
            self.play_hosts.add(data["host"])
            self._draw()
        elif kind in DONE_EVENTS and self.stage is not None and data.get("host"):
            host = data["host"]
            self.stage.done.add(host)
            self.play_hosts.add(host)
            if kind == "runner_on_failed":
                self.stage.failed.add(host)
            elif kind == "runner_on_unreachable":
                self.stage.unreachable.add(host)
            self._draw()
        elif kind == "playbook_on_stats":
            self._finish()

    def _finish(self):
        if self.stage is None:
            return
        text = self.line(final=True)
        self.stage = None
        if self.tty:
            self._clear()
        else:
            self._print(text)

    def _draw(self):
        if not self.tty or self.stage is None:
            return
        text = self.line()
        if len(text) > self.width - 1:
            text = text[:self.width - 2] + "…"
        self.stream.write("\r\x1b[K" + text)
        self.stream.flush()
        self.shown = True

    def _clear(self):
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False

    def _print(self, text):
        self.stream.write(text + "\n")
        self.stream.flush()

    def tick(self):
        """Redraw the TTY line (the elapsed seconds move while a stage waits for its nodes)."""
        with self.lock:
            self._draw()

    def start(self, interval=1.0):
        """On a TTY, tick every ``interval`` seconds in a daemon thread until :meth:`close`."""
        if not self.tty or self._ticker is not None:
            return self

        def _run():
            while not self._stop.wait(interval):
                self.tick()

        self._ticker = threading.Thread(target=_run, name="preflight-progress", daemon=True)
        self._ticker.start()
        return self

    def close(self):
        """Stop ticking and leave the terminal line clean."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=2)
            self._ticker = None
        with self.lock:
            self._finish()
            self._clear()
