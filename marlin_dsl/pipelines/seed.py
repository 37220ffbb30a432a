"""Seed 002's pipelines: the A and B tiles staged in threadgroup memory (`DoubleBuffered`,
`FusedDequant`, `StripedKParallel`); Metal and CUDA. Lowered by `lowering/staged.py`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..errors import ScheduleError
from ..formats import Format
from ..machine.target import Target
from .base import ScheduleShape, register_pipeline


def check_staged(schedule: ScheduleShape, fmt: Format, target: Target) -> None:
    """The staged pipelines' needs: warp tiles of whole MMA tiles, K steps of whole MMA K and
    whole packed units of the format."""
    where, name = schedule.location, schedule.name
    wm, wn = schedule.warp_tile
    if wm % target.mma_m or wn % target.mma_n:
        raise ScheduleError(
            f"schedule {name!r}: warp tile {wm}x{wn} is not a multiple of {target.name}'s "
            f"MMA tile {target.mma_m}x{target.mma_n}", where)
    if schedule.tile_k % target.mma_k:
        raise ScheduleError(
            f"schedule {name!r}: tile_k={schedule.tile_k} is not a multiple of {target.name}'s "
            f"MMA k={target.mma_k}", where)
    if schedule.tile_k % fmt.k_granule:
        raise ScheduleError(
            f"schedule {name!r}: tile_k={schedule.tile_k} is not a multiple of format "
            f"{fmt.name!r}'s K granule {fmt.k_granule}", where)


class _Staged:
    """Shared behaviour of the staged pipelines: one warp per warp tile, the staged checks."""

    def validate(self, schedule: ScheduleShape) -> None:
        pass

    def warps(self, schedule: ScheduleShape) -> int:
        return schedule.warps_m * schedule.warps_n

    def check(self, schedule: ScheduleShape, fmt: Format, target: Target) -> None:
        check_staged(schedule, fmt, target)


@register_pipeline
@dataclass(frozen=True)
class DoubleBuffered(_Staged):
    """Seed 002's marlin_gemm: A and the dequantised B tile staged in threadgroup memory,
    two stages so loading tile k+1 overlaps computing tile k."""

    kind: Literal["double_buffered"] = "double_buffered"


@register_pipeline
@dataclass(frozen=True)
class FusedDequant(_Staged):
    """Seed 002's marlin_gemm_fused: A in threadgroup memory; each warp dequantises its own
    slice of B in registers into a small per-warp staging tile (warp barriers only for B)."""

    kind: Literal["fused_dequant"] = "fused_dequant"


@register_pipeline
@dataclass(frozen=True)
class StripedKParallel(_Staged):
    """Seed 002's marlin_gemm_striped: the (M tile, N tile, K slice) work units are
    linearised over a 1-D grid of `groups` threadgroups; each K slice writes a partial sum
    and the last threadgroup to arrive at a tile (atomic counter, no float atomics) reduces."""

    parallel: int = 2
    groups: int = 8
    kind: Literal["striped"] = "striped"

    def validate(self, schedule: ScheduleShape) -> None:
        if self.parallel < 1 or self.groups < 1:
            raise ScheduleError(f"schedule {schedule.name!r}: striped parallel and groups "
                                "must be positive", schedule.location)


__all__ = ["DoubleBuffered", "FusedDequant", "StripedKParallel", "check_staged"]
