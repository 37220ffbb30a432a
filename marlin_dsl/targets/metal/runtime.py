"""The Metal target above the compiler (`RUNTIME`, a `TargetRuntime`): kernels ship as a .metal
file and a generated launcher (`ship.py`), the CLI checks the shipped text on the CPU harness,
and layers launch kernels compiled on first use for `quantized_linear`: the same compiler path
as `marlin-dsl compile` (lower, passes, print, write the launcher), cached on disk by a hash of
the format and tool version, and launched through the generated launcher module."""
from __future__ import annotations

import hashlib
import importlib.util
from functools import lru_cache
from pathlib import Path
from types import ModuleType

from ...compiler import CompiledGemm, compile_gemm
from ...formats import Format
from ...formats.text import format_to_text
from ...ir.core import Kernel
from ...schedule import Gemm, default_schedule
from ..base import LayerKernel, Shipped, Target
from .cpu_harness import CompiledMetal, compile_metal, find_compiler
from .description import METAL
from .launch import MetalGemm, build_metal_kernel
from .printer import print_metal
from .ship import metal_text, write_metal_kernel


def _cache_root() -> Path:
    from ...cache import cache_root

    return cache_root()


@lru_cache(maxsize=None)
def metal_launcher(fmt: Format, activation: str) -> ModuleType:
    """The generated launcher module of the default kernel for (format, activation)."""
    from ... import __version__

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


class CpuHarnessCheck:
    """The shipped .metal text compiled by g++ against codegen/metal_shim.h and run on the CPU
    (`cpu_harness.py`): the compile table's `.metal` column."""

    column = ".metal"
    note = ("the emitted .metal text compiled by g++ against codegen/metal_shim.h and run\n"
            "  by the CPU harness (threads with real barriers, collective simdgroup\n"
            "  matrices)")
    unavailable_note = "skipped: no C++ compiler (g++) on this machine"

    def available(self) -> bool:
        return find_compiler() is not None

    def build(self, compiled: CompiledGemm, shipped_text: str) -> CompiledMetal:
        return compile_metal(print_metal(compiled.kernel), shipped_text=shipped_text)


class MetalRuntime:
    """`TargetRuntime` of Metal."""

    target: Target = METAL
    native_check = CpuHarnessCheck()

    def ship(self, compiled: CompiledGemm, spec_path: Path | None, out_dir: Path | None) -> Shipped:
        """The .metal text MLX receives; with `out_dir`, the kernel's four files written under
        out_dir/<gemm>/ (`ship.write_metal_kernel`)."""
        if out_dir is None:
            return Shipped(metal_text(print_metal(compiled.kernel), compiled, spec_path))
        files = write_metal_kernel(compiled, spec_path, out_dir)
        return Shipped(files["metal"].read_text(), list(files.values()))

    def launcher(self, kernel: Kernel) -> MetalGemm:
        """The in-process launcher of a compiled GEMM kernel (the `Launcher` protocol)."""
        return build_metal_kernel(kernel)

    def layer_layout(self, fmt: Format, k: int, n: int) -> str | None:
        return None  # the Metal kernels read the format's own layout

    def layer_kernel(self, fmt: Format, activation: str, m: int, k: int, n: int) -> LayerKernel:
        """The format's default kernel, through its generated launcher module."""
        module = metal_launcher(fmt, activation)
        gx, gy, gz = module.threadgroups(m, n, k)
        return LayerKernel(module.kernel(), module.NAME, tuple(module.INPUT_NAMES), tuple(module.OUTPUT_NAMES),
                           (m, n, k), (gx * module.THREADS, gy, gz), (module.THREADS, 1, 1), None)


RUNTIME = MetalRuntime()
