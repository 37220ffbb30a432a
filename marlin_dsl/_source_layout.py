"""Make `marlin_dsl.grammar` and `marlin_dsl.codegen` importable from a source checkout.

The design card keeps grammar/ and codegen/ at the top of the repository; the wheel installs
them inside the package (pyproject's package-dir). An editable install maps them too. When the
package is used straight from a checkout (PYTHONPATH=repo, as on the GPU machine), they sit
beside marlin_dsl/ instead: register them under their package names from there.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_SUBPACKAGES = ("grammar", "codegen")


def register_source_subpackages(package: str, package_dir: Path) -> None:
    for name in _SUBPACKAGES:
        full = f"{package}.{name}"
        if full in sys.modules or importlib.util.find_spec(full) is not None:
            continue
        folder = package_dir.parent / name
        init = folder / "__init__.py"
        if not init.is_file():
            continue
        spec = importlib.util.spec_from_file_location(full, init, submodule_search_locations=[str(folder)])
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[full] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        setattr(sys.modules[package], name, module)
