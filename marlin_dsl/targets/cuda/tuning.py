"""CUDA's tuned tile tables: the schedule the weight-stream and multistage pipelines run with
for M rows of activations (and a [K, N] weight), from measurements on an H100
(bench/results/gpu/). `runtime.cuda_schedule` and the benchmarks pick schedules here."""
from __future__ import annotations

from ...errors import ScheduleError
from ...formats import Format
from ...formats.encodings import IntEncoding
from ...layouts.weight_stream import stream_layout
from ...machine.cuda import CUDA
from ...machine.target import Target
from ...schedule import Multistage, Schedule, Warpgroup, WeightStream

__all__ = ["DEQUANTIZE_MIN_M", "DEQUANTIZE_MIN_M_SMALL", "SKIP_MAX_M", "SKIP_MAX_STORED", "SKIP_MAX_STORED_SMALL",
           "dequantize_min_m", "max_stored", "multistage_schedule", "skip_schedule", "stream_step_k", "tuned_schedule",
           "warpgroup_roles_schedule", "warpgroup_schedule"]


def tuned_schedule(fmt: Format, m: int, target: Target | None = None, k: int | None = None,
                   n: int | None = None, warpgroup: bool = False) -> Schedule:
    """The tuned schedule for M rows of activations (and, when known, the weight's [K, N]):
    up to 64 rows (16 where N > K) the weight stream, tiles one MMA wide in M (8 or 16 rows)
    and many warps splitting K, so that enough 128-bit weight loads are in flight, or 32-row
    tiles over the same weights (served from L2 after the first); beyond, the multistage
    pipeline (`multistage_schedule`), or with `warpgroup` (the device has the target's
    warpgroup MMA) and more than WARPGROUP_MIN_M rows the warpgroup pipeline where the format
    takes it (`warpgroup_schedule`)."""
    target = target or CUDA  # None: this target (callers may pass another description)
    if warpgroup and m > WARPGROUP_MIN_M:
        try:
            return warpgroup_schedule(fmt, m, target, k, n)
        except ScheduleError:  # a format the warpgroup pipeline does not take
            pass
    pair_k = stream_step_k(fmt, target)  # two K vectors per step where a group covers both
    one_k = stream_layout(fmt, target).dense_chunk

    def make(name: str, tile_m: int, k_warps: int, depth: int = 1, warps_n: int = 1,
             tile_k: int = one_k, n_tiles: int = 1, x_ahead: int = 0, x_shuffle: int = 0) -> Schedule:
        return Schedule(name, tile_m=tile_m, tile_n=16 * warps_n * n_tiles, tile_k=tile_k, warps_m=1,
                        warps_n=warps_n, pipeline=WeightStream(k_warps=k_warps, depth=depth, x_ahead=x_ahead,
                                                               x_shuffle=x_shuffle))

    # From ncu on an H100, cold L2 (bench/results/issue15_h100_2026-11-25c/decode: the sweep of
    # k_warps x depth x K vectors per step for fp4 on 4096^2, 4096 x 14336, 14336 x 4096): at
    # M <= 8 two vectors per step and depth 2 win (7.8 / 16.0 / 14.4 us), with 16 warps
    # splitting K, 8 where N > K; at M = 16 one vector per step and depth 1 (9.7 / 19.9 /
    # 18.6 us; two vectors: 10.8 / 24.5 / 30.8), again 16 warps, 8 where N > K. Up to 64
    # rows, 32-row tiles where N <= K (ncu_kshuffle_probe_h100_2026-11-22.json), one vector a
    # step as at M = 16 (not swept).
    wide_n = k is not None and n is not None and n > k
    k_warps = 8 if wide_n else 16
    if stream_layout(fmt, target).sparse and m <= 16:
        # 2:4 on the sparse MMA: a step is one vector of 128 dense K whose B fragments are
        # 16 two-element loads per M tile, and waiting on them bounded the kernel. From ncu on
        # the H200, cold L2 (bench/results/issue33_h200_2026-11-28, fp4 2:4 on 4096^2,
        # 4096 x 14336, 14336 x 4096): at M <= 8 the B fragments loaded a step ahead
        # (x_ahead) take 7.6 / 17.4 / 17.2 us to 7.4 / 14.8 / 14.1 (run 2); at M = 16 two
        # 8-row M tiles over the same weights (the second read mostly from L2), two N tiles a
        # warp (each B fragment used twice), 8 warps and x_ahead take 18.9 / 52.9 / 54.6 us
        # (run 2) to 12.4 / 34.1 / 26.6 (run 3; the one-tile 16-row kernels ran at 72-96
        # registers in 512-thread blocks). int4 2:4 (72 registers) measured the same M = 16
        # schedule best; at M = 1 integer codes ran faster with 8 K warps than 16 on 4096^2
        # and 14336 x 4096 in two runs (run 3: 7.6 / 14.9 us against 8.9 / 16.2; run 4: 7.6 /
        # 15.5 against 8.8 / 16.2), float codes slower (fp4 2:4, run 4: 8.1 / 16.1 against
        # 7.7 / 14.1), so integer encodings take 8 K warps at M <= 8.
        # At M = 16 the two-element activation loads bounded the kernel at the L1 (run 17 on
        # the H200: L1 throughput 87%, 4.6 M tag requests on 4096 x 14336 against dense's
        # 2.1 M): 128-bit loads shared by the 4 lanes of a quad through warp shuffles
        # (`x_shuffle=4`) with 16-row M tiles, two N tiles a warp, depth 1 and x_ahead took
        # 12.9 / 34.6 / 26.9 us to 11.1 / 22.9 / 19.3 (run 18: 16 K warps where K > N, else 8;
        # dense fp4 8.7 / 18.8 / 17.3 in the same session). At M = 1 (one distinct row, every
        # load the same line) the shuffles did not pay (run 18: the tuned 7.2 / 14.2 / 13.5 us
        # stayed ahead of 24 variants); M = 2..8 was not measured with them.
        if m <= 8:
            sparse_k_warps = 8 if isinstance(fmt.element, IntEncoding) else k_warps
            return make("stream_m8_sparse", 8, sparse_k_warps, depth=2, x_ahead=1)
        long_k = k is not None and n is not None and k > n
        return make("stream_m16_sparse", 16, 16 if long_k else 8, depth=1, n_tiles=2, x_ahead=1, x_shuffle=4)
    if m <= 8:
        # Where N > K, 4 K warps (896 blocks of 4 warps on 4096 x 14336: one wave at 58
        # registers) rather than 8 (1.7 waves): 11.9 against 12.8 us for fp4 at M = 1 on the
        # H200 (ncu, cold L2; bench/results/issue34_h200_2026-11-29 run 7, one run); depth 3
        # or 4 were slower with either (13.8-19.5 us).
        return make("stream_m8", 8, 4 if wide_n else k_warps, depth=2, tile_k=pair_k)
    if m <= 16:
        return make("stream_m16", 16, k_warps)
    if m <= 64 and not wide_n:
        return make("stream_m32", 32, 8)
    # Beyond 64 rows, and from 17 where N > K, the multistage pipeline
    # (bench/results/gpu/ncu_m64_m128_probe_h100_2026-11-22.json: at M = 64 on 4096 x 14336
    # its 64 x 128 tiles take 67 us for fp4 and 49 us for fp4 2:4, the weight-stream 64-row
    # tiles 78 and 166 us; where N <= K the weight-stream tiles stay ahead: 82 vs 213 us).
    if stream_layout(fmt, target).scatter is not None:  # N:M without mma.sp: only the stream reads it
        return make("stream_m32", 32, 8)
    return multistage_schedule(fmt, m, target, k, n)


