"""Metal's tuned schedules: the weight-stream pipeline (`WeightStream`) on the simdgroup 8x8
lane layout for every M of a format the stream layout takes (`runtime.tuned_schedule`).

No Apple GPU was available to time them: the tiles are chosen by the static cost model
(docs/COST_MODEL.md, `marlin-dsl compile --cost`), per weight at M = 1:

- tile_n = 128 (16 N tiles of 8 rows, 2 per simdgroup): the activations a threadgroup reads
  per weight (M x 2 bytes / tile_n) fall below the first-generation kernels' (64 columns);
  2 N tiles per simdgroup keep the estimate at ~57 registers (4 tiles: ~97, 14% fewer
  instructions but half the occupancy);
- k_warps = 2: 16 simdgroups (512 threads) per threadgroup, each streaming every other K
  vector of its rows, so a 4096-wide N gives 512 simdgroups of weight loads in flight;
- tile_m: one 8-column B tile up to 8 rows, two up to 16, four beyond. There is no Metal
  multistage pipeline yet (issue 16), so large M runs the stream with 32-row tiles too: one
  physical weight layout serves every M, as on CUDA.
"""
from __future__ import annotations

from ...errors import ScheduleError
from ...formats import Format
from ...layouts.weight_stream import stream_layout
from ...schedule import Schedule, WeightStream
from .description import METAL

__all__ = ["tuned_schedule", "TILE_N", "WARPS_N", "K_WARPS"]

TILE_N, WARPS_N, K_WARPS = 128, 8, 2


def tuned_schedule(fmt: Format, m: int, k: int | None = None, n: int | None = None) -> Schedule:
    """The Metal weight-stream schedule for m rows (ScheduleError where the stream layout does
    not take the format: the caller falls back to the format's own layout and kernels)."""
    if m < 1:
        raise ScheduleError(f"metal: a schedule needs at least one row of activations, got M={m}")
    layout = stream_layout(fmt, METAL)
    tile_m = 8 if m <= 8 else 16 if m <= 16 else 32
    return Schedule(f"metal_stream_m{tile_m}", tile_m=tile_m, tile_n=TILE_N, tile_k=layout.dense_chunk,
                    warps_m=1, warps_n=WARPS_N, pipeline=WeightStream(k_warps=K_WARPS))
