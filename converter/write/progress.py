"""A one-line progress bar on stderr for long writes: items and bytes done, rate, time left.

Never writes to stdout (JSON output is unaffected), and nothing at all when stderr is not a
terminal, when ``--quiet`` is in force, or when the work ends within ``delay`` seconds.
"""

from __future__ import annotations

import os
import sys
import time

from converter.runtime import current

__all__ = ["Progress"]


def _fmt_time(s: float) -> str:
    s = int(max(0, s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Progress:
    """A one-line progress bar on stderr (:mod:`rich.progress`): items and bytes done, rate, time left.

    Silent when the options say quiet or stderr is not a terminal (set ``QCKPT_PROGRESS=1`` to
    force it; on a stream that is not a terminal the last line alone is printed, at the end);
    appears only once the work has run longer than ``delay`` seconds, so quick commands print
    nothing. Never writes to stdout (JSON output is unaffected). Redrawn by the calls to
    :meth:`advance`, not by a thread of its own (worker processes are forked while it is shown).

    Parameters
    ----------
    label : str
    total_items, total_bytes : int
        The work: tensors, and their bytes (the bar's measure).
    delay : float
        Seconds before the bar first appears.
    stream : text stream, optional
        Default ``sys.stderr``.
    enabled : bool, optional
        Default: not quiet, and ``stream`` is a terminal (or ``QCKPT_PROGRESS=1``).
    """

    def __init__(self, label: str, total_items: int, total_bytes: int, *, delay: float = 0.5,
                 stream=None, enabled: bool | None = None) -> None:
        self.label, self.total_items, self.total_bytes = label, int(total_items), int(total_bytes)
        self.items = self.bytes = 0
        self.stream = stream or sys.stderr
        if enabled is None:
            force = os.environ.get("QCKPT_PROGRESS")
            enabled = not current().quiet and (force == "1" or (force != "0" and self.stream.isatty()))
        self.enabled = enabled
        self.t0 = time.monotonic()
        self.delay = delay
        self._last = 0.0
        self._bar = None
        self._task = None

    def advance(self, items: int = 0, nbytes: int = 0) -> None:
        """Count ``items`` tensors and ``nbytes`` bytes more as done (redraws at most every 0.1 s)."""
        self.items += items
        self.bytes += nbytes
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.t0 < self.delay or (now - self._last < 0.1 and self.items < self.total_items):
            return
        self._last = now
        self._draw(now)

    def _line(self, now: float) -> str:
        el = max(now - self.t0, 1e-9)
        rate = self.bytes / el
        left = (self.total_bytes - self.bytes) / rate if rate > 0 else 0
        return (f"{self.items}/{self.total_items} tensors {self.bytes / 1e9:.2f}/{self.total_bytes / 1e9:.2f} GB "
                f"{rate / 1e9:.2f} GB/s elapsed {_fmt_time(el)} left {_fmt_time(left)}")

    def _draw(self, now: float) -> None:
        if self._bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, Progress as Bar, TextColumn
            self._bar = Bar(TextColumn("{task.description}"), BarColumn(bar_width=24),
                            TextColumn("{task.fields[line]}"),
                            console=Console(file=self.stream), auto_refresh=False,
                            redirect_stdout=False, redirect_stderr=False)  # sys.stdout stays as it is
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=max(1, self.total_bytes or self.total_items), line="")
        done = self.bytes if self.total_bytes else self.items
        self._bar.update(self._task, completed=done, line=self._line(now))
        self._bar.refresh()

    def close(self) -> None:
        """Draw the final state and end the line (when the bar was shown or the delay has passed)."""
        if self.enabled and (self._bar is not None or time.monotonic() - self.t0 >= self.delay):
            self._draw(time.monotonic())
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
