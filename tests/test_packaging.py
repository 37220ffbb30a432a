"""The wheel carries every package and the top-level grammar/ and codegen/ folders."""
from __future__ import annotations

import fnmatch
import re
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


def _quoted_includes(header: Path) -> set[str]:
    """The headers `header` names in `#include "..."`, and theirs (codegen/ only)."""
    seen: set[str] = set()
    todo = [header.name]
    while todo:
        name = todo.pop()
        if name in seen or not (header.parent / name).exists():
            continue
        seen.add(name)
        todo += re.findall(r'^\s*#\s*include\s+"([^"]+)"', (header.parent / name).read_text(), re.M)
    return seen


def test_harness_headers_are_shipped_and_keyed() -> None:
    """Every header a CPU harness's shim includes (the runtime they share among them) is in
    codegen/, installed by package-data, and in that harness's cache key (SHIM_FILES)."""
    from marlin_dsl.targets.cuda import cpu_harness as cuda_harness
    from marlin_dsl.targets.metal import cpu_harness as metal_harness

    codegen = ROOT / "codegen"
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "marlin_dsl.codegen"]
    for harness, entries in ((metal_harness, ["metal_shim.h"]), (cuda_harness, ["cuda_shim.h", "cuda_shim_ptx.h"])):
        needed = set().union(*(_quoted_includes(codegen / e) for e in entries))
        assert "shim_runtime.h" in needed
        assert needed == set(harness.SHIM_FILES), harness.__name__
        for name in needed:
            assert (codegen / name).is_file() and any(fnmatch.fnmatch(name, p) for p in patterns), name
