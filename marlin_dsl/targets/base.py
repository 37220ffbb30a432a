"""What a target offers above the compiler: the registry of printers (`register`, `emit`) and
the protocols of its runtime (`TargetRuntime`: shipping, native checks, layer kernels, launchers,
timed kernels).

The description of a target (`Target`, its lane tables, limits and the `TARGETS` registry of
descriptions) is data at the bottom of the stack, `marlin_dsl/machine/`: the lowering, the
passes and the interpreter read it there without loading any printer. Each target's folder here
(`targets/metal/`, `targets/cuda/`) holds what makes it run: printer, launcher, runtime, tuned
tile tables.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

from ..errors import CompileError
from ..machine.target import Target, register_target


# ----- printers ---------------------------------------------------------------------------------


class Source(Protocol):
    """What a printer returns: the kernel's name and its complete text."""

    name: str

    def full_source(self) -> str: ...


Printer = Callable[[Any], Source]


@runtime_checkable
class Launcher(Protocol):
    """What a target's launcher offers: made from a compiled kernel (`TargetRuntime.launcher`),
    called with the packed weights and the activations x [M, K], returning y [M, N] as an MLX
    array (`targets/cuda/launch.py`, `targets/metal/launch.py`)."""

    def __call__(self, weights: Any, x: Any) -> Any: ...


_PRINTERS: dict[str, Printer] = {}


def register(target: Target, printer: Printer) -> Target:
    """Add a target's printer to the registry (once per name), and its description to
    `TARGETS` where `marlin_dsl.machine` has not (the same object: a no-op)."""
    register_target(target)
    _PRINTERS[target.name] = printer
    return target


def emit(kernel: Any, target: Target) -> Source:
    """The kernel printed for `target` (its default printing: what the tests pin)."""
    printer = _PRINTERS.get(target.name)
    if printer is None:
        raise CompileError(f"no printer for target {target.name!r}; known: {sorted(_PRINTERS)}")
    return printer(kernel)


# ----- runtimes: what the layers and the CLI use of a target ------------------------------------


@dataclass(frozen=True)
class Shipped:
    """What writing a compiled kernel out gave: the text that ships (None where the target
    ships no text without an output folder) and the files written."""

    text: str | None
    files: list = field(default_factory=list)


class NativeKernel(Protocol):
    """The shipped text of one kernel built for a native executor off the target hardware."""

    def run(self, buffers: dict, scalars: dict, seed: int = 0) -> dict: ...


class NativeCheck(Protocol):
    """A check of the exact shipped text (e.g. the Metal CPU harness) beside the interpreter."""

    #: the compile table's column for its result
    column: str
    #: the legend line: what the column checks, and what it says where it cannot run
    note: str
    unavailable_note: str

    def available(self) -> bool: ...

    def build(self, compiled: Any, shipped_text: str | None) -> NativeKernel | None:
        """The kernel's shipped text (None where the target ships none in memory) built for the
        check; None where the check does not apply to this kernel (the table shows "-")."""
        ...


@dataclass(frozen=True)
class LayerKernel:
    """One compiled GEMM ready for `layers.dispatch` to bind to an activation shape: the MLX
    kernel object, its parameter names, the `dims` input, grid and threadgroup (in MLX's
    thread units), and the weight layout it reads (None: the format's own)."""

    kernel: Any
    name: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    dims: tuple[int, ...]
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    weight_layout: str | None


class KernelLaunch(Protocol):
    """Any printed kernel bound to MLX (`TargetRuntime.kernel_launcher`; not only GEMMs: the
    activation sparsify and sparse-GEMM kernels): called with the input arrays by name, the
    output shapes by name, the launch scalars and the fill value of the outputs (None: left
    uninitialised), it returns the outputs by name."""

    def __call__(self, arrays: dict, out_shapes: dict, scalars: dict,
                 init_value: float | None = None) -> dict: ...


class TimedKernel(Protocol):
    """A compiled GEMM as the benchmark runner times it (`TargetRuntime.timed_kernel`): device
    copies of the packed weight in the kernel's physical layout, a launch whose inputs are all
    prepared beforehand (what the kernel time measures) and the public call path (what the
    end-to-end time measures). Both return launch(i), which runs on weight copy i."""

    #: kernels with the same key read the same weight copies (one physical layout)
    weights_key: str

    def weight_copies(self, packed: Any, count: int) -> list: ...

    def launch_timed(self, copies: list, x: Any, m: int, n: int, k: int,
                     slots: int) -> Callable[[int], Any]: ...

    def timed_call(self, copies: list, x: Any) -> Callable[[int], Any]: ...


class TargetRuntime(Protocol):
    """A target above the compiler: shipping, native checks, layer launches, launches of any
    kernel, its tuned schedules and what the benchmark runner times. Each target package has one
    (`targets/<name>/runtime.py`, `RUNTIME`); `targets.runtimes` lists them."""

    target: Target
    #: a check of the shipped text beside the interpreter, or None
    native_check: NativeCheck | None
    #: rows of activations its block-skipping kernels serve (`layer_kernel(..., skip=True)`);
    #: 0 where the target has no skipping layout
    skip_max_m: int
    #: binds any kernel to MLX, kernel_launcher(kernel, inout_inputs) -> KernelLaunch (the
    #: readwrite buffers in inout_inputs are passed as inputs); None where that is not wired
    kernel_launcher: Callable[[Any, tuple[str, ...]], KernelLaunch] | None

    def tuned_schedule(self, fmt: Any, m: int, k: int | None = None, n: int | None = None) -> Any:
        """The target's tuned weight-stream schedule for m rows of activations and a [K, N]
        weight (ScheduleError where the target or the format has none)."""
        ...

    def timed_kernel(self, compiled: Any) -> TimedKernel: ...

    def ship(self, compiled: Any, spec_path: Any, out_dir: Any) -> Shipped: ...

    def launcher(self, kernel: Any) -> Launcher: ...

    def layer_layout(self, fmt: Any, k: int, n: int) -> str | None: ...

    def layer_dequantize(self, fmt: Any, activation: str, m: int, k: int, n: int) -> LayerKernel | None:
        """The kernel decoding a [K, N] weight to W^T [N, K] (activation type) where a layer of
        m rows multiplies faster through it and the fp16/bf16 GEMM, else None."""
        ...

    def skip_max_stored(self, k: int, n: int) -> float:
        """The largest share of a [K, N] weight's vectors stored at which a layer runs the
        block-skipping kernels (measured on the target); 0 where it has none."""
        ...

    def layer_epilogue(self, fmt: Any, activation: str, m: int, k: int, n: int,
                       steps: tuple[str, ...]) -> LayerKernel | None:
        """`layer_kernel`'s kernel for m rows with the epilogue `steps` (marlin_dsl/epilogue.py)
        where that kernel's pipeline applies epilogues, else None (the layer composes the
        epilogue after the plain kernel)."""
        ...

    def layer_kernel(self, fmt: Any, activation: str, m: int, k: int, n: int,
                     outputs: tuple[int, ...] = (), skip: bool = False) -> LayerKernel:
        """The layer's kernel for m rows; with `outputs` (part widths adding up to n) it may
        write Y's columns as those parts (output names y0, y1, ...: `Gemm.outputs`) or, where
        its kernel for m rows cannot, one y (the layer then splits). `skip`: the kernel that
        reads the target's block-skipping layout (`Target.skip_layout`; targets without one
        are never asked)."""
        ...
