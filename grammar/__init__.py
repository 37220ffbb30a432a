"""Lark grammars of marlin-dsl's textual forms (installed as `marlin_dsl.grammar`)."""
from __future__ import annotations

from importlib import resources


def read_grammar(name: str) -> str:
    """The text of grammar `name` (e.g. "format.lark") shipped with the package."""
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
