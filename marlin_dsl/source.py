"""Capture where a declaration was made, so later errors can point at the spec line."""
from __future__ import annotations

import sys
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Iterator

from .errors import SourceLocation

_PACKAGE_DIR = str(Path(__file__).resolve().parent)


def caller_location() -> SourceLocation | None:
    """The first stack frame outside the marlin_dsl package: the user's declaration."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        # "<string>" frames are the __init__ methods that dataclasses generate.
        if filename != "<string>":
            resolved = filename if filename.startswith("<") else str(Path(filename).resolve())
            if not resolved.startswith(_PACKAGE_DIR):
                return SourceLocation(filename, frame.f_lineno)
        frame = frame.f_back
    return None


#: While a spec file runs (`spec.load_spec`), every Format and Gemm constructed, in order: a
#: declaration kept in a list, a dict or only in a loop variable is still a declaration.
_DECLARED: ContextVar[list | None] = ContextVar("marlin_dsl_declared", default=None)


def record_declaration(obj: object) -> None:
    """Note a validated Format or Gemm when a spec file is being loaded (else nothing)."""
    declared = _DECLARED.get()
    if declared is not None:
        declared.append(obj)


@contextmanager
def collecting_declarations() -> Iterator[list]:
    """The list that `record_declaration` fills while the block runs."""
    declared: list = []
    token = _DECLARED.set(declared)
    try:
        yield declared
    finally:
        _DECLARED.reset(token)


@contextmanager
def suspended_declarations() -> Iterator[None]:
    """Objects made in the block are not declarations (a helper's intermediate values)."""
    token = _DECLARED.set(None)
    try:
        yield
    finally:
        _DECLARED.reset(token)
