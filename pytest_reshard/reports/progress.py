"""Progress of long runs: one live line per scenario on a terminal, plain lines elsewhere.

The supervisor's watch loop already reads every event; after each batch it hands a ``Status``
(generation, world size, step, faults delivered) to ``Supervisor.on_status``. ``LiveLine`` shows
it: on a TTY one line rewritten in place (at most ``interval_s`` apart), and when output goes to
a file or a CI log a plain line only when something worth a line happens (a new generation, a
fault delivered), never a line per step.
"""
from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable
from typing import Any

from pytest_reshard.supervisor.watch import Status

__all__ = ["LiveLine", "Status"]


class LiveLine:
    """Shows ``Status`` updates and plain messages through a pytest terminal reporter.

    ``reporter`` needs ``write_line(text)`` and, on a TTY, ``rewrite(text, erase=True)``,
    ``ensure_newline()``, ``write(text, flush=)`` and ``flush()`` (pytest's ``TerminalReporter``).
    """

    def __init__(self, reporter: Any, *, tty: bool, interval_s: float = 0.2,
                 clock: Callable[[], float] = time.monotonic, prefix: str = "  reshard: ",
                 uncaptured: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext) -> None:
        self.reporter, self.tty, self.interval_s, self.clock = reporter, tty, interval_s, clock
        self.prefix = prefix
        self.uncaptured = uncaptured  # pytest captures fd 1 during a test: write around it
        self._shown: Status | None = None     # what the live line (TTY) or last plain line shows
        self._drawn_at = float("-inf")
        self._live = False                    # a live line is on screen, without its newline
        self._pending: Status | None = None   # the newest status, drawn or not (throttled)

    def status(self, st: Status) -> None:
        with self.uncaptured():
            self._status(st)

    def _status(self, st: Status) -> None:
        if self.tty:
            now = self.clock()
            important = self._shown is None or (st.gen, st.faults_fired) != (
                self._shown.gen, self._shown.faults_fired)
            if important or now - self._drawn_at >= self.interval_s:
                self._draw(st)
                self._drawn_at = now
            self._pending = st
        else:
            if self._shown is None or (st.gen, st.faults_fired, st.name) != (
                    self._shown.gen, self._shown.faults_fired, self._shown.name):
                self.reporter.write_line(self.prefix + st.line())
            self._shown = st

    def message(self, text: str) -> None:
        """A line that stays (a generation's outcome, a reference run); the live line follows it."""
        with self.uncaptured():
            self._message(text)

    def _message(self, text: str) -> None:
        if self.tty and self._live:
            self.reporter.rewrite(self._fit(self.prefix + text), erase=True)
            self.reporter.write("\n", flush=True)
            self._live = False
            latest = self._pending or self._shown
            if latest is not None:
                self._draw(latest)
        else:
            self.reporter.write_line(self.prefix + text)

    def finish(self) -> None:
        """End the scenario's live line: keep its last state on screen, newline after it."""
        with self.uncaptured():
            self._finish()

    def _finish(self) -> None:
        if self.tty and self._live:
            last = self._pending or self._shown
            if last is not None:
                self.reporter.rewrite(self._fit(self.prefix + last.line()), erase=True)
            self.reporter.write("\n", flush=True)
        self._live = False
        self._shown = None
        self._pending = None
        self._drawn_at = float("-inf")

    def _draw(self, st: Status) -> None:
        if not self._live:
            self.reporter.ensure_newline()
        self.reporter.rewrite(self._fit(self.prefix + st.line()), erase=True)
        self.reporter.flush()
        self._live = True
        self._shown = st

    @staticmethod
    def _fit(text: str) -> str:
        """A live line must not wrap, or ``\\r`` rewinds only its last part."""
        width = shutil.get_terminal_size().columns - 1
        return text if len(text) <= width else text[:max(width - 1, 10)] + "~"
