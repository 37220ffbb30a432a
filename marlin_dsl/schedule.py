"""Tiling schedules (target-neutral) and the GEMMs a spec asks the compiler to build."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Union

from .errors import ScheduleError, SourceLocation
from .formats import Format
from .source import caller_location, record_declaration
from .targets import Target

def _located(obj: object) -> None:
    if getattr(obj, "location", None) is None:
        object.__setattr__(obj, "location", caller_location())


@dataclass(frozen=True)
class DoubleBuffered:
    """Seed 002's marlin_gemm: A and the dequantised B tile staged in threadgroup memory,
    two stages so loading tile k+1 overlaps computing tile k."""

    kind: Literal["double_buffered"] = "double_buffered"


@dataclass(frozen=True)
class FusedDequant:
    """Seed 002's marlin_gemm_fused: A in threadgroup memory; each warp dequantises its own
    slice of B in registers into a small per-warp staging tile (warp barriers only for B)."""

    kind: Literal["fused_dequant"] = "fused_dequant"


@dataclass(frozen=True)
class StripedKParallel:
    """Seed 002's marlin_gemm_striped: the (M tile, N tile, K slice) work units are
    linearised over a 1-D grid of `groups` threadgroups; each K slice writes a partial sum
    and the last threadgroup to arrive at a tile (atomic counter, no float atomics) reduces."""

    parallel: int = 2
    groups: int = 8
    kind: Literal["striped"] = "striped"


@dataclass(frozen=True)
class WeightStream:
    """Marlin's idea for small M: weights never touch shared memory. The product is computed
    transposed (Y^T = W^T X^T) so the weights are the MMA's A operand; the target lays the
    packed weights out in fragment order at pack time (`lowering/stream_layout.py`), each lane
    fetches its fragments for several K tiles with one 128-bit load (the next step's load is
    issued before this step's decode), decodes them in registers two at a time, and takes the
    activations' B fragments straight from device memory. The `k_warps` warps of a threadgroup
    split K and add their partial tiles through shared memory at the end.

    Schedule fields: tile_n N rows per threadgroup (warps_n warps side by side, each a
    multiple of the MMA's M), tile_m M columns (a multiple of the MMA's N), tile_k the dense K
    of one step (must equal the layout's vector chunk), warps_m 1."""

    k_warps: int = 4
    depth: int = 1  # steps fetched ahead of the one computing (registers per extra step: ~6)
    kind: Literal["weight_stream"] = "weight_stream"


@dataclass(frozen=True)
class Multistage:
    """Marlin's large-M mode: the weight-stream product and physical layout (Y^T = W^T X^T,
    weights as the MMA's A operand, each lane's fragments for several K tiles in one 128-bit
    vector), with the threadgroup's weight vectors and its activation tile copied into shared
    memory asynchronously, `stages` K steps in flight (cp.async groups on CUDA). Each warp
    decodes its A fragments once per K tile and reuses them across all its M tiles, so large
    tiles amortise the decode; activations are read from shared memory as each lane's
    contiguous run (the layout's K shuffle) instead of once per N tile from device memory.

    Schedule fields: tile_n N rows and tile_m M rows per threadgroup, split over warps_n x
    warps_m warps (tile_n/warps_n a multiple of the MMA's M, tile_m/warps_m of its N), tile_k
    the dense K of one step (the layout's vector chunk)."""

    stages: int = 3
    kind: Literal["multistage"] = "multistage"


Pipeline = Union[DoubleBuffered, FusedDequant, StripedKParallel, WeightStream, Multistage]


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
        if isinstance(self.pipeline, WeightStream):
            for attr in ("k_warps", "depth"):
                value = getattr(self.pipeline, attr)
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise ScheduleError(f"schedule {self.name!r}: weight_stream {attr} must be a "
                                        f"positive integer, got {value!r}", self.location)
            if self.warps_m != 1:
                raise ScheduleError(f"schedule {self.name!r}: weight_stream splits N and K among "
                                    f"warps, not M: warps_m must be 1, got {self.warps_m}", self.location)
        if isinstance(self.pipeline, Multistage):
            stages = self.pipeline.stages
            if not isinstance(stages, int) or isinstance(stages, bool) or not 2 <= stages <= 8:
                raise ScheduleError(f"schedule {self.name!r}: multistage stages must be an integer "
                                    f"2..8 (K steps in flight plus the one computing), got {stages!r}",
                                    self.location)
        if isinstance(self.pipeline, StripedKParallel):
            if self.pipeline.parallel < 1 or self.pipeline.groups < 1:
                raise ScheduleError(f"schedule {self.name!r}: striped parallel and groups "
                                         "must be positive", self.location)

    @property
    def warps(self) -> int:
        k_warps = self.pipeline.k_warps if isinstance(self.pipeline, WeightStream) else 1
        return self.warps_m * self.warps_n * k_warps

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
        """Raise ScheduleError (at the schedule's spec line) if it cannot run."""
        where = self.location
        if isinstance(self.pipeline, (WeightStream, Multistage)):
            self._check_stream(fmt, target)
            return
        wm, wn = self.warp_tile
        if wm % target.mma_m or wn % target.mma_n:
            raise ScheduleError(
                f"schedule {self.name!r}: warp tile {wm}x{wn} is not a multiple of {target.name}'s "
                f"MMA tile {target.mma_m}x{target.mma_n}", where)
        if self.tile_k % target.mma_k:
            raise ScheduleError(
                f"schedule {self.name!r}: tile_k={self.tile_k} is not a multiple of {target.name}'s "
                f"MMA k={target.mma_k}", where)
        if self.tile_k % fmt.k_granule:
            raise ScheduleError(
                f"schedule {self.name!r}: tile_k={self.tile_k} is not a multiple of format "
                f"{fmt.name!r}'s K granule {fmt.k_granule}", where)
        threads = self.threads(target)
        if threads > target.max_threads:
            raise ScheduleError(
                f"schedule {self.name!r}: {threads} threads per threadgroup exceed "
                f"{target.name}'s limit of {target.max_threads}", where)


    def _check_stream(self, fmt: Format, target: Target) -> None:
        from .lowering.stream_layout import stream_layout

        where = self.location
        kind = self.pipeline.kind
        layout = stream_layout(fmt, target, where)
        rows_per_warp = self.tile_n // self.warps_n
        if rows_per_warp % layout.tile_rows:
            raise ScheduleError(
                f"schedule {self.name!r}: {kind} gives each warp tile_n/warps_n = "
                f"{rows_per_warp} N rows, not a multiple of {target.name}'s MMA M {layout.tile_rows}", where)
        cols_per_warp = self.tile_m // self.warps_m
        if cols_per_warp % target.mma_n:
            raise ScheduleError(
                f"schedule {self.name!r}: {kind} gives each warp tile_m/warps_m = {cols_per_warp} "
                f"M rows, not a multiple of {target.name}'s MMA N {target.mma_n}", where)
        dense_chunk = layout.dense_chunk
        if self.tile_k != dense_chunk:
            raise ScheduleError(
                f"schedule {self.name!r}: {kind} steps K by one vector load per lane, "
                f"{dense_chunk} positions for format {fmt.name!r} on {target.name}: set "
                f"tile_k={dense_chunk}, not {self.tile_k}", where)
        g = fmt.scale.group_size
        tile_dense = layout.dense_tile_k
        if g != "K" and int(g) % tile_dense:
            raise ScheduleError(
                f"schedule {self.name!r}: {kind} needs scale groups that cover whole MMA "
                f"K tiles ({tile_dense}); format {fmt.name!r} has group_size {g}", where)
        threads = self.threads(target)
        if threads > target.max_threads:
            raise ScheduleError(
                f"schedule {self.name!r}: {threads} threads per threadgroup exceed "
                f"{target.name}'s limit of {target.max_threads}", where)


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
