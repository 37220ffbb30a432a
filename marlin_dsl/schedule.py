"""Tiling schedules (target-neutral) and the GEMMs a spec asks the compiler to build."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .errors import ScheduleError, SourceLocation
from .formats import Format
# The pipelines live in marlin_dsl/pipelines/ (one module each, registered by kind); their
# classes stay importable from here.
from .pipelines import PIPELINES, DoubleBuffered, FusedDequant, Multistage, Pipeline, StripedKParallel, WeightStream
from .source import caller_location, record_declaration
from .targets import Target

def _located(obj: object) -> None:
    if getattr(obj, "location", None) is None:
        object.__setattr__(obj, "location", caller_location())


@dataclass(frozen=True)
class Schedule:
    """A threadgroup computes a tile_m x tile_n output tile, stepping K by tile_k; its warps
    are laid out warps_m x warps_n, each owning a (tile_m/warps_m) x (tile_n/warps_n) tile,
    which the target covers with its MMA shape. Threads = 32 * warps_m * warps_n."""

    name: str
    tile_m: int = 64
    tile_n: int = 64
    tile_k: int = 32
    warps_m: int = 2
    warps_n: int = 2
    pipeline: Pipeline = field(default_factory=DoubleBuffered)
    location: SourceLocation | None = field(default=None, compare=False, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        _located(self)
        for attr in ("tile_m", "tile_n", "tile_k", "warps_m", "warps_n"):
            value = getattr(self, attr)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ScheduleError(f"schedule {self.name!r}: {attr} must be a positive "
                                         f"integer, got {value!r}", self.location)
        for tile, warps in (("tile_m", "warps_m"), ("tile_n", "warps_n")):
            if getattr(self, tile) % getattr(self, warps):
                raise ScheduleError(
                    f"schedule {self.name!r}: {tile}={getattr(self, tile)} is not divisible by "
                    f"{warps}={getattr(self, warps)}", self.location)
        if not isinstance(self.pipeline, Pipeline) or PIPELINES.get(self.pipeline.kind) is not type(self.pipeline):
            raise ScheduleError(f"schedule {self.name!r}: pipeline must be one of "
                                f"{', '.join(cls.__name__ for cls in PIPELINES.values())}, got "
                                f"{self.pipeline!r}", self.location)
        self.pipeline.validate(self)

    @property
    def warps(self) -> int:
        """Warps of a threadgroup: warps_m x warps_n, times what the pipeline adds (the
        weight stream's k_warps)."""
        return self.pipeline.warps(self)

    def threads(self, target: Target) -> int:
        return self.warps * target.warp_size

    @property
    def warp_tile(self) -> tuple[int, int]:
        return self.tile_m // self.warps_m, self.tile_n // self.warps_n

    def mma_grid(self, target: Target) -> tuple[int, int]:
        """How many MMA tiles (rows, cols) each warp owns on `target`."""
        wm, wn = self.warp_tile
        return wm // target.mma_m, wn // target.mma_n

    def k_substeps(self, target: Target) -> int:
        return self.tile_k // target.mma_k

    def check(self, fmt: Format, target: Target) -> None:
        """Raise ScheduleError (at the schedule's spec line) if it cannot run: the pipeline's
        own checks, then the generic ones."""
        self.pipeline.check(self, fmt, target)
        threads = self.threads(target)
        if threads > target.max_threads:
            raise ScheduleError(
                f"schedule {self.name!r}: {threads} threads per threadgroup exceed "
                f"{target.name}'s limit of {target.max_threads}", self.location)


@dataclass(frozen=True)
class Gemm:
    """Y[M, N] = X[M, K] @ W[K, N] with W in `format`, X and Y in `activation` (f16 or bf16)."""

    name: str
    format: Format
    schedule: Schedule
    activation: Literal["f16", "bf16"] = "f16"
    location: SourceLocation | None = field(default=None, compare=False, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        _located(self)
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ScheduleError(f"Gemm name must be an identifier (it names kernels and files), "
                                f"got {self.name!r}", self.location)
        if not isinstance(self.format, Format) or not isinstance(self.schedule, Schedule):
            raise ScheduleError(f"gemm {self.name!r}: needs a Format and a Schedule", self.location)
        if self.activation not in ("f16", "bf16"):
            raise ScheduleError(f"gemm {self.name!r}: activation must be 'f16' or 'bf16', "
                                     f"got {self.activation!r}", self.location)
        record_declaration(self)


def default_schedule(fmt: Format) -> Schedule:
    """The schedule `quantized_linear` compiles a format with when no spec names one: seed
    002's fused kernel (64x64 tiles, 2x2 warps) with K steps of 32 positions, or of the
    format's K granule when that is larger (so a step holds whole packed units)."""
    from math import lcm

    return Schedule("auto_fused", tile_k=lcm(32, fmt.k_granule), pipeline=FusedDequant())


def stream_schedule(fmt: Format, m: int, target: Target | None = None, k: int | None = None,
                    n: int | None = None) -> Schedule:
    """The weight-stream schedule for M rows of activations (and, when known, the weight's
    [K, N]): tiles one MMA wide in M (8 or 16 rows) and many warps splitting K, so that enough
    128-bit weight loads are in flight; larger M runs several 16-row threadgroups over the same
    weights (served from L2 after the first)."""
    from .lowering.stream_layout import stream_layout
    from .targets import CUDA

    target = target or CUDA
    tile_k = stream_layout(fmt, target).dense_chunk

    def make(name: str, tile_m: int, k_warps: int, depth: int = 1, warps_n: int = 1) -> Schedule:
        return Schedule(name, tile_m=tile_m, tile_n=16 * warps_n, tile_k=tile_k, warps_m=1,
                        warps_n=warps_n, pipeline=WeightStream(k_warps=k_warps, depth=depth))

    # From ncu on an H100 (bench/results/gpu/ncu_kshuffle_probe_h100_2026-11-22.json and
    # ncu_large_m_probe_h100_2026-11-22.json): 16 warps splitting K win at M <= 8 (more loads
    # in flight); at M <= 16 they win where K > N (few N tiles to spread), 8 warps elsewhere;
    # up to 64 rows, 32-row tiles where N <= K.
    wide_n = k is not None and n is not None and n > k
    if m <= 8:
        return make("stream_m8", 8, 16)
    if m <= 16:
        if k is not None and n is not None and k > n:
            return make("stream_m16_long_k", 16, 16, depth=2)
        return make("stream_m16", 16, 8)
    if m <= 64 and not wide_n:
        return make("stream_m32", 32, 8)
    # Beyond 64 rows, and from 17 where N > K, the multistage pipeline
    # (bench/results/gpu/ncu_m64_m128_probe_h100_2026-11-22.json: at M = 64 on 4096 x 14336
    # its 64 x 128 tiles take 67 us for fp4 and 49 us for fp4 2:4, the weight-stream 64-row
    # tiles 78 and 166 us; where N <= K the weight-stream tiles stay ahead: 82 vs 213 us).
    return multistage_schedule(fmt, m, target, k, n)


#: Threadgroups below which the large tiles leave an H100's 132 SMs too idle.
_FULL_GRID = 100


def multistage_schedule(fmt: Format, m: int, target: Target | None = None, k: int | None = None,
                        n: int | None = None) -> Schedule:
    """The multistage schedule for M rows (M > 64): 128 x 256 tiles (8 warps, each 64 M x 64 N
    rows, 3 stages) where they give the GPU enough threadgroups, else 64 x 128 (4 warps, each
    32 x 64, 4 stages). From bench/results/gpu/multistage_probe_h100_2026-11-22.json: at M =
    2048 the large tiles are fastest (273 us dense, 212 us 2:4 at 4096 x 4096); at M = 256 on
    N = 4096 they make 32 threadgroups and the small ones win."""
    from .lowering.stream_layout import stream_layout
    from .targets import CUDA

    target = target or CUDA
    tile_k = stream_layout(fmt, target).dense_chunk
    n_eff = n if n is not None else 4096
    if -(-m // 128) * -(-n_eff // 256) >= _FULL_GRID:
        return Schedule("multistage_large", tile_m=128, tile_n=256, tile_k=tile_k, warps_m=2, warps_n=4,
                        pipeline=Multistage(stages=3))
    return Schedule("multistage_small", tile_m=64, tile_n=128, tile_k=tile_k, warps_m=2, warps_n=2,
                    pipeline=Multistage(stages=4))
