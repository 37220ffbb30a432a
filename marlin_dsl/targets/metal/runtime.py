"""The Metal target above the compiler (`RUNTIME`, a `TargetRuntime`): kernels ship as a .metal
file and a generated launcher (`ship.py`), the CLI checks the shipped text on the CPU harness,
and layers launch kernels compiled on first use for `quantized_linear`: the same compiler path
as `marlin-dsl compile` (lower, passes, print, write the launcher), cached on disk by a hash of
the format and tool version, and launched through the generated launcher module. The benchmark
runner times a kernel through its generated launcher too (`ShippedKernel`). Layers run the
tuned kernels (`tuning.py`) on weights held in Metal's stream layout where the
format takes it, else the format's default kernel on its own layout. Any other kernel (the
activation sparsify kernels) launches through `kernel_launcher` (`launch.MetalLaunch`, the
GEMMs' `mx.fast.metal_kernel` path); with no Apple GPU here, its text is checked on the CPU
harness and the launch with a stand-in for `mx.fast.metal_kernel` (tests/test_metal_activation.py).
The tuned kernels are the weight stream up to 32 rows and the multistage pipeline above, both
on the stream layout (`tuning.py`)."""
from __future__ import annotations

import hashlib
import importlib.util
import tempfile
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import numpy as np

from ..._version import __version__
from ...compiler import CompiledGemm, compile_gemm
from ...errors import ScheduleError
from ...formats import Format
from ...formats.text import format_to_text
from ...ir.core import Kernel
from ...machine.metal import METAL, STREAM_LAYOUT
from ...machine.target import Target
from ...epilogue import Epilogue
from ...pipelines import applies_epilogue
from ...schedule import Gemm, Schedule, default_schedule, written_outputs
from ..base import LayerKernel, Shipped
from .cpu_harness import CompiledMetal, compile_metal, find_compiler
from .launch import MetalGemm, MetalLaunch, build_metal_kernel
from .printer import DIMS_NAME, print_metal
from .tuning import tuned_schedule as metal_tuned_schedule
from .ship import metal_text, write_metal_kernel


def _cache_root() -> Path:
    from ...cache import cache_root

    return cache_root()


@lru_cache(maxsize=None)
def metal_launcher(fmt: Format, activation: str, schedule: Schedule | None = None,
                   outputs: tuple[int, ...] = (), epilogue: tuple[str, ...] = ()) -> ModuleType:
    """The generated launcher module of (format, activation, schedule): the format's default
    kernel where `schedule` is None; with `outputs`, Y's columns as parts of those widths
    (`Gemm.outputs`: its `launch` returns them); with `epilogue`, the epilogue of those steps
    (`Epilogue.steps`)."""
    text = f"{__version__}\0{activation}\0{format_to_text(fmt)}"
    if schedule is not None:  # the default kernel's key (and cache folder) stays as it was
        text += f"\0{schedule!r}"
    if outputs:
        text += f"\0outputs={list(outputs)}"
    if epilogue:
        text += f"\0epilogue={list(epilogue)}"
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    name = f"{fmt.name}_{activation}_{key}" if schedule is None else f"{fmt.name}_{activation}_{schedule.name}_{key}"
    folder = _cache_root() / "metal" / name
    launcher = folder / name / f"{name}.py"
    if not launcher.exists():
        compiled = compile_gemm(Gemm(name, fmt, schedule or default_schedule(fmt), activation, outputs,
                                     Epilogue.from_steps(epilogue) if epilogue else None), METAL)
        write_metal_kernel(compiled, None, folder)
    return _load_module(f"marlin_dsl_metal_{name}", launcher)


def stream_schedule(fmt: Format, m: int, k: int | None = None, n: int | None = None) -> Schedule | None:
    """The tuned schedule on the stream layout (weight stream or multistage, by M), or None
    where the stream layout does not take the format (it keeps its own layout and the default
    kernel)."""
    try:
        return metal_tuned_schedule(fmt, m, k, n)
    except ScheduleError:
        return None


