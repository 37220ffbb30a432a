"""Two-level scales (not in the library's examples before issue 14): one f32 scale per output
column times one 8-bit sub-scale per group of K positions,

    value = table[code] * (channel_scales[0, n] * scales[k // G, n])

`channel_scales` is [1, N] float32 and `scales` [K/G, N] uint8. With `sub_dtype="u8"` a
sub-scale is an integer multiplier 1..255 (the column scale is the column's largest group
scale / 255); with `sub_dtype="e8m0"` it is a power of two 2**(e - 127) <= 1 (OCP E8M0).
8 bits of scale per group instead of 16, one f32 per column. `TwoLevelScale` is a scale scheme
(marlin_dsl/formats/scaling/two_level.py): its buffers, quantiser, reference, validation,
textual form and in-kernel load and apply are its own; the lowering and the printers have
no code for it.
"""
from marlin_dsl import (
    DoubleBuffered, FloatEncoding, Format, FusedDequant, Gemm, IntEncoding, Schedule, TwoLevelScale,
    WeightStream,
)

int4_2l = Format(
    "int4_two_level_g64",
    IntEncoding(bits=4, offset=8),  # value = code - 8, in -8..7
    TwoLevelScale(64, sub_dtype="u8"),  # f32 per column x u8 multiplier 1..255 per group of 64
    doc="signed INT4, f32 column scales times u8 group sub-scales, group 64",
)

fp4_2l = Format(
    "fp4_two_level_g32",
    FloatEncoding(bits=4, exp_bits=2, man_bits=1, bias=1),  # E2M1
    TwoLevelScale(32, sub_dtype="e8m0"),  # f32 per column x power of two per group of 32
    doc="FP4 E2M1, f32 column scales times E8M0 group sub-scales, group 32",
)

fused = Schedule("fused_64x64x32", pipeline=FusedDequant())
double_buffered = Schedule("db_64x64x32", tile_m=64, tile_n=64, tile_k=32, warps_m=2, warps_n=2,
                           pipeline=DoubleBuffered())

int4_2l_fused = Gemm("int4_2level_g64_fused", int4_2l, fused)
fp4_2l_db = Gemm("fp4_2level_g32_db", fp4_2l, double_buffered)

# Metal's small-M kernel (issue 16): the weight-stream pipeline on the simdgroup 8x8 lane
# layout, weights re-laid out at pack time (metal_lane_stream), one 128-bit load per lane a
# K step of 128 positions; the tuned schedule of `quantized_linear` for M <= 8. Metal only: on
# CUDA's 16-wide tiles 128 positions are two loads a step, which needs scale groups covering
# whole steps, not groups of 64 or 32.
stream_m8 = Schedule("metal_stream_m8", tile_m=8, tile_n=128, tile_k=128, warps_m=1, warps_n=8,
                    pipeline=WeightStream(k_warps=2), targets=("metal",))
int4_2l_stream = Gemm("int4_2level_g64_stream", int4_2l, stream_m8)
fp4_2l_stream = Gemm("fp4_2level_g32_stream", fp4_2l, stream_m8)
