"""INT3 weights with per-group integer zero points, group size 32 (not a built-in format).

Each weight is an unsigned 3-bit code 0..7 and dequantises as (code - zero) * scale, with one
fp16 scale and one u8 zero point per 32 consecutive K positions and column ([K/32, N] each).
Codes are packed along K as one continuous LSB-first bit stream in uint32 words: 32 codes
take 96 bits = 3 words, and codes 10 and 21 straddle a word boundary (code 10 uses bits
[31:30] of word 0 and bit [0] of word 1; code 21 uses bit [31] of word 1 and bits [1:0] of
word 2). The packed codes are [3*K/32, N] uint32.
"""
from marlin_dsl import Format, FusedDequant, Gemm, GroupScale, IntEncoding, Schedule, WeightStream, ZeroPoint

int3_zp = Format(
    "int3_zp",
    IntEncoding(bits=3),  # codes 0..7, an integer grid, so zero points apply
    GroupScale(32),
    ZeroPoint("u8"),  # value = (code - zero) * scale
    doc="unsigned INT3 with u8 zero points, group 32, 3-bit bit-stream packing",
)

# A kernel for it: the compiler derives the 3-word decode (with the straddling codes) from
# the description above; nothing in the compiler knows INT3.
int3_fused = Gemm("int3_zp_fused", int3_zp, Schedule("fused_64x64x32", pipeline=FusedDequant()))

# Metal's small-M kernel (issue 16): the weight-stream pipeline on the simdgroup 8x8 lane
# layout (metal_lane_stream). 3 bits do not divide a 16-bit half, so the layout packs 5 codes
# per half and leaves its top bit 0 (3.2 bits a code): one 128-bit load per lane holds 20 K
# tiles, so a K step is 160 positions (five groups of 32), not 128; the tuned schedule of
# `quantized_linear` for M <= 8. Metal only: on CUDA's 16-wide tiles 160 positions are two
# loads a step, which needs scale groups covering whole steps, not groups of 32.
stream_m8 = Schedule("metal_stream_m8", tile_m=8, tile_n=128, tile_k=160, warps_m=1, warps_n=8,
                     pipeline=WeightStream(k_warps=2), targets=("metal",))
int3_stream = Gemm("int3_zp_stream", int3_zp, stream_m8)

# CUDA's small-M kernel for the same format (what `tuned_schedule(int3_zp, 1, target=CUDA)`
# picks): one 128-bit load per lane of mma.sync's 16-wide tiles is 80 positions, 16 warps split
# K. CUDA only (Metal's step is the 160 above). A kernel that wants another schedule on each
# target is one Gemm per target, each schedule declaring its own.
cuda_stream_m8 = Schedule("cuda_stream_m8", tile_m=8, tile_n=16, tile_k=80, warps_m=1, warps_n=1,
                          pipeline=WeightStream(k_warps=16, depth=2), targets=("cuda",))
int3_stream_cuda = Gemm("int3_zp_stream_cuda", int3_zp, cuda_stream_m8)
