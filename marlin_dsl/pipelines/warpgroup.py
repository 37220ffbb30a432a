"""The warpgroup pipeline (`Warpgroup`, large M on targets with a warpgroup MMA: Hopper's
wgmma). Lowered by `lowering/warpgroup.py`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..errors import ScheduleError
from ..formats import Format
from ..layouts.weight_stream import stream_layout
from ..machine.target import Target
from .base import ScheduleShape, is_positive_int, register_pipeline
from .weight_stream import check_stream


#: registers a consumer warp of the warp-role kernel needs besides its accumulator (the
#: descriptors, slot indices and loop state of the wgmma loop; ptxas used 26 at tile_m = 256)
_CONSUMER_REGISTERS = 26


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
    #: A in registers, dense formats: decode the next step's A while this step's wgmmas run
    #: (Machete's overlap within a warpgroup) instead of after their wait. The K loop runs two
    #: steps a pass so that the two steps' A fragments are distinct registers: decoding into
    #: the registers a queued wgmma reads made ptxas serialise the batch (C7513, nvcc 13.0)
    decode_ahead: bool = False
    #: 2:4 formats, A in shared memory: K steps per loop pass, 1 or 2 (the sparse wgmma reads
    #: its metadata register when it executes, so a pass retires all its steps' wgmmas before
    #: the loop goes round, and only the steps before its last run on while the next is
    #: prepared). Longer passes were tried: at 3 ptxas serialises the wgmmas (C7513), at 4 it
    #: loaded a later step's words into a register a queued wgmma still read (its SASS, by
    #: `bench/probes/warpgroup_gpu.py prepare`'s scan)
    sparse_pass: int = 2
    #: producer warpgroups (0: none, every warp does everything). With producers the warps
    #: specialise (lowering/warpgroup_roles.py): producer warps copy the activation tiles and
    #: decode the weights into shared memory, the consumer warpgroups (warps_n / 4) only issue
    #: the wgmmas and hold the accumulators, and the two meet at mbarriers. The threadgroup
    #: has 4 * producers more warps; each producer warp decodes warps_n / (4 * producers) of
    #: the block's 16-row N tiles. Every thread gets the same registers (ptxas allocates no
    #: more to one role), so the consumers' accumulators must fit the even share (`check`)
    producers: int = 0
    #: with producers: decoded-weight (A) slots in shared memory; the activation slots are
    #: `stages`, the copies run stages - a_stages steps ahead of the decode
    a_stages: int = 3
    #: with producers: who copies the activation tiles. "producers" (every step's copies, then
    #: the decode), or "consumers" (the warps that hold the accumulators and otherwise only wait
    #: for the tensor cores; they run the copies stages - 2 steps ahead and meet each other at
    #: an mbarrier when a step's have landed, so the producers only decode)
    copies: Literal["producers", "consumers"] = "producers"
    #: the accumulator stores: "branch" (a tile inside M and N stores unpredicated behind a
    #: branch, others predicated) or "predicated" (each store checks M and N). ptxas (nvcc
    #: 13.0) serialised every wgmma of kernels whose stores sat in the final wait's block
    #: (C7514: fp4 with bf16, uint4_zp with f16, the warp-role kernels); with the branch none
    #: is. On the H100 the branch made uint4_zp f16 6-21% faster and fp4 f16 between 11%
    #: slower (M = 512) and 10% faster (M = 2048), around the 7% two identical kernels differ
    #: by (bench/README.md, issue 15's sixth round). Warp-role kernels always branch.
    epilogue: Literal["branch", "predicated"] = "branch"
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
        if self.epilogue not in ("branch", "predicated"):
            raise ScheduleError(f"schedule {schedule.name!r}: warpgroup epilogue must be 'branch' or "
                                f"'predicated', got {self.epilogue!r}", where)
        if not isinstance(self.decode_ahead, bool):
            raise ScheduleError(f"schedule {schedule.name!r}: warpgroup decode_ahead must be True or False, "
                                f"got {self.decode_ahead!r}", where)
        if self.decode_ahead and self.a_source != "registers":
            raise ScheduleError(f"schedule {schedule.name!r}: warpgroup decode_ahead overlaps the decode "
                                "into A registers with the wgmmas: a_source must be 'registers' (with A in "
                                "shared memory the next step's decode already runs during this step's)", where)
        if self.a_source == "shared" and self.stages < 3:
            raise ScheduleError(f"schedule {schedule.name!r}: warpgroup with a_source='shared' keeps one "
                                f"step's wgmmas in flight while the next is copied: stages must be "
                                f"at least 3, got {self.stages}", where)
        if not isinstance(self.producers, int) or isinstance(self.producers, bool) or self.producers < 0 or (
                self.producers and (schedule.warps_n % 4 or (schedule.warps_n // 4) % self.producers)):
            raise ScheduleError(f"schedule {schedule.name!r}: warpgroup producers is 0 (no warp roles) or a "
                                f"number of warpgroups dividing warps_n / 4 = {schedule.warps_n // 4} (each "
                                f"producer warp decodes the same number of 16-row N tiles), got {self.producers!r}",
                                where)
        if self.producers:
            if self.a_source != "shared":
                raise ScheduleError(f"schedule {schedule.name!r}: warpgroup producers decode into shared "
                                    "memory: a_source must be 'shared'", where)
            if self.copies not in ("producers", "consumers"):
                raise ScheduleError(f"schedule {schedule.name!r}: warpgroup copies must be 'producers' or "
                                    f"'consumers', got {self.copies!r}", where)
            top = self.stages - 1 if self.copies == "producers" else 8
            if not is_positive_int(self.a_stages) or not 2 <= self.a_stages <= top:
                raise ScheduleError(f"schedule {schedule.name!r}: warpgroup a_stages (decoded-weight slots) "
                                    f"must be an integer 2..{top} (producers copying run the copies "
                                    f"stages - a_stages steps ahead), got {self.a_stages!r} with stages "
                                    f"{self.stages}", where)
        if schedule.warps_m != 1:
            raise ScheduleError(f"schedule {schedule.name!r}: warpgroup splits N among warps (one "
                                f"instruction covers the tile's M): warps_m must be 1, got "
                                f"{schedule.warps_m}", where)

    def warps(self, schedule: ScheduleShape) -> int:
        return schedule.warps_m * schedule.warps_n + 4 * self.producers

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
        if self.producers and target.warpgroup_warps != 4:
            raise ScheduleError(f"schedule {name!r}: warpgroup producers are warpgroups of 4 warps; "
                                f"{target.name}'s warpgroup has {target.warpgroup_warps}", where)
        if self.producers and target.registers_per_block:
            threads = (schedule.warps_n + 4 * self.producers) * target.warp_size
            share = min(target.max_registers, target.registers_per_block // threads) // 8 * 8
            need = schedule.tile_m // 2 + _CONSUMER_REGISTERS
            if need > share:
                raise ScheduleError(f"schedule {name!r}: warpgroup with {self.producers} producer warpgroups "
                                    f"is {threads} threads, {share} registers each; a consumer's {schedule.tile_m}"
                                    f"-column accumulator and loop need about {need}: fewer producers or a "
                                    "smaller tile_m", where)
        if self.decode_ahead and layout.sparse:
            raise ScheduleError(f"schedule {name!r}: warpgroup decode_ahead takes dense formats; the sparse "
                                f"wgmma of {fmt.name!r} reads its metadata register when it executes, so "
                                "the next step's words must wait for this step's wgmmas: use "
                                "decode_ahead=False", where)
        if self.producers and layout.sparse:
            raise ScheduleError(f"schedule {name!r}: warpgroup producers (warp roles) take dense formats; "
                                f"{fmt.name!r} is 2:4 (its metadata words would have to reach the consumer "
                                "warps through shared memory): use producers=0", where)
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
