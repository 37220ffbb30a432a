"""Errors raised by marlin-dsl.

Every user-facing error is a `ValueError` subclass (so callers can catch the usual
exception for bad input) and names *where* the problem is: the argument, the
index or shape, and, for declarations, the spec file and line that made them.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceLocation:
    """Where a declaration was written: a spec file and a line in it."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


class MarlinDSLError(ValueError):
    """Base class of marlin-dsl's errors; optionally carries a source location."""

    def __init__(self, message: str, location: SourceLocation | None = None) -> None:
        self.message = message
        self.location = location
        super().__init__(f"{location}: {message}" if location else message)


class FormatError(MarlinDSLError):
    """A format description is inconsistent (raised where the format is declared)."""


class ShapeError(MarlinDSLError):
    """An array argument has the wrong shape, rank or dtype for its format."""


class ValueRangeError(MarlinDSLError):
    """An array holds values that its format cannot take (NaN, Inf, invalid metadata...)."""


class SpecError(MarlinDSLError):
    """A spec file cannot be loaded or declares nothing usable."""


class ScheduleError(MarlinDSLError):
    """A schedule cannot work for its format or target (raised at the schedule's spec line)."""


class UsageError(MarlinDSLError):
    """A command-line option or API argument names something that does not exist (a pass,
    a dump stage, an output path that is a file)."""


class EnvironmentUnavailable(MarlinDSLError):
    """This machine lacks what the command needs (a GPU backend, a compiler)."""


class CompileError(MarlinDSLError):
    """A kernel exceeds a target limit (threadgroup memory, threads) or cannot be lowered."""
