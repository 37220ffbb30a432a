"""Static text used by the target printers (installed as `marlin_dsl.codegen`).

Holds the files that generated kernels and their checks include verbatim, such as target
headers; the printers themselves live in `marlin_dsl`.
"""
from __future__ import annotations

from importlib import resources


def read_codegen_file(name: str) -> str:
    """The text of a file shipped under codegen/."""
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