def _load_module(name: str, path: Path) -> ModuleType:
    """A generated launcher module, imported from its file."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


class ShippedKernel:
    """A compiled kernel launched through its generated launcher module (written to a temporary
    folder) as the benchmark runner times it (`TimedKernel`): the weights in the format's own
    layout, one call of the launcher per launch. Untested here: no Apple GPU on the machines
    this was written on."""

    def __init__(self, compiled: CompiledGemm) -> None:
        folder = Path(tempfile.mkdtemp(prefix="marlin_bench_"))
        files = write_metal_kernel(compiled, None, folder)
        self.module = _load_module(f"marlin_bench_{compiled.gemm.name}", files["launcher"])
        self.attrs = dict(compiled.kernel.attrs)
        #: kernels of one physical layout share weight copies (the format's own, or the stream's)
        self.weights_key = f"metal/{self.attrs.get('weight_layout') or 'linear'}"

    def weight_copies(self, packed: Any, count: int) -> list[list]:
        """`count` device copies of the packed arrays the launcher takes (in the kernel's
        physical layout), evaluated."""
        import mlx.core as mx

        from ...kernel_args import physical_arrays

        arrays = physical_arrays(self.attrs, packed)
        names = [nm for nm in self.module.INPUT_NAMES if nm not in ("x", DIMS_NAME)]
        copies = [[mx.array(np.ascontiguousarray(arrays[nm])) for nm in names] for _ in range(count)]
        mx.eval(*[a for c in copies for a in c])
        return copies

    def launch_timed(self, copies: list[list], x: Any, m: int, n: int, k: int,
                     slots: int) -> Callable[[int], Any]:
        """The launcher's call is the launch (it prepares nothing that could be hoisted)."""
        return self.timed_call(copies, x)

    def timed_call(self, copies: list[list], x: Any) -> Callable[[int], Any]:
        return lambda i: self.module.launch(x, *copies[i % len(copies)])


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
    kernel_launcher = MetalLaunch  # any kernel through mx.fast.metal_kernel (the activation kernels)
    skip_max_m = 0  # no block-skipping layout

    def skip_max_stored(self, k: int, n: int) -> float:
        """No skipping layout: never."""
        return 0.0

    def tuned_schedule(self, fmt: Format, m: int, k: int | None = None, n: int | None = None) -> Schedule:
        """The tuned schedule for m rows (`tuning.py`: the weight stream, above 32 rows the
        multistage pipeline); ScheduleError for a format the stream layout does not take."""
        return metal_tuned_schedule(fmt, m, k, n)

    def timed_kernel(self, compiled: CompiledGemm) -> ShippedKernel:
        """The kernel through its generated launcher, as users call it."""
        return ShippedKernel(compiled)

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
        """Metal's weight-stream layout where the format has one (the tuned kernels read it at
        every M), else the format's own layout (the default fused kernel)."""
        return STREAM_LAYOUT if stream_schedule(fmt, 1, k, n) is not None else None

    def layer_kernel(self, fmt: Format, activation: str, m: int, k: int, n: int,
                     outputs: tuple[int, ...] = (), skip: bool = False) -> LayerKernel:
        """The tuned kernel for m rows (weight stream or multistage) where the format takes the
        stream layout, else the format's default kernel, through its generated launcher module;
        with `outputs`, writing the parts where the schedule's pipeline does (the weight
        stream), else one y (a fused layer then splits it). Metal has no skipping layout
        (`skip` is never asked of it)."""
        if skip:
            raise ScheduleError("target 'metal' has no block-skipping weight layout (Target.skip_layout)")
        schedule = stream_schedule(fmt, m, k, n)
        module = metal_launcher(fmt, activation, schedule, written_outputs(schedule, outputs))
        gx, gy, gz = module.threadgroups(m, n, k)
        return LayerKernel(module.kernel(), module.NAME, tuple(module.INPUT_NAMES), tuple(module.OUTPUT_NAMES),
                           (m, n, k), (gx * module.THREADS, gy, gz), (module.THREADS, 1, 1),
                           None if schedule is None else STREAM_LAYOUT)

    def layer_epilogue(self, fmt: Format, activation: str, m: int, k: int, n: int,
                       steps: tuple[str, ...]) -> LayerKernel | None:
        """`layer_kernel`'s kernel with the epilogue `steps` where its pipeline applies one (the
        weight stream; the multistage pipeline but for a gate: its 8x8 C tile pairs no rows in a
        lane), else None."""
        schedule = stream_schedule(fmt, m, k, n)
        if schedule is None or not applies_epilogue(schedule.pipeline):
            return None
        try:
            module = metal_launcher(fmt, activation, schedule, (), tuple(steps))
        except ScheduleError:  # a schedule whose tiles the epilogue cannot pair (gate)
            return None
        gx, gy, gz = module.threadgroups(m, n, k)
        return LayerKernel(module.kernel(), module.NAME, tuple(module.INPUT_NAMES), tuple(module.OUTPUT_NAMES),
                           (m, n, k), (gx * module.THREADS, gy, gz), (module.THREADS, 1, 1), STREAM_LAYOUT)

    def layer_dequantize(self, fmt: Format, activation: str, m: int, k: int, n: int) -> LayerKernel | None:
        """None: Metal layers run their GEMM kernels at every row count."""
        return None


RUNTIME = MetalRuntime()
