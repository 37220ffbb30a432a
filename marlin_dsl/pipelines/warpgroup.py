"""The warpgroup pipeline (`Warpgroup`, large M on targets with a warpgroup MMA: Hopper's
wgmma). Lowered by `lowering/warpgroup.py`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..errors import ScheduleError
from ..formats import Format
from ..layouts.weight_stream import stream_layout
from ..targets.base import Target
from .base import ScheduleShape, is_positive_int, register_pipeline
from .weight_stream import check_stream


@register_pipeline
@dataclass(frozen=True)
class Warpgroup:
    """Machete's idea in the stream family: the weight-stream product and physical layout
    (Y^T = W^T X^T, the weights as the MMA's A operand in fragment order, chosen at pack time)
    with the warpgroup MMA, whose B (the activation tile, up to 256 M rows) comes from shared
    memory: each warp decodes its 16 N rows of A once per K tile straight into the registers
    the instruction reads (`a_source`), and one instruction multiplies them with every M row of the tile,
    so the decode is amortised over tile_m columns. Activations are copied into shared memory
    asynchronously (`stages` K steps in flight) in the target's swizzled rows, in the K order
    the weight layout uses; weight vectors go from device memory to registers `depth` steps
    ahead; the next step's A is decoded while this step's MMAs run.

    Schedule fields: warps_n warps (whole warpgroups), each one MMA M (16) of N rows, so
    tile_n = 16 * warps_n; warps_m 1; tile_m the instruction's N (a multiple of 8 up to the
    target's maximum, 256 on CUDA); tile_k the layout's vector chunk."""

    stages: int = 4
    depth: int = 1  # K steps whose weight vectors are in registers ahead of the one decoding
    #: where the wgmma reads the decoded weights: "shared" (the warps store them in swizzled
    #: rows; the next step's copies and decode run while this step's wgmmas do) or "registers"
    #: (the A fragments themselves; a warp waits for its wgmmas before decoding the next step,
    #: since ptxas serialises a batch whose a registers may be overwritten before its wait)
    a_source: Literal["shared", "registers"] = "shared"
    #: 2:4 formats, A in shared memory: K steps per loop pass, 1 or 2 (the sparse wgmma reads
    #: its metadata register when it executes, so a pass retires all its steps' wgmmas before
    #: the loop goes round, and only the steps before its last run on while the next is
    #: prepared). Longer passes were tried: at 3 ptxas serialises the wgmmas (C7513), at 4 it
    #: loaded a later step's words into a register a queued wgmma still read (its SASS, by
    #: `bench/warpgroup_gpu.py prepare`'s scan)
    sparse_pass: int = 2
    kind: Literal["warpgroup"] = "warpgroup"

    def validate(self, schedule: ScheduleShape) -> None:
        where = schedule.location
        if not is_positive_int(self.stages) or not 2 <= self.stages <= 8:
            raise ScheduleError(f"schedule {schedule.name!r}: warpgroup stages must be an integer "
                                f"2..8, got {self.stages!r}", where)
        if not is_positive_int(self.depth) or not 1 <= self.depth <= 4:
            raise ScheduleError(f"schedule {schedule.name!r}: warpgroup depth must be an integer "
                                f"1..4, got {self.depth!r}", where)
        if not is_positive_int(self.sparse_pass) or self.sparse_pass not in (1, 2):
            raise ScheduleError(f"schedule {schedule.name!r}: warpgroup sparse_pass must be 1 or 2 "
                                f"(steps per loop pass of the sparse wgmma), got {self.sparse_pass!r}", where)
        if self.a_source not in ("shared", "registers"):
            raise ScheduleError(f"schedule {schedule.name!r}: warpgroup a_source must be 'shared' or "
                                f"'registers', got {self.a_source!r}", where)
        if self.a_source == "shared" and self.stages < 3:
            raise ScheduleError(f"schedule {schedule.name!r}: warpgroup with a_source='shared' keeps one "
                                f"step's wgmmas in flight while the next is copied: stages must be "
                                f"at least 3, got {self.stages}", where)
        if schedule.warps_m != 1:
            raise ScheduleError(f"schedule {schedule.name!r}: warpgroup splits N among warps (one "
                                f"instruction covers the tile's M): warps_m must be 1, got "
                                f"{schedule.warps_m}", where)

    def warps(self, schedule: ScheduleShape) -> int:
        return schedule.warps_m * schedule.warps_n

    def check(self, schedule: ScheduleShape, fmt: Format, target: Target) -> None:
        where, name = schedule.location, schedule.name
        wg = target.warpgroup_mma
        if wg is None or target.warpgroup_b_layout is None:
            raise ScheduleError(f"schedule {name!r}: the warpgroup pipeline needs a warpgroup MMA, "
                                f"which {target.name} does not have", where)
        check_stream(schedule, self.kind, fmt, target, vectors=True)
        layout = stream_layout(fmt, target, where)
        _, max_n, k = wg
        if layout.sparse:
            if target.warpgroup_sparse_k is None:
                raise ScheduleError(f"schedule {name!r}: {target.name} has no sparse warpgroup MMA "
                                    f"for the 2:4 format {fmt.name!r}; use multistage", where)
            k = target.warpgroup_sparse_k // 2  # A's compressed columns per instruction
        if layout.tile_cols != k or layout.tile_rows != target.mma_m:
            raise ScheduleError(f"schedule {name!r}: the weight layout's A tiles are "
                                f"{layout.tile_rows}x{layout.tile_cols}, the warpgroup MMA's "
                                f"per-warp A is {target.mma_m}x{k}", where)
        if schedule.warps_n % target.warpgroup_warps:
            raise ScheduleError(f"schedule {name!r}: warps_n = {schedule.warps_n} is not a whole "
                                f"number of warpgroups ({target.warpgroup_warps} warps)", where)
        if schedule.tile_n != target.mma_m * schedule.warps_n:
            raise ScheduleError(f"schedule {name!r}: warpgroup gives each warp one MMA M "
                                f"({target.mma_m}) of N rows: tile_n must be "
                                f"{target.mma_m * schedule.warps_n}, got {schedule.tile_n}", where)
        if not 8 <= schedule.tile_m <= max_n or schedule.tile_m % 8:
            raise ScheduleError(f"schedule {name!r}: tile_m is the warpgroup MMA's N: a multiple "
                                f"of 8 up to {max_n}, got {schedule.tile_m}", where)
        elem_bytes = 2
        row = target.warpgroup_b_layout.row_bytes // elem_bytes
        if layout.chunk != row:
            raise ScheduleError(f"schedule {name!r}: a K vector of {layout.chunk} stored weights "
                                f"does not fill one {target.warpgroup_b_layout.row_bytes}-byte "
                                f"swizzled row ({row} elements)", where)


__all__ = ["Warpgroup"]
