"""Progress of a conversion, one step per linear layer (converted, fused or skipped alike, so
the count reaches the total).

On a terminal: one bar redrawn in place with `\\r`. Anywhere else (a log file, a pipe, CI) a
`\\r` leaves one long line of overdrawn bars, so each layer gets a plain line instead. Either
way the output ends on a fresh line, also when the conversion fails, so that an error message
starts a line of its own instead of being glued to the bar.
"""
from __future__ import annotations

import time
from typing import TextIO


def is_terminal(out: TextIO) -> bool:
    try:
        return bool(out.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Progress:
    """Steps of a conversion of `total` layers written to `out` (None: nothing)."""

    WIDTH = 30

    def __init__(self, out: TextIO | None, total: int) -> None:
        self.out, self.total = out, total
        self.terminal = out is not None and is_terminal(out)
        self.start = time.perf_counter()
        self.done = 0
        self._open = False  # a bar is on the line, without its newline

    def step(self, path: str, what: str) -> None:
        """One more layer done: `path` and what happened to it ('fp4', 'skipped: ...')."""
        self.done += 1
        if self.out is None:
            return
        seconds = time.perf_counter() - self.start
        if self.terminal:
            filled = self.WIDTH * self.done // max(self.total, 1)
            bar = "#" * filled + "." * (self.WIDTH - filled)
            self.out.write(f"\r[{bar}] {self.done}/{self.total} {seconds:6.1f}s {path[-40:]:<40}")
            self._open = True
        else:
            self.out.write(f"[{self.done}/{self.total}] {seconds:.1f}s {path}: {what}\n")
        self.out.flush()

    def close(self) -> None:
        """End the bar's line (nothing to do for plain lines)."""
        if self._open and self.out is not None:
            self.out.write("\n")
            self.out.flush()
            self._open = False


__all__ = ["Progress", "is_terminal"]
