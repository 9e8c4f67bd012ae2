"""Rank 0's progress display: a tqdm bar on a terminal, plain lines at an interval anywhere else.

A bar redraws itself with carriage returns, which a log file or CI output keeps as one unreadable
line; without a terminal the progress is a line such as
``step 120/300 (40%) | loss 2.104 | 31,200 tokens/s | 12s elapsed, ~18s left`` every
``interval`` seconds, and one for the last step.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm


class Progress:
    """Show steps ``initial``..``total`` on ``stream`` (default stderr); ``enabled=False`` shows nothing."""

    def __init__(self, total: int, initial: int, enabled: bool, interval: float, stream: TextIO | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.first, self.interval, self.enabled = total, initial, interval, enabled
        is_tty = getattr(self.stream, "isatty", lambda: False)()
        self.bar = (tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, file=self.stream)
                    if enabled and is_tty else None)
        self.start = self.last_line = time.monotonic()
        self.state: tuple[int, float, float] | None = None
        self.shown = True

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        """Record that ``step`` finished with training loss ``loss`` at ``tokens_per_s``."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens_per_s:,.0f}", refresh=False)
            self.bar.update(1)
            return
        self.state, self.shown = (step, loss, tokens_per_s), False
        if step == self.total or time.monotonic() - self.last_line >= self.interval:
            self._line()

    def close(self) -> None:
        """Close the bar, or write the line of the last step if it is not shown yet."""
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and not self.shown:
            self._line()

    def _line(self) -> None:
        step, loss, rate = self.state
        now = time.monotonic()
        elapsed, done = now - self.start, step - self.first
        left = f", ~{_duration(elapsed / done * (self.total - step))} left" if done and step < self.total else ""
        pct = 100 * step // self.total if self.total else 100
        print(f"step {step}/{self.total} ({pct}%) | loss {loss:.3f} | {rate:,.0f} tokens/s | "
              f"{_duration(elapsed)} elapsed{left}", file=self.stream, flush=True)
        self.last_line, self.shown = now, True


def _duration(seconds: float) -> str:
    """'42s', '3m05s', '1h02m'."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
