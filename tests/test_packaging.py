"""The wheel carries every package and the top-level grammar/ and codegen/ folders."""
from __future__ import annotations

import tomllib
from pathlib import Path

import marlin_dsl.codegen
import marlin_dsl.grammar

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_is_listed_in_pyproject() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "marlin_dsl").rglob("__init__.py")}
    assert on_disk <= listed, f"packages missing from pyproject.toml: {sorted(on_disk - listed)}"
    mapping = config["tool"]["setuptools"]["package-dir"]
    assert mapping == {"marlin_dsl.grammar": "grammar", "marlin_dsl.codegen": "codegen"}


def test_grammar_and_codegen_are_importable_resources() -> None:
    assert "format" in marlin_dsl.grammar.read_grammar("format.lark")
    assert "kernel" in marlin_dsl.grammar.read_grammar("ir.lark")
    assert Path(marlin_dsl.codegen.__file__).resolve().parent == ROOT / "codegen"
