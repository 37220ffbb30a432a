"""What every command shares: the exit codes, plain-text tables, the status line, argument types."""
from __future__ import annotations

import argparse
import sys
import textwrap

from ..errors import EnvironmentUnavailable, MarlinDSLError, UsageError

EXIT_OK, EXIT_CHECK_FAILED, EXIT_USAGE, EXIT_INPUT, EXIT_ENVIRONMENT, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130

#: Tables are wrapped to this many columns (the widest column's cells wrap onto more lines).
TABLE_WIDTH = 100


def table(headers: list[str], rows: list[list[str]], width: int = TABLE_WIDTH) -> str:
    """A plain-text table no wider than `width`: while it is too wide, the widest column is
    narrowed and its cells wrap (at spaces and commas) onto continuation lines."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    # A column narrows no further than its longest word (words never break).
    floors = [max(len(word) for cell in [h, *(r[i] for r in rows)] for word in cell.split() or [""])
              for i, h in enumerate(headers)]
    while sum(widths) + 2 * (len(widths) - 1) > width:
        movable = [i for i in range(len(widths)) if widths[i] > floors[i]]
        if not movable:
            break
        widths[max(movable, key=widths.__getitem__)] -= 1  # the widest narrows first
    # Columns of unbreakable words (names, numbers) that still overflow: one space between them.
    sep = "  " if sum(widths) + 2 * (len(widths) - 1) <= width else " "

    def lines(cells: list[str]) -> list[str]:
        wrapped = [textwrap.wrap(c, w, break_on_hyphens=False, break_long_words=False) or [""]
                   for c, w in zip(cells, widths)]
        out = []
        for i in range(max(len(w) for w in wrapped)):
            out.append(sep.join((w[i] if i < len(w) else "").ljust(n) for w, n in zip(wrapped, widths)).rstrip())
        return out
    body = [line for r in rows for line in lines(r)]
    return "\n".join([*lines(headers), sep.join("-" * w for w in widths), *body])


def progress(message: str) -> None:
    """One overwritten status line on stderr while a long run works; nothing unless stderr
    is a terminal (logs and pipes stay clean). An empty message clears it."""
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K" + message[:TABLE_WIDTH])
        sys.stderr.flush()


def parse_shape(text: str) -> tuple[int, int]:
    """'KxN' (e.g. 4096x14336) -> (K, N)."""
    parts = text.lower().replace("*", "x").split("x")
    try:
        k, n = (int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a shape KxN such as 4096x14336, got {text!r}") from None
    if k < 1 or n < 1:
        raise argparse.ArgumentTypeError(f"K and N must be positive, got {text!r}")
    return k, n


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def exit_code(err: MarlinDSLError) -> int:
    """The documented exit code of one of our errors."""
    if isinstance(err, UsageError):
        return EXIT_USAGE
    if isinstance(err, EnvironmentUnavailable):
        return EXIT_ENVIRONMENT
    return EXIT_INPUT


__all__ = ["EXIT_CHECK_FAILED", "EXIT_ENVIRONMENT", "EXIT_INPUT", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE",
           "TABLE_WIDTH", "exit_code", "parse_shape", "positive", "progress", "table"]