#: K vectors per weight-stream step where the format's scale groups cover them.
_STEP_VECTORS = 2


#: Rows of activations the skipping weight stream serves (decode); beyond, the dense kernels.
SKIP_MAX_M = 16
#: The largest stored share at which a layer skips. Between run 11's rows (H200, ncu: stored
#: shares 0.25, 0.5 and 1.0 of the same kernels, bench/results/issue33_h200_2026-11-29) the
#: skipping kernel breaks even with dense fp4 at 0.55 (4096 x 14336, M = 16) to 0.75 of the
#: vectors stored on the two large shapes; this keeps a margin below that and takes weights
#: pruned to half (0.50-0.51 stored) ...
SKIP_MAX_STORED = 0.52
#: ... and for weights of fewer than SMALL_WEIGHT elements, where the call's fixed part is a
#: larger share: 4096 x 4096 at M = 1 breaks even at 0.40 (1.11x at 0.25, 0.93x at 0.51)
SKIP_MAX_STORED_SMALL = 0.35
SMALL_WEIGHT = 1 << 25


def max_stored(k: int, n: int) -> float:
    """The largest stored share at which a [K, N] weight's layer runs the skipping kernels."""
    return SKIP_MAX_STORED if k * n >= SMALL_WEIGHT else SKIP_MAX_STORED_SMALL


