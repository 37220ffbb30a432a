"""The CUDA target above the compiler (`RUNTIME`, a `TargetRuntime`): what `marlin-dsl compile
-o` writes for a kernel (the IR, a complete .cu and a manifest a launcher can rebuild the
`CudaSource` from), and kernels compiled on first use for `quantized_linear` (MLX's CUDA
backend), lowered, passed and printed as `marlin-dsl compile` does, and launched through
`build_cuda_kernel`. The runtime also binds any kernel to MLX (`CudaLaunch`: the activation
kernels), names the tuned schedules and hands the benchmark runner its launchers.

The schedule follows the rows of x: the tuned schedule for that many rows
(`tuning.tuned_schedule`) where the format has a weight-stream layout on CUDA, else the
format's default schedule. Kernels are cached per (format, activation, schedule) for the process;
the weights' CUDA layout is made once per packed weight (`cuda_weights`)."""
from __future__ import annotations

import json
import weakref
from functools import lru_cache
from pathlib import Path

import numpy as np

from ...compiler import CompiledGemm, compile_dequantize, compile_gemm
from ...errors import ScheduleError
from ...formats import Format, PackedWeights
from ...ir.core import Kernel
from ...ir.text import print_kernel
from ...layouts.weight_stream import LAYOUT_NAME, stream_layout
from ...machine.cuda import CUDA
from ...machine.target import Target
from ...epilogue import Epilogue
from ...pipelines import applies_epilogue
from ...schedule import Gemm, Schedule, default_schedule, written_outputs
from ..base import LayerKernel, Shipped
from .cpu_harness import CompiledCudaCPU, CudaCPUError, compile_cuda_cpu, find_compiler, refuse_unsupported
from .launch import CudaGemm, CudaLaunch, CudaWeights, build_cuda_kernel, gemm_inout_inputs
from .launch_precompiled import device_arch
from .printer import print_cuda
from ...lowering.dequantize import dequantize_supported
from .tuning import SKIP_MAX_M, dequantize_min_m, max_stored, skip_schedule, tuned_schedule


def cuda_schedule(fmt: Format, m: int, k: int | None = None, n: int | None = None) -> Schedule:
    """The schedule `quantized_linear` runs `fmt` with for m rows of activations (and a [K, N]
    weight) on CUDA."""
    try:
        return tuned_schedule(fmt, m, CUDA, k, n, warpgroup=device_has_warpgroup())
    except ScheduleError:  # no weight-stream layout for this format (4:8 of pairs)
        return default_schedule(fmt)


@lru_cache(maxsize=1)
def device_has_warpgroup() -> bool:
    """MLX's GPU is of the architecture with CUDA's warpgroup MMA (sm_90a code runs on cc 9.0);
    False without one (or without MLX's CUDA backend)."""
    want = CUDA.warpgroup_arch
    if want is None:
        return False
    try:
        return device_arch() == want.rstrip("af")
    except Exception:  # noqa: BLE001 - no GPU, no CUDA backend: the plain schedules
        return False


@lru_cache(maxsize=None)
def cuda_gemm(fmt: Format, activation: str, schedule: Schedule | None = None,
              outputs: tuple[int, ...] = (), epilogue: tuple[str, ...] = ()) -> CudaGemm:
    """The compiled kernel of (format, activation, schedule), Y's columns as parts of
    `outputs` widths where given (`Gemm.outputs`), with the epilogue of `epilogue` steps
    (`Epilogue.steps`); cached."""
    schedule = schedule or default_schedule(fmt)
    parts = "_parts" + "x".join(map(str, outputs)) if outputs else ""
    parts += "_" + "_".join(epilogue) if epilogue else ""
    gemm = Gemm(f"{fmt.name}_{activation}_{schedule.name}{parts}", fmt, schedule, activation, outputs,
                Epilogue.from_steps(epilogue) if epilogue else None)
    return build_cuda_kernel(compile_gemm(gemm, CUDA).kernel)


@lru_cache(maxsize=None)
def cuda_dequantize(fmt: Format, activation: str) -> CudaGemm:
    """The compiled dequantize kernel of (format, activation) (`compile_dequantize`); cached."""
    return build_cuda_kernel(compile_dequantize(fmt, activation, CUDA).kernel)


