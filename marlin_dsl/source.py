"""Capture where a declaration was made, so later errors can point at the spec line."""
from __future__ import annotations

import sys
from pathlib import Path

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
