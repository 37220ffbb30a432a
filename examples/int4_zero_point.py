"""INT4 weights: unsigned codes with per-group integer zero points (GPTQ style), and signed
codes stored as offset binary (stored = actual + 8) with symmetric scales (seed 002)."""
from marlin_dsl import (
    FusedDequant, Format, Gemm, GroupScale, IntEncoding, Multistage, Schedule, WeightStream, ZeroPoint,
)

uint4_zp_g128 = Format(
    "uint4_zp_g128",
    IntEncoding(bits=4),  # codes 0..15
    GroupScale(128),
    ZeroPoint("u8"),  # value = (code - zero) * scale
    doc="unsigned INT4 with zero points, group 128",
)

int4_g64 = Format(
    "int4_g64",
    IntEncoding(bits=4, offset=8),  # value = code - 8, in -8..7
    GroupScale(64),
    doc="signed INT4 (offset binary), group 64",
)

fused = Schedule("fused_64x64x32", pipeline=FusedDequant())

uint4_zp_fused = Gemm("uint4_zp_g128_fused", uint4_zp_g128, fused)
int4_fused = Gemm("int4_g64_fused", int4_g64, fused)

# Metal's small-M kernel (issue 16): the weight-stream pipeline on the simdgroup 8x8 lane
# layout, weights re-laid out at pack time (metal_lane_stream), one 128-bit load per lane a
# K step of 128 positions; the tuned schedule of `quantized_linear` for M <= 8. Metal only: on
# CUDA's 16-wide tiles 128 positions are two loads a step, which needs scale groups covering
# whole steps, and int4_g64's groups are 64.
stream_m8 = Schedule("metal_stream_m8", tile_m=8, tile_n=128, tile_k=128, warps_m=1, warps_n=8,
                    pipeline=WeightStream(k_warps=2), targets=("metal",))
uint4_zp_stream = Gemm("uint4_zp_g128_stream", uint4_zp_g128, stream_m8)
int4_stream = Gemm("int4_g64_stream", int4_g64, stream_m8)

# Metal's large-M kernel (issue 16, see dense_fp4.py): the multistage pipeline through
# registers into one threadgroup buffer; the tuned schedule of `quantized_linear` above 32 rows.
multistage = Schedule("metal_multistage", tile_m=64, tile_n=128, tile_k=128, warps_m=1, warps_n=8,
                      pipeline=Multistage(stages=2))
uint4_zp_multistage = Gemm("uint4_zp_g128_multistage", uint4_zp_g128, multistage)