def layer_binding(kernel: CudaGemm, m: int, k: int, n: int) -> LayerKernel:
    """A compiled kernel bound to one (M, K, N) for `layers.dispatch`: the MLX kernel, its
    parameter names, the dims input, grid and threadgroup, and the layout it reads."""
    source = kernel.source
    scalars = {"M": m, "N": n, "K": k}
    grid, threadgroup = source.launch_dims(scalars)
    return LayerKernel(kernel.kernel, source.name, tuple(source.input_names), tuple(source.output_names),
                       tuple(int(v) for v in source.dims(scalars)), grid, threadgroup,
                       source.attrs.get("weight_layout"))


#: id(packed) -> (weak reference to it, {layout: CudaWeights}): one conversion per weight.
_WEIGHTS: dict[int, tuple[weakref.ref, dict]] = {}


def cuda_weights(gemm: CudaGemm, packed: PackedWeights) -> CudaWeights:
    """`packed` (numpy or MLX arrays) as the flat MLX arrays `gemm` reads, in its layout."""
    import mlx.core as mx

    layout = gemm.source.attrs.get("weight_layout")
    if layout is None:  # the format's own layout: no copy
        flat = {n: a.reshape(-1) for n, a in packed.arrays.items()}
        return CudaWeights(flat, tuple(int(v) for v in packed.shape), packed.format.name)
    key = id(packed)
    entry = _WEIGHTS.get(key)
    if entry is None or entry[0]() is not packed:
        entry = _WEIGHTS[key] = (weakref.ref(packed, lambda _, k=key: _WEIGHTS.pop(k, None)), {})
    if layout not in entry[1]:
        host = PackedWeights(packed.format, packed.shape, {n: np.array(a) for n, a in packed.arrays.items()},
                             packed.layout)
        weights = gemm.weights(host)
        mx.eval(*weights.arrays.values())
        entry[1][layout] = weights
    return entry[1][layout]


def write_cuda_kernel(compiled: CompiledGemm, out_dir: Path) -> list[Path]:
    """out_dir/<gemm>/: the kernel IR, a complete translation unit (prelude, tables, kernel with
    MLX's parameter list: what nvcc compiles in the tests and what mx.fast.cuda_kernel receives
    in parts) and manifest.json, everything a launcher needs: CudaSource.from_json(
    json.load(...)["source"]) gives the source back; the weights must be in the kernel's
    physical layout (weight_layout)."""
    name, target = compiled.gemm.name, compiled.target.name
    folder = out_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.{target}.ir").write_text(print_kernel(compiled.kernel))
    src = print_cuda(compiled.kernel)
    (folder / f"{name}.cu").write_text(src.full_source())
    layout = src.attrs.get("weight_layout", "linear")
    schedule = compiled.gemm.schedule
    (folder / "manifest.json").write_text(json.dumps({
        "kernel": name, "target": target, "weight_layout": layout,
        # the schedule's name and the targets it declares (None: every target)
        "schedule": {"name": schedule.name, "targets": None if schedule.targets is None else list(schedule.targets)},
        "weights": "as marlin_dsl.pack(format, w) gives them" if layout == "linear" else
                   "marlin_dsl.kernel_args.to_kernel_layout(source['attrs'], marlin_dsl.pack(format, w))",
        "source": src.to_json()}, indent=1, sort_keys=True) + "\n")
    return [folder / f"{name}.{target}.ir", folder / f"{name}.cu", folder / "manifest.json"]


class CpuHarnessCheck:
    """The printed CUDA compiled by g++ against codegen/cuda_shim.h and run on the CPU
    (`cpu_harness.py`): the compile table's `.cu` column. The sparse warpgroup kernels (the
    sparse wgmma) are not emulated: their column reads "-"."""

    column = ".cu"
    note = ("the printed .cu text compiled by g++ against codegen/cuda_shim.h and run by the\n"
            "  CUDA CPU harness (threads with real barriers, warp-collective mma.sync / mma.sp\n"
            "  and the dense wgmma from the PTX ISA's rules; '-': the sparse wgmma, not\n"
            "  emulated)")
    unavailable_note = "skipped: no C++ compiler (g++) on this machine"

    def available(self) -> bool:
        return find_compiler() is not None

    def build(self, compiled: CompiledGemm, shipped_text: str | None) -> CompiledCudaCPU | None:
        source = print_cuda(compiled.kernel, inout_inputs=gemm_inout_inputs(compiled.kernel))
        try:
            refuse_unsupported(source)
        except CudaCPUError:
            return None
        return compile_cuda_cpu(source)


