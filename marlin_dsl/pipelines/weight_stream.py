"""The weight-stream pipeline (`WeightStream`, CUDA, small M) and the checks it shares with
`Multistage` (both read the weights in the fragment-ordered stream layout). Lowered by
`lowering/weight_stream.py`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from ..errors import ScheduleError
from ..formats import Format
from ..layouts.activation_transpose import target_transpose_plan
from ..layouts.block_skip import skip_layout
from ..layouts.weight_stream import VECTOR_WORDS, stream_layout
from ..machine.target import Target
from .base import ScheduleShape, register_pipeline, require_positive


def check_stream(schedule: ScheduleShape, kind: str, fmt: Format, target: Target,
                 vectors: bool = False, scatter: bool = False) -> None:
    """What the stream layout asks of a schedule: warp tiles of whole MMA tiles (N as the MMA's
    M, M as its N), K steps of one vector load per lane (`vectors`: or of several consecutive
    ones inside one scale group), scale groups of whole K tiles; and a pipeline that reads the
    scattered N:M layout (`scatter`) where the format has it."""
    where, name = schedule.location, schedule.name
    layout = stream_layout(fmt, target, where)
    if layout.scatter is not None and not scatter:
        raise ScheduleError(
            f"schedule {name!r}: {kind} does not read the scattered N:M layout that format "
            f"{fmt.name!r} has on {target.name} (no sparse MMA for its pattern: the lanes scatter "
            "their kept values); use weight_stream", where)
    rows_per_warp = schedule.tile_n // schedule.warps_n
    if rows_per_warp % layout.tile_rows:
        raise ScheduleError(
            f"schedule {name!r}: {kind} gives each warp tile_n/warps_n = "
            f"{rows_per_warp} N rows, not a multiple of {target.name}'s MMA M {layout.tile_rows}", where)
    cols_per_warp = schedule.tile_m // schedule.warps_m
    if cols_per_warp % target.mma_n:
        raise ScheduleError(
            f"schedule {name!r}: {kind} gives each warp tile_m/warps_m = {cols_per_warp} "
            f"M rows, not a multiple of {target.name}'s MMA N {target.mma_n}", where)
    dense_chunk = layout.dense_chunk
    g = fmt.scale.group_size
    if vectors and schedule.tile_k > dense_chunk and schedule.tile_k % dense_chunk == 0:
        # several vectors per step: every step must lie in one scale group, and K (a multiple
        # of the group size) then is a whole number of steps
        if g == "K" or int(g) % schedule.tile_k:
            raise ScheduleError(
                f"schedule {name!r}: {kind} with tile_k={schedule.tile_k} steps K by "
                f"{schedule.tile_k // dense_chunk} vector loads per lane; that needs scale groups "
                f"that cover whole steps, and format {fmt.name!r} has group_size {g}: set tile_k="
                f"{dense_chunk}", where)
    elif schedule.tile_k != dense_chunk:
        more = " (or a multiple inside one scale group)" if vectors else ""
        raise ScheduleError(
            f"schedule {name!r}: {kind} steps K by one vector load per lane, "
            f"{dense_chunk} positions for format {fmt.name!r} on {target.name}: set "
            f"tile_k={dense_chunk}{more}, not {schedule.tile_k}", where)
    tile_dense = layout.dense_tile_k
    if g != "K" and int(g) % tile_dense:
        raise ScheduleError(
            f"schedule {name!r}: {kind} needs scale groups that cover whole MMA "
            f"K tiles ({tile_dense}); format {fmt.name!r} has group_size {g}", where)


@register_pipeline
@dataclass(frozen=True)
class WeightStream:
    """Marlin's idea for small M: weights never touch shared memory. The product is computed
    transposed (Y^T = W^T X^T) so the weights are the MMA's A operand; the target lays the
    packed weights out in fragment order at pack time (`layouts/weight_stream.py`), each lane
    fetches its fragments for several K tiles with one 128-bit load (the next step's load is
    issued before this step's decode), decodes them in registers two at a time, and takes the
    activations' B fragments straight from device memory. The `k_warps` warps of a threadgroup
    split K and add their partial tiles through shared memory at the end.

    Schedule fields: tile_n N rows per threadgroup (warps_n warps side by side, each a
    multiple of the MMA's M), tile_m M columns (a multiple of the MMA's N), tile_k the dense K
    of one step (the layout's vector chunk, or a multiple of it inside one scale group: then a
    step loads that many consecutive vectors and loads its scales, and multiplies its sums by
    them, once), warps_m 1. Pipeline fields: k_warps, depth (steps fetched ahead), unroll
    (steps per loop iteration), stages (a shared ring for the weight words, see below),
    x_ahead (the activations' B fragments loaded a step ahead, see below), x_shuffle (lanes
    sharing their activation loads through warp shuffles, see below)."""

    k_warps: int = 4
    depth: int = 1  # steps fetched ahead of the one computing (registers per extra step: ~6)
    #: K steps per loop iteration (the rest in a second loop): the loop's counters, compare
    #: and branch are paid once per `unroll` steps. 1 by default: at 2, ptxas's K loop is
    #: 78.5 instead of 80 SASS instructions per step for fp4 at M = 1 but longer for 2:4 and
    #: M = 16 (register pressure; bench/results/issue15_decode_notes.md), so the GPU sweep
    #: (bench/probes/decode_sweep.py) decides
    unroll: int = 1
    #: Shared-memory slots per warp for the weight words (0: none, registers only). With
    #: S >= 2 each lane copies its words asynchronously S - 1 steps ahead into a ring and
    #: reads them back from it (lowering/parts/ring_fetch.py): more bytes in flight without
    #: the registers `depth` costs. Needs a target with asynchronous copies (CUDA).
    stages: int = 0
    #: Steps the activations' B fragments are loaded ahead (0 or 1). With 1 each step's
    #: activation loads are issued a step before the MMAs that read them and carried in
    #: registers (a B fragment per K tile and M tile: 4 registers each), so their latency
    #: overlaps a step of decode and MMAs instead of sitting in the step's chain. For 2:4
    #: at M <= 16, whose B fragments are 16-32 two-element loads a step, the stall on them
    #: bounded the kernel (bench/results/issue33_h200_2026-11-28).
    x_ahead: int = 0
    #: Lanes that share their activation loads (0, 2 or 4): with L, each lane loads L words of
    #: activations with one vector load (64 or 128 bits) and the L lanes of a group transpose
    #: them with warp shuffles (lowering/parts/x_transpose.py), instead of one two-element load
    #: per word. For layouts without the K shuffle (2:4 on the sparse MMA, whose groups of 4
    #: must stay together; scale groups smaller than a vector): there each two-element load
    #: touches as many L1 lines as the 128-bit one (bench/results/issue33_h200_2026-11-29, run 17).
    x_shuffle: int = 0
    #: Skip the empty blocks of a format with block patterns (seed 003): the target's
    #: skipping layout (`layouts/block_skip.py`) stores per block of the format's block_n rows
    #: only the K vectors that hold a non-zero, and each warp (its tile_n / warps_n rows lie
    #: in one block: a divisor of block_n) loops over its block's stored vectors
    #: (lowering/weight_stream_skip.py).
    skip_empty: bool = False
    kind: Literal["weight_stream"] = "weight_stream"
    #: Its epilogue writes Y's columns as several outputs (`Gemm.outputs`; KWarpReduce).
    splits_outputs: ClassVar[bool] = True
    #: Its epilogue applies a Gemm's `Epilogue` (KWarpReduce: the whole tile is in shared memory).
    applies_epilogue: ClassVar[bool] = True

    def validate(self, schedule: ScheduleShape) -> None:
        require_positive(schedule, "weight_stream", self, ("k_warps", "depth", "unroll"))
        if not isinstance(self.stages, int) or isinstance(self.stages, bool) or self.stages == 1 \
                or self.stages < 0:
            raise ScheduleError(f"schedule {schedule.name!r}: weight_stream stages must be 0 (weights "
                                f"in registers) or at least 2 (a ring of shared slots), got {self.stages!r}",
                                schedule.location)
        if not isinstance(self.x_ahead, int) or isinstance(self.x_ahead, bool) or self.x_ahead not in (0, 1):
            raise ScheduleError(f"schedule {schedule.name!r}: weight_stream x_ahead must be 0 (activations "
                                f"loaded in the step that reads them) or 1 (a step ahead), got {self.x_ahead!r}",
                                schedule.location)
        if not isinstance(self.x_shuffle, int) or isinstance(self.x_shuffle, bool) or self.x_shuffle not in (0, 2, 4):
            raise ScheduleError(f"schedule {schedule.name!r}: weight_stream x_shuffle must be 0 (two-element "
                                f"activation loads), 2 or 4 (lanes sharing 64- or 128-bit loads through warp "
                                f"shuffles), got {self.x_shuffle!r}", schedule.location)
        if not isinstance(self.skip_empty, bool):
            raise ScheduleError(f"schedule {schedule.name!r}: weight_stream skip_empty must be True or "
                                f"False, got {self.skip_empty!r}", schedule.location)
        if schedule.warps_m != 1:
            raise ScheduleError(f"schedule {schedule.name!r}: weight_stream splits N and K among "
                                f"warps, not M: warps_m must be 1, got {schedule.warps_m}", schedule.location)

    def warps(self, schedule: ScheduleShape) -> int:
        """k_warps warps split K beside each warp tile."""
        return schedule.warps_m * schedule.warps_n * self.k_warps

    def check(self, schedule: ScheduleShape, fmt: Format, target: Target) -> None:
        if self.skip_empty:  # first: whether the target and format can skip at all
            check_skip(self, schedule, fmt, target)
        check_stream(schedule, self.kind, fmt, target, vectors=True, scatter=True)
        if self.x_shuffle:
            check_shuffle(self, schedule, fmt, target)
        if self.stages and target.async_copy_bytes < 4 * VECTOR_WORDS:
            raise ScheduleError(
                f"schedule {schedule.name!r}: weight_stream stages={self.stages} copies the weight "
                f"words asynchronously, and {target.name} has no asynchronous copies of "
                f"{4 * VECTOR_WORDS} bytes (Target.async_copy_bytes): set stages=0", schedule.location)


def check_skip(p: WeightStream, schedule: ScheduleShape, fmt: Format, target: Target) -> None:
    """What skipping empty blocks asks: the target's skipping layout for the format, each
    warp's N rows in one block, one vector per step (a stored vector's K is read from a table, per step), scale
    groups of whole vectors, and none of the options that load ahead by K position (unroll
    is free: the unrolled loop's steps are stored vectors like the rest)."""
    where, name = schedule.location, schedule.name
    layout = skip_layout(fmt, target, where)
    rows = schedule.tile_n // schedule.warps_n
    if layout.block_rows % rows:
        raise ScheduleError(
            f"schedule {name!r}: weight_stream skip_empty gives each warp N rows of one block of "
            f"format {fmt.name!r} ({layout.block_rows} N rows): tile_n / warps_n is {rows}, which "
            f"does not divide {layout.block_rows}", where)
    if schedule.tile_k != layout.stream.dense_chunk:
        raise ScheduleError(
            f"schedule {name!r}: weight_stream skip_empty steps one stored vector at a time: set "
            f"tile_k={layout.stream.dense_chunk}, not {schedule.tile_k}", where)
    g = fmt.scale.group_size
    if g == "K" or int(g) % layout.stream.dense_chunk:
        raise ScheduleError(
            f"schedule {name!r}: weight_stream skip_empty needs scale groups of whole vectors "
            f"({layout.stream.dense_chunk} K); format {fmt.name!r} has group_size {g}", where)
    for field, value in (("stages", p.stages), ("x_ahead", p.x_ahead), ("x_shuffle", p.x_shuffle)):
        if value:
            raise ScheduleError(
                f"schedule {name!r}: weight_stream skip_empty does not take {field}="
                f"{getattr(p, field)} (its steps are the stored vectors, known one fetch ahead)", where)


def check_shuffle(p: WeightStream, schedule: ScheduleShape, fmt: Format, target: Target) -> None:
    """x_shuffle replaces the two-element activation loads of layouts without the K shuffle
    (2:4 on the sparse MMA, whose groups of 4 forbid it; scale groups smaller than a vector);
    layouts with it already read each lane's activations as runs, scattered ones per element.
    The target's B lane table must allow the transpose (`layouts/activation_transpose.py`)."""
    where = schedule.location
    layout = stream_layout(fmt, target, where)
    if layout.k_perm is not None or layout.scatter is not None:
        raise ScheduleError(
            f"schedule {schedule.name!r}: weight_stream x_shuffle={p.x_shuffle} replaces two-element "
            f"activation loads; format {fmt.name!r} on {target.name} reads its activations otherwise (as runs "
            "of the K shuffle, or scattered): set x_shuffle=0", where)
    try:
        target_transpose_plan(target, layout.dense_tile_k, p.x_shuffle)
    except ScheduleError as e:
        raise ScheduleError(f"schedule {schedule.name!r}: {e.message}", where) from None


__all__ = ["WeightStream", "check_shuffle", "check_skip", "check_stream"]