def skip_schedule(fmt: Format, m: int, target: Target | None = None, k: int | None = None) -> Schedule:
    """The weight stream over each block's stored vectors (`WeightStream(skip_empty=True)`)
    for m <= SKIP_MAX_M rows of a block-pattern format. From ncu on an H200, cold L2
    (bench/results/issue33_h200_2026-11-28 run 9, 14336 x 4096 and 4096 x 14336 at random 50%
    and clustered 50% / 75%): unrolled by 2 (a loop-carried prefetch otherwise waits on its
    own load), 16 K warps where K has 128 or more vectors (8 below: a warp's few steps), at
    M = 16 depth 1 with 16 K warps (64 registers, 2 threadgroups an SM; depth 2 crossed to 72
    and halved the occupancy) and depth 2 with 8."""
    target = target or CUDA
    if m > SKIP_MAX_M:
        raise ScheduleError(f"skip_schedule: {m} rows; the skipping weight stream serves up to {SKIP_MAX_M}")
    vector = stream_layout(fmt, target).dense_chunk
    long_k = k is not None and k >= 128 * vector
    k_warps = 16 if long_k else 8
    depth = 1 if m > 8 and long_k else 2
    name = f"skip_m{8 if m <= 8 else 16}_kw{k_warps}"
    return Schedule(name, tile_m=8 if m <= 8 else 16, tile_n=16, tile_k=vector, warps_m=1, warps_n=1,
                    pipeline=WeightStream(k_warps=k_warps, depth=depth, unroll=2, skip_empty=True))


def stream_step_k(fmt: Format, target: Target | None = None) -> int:
    """The weight stream's tile_k: two consecutive K vectors per step where a scale group
    covers both (one scale load, conversion and multiply of the sums per two vectors: K-loop
    SASS per vector for fp4 at M = 1 80 -> 70.5, M = 16 97 -> 81.5; bench/probes/sass_count.py,
    bench/results/issue15_decode_notes.md), else one. Static counts only: the GPU sweep
    (bench/probes/decode_sweep.py --vectors 1,2) has the last word."""
    layout = stream_layout(fmt, target or CUDA)
    g = fmt.scale.group_size
    vectors = _STEP_VECTORS if g != "K" and int(g) % (_STEP_VECTORS * layout.dense_chunk) == 0 else 1
    return vectors * layout.dense_chunk


#: Threadgroups below which the large tiles leave an H100's 132 SMs too idle.
_FULL_GRID = 100


