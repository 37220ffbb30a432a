"""Metal's tuned schedules, on the simdgroup 8x8 lane layout (`metal_lane_stream`) for every M of
a format the stream layout takes (`runtime.tuned_schedule`): the weight-stream pipeline
(`WeightStream`) up to MULTISTAGE_MIN_M rows, the multistage pipeline (`Multistage`, threadgroup
buffers fed through registers) above. One physical weight layout serves every M, as on CUDA.

No Apple GPU was available to time them: the tiles are chosen by the static cost model
(docs/COST_MODEL.md, `marlin-dsl compile --cost`; the numbers are in docs/notes/i16-mstage.md).

The weight stream, per weight at M = 1:

- tile_n = 128 (16 N tiles of 8 rows, 2 per simdgroup): the activations a threadgroup reads
  per weight (M x 2 bytes / tile_n) fall below the first-generation kernels' (64 columns);
  2 N tiles per simdgroup keep the estimate at ~57 registers (4 tiles: ~97, 14% fewer
  instructions but half the occupancy);
- k_warps = 2: 16 simdgroups (512 threads) per threadgroup, each streaming every other K
  vector of its rows, so a 4096-wide N gives 512 simdgroups of weight loads in flight;
- tile_m: one 8-column B tile up to 8 rows, two up to 16, four up to 32.

The multistage pipeline above 32 rows (lane instructions per weight, f16, the example formats
the stream takes; docs/notes/i16-mstage.md has the tables):

- 64 x 128 tiles, 8 simdgroups side by side in N (16 N rows x 64 M rows each), so every A
  fragment is decoded once per threadgroup and multiplied with 8 B fragments; one
  threadgroup buffer (stages = 2, 25.6 KB with the activation rows padded: two do not fit
  32 KB), 2 barriers per K step of 128;
- the threshold: above 32 rows the stream needs two 32-row tiles where one 64-row multistage
  tile does, and one multistage tile costs less than two stream tiles for every format
  (16.8 / 16.4 / 11.8 / 16.6 / 22.6 against 20.2 / 19.4 / 26.3 / 36.0 / 48.0 for fp4_g128,
  uint4_zp_g128, int4_g64 and the two two-level formats: 16-55% fewer per row), and its loads
  ask for 1.6 bytes per weight per 64 rows against the stream's 4.6 per 32. Up to 32 rows one
  stream tile costs less where the layout has the K shuffle (fp4_g128: 10.1 against 16.8; a
  32-row multistage tile, 10.3, is no cheaper) and needs no barrier;
- 2 x 4 simdgroups (32 x 32 rows each, decoding every A fragment twice) cost 5-8% less with
  the K shuffle and 5-50% more without it; 4 N tiles x 8 M tiles per simdgroup (12.4 for
  fp4_g128) need ~250 registers by the estimate, the chosen tile 99-191 (115-136 before the
  instruction scheduler, passes/interleave.py, hoists the stage's loads).
"""
from __future__ import annotations

from ...errors import ScheduleError
from ...formats import Format
from ...layouts.weight_stream import VECTOR_WORDS, stream_layout
from ...schedule import Multistage, Schedule, WeightStream
from ...machine.metal import METAL

__all__ = ["tuned_schedule", "multistage_schedule", "TILE_N", "WARPS_N", "K_WARPS", "MULTISTAGE_MIN_M"]

TILE_N, WARPS_N, K_WARPS = 128, 8, 2
#: Rows above which the multistage pipeline runs (module docstring: beyond the stream's
#: largest tile, one 64-row multistage tile costs fewer instructions than two stream tiles).
MULTISTAGE_MIN_M = 32
#: The multistage tile: M rows, N rows, simdgroups side by side in N, threadgroup stages.
MS_TILE_M, MS_TILE_N, MS_WARPS_N, MS_STAGES = 64, 128, 8, 2
#: Activation bytes of f16 and bf16 alike.
_ACT_BYTES = 2


def tuned_schedule(fmt: Format, m: int, k: int | None = None, n: int | None = None) -> Schedule:
    """The Metal schedule for m rows: the weight stream up to MULTISTAGE_MIN_M rows, the
    multistage pipeline above (where its tile fits the format's K step in threadgroup memory;
    else the stream's 32-row tile). ScheduleError where the stream layout does not take the
    format: the caller falls back to the format's own layout and kernels."""
    if m < 1:
        raise ScheduleError(f"metal: a schedule needs at least one row of activations, got M={m}")
    layout = stream_layout(fmt, METAL)
    if m > MULTISTAGE_MIN_M:
        schedule = multistage_schedule(fmt, m, k, n)
        if schedule is not None:
            return schedule
    tile_m = 8 if m <= 8 else 16 if m <= 16 else 32
    return Schedule(f"metal_stream_m{tile_m}", tile_m=tile_m, tile_n=TILE_N, tile_k=layout.dense_chunk,
                    warps_m=1, warps_n=WARPS_N, pipeline=WeightStream(k_warps=K_WARPS))


def multistage_schedule(fmt: Format, m: int, k: int | None = None, n: int | None = None) -> Schedule | None:
    """The multistage schedule (module docstring), or None where its buffer (the activation
    tile of one K step and the weight vectors of the tile's N rows) would not fit Metal's
    threadgroup memory (a K step of the stream layout is 128 positions for 4-bit codes, 256
    for 2-bit ones) or the pipeline's own check refuses the format's layout (N:M formats that
    the lanes scatter themselves): the stream serves every M. ScheduleError where the stream
    layout does not take the format."""
    layout = stream_layout(fmt, METAL)
    row = (layout.dense_chunk * _ACT_BYTES + METAL.shared_row_pad_bytes) * MS_TILE_M
    words = VECTOR_WORDS + (layout.meta_words if layout.sparse else 0)
    weights = MS_TILE_N // layout.tile_rows * layout.lanes * words * 4
    if (MS_STAGES - 1) * (row + weights) > METAL.max_shared_bytes:
        return None
    schedule = Schedule("metal_multistage", tile_m=MS_TILE_M, tile_n=MS_TILE_N, tile_k=layout.dense_chunk,
                        warps_m=1, warps_n=MS_WARPS_N, pipeline=Multistage(stages=MS_STAGES))
    try:
        schedule.check(fmt, METAL)
    except ScheduleError:
        return None
    return schedule
