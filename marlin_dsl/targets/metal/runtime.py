"""Metal kernels compiled on first use for `quantized_linear`: the same compiler path as
`marlin-dsl compile` (lower, passes, print, write the launcher), cached on disk by a hash of
the format and tool version, and launched through the generated launcher module."""
from __future__ import annotations

import hashlib
import importlib.util
from functools import lru_cache
from pathlib import Path
from types import ModuleType

from ..formats import Format
from ..formats.text import format_to_text
from ..schedule import Gemm, default_schedule
from ..targets import METAL


def _cache_root() -> Path:
    from ..cache import cache_root

    return cache_root()


@lru_cache(maxsize=None)
def metal_launcher(fmt: Format, activation: str) -> ModuleType:
    """The generated launcher module of the default kernel for (format, activation)."""
    from .. import __version__
    from ..compiler import compile_gemm
    from ..emit import write_metal_kernel

    key = hashlib.sha256(f"{__version__}\0{activation}\0{format_to_text(fmt)}".encode()).hexdigest()[:16]
    name = f"{fmt.name}_{activation}_{key}"
    folder = _cache_root() / "metal" / name
    launcher = folder / name / f"{name}.py"
    if not launcher.exists():
        compiled = compile_gemm(Gemm(name, fmt, default_schedule(fmt), activation), METAL)
        write_metal_kernel(compiled, None, folder)
    spec = importlib.util.spec_from_file_location(f"marlin_dsl_metal_{name}", launcher)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module