class CudaRuntime:
    """`TargetRuntime` of CUDA."""

    target: Target = CUDA
    native_check = CpuHarnessCheck()  # also nvcc compiles (tests) and the GPU (bench/)
    kernel_launcher = CudaLaunch  # any kernel through mx.fast.cuda_kernel (or precompiled: launch.mlx_kernel)
    skip_max_m = SKIP_MAX_M  # the decode's rows (tuning.skip_schedule)

    def skip_max_stored(self, k: int, n: int) -> float:
        """The largest stored share at which a layer skips (`tuning.max_stored`)."""
        return max_stored(k, n)

    def tuned_schedule(self, fmt: Format, m: int, k: int | None = None, n: int | None = None) -> Schedule:
        """The H100-tuned weight-stream (or, for many rows, multistage or on Hopper warpgroup)
        schedule (`tuning.py`)."""
        return tuned_schedule(fmt, m, CUDA, k, n, warpgroup=device_has_warpgroup())

    def timed_kernel(self, compiled: CompiledGemm) -> CudaGemm:
        """The launcher the benchmark runner times (`CudaGemm` is a `TimedKernel`)."""
        return build_cuda_kernel(compiled.kernel)

    def ship(self, compiled: CompiledGemm, spec_path: Path | None, out_dir: Path | None) -> Shipped:
        """With `out_dir`, the kernel's files (`write_cuda_kernel`); without, nothing is printed."""
        return Shipped(None, [] if out_dir is None else write_cuda_kernel(compiled, out_dir))

    def launcher(self, kernel: Kernel) -> CudaGemm:
        """The in-process launcher of a compiled GEMM kernel (the `Launcher` protocol)."""
        return build_cuda_kernel(kernel)

    def layer_layout(self, fmt: Format, k: int, n: int) -> str | None:
        """The weight-stream layout where the format has one (its kernels read it), else the
        format's own layout (the fused kernel)."""
        try:
            stream_layout(fmt, CUDA)
        except ScheduleError:
            return None
        return LAYOUT_NAME

    def layer_kernel(self, fmt: Format, activation: str, m: int, k: int, n: int,
                     outputs: tuple[int, ...] = (), skip: bool = False) -> LayerKernel:
        """The kernel for m rows (`cuda_schedule`), bound to `mx.fast.cuda_kernel`; with
        `outputs` (part widths), writing the parts as separate outputs where the schedule's
        pipeline does (the weight stream: the decode's row counts), else one y. `skip`: the
        kernel over each block's stored vectors (`skip_schedule`; the skipping layout)."""
        schedule = skip_schedule(fmt, m, CUDA, k) if skip else cuda_schedule(fmt, m, k, n)
        return layer_binding(cuda_gemm(fmt, activation, schedule, written_outputs(schedule, outputs)), m, k, n)

    def layer_epilogue(self, fmt: Format, activation: str, m: int, k: int, n: int,
                       steps: tuple[str, ...]) -> LayerKernel | None:
        """`layer_kernel`'s kernel with the epilogue `steps` where its pipeline applies one
        (the weight stream and the multistage pipeline; not the warpgroup pipeline) and no
        dequantize route takes m rows; else None."""
        if self.layer_dequantize(fmt, activation, m, k, n) is not None:
            return None
        schedule = cuda_schedule(fmt, m, k, n)
        if not applies_epilogue(schedule.pipeline):
            return None
        try:
            return layer_binding(cuda_gemm(fmt, activation, schedule, (), tuple(steps)), m, k, n)
        except ScheduleError:  # a schedule whose tiles the epilogue cannot pair (gate)
            return None

    def layer_dequantize(self, fmt: Format, activation: str, m: int, k: int, n: int) -> LayerKernel | None:
        """The dequantize kernel (W^T [N, K] in the activation type, for `mx.matmul`) where a
        layer of m rows should decode its weight once (`tuning.dequantize_min_m`, on a device
        with the warpgroup MMA, where it was measured) and the format's stream layout is
        dense; else None (the layer runs `layer_kernel`'s GEMM)."""
        if m < dequantize_min_m(k, n) or not device_has_warpgroup() or dequantize_supported(fmt, CUDA, k):
            return None
        return layer_binding(cuda_dequantize(fmt, activation), m, k, n)


RUNTIME = CudaRuntime()
