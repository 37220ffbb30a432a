"""The static cost of a compiled GEMM kernel per weight, from its IR after the passes.

Units (docs/COST_MODEL.md):
- a *weight* is one dense element of W [K, N] that the threadgroup multiplies (a 2:4 format's
  pruned zeros count: costs are per dense weight, so formats compare at equal work);
- one K-loop iteration of a threadgroup covers `weights_per_iteration` = tile_n x tile_k x
  (K warps: WeightStream's `k_warps` split K inside the threadgroup) x (K steps per iteration:
  WeightStream's `unroll`) weights;
- instructions per weight = (ops one thread runs per iteration) x threads / weights per
  iteration: *lane instructions* per weight, the same as (a lane's ops) / (the weights that are
  its share). Divided by 32 it is SIMD-group (warp) issue slots per weight;
- bytes per weight: `requested` = bytes the loop's load instructions ask for (every thread,
  repeats included: a scale that 8 threads load counts 8 times), from the IR; `unique` = the
  bytes the threadgroup needs from device memory: the format's storage per weight for the
  weight-side arrays, and for the activations M x (2 bytes) per K position shared by the
  tile's tile_n columns, i.e. M x 2 / tile_n per weight at the M assumed (default: the tile's
  own tile_m, one full tile of rows)."""
from __future__ import annotations

from dataclasses import dataclass, field
from math import lcm

from ..formats import PER_COLUMN, Format
from ..ir.core import Kernel
from ..layouts.block_skip import skip_layout
from ..layouts.weight_stream import stream_layout
from ..machine.target import TARGETS
from ..schedule import Gemm
from .classify import CLASSES
from .loop import LoopCounts, count_loop
from .registers import live_registers

#: The buffer the activations arrive in (every lowering names it so).
ACTIVATIONS = "x"

#: The K x N at which a format's storage per weight is taken: a typical LLM projection, K
#: rounded to whole groups and granules (as `marlin-dsl formats` reports storage).
STORAGE_SHAPE = (4096, 4096)


def _storage_shape(fmt: Format) -> tuple[int, int]:
    """STORAGE_SHAPE with K rounded to whole groups and granules."""
    k, n = STORAGE_SHAPE
    g = fmt.scale.group_size
    unit = fmt.k_granule if g == PER_COLUMN else lcm(fmt.k_granule, int(g))
    return max(unit, round(k / unit) * unit), n


def storage_per_weight(fmt: Format) -> dict[str, float]:
    """Bytes per dense weight of each array of a packed weight (qweight, scales, zeros, meta,
    ...), at STORAGE_SHAPE."""
    k, n = _storage_shape(fmt)
    return {b.name: b.nbytes / (k * n) for b in fmt.buffers(k, n)}


def kernel_storage(kernel: Kernel, fmt: Format, stored: float = 1.0) -> dict[str, float]:
    """`storage_per_weight` as the kernel reads it: qweight at the size of the physical layout
    the kernel reads (`attrs["weight_layout"]`: the weight stream's words, padded to whole
    vectors and N tiles, with the spare bits of code widths that do not divide 16), and
    without the arrays no op of the kernel reads (a stream kernel ignores block patterns).
    A kernel that reads the target's skipping layout (`layouts/block_skip.py`) reads the
    `stored` share of the stream's words (known only with the weights: `stored_fraction`;
    1.0 is the upper bound) and a 4-byte `vec_k` entry per stored vector; its scales are
    counted whole (a group is read where any of its vectors is stored)."""
    storage = storage_per_weight(fmt)
    read = {str(op.attrs["buffer"]) for op in kernel.walk() if "buffer" in op.attrs}
    storage = {name: v for name, v in storage.items() if name in read}
    layout_name = kernel.attrs.get("weight_layout")
    if layout_name is not None and "qweight" in storage:
        k, n = _storage_shape(fmt)
        target = TARGETS[str(kernel.attrs["target"])]
        layout = stream_layout(fmt, target)
        storage["qweight"] = layout.words(fmt.stored_k(k), n) * 4 / (k * n)
        if layout_name == target.skip_layout:
            skip = skip_layout(fmt, target)
            storage["qweight"] *= stored
            storage["vec_k"] = 4 * stored / (skip.stream.chunk * skip.block_rows)
    return storage


