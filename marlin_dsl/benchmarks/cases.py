"""What `marlin-dsl bench` measures: the shapes, Ms, pipelines and formats of a run, the
names of MLX's baselines, the definitions written into bench.json, and the protocols between the
run (`runner.run_bench`) and where its subjects come from (`mlx_runner.MLXRunner` on a GPU, a
fake runner in the tests)."""
from __future__ import annotations

from dataclasses import dataclass, field
from math import lcm
from typing import Callable, Protocol

from ..formats.format import Format
from ..schedule import DoubleBuffered, FusedDequant, Schedule, StripedKParallel
from .timing import BATCH_LAUNCHES

#: A target's tuned weight-stream schedules, tuned(fmt, m, k, n) (`TargetRuntime.tuned_schedule`).
TunedSchedule = Callable[[Format, int, "int | None", "int | None"], Schedule]

DEFAULT_SHAPES: tuple[tuple[int, int], ...] = ((4096, 4096), (4096, 14336), (14336, 4096))
DEFAULT_MS: tuple[int, ...] = (1, 16, 64, 256, 2048)
#: Every pipeline the bench can build (the striped one with one group per H100 SM, as
#: bench/prepare_gpu_kernels.py builds it for the correctness run).
PIPELINES: tuple[str, ...] = ("double_buffered", "fused_dequant", "striped", "weight_stream")
#: The default selection: every pipeline. The default run (7 formats x 3 pipelines x 3 shapes
#: x 5 Ms) took 3.3 min on an H100 (2026-11-22), of which ~70 s were MLX compiling its own
#: quantized_matmul kernels and ~45 s NVRTC compiling ours.
DEFAULT_PIPELINES: tuple[str, ...] = PIPELINES
QUICK_SHAPES: tuple[tuple[int, int], ...] = ((4096, 4096),)
QUICK_MS: tuple[int, ...] = (1, 16)
QUICK_FORMATS: tuple[str, ...] = ("fp4", "fp4_2of4")
DEFAULT_REPEATS = 5

ACT_BYTES = 2
REL_TOL = 2e-3  # kernel_check.REL_TOL for f16
#: A kernel time below this many per-launch floors (environment.launch_floor_us) is marked
#: host-bound: launches could not be issued faster, so it is an upper bound on the GPU time.
HOST_BOUND_FACTOR = 1.5

QMM = "mx.quantized_matmul"
FP16 = "mx.matmul"
QMM_FORMAT = "mlx_affine4_g64"
FP16_FORMAT = "fp16"
KIND_ORDER = {"fp16": 0, "mlx_q4": 1, "marlin": 2}