def multistage_schedule(fmt: Format, m: int, target: Target | None = None, k: int | None = None,
                        n: int | None = None) -> Schedule:
    """The multistage schedule for M rows (M > 64): 128 x 256 tiles (8 warps, each 64 M x 64 N
    rows, 3 stages) where they give the GPU enough threadgroups, else 64 x 128 (4 warps, each
    32 x 64, 4 stages). From bench/results/gpu/multistage_probe_h100_2026-11-22.json: at M =
    2048 the large tiles are fastest (273 us dense, 212 us 2:4 at 4096 x 4096); at M = 256 on
    N = 4096 they make 32 threadgroups and the small ones win."""
    target = target or CUDA  # None: this target (callers may pass another description)
    tile_k = stream_layout(fmt, target).dense_chunk
    n_eff = n if n is not None else 4096
    if -(-m // 128) * -(-n_eff // 256) >= _FULL_GRID:
        return Schedule("multistage_large", tile_m=128, tile_n=256, tile_k=tile_k, warps_m=2, warps_n=4,
                        pipeline=Multistage(stages=3))
    return Schedule("multistage_small", tile_m=64, tile_n=128, tile_k=tile_k, warps_m=2, warps_n=2,
                    pipeline=Multistage(stages=4))


#: Rows from which a layer decodes its weight once to W^T (the dequantize kernel,
#: lowering/dequantize.py) and multiplies with the fp16/bf16 GEMM (`mx.matmul`), where that is
#: faster than decoding per M tile inside our GEMMs, for weights of at least SMALL_WEIGHT
#: elements and for smaller ones (where the decode's fixed part weighs more). From the H200,
#: MLX wall clock, weights rotated past the L2 (bench/results/issue34_h200_2026-11-29 runs 3
#: and 5, fp4 and uint4_zp, f16 and bf16): on 4096 x 14336 and 14336 x 4096 the route took
#: 234-245 us at M = 1024 against our warpgroup GEMM's 244-300 (at 512 it lost: 156-169
#: against 141-156); on 4096 x 4096 it lost at 1024 (88-95 against 84-97), broke even at 1536
#: (114-116 against 117-120) and won at 2047 (138-140 against 159-165), on 4096 x 6144 it won
#: from 1536. mlx-lm prefills a 2048-token prompt as 2047 rows, then one.
DEQUANTIZE_MIN_M = 1024
DEQUANTIZE_MIN_M_SMALL = 1536


def dequantize_min_m(k: int, n: int) -> int:
    """The fewest rows at which a [K, N] weight's layer takes the dequantize route."""
    return DEQUANTIZE_MIN_M if k * n >= SMALL_WEIGHT else DEQUANTIZE_MIN_M_SMALL


#: Rows above which a device with the warpgroup MMA runs the warpgroup pipeline
#: (bench/results/issue15_h100_2026-11-25b: at M = 512 it is ahead of multistage on every shape).
WARPGROUP_MIN_M = 128


def warpgroup_schedule(fmt: Format, m: int, target: Target | None = None, k: int | None = None,
                       n: int | None = None) -> Schedule:
    """The warpgroup schedule (Hopper's wgmma): decoded weights in shared memory, 256 M rows
    per instruction (128 for at most 128 rows), 2 warpgroups of 64 N rows, 4 stages, weights
    loaded 2 steps ahead. From bench/results/issue15_h100_2026-11-25b/warpgroup_run5: 256 x 128
    tiles were fastest on every shape at M = 512 and 2048 (0.68-0.85x fp16 mx.matmul). A
    ScheduleError where the format or target has no warpgroup kernel."""
    target = target or CUDA
    # One K vector a step: two (tile_k = 128, `Warpgroup` takes it) halve the per-step work
    # but need 2x the shared memory (256-row tiles no longer fit) and ptxas moves the next
    # step's decode into the batch of 8 wgmmas and serialises it (C7514); not measured yet.
    layout = stream_layout(fmt, target)
    tile_k = layout.dense_chunk
    # 2:4 (the sparse wgmma, k32): a K vector is 128 activations, two swizzled rows, so a
    # 256-row stage is 64 KB and 4 of them no longer fit. With steps in pairs (lowering), 192 x
    # 128 tiles and 3 stages were the fastest at M = 2048 on every shape, 1.02-1.08x fp16, and
    # level with 128-row tiles at 512 (bench/results/issue15_h100_2026-11-25d/sparse_wgmma/
    # run5_pairs); 128-row tiles below 256 rows waste less of a partial tile.
    if layout.sparse:
        tile_m, stages = (192 if m > 256 else 128), 3
    else:
        tile_m, stages = (256 if m > 128 else 128), 4
    sched = Schedule(f"warpgroup_{tile_m}", tile_m=tile_m, tile_n=128, tile_k=tile_k, warps_m=1, warps_n=8,
                     pipeline=Warpgroup(stages=stages, depth=2))
    sched.check(fmt, target)
    return sched


def warpgroup_roles_schedule(fmt: Format, m: int, target: Target | None = None) -> Schedule:
    """The warpgroup schedule with warp roles (dense formats): one producer warpgroup decoding
    the 128 N rows of a block into 4 A slots, two consumer warpgroups multiplying 256 M rows and
    copying the activations 2 steps ahead into 4 slots. The best of the roles schedules timed on
    the H100 (bench/results/issue15_h100_2026-11-27: 150 / 516 / 475 us at M = 2048 on the three
    issue shapes in run 3, 153 / 532 / 478 in run 4), but up to 9% slower for fp4 than
    `warpgroup_schedule`'s (level on one shape in one run) and 9-18% for int4: the one producer
    warpgroup's decode bounds it. So `tuned_schedule` does not pick it. A
    ScheduleError where the format has no such kernel (2:4, block patterns)."""
    target = target or CUDA
    tile_m = 256 if m > 128 else 128
    sched = Schedule(f"warpgroup_roles_{tile_m}", tile_m=tile_m, tile_n=128, tile_k=stream_layout(fmt, target).dense_chunk,
                     warps_m=1, warps_n=8,
                     pipeline=Warpgroup(stages=4, depth=2, producers=1, a_stages=4, copies="consumers"))
    sched.check(fmt, target)
    return sched
