"""FP4 with seed 003's block patterns: one byte per 8 K positions x 32 columns marks which K
positions hold any non-zero, so a kernel skips empty ones: it does not load a weight word
whose patterns are all empty, and decodes only the `count` positions listed in the
(count, offsets) table, dispatched on count into unrolled copies by the specialise pass.

Only clustered zeros (pruned channels, ReLU-like structure) make bytes other than 0xFF: an
unstructured 50%-sparse matrix has essentially no empty K position across 32 columns.
"""
from marlin_dsl import (
    BlockPatternSparsity, DoubleBuffered, FloatEncoding, Format, Gemm, GroupScale, Schedule, WeightStream,
)

fp4_blocks_g128 = Format(
    "fp4_blocks_g128",
    FloatEncoding(bits=4, exp_bits=2, man_bits=1, bias=1),
    GroupScale(128),
    sparsity=BlockPatternSparsity(block_k=8, block_n=32),
    doc="FP4 with 8x32 block patterns, group 128",
)

fp4_blocks_db = Gemm("fp4_blocks_g128_db", fp4_blocks_g128, Schedule("db_64x64x32", pipeline=DoubleBuffered()))

# Metal's small-M kernel (issue 16): the weight-stream pipeline on the simdgroup 8x8 lane
# layout (metal_lane_stream), the tuned schedule of `quantized_linear` for M <= 8. The values
# are stored dense and empty K positions hold codes that decode to 0, so the stream reads
# every value and ignores the patterns: it skips nothing (the K step is one 128-bit load per
# lane of all 16 K tiles, decoded in registers, where a skip would cost a branch per step).
stream_m8 = Schedule("metal_stream_m8", tile_m=8, tile_n=128, tile_k=128, warps_m=1, warps_n=8,
                     pipeline=WeightStream(k_warps=2))
fp4_blocks_stream = Gemm("fp4_blocks_g128_stream", fp4_blocks_g128, stream_m8)

# CUDA's decode kernel that skips (issue 33): the skipping layout stores per block of 32 N rows
# only the K vectors (64 K positions, one 128-bit load per lane) that hold a non-zero, and each
# warp, which owns one block, loops over its block's stored vectors: an empty vector is neither
# read nor multiplied (layouts/block_skip.py, lowering/weight_stream_skip.py). Pays where zeros
# cluster in runs of 64 K positions of a block (pruned channel groups); a pattern byte's 8
# positions alone are finer than a lane's load and skip nothing.
skip_m8 = Schedule("cuda_skip_m8", tile_m=8, tile_n=32, tile_k=64, warps_m=1, warps_n=1,
                   pipeline=WeightStream(k_warps=8, depth=2, skip_empty=True), targets=("cuda",))
fp4_blocks_skip = Gemm("fp4_blocks_g128_skip", fp4_blocks_g128, skip_m8)