DEFINITIONS = {
    "kernel_us": (
        "median over `repeats` batches of (wall time of one mx.eval + mx.synchronize over a batch of "
        "launches queued beforehand) / launches in the batch; launches per batch: `launches` (50, fewer "
        "when one launch is slow), rotating over `copies` copies of the weights so that weights are not "
        "served from L2; with MLX_MAX_OPS_PER_BUFFER=1 every launch is its own CUDA graph, so the "
        "launches run one after another (this includes the gap between launches, see "
        "environment.launch_floor_us)"),
    "e2e_us": ("median of single calls each followed by mx.eval (Python + MLX graph building + "
               "launch + wait), through the public call path (ours: CudaGemm.__call__, poison=False)"),
    "floor_us": ("(weight_bytes + x_bytes + y_bytes) / copy bandwidth: the time to move the bytes that "
                 "must move at the measured device-to-device copy bandwidth"),
    "weight_bytes": ("the packed weight as launched: every array the kernel reads (codes, scales, zero "
                     "points, sparsity metadata); for mx.quantized_matmul w + scales + biases; for fp16 K*N*2"),
    "pct_floor_bw": "100 * floor_us / kernel_us: the achieved share of the copy bandwidth",
    "vs_qmm": "kernel_us of mx.quantized_matmul at the same K, N, M / this kernel_us (> 1: faster than it)",
    "vs_fp16": "kernel_us of float16 mx.matmul at the same K, N, M / this kernel_us (> 1: faster than it)",
    "rel_error": ("||y - x @ W|| / ||x @ W|| (Frobenius) of the first end-to-end output, W dequantised "
                  "from the kernel's own weights, float32 reference; ok when <= 2e-3"),
    "copy_bandwidth": ("(bytes read + bytes written) / time of a chain of negations of a 1 GiB float32 "
                       "array (each step reads and writes 1 GiB), median of several chains"),
    "launch_floor_us": "kernel_us measured the same way for a one-element negation: the per-launch overhead",
    "host_bound": (f"kernel_us < {HOST_BOUND_FACTOR:g} * launch_floor_us: MLX could not issue the launches "
                   "faster, so kernel_us is an upper bound on the GPU time (table: '*')"),
    "queue_us": "Python time to queue one launch (building the lazy MLX array; not in kernel_us, in e2e_us)",
    "first_launch_ms": "the first launch at this M evaluated alone (JIT compilation when it is the kernel's first)",
    "measure_s": "wall time of the whole measurement of this row",
    "e2e_prepared_us": ("like e2e_us, but each call is the launch that kernel_us times, its inputs made "
                        "beforehand (ours: dims array and zeroed counters already on the device); "
                        "e2e_us - e2e_prepared_us is what the public call path adds"),
    "compile_s": "per kernel: lowering + passes + printing (the NVRTC compilation happens at the first launch)",
}




# ----- subjects ---------------------------------------------------------------------------------

@dataclass
class Measurement:
    """What a subject's `measure(m)` returns."""

    kernel_s: float
    e2e_s: float
    launches: int = BATCH_LAUNCHES
    copies: int = 1
    rel_error: float | None = None
    kernel_samples_s: list[float] = field(default_factory=list)
    e2e_samples_s: list[float] = field(default_factory=list)
    #: Python time to queue one launch (building the lazy MLX array, no evaluation).
    queue_s: float | None = None
    #: The first launch at this M, evaluated alone (includes JIT compilation on first use).
    first_launch_s: float | None = None
    #: Like e2e_s, but calling the launch the kernel time uses (inputs prepared beforehand).
    e2e_prepared_s: float | None = None


class Subject(Protocol):
    """One kernel at one (K, N), weights prepared: `measure(m)` times it at M = m."""

    kind: str  # "marlin", "mlx_q4" or "fp16"
    format: str
    pipeline: str
    weight_bytes: int

    def measure(self, m: int) -> Measurement: ...


class Runner(Protocol):
    """Where subjects come from: the MLX runner on a GPU, a fake one in tests."""

    def environment(self) -> dict: ...

    def copy_bandwidth(self) -> dict: ...

    def baselines(self, k: int, n: int) -> list[Subject]: ...

    def marlin(self, fmt: str, pipeline: str, k: int, n: int) -> Subject: ...

    def end_shape(self) -> None: ...


def kernel_label(kind: str, fmt: str, pipeline: str) -> str:
    if kind == "mlx_q4":
        return QMM
    if kind == "fp16":
        return FP16
    return f"{fmt}/{pipeline}"


def bench_schedule(fmt: Format, pipeline: str, m: int = 1, k: int | None = None, n: int | None = None, *,
                   tuned: TunedSchedule) -> Schedule:
    """The schedule the bench compiles `pipeline` with for `fmt`: weight_stream's is the
    target's tuned one for M rows (`tuned`, the runtime's `tuned_schedule`)."""
    if pipeline == "weight_stream":  # its schedule depends on M (the tuned tables' buckets)
        return tuned(fmt, m, k, n)

    pl = {"double_buffered": DoubleBuffered, "fused_dequant": FusedDequant,
          "striped": lambda: StripedKParallel(parallel=2, groups=132)}[pipeline]()
    return Schedule("bench", tile_k=lcm(32, fmt.k_granule), pipeline=pl)

