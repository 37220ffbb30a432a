"""Dense FP4 E2M1 weights with fp16 scales per group of 128 K positions (seed 002), with
one kernel per pipeline kind of seed 002."""
from marlin_dsl import (
    DoubleBuffered, FloatEncoding, Format, FusedDequant, Gemm, GroupScale, Multistage, Schedule,
    StripedKParallel, WeightStream,
)

E2M1 = FloatEncoding(bits=4, exp_bits=2, man_bits=1, bias=1)

fp4_g128 = Format("fp4_g128", E2M1, GroupScale(128), doc="dense FP4, group 128")

# Seed 002's tile: 64x64 outputs, K steps of 32, 4 simdgroups as 2x2, each owning 32x32.
double_buffered = Schedule("db_64x64x32", tile_m=64, tile_n=64, tile_k=32, warps_m=2, warps_n=2,
                           pipeline=DoubleBuffered())
fused = Schedule("fused_64x64x32", tile_m=64, tile_n=64, tile_k=32, warps_m=2, warps_n=2,
                 pipeline=FusedDequant())
striped = Schedule("striped_64x64x32_p4", tile_m=64, tile_n=64, tile_k=32, warps_m=2, warps_n=2,
                   pipeline=StripedKParallel(parallel=4, groups=16))

fp4_db = Gemm("fp4_g128_db", fp4_g128, double_buffered)
fp4_fused = Gemm("fp4_g128_fused", fp4_g128, fused)
fp4_striped = Gemm("fp4_g128_striped", fp4_g128, striped)

# Metal's small-M kernel (issue 16): the weight-stream pipeline on the simdgroup 8x8 lane
# layout, weights re-laid out at pack time (metal_lane_stream), one 128-bit load per lane a
# K step of 128 positions; the tuned schedule of `quantized_linear` for M <= 8.
stream_m8 = Schedule("metal_stream_m8", tile_m=8, tile_n=128, tile_k=128, warps_m=1, warps_n=8,
                    pipeline=WeightStream(k_warps=2))
fp4_stream = Gemm("fp4_g128_stream", fp4_g128, stream_m8)

# Metal's large-M kernel (issue 16): the multistage pipeline on the same layout, without
# asynchronous copies: each K step's weight vectors and activation tile are loaded into
# registers while the previous step computes, then stored into one threadgroup buffer between
# two barriers; 8 simdgroups side by side in N, each decoding its A fragments once per K tile
# for 64 rows. The tuned schedule of `quantized_linear` above 32 rows.
multistage = Schedule("metal_multistage", tile_m=64, tile_n=128, tile_k=128, warps_m=1, warps_n=8,
                      pipeline=Multistage(stages=2))
fp4_multistage = Gemm("fp4_g128_multistage", fp4_g128, multistage)