@dataclass(frozen=True)
class KernelCost:
    """A kernel's cost per weight (units in the module docstring)."""

    gemm: str
    target: str
    pipeline: str
    threads: int
    tile: tuple[int, int, int]  # tile_m, tile_n, tile_k
    weights_per_iteration: int  # dense weights of W per K-loop iteration of a threadgroup
    steps_per_iteration: int  # K steps (of tile_k) per iteration
    m: int  # rows of activations assumed for the unique activation bytes
    per_weight: dict[str, float]  # lane instructions per weight, by class (CLASSES)
    invariant_per_weight: float  # of which loop-invariant pure ops (a compiler hoists them)
    requested_bytes: dict[str, float]  # device buffer -> bytes per weight the loads ask for
    unique_bytes: dict[str, float]  # device buffer -> bytes per weight the threadgroup needs
    shared_bytes: int  # threadgroup memory declared
    shared_traffic: tuple[float, float]  # threadgroup memory bytes read, written per weight
    registers: int  # estimated 32-bit registers per thread (registers.py)
    registers_invariant: int  # of which loop-invariant values
    barriers_per_step: dict[str, float]  # scope -> barriers per K step
    per_iteration: dict[str, float]  # one thread's ops per iteration, by class
    notes: list[str] = field(default_factory=list)

    @property
    def instructions_per_weight(self) -> float:
        return sum(self.per_weight.values())

    @property
    def unique_bytes_per_weight(self) -> float:
        return sum(self.unique_bytes.values())

    @property
    def requested_bytes_per_weight(self) -> float:
        return sum(self.requested_bytes.values())

    @property
    def lane_weights(self) -> float:
        """Weights per iteration that are one lane's share."""
        return self.weights_per_iteration / self.threads


def iteration_shape(gemm: Gemm) -> tuple[int, int]:
    """(weights per K-loop iteration of a threadgroup, K steps per iteration), from the
    schedule: K warps and unrolled steps multiply the tile (module docstring)."""
    s = gemm.schedule
    k_warps = int(getattr(s.pipeline, "k_warps", 1))
    unroll = int(getattr(s.pipeline, "unroll", 1))
    return s.tile_n * s.tile_k * k_warps * unroll, unroll


def cost_from_counts(kernel: Kernel, counts: LoopCounts, weights: int, steps: int = 1, *,
                     gemm_name: str | None = None, m: int = 1, tile: tuple[int, int, int] = (1, 1, 1),
                     storage: dict[str, float] | None = None, act_bytes: int = 2) -> KernelCost:
    """Per-weight costs of one loop iteration's counts (`count_loop`) that cover `weights`
    dense weights and `steps` K steps; `storage` gives the weight-side arrays' bytes per
    weight (None: unique bytes only for the activations)."""
    scale = kernel.threads / weights  # one thread's count -> lane instructions per weight
    tally = counts.tally
    unique = dict(storage or {})
    if ACTIVATIONS in tally.device_read:
        unique[ACTIVATIONS] = m * act_bytes / tile[1]
    regs, regs_invariant = live_registers(kernel, counts.loop)
    return KernelCost(
        gemm=gemm_name or kernel.name, target=str(kernel.attrs.get("target", "?")),
        pipeline=str(kernel.attrs.get("pipeline", "?")), threads=kernel.threads, tile=tile,
        weights_per_iteration=weights, steps_per_iteration=steps, m=m,
        per_weight={c: tally.counts[c] * scale for c in CLASSES},
        invariant_per_weight=tally.invariant * scale,
        requested_bytes={b: n * scale for b, n in sorted(tally.device_read.items())},
        unique_bytes=unique, shared_bytes=kernel.shared_bytes,
        shared_traffic=(tally.shared_read * scale, tally.shared_written * scale),
        registers=regs, registers_invariant=regs_invariant,
        barriers_per_step={s: n / steps for s, n in sorted(tally.barriers.items())},
        per_iteration=dict(tally.counts), notes=list(counts.notes))


def kernel_cost(kernel: Kernel, gemm: Gemm, m: int | None = None, stored: float = 1.0) -> KernelCost:
    """The cost model of `kernel`, compiled from `gemm`, per weight; activation bytes at M =
    `m` rows (default: the schedule's tile_m, capped at it: a threadgroup holds at most
    tile_m rows); `stored`: a skipping kernel's share of stored vectors (`kernel_storage`)."""
    s = gemm.schedule
    weights, steps = iteration_shape(gemm)
    rows = s.tile_m if m is None else min(m, s.tile_m)
    storage = kernel_storage(kernel, gemm.format, stored)
    act_bytes = 2  # f16 and bf16 activations alike
    return cost_from_counts(kernel, count_loop(kernel), weights, steps, gemm_name=gemm.name,
                            m=rows, tile=(s.tile_m, s.tile_n, s.tile_k), storage=storage,
                            act_bytes=act_bytes)
