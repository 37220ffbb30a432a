"""NF4-like value table with pair-wise 4:8 structured sparsity (seed 001's u4/s4 and e2m1
`mma.sp` granularity), not a built-in format.

Every eight consecutive K positions form a block of four two-wide sub-chunks; two sub-chunks
(four values) are kept, so each pair of adjacent K positions is stored or dropped together.
The block's metadata field is `(pos1 << 2) | pos0` over sub-chunk positions pos0 < pos1 in
0..3, the same six nibbles (4, 8, 9, 12, 13, 14) as 2:4, packed 8 a uint32 word LSB first, so
one metadata word covers 64 K positions: metadata is [K/64, N]. The kept codes are packed 8 a
uint32 word in dense-K order ([K/16, N]). Codes index the 16-entry table below (the NormalFloat4
quantiles of QLoRA, normalised to [-1, 1]), scaled by one fp16 scale per 64 K positions.
"""
from marlin_dsl import DoubleBuffered, Format, Gemm, GroupScale, NMSparsity, Schedule, TableEncoding, WeightStream

NF4_VALUES = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)

nf4_pairwise_4of8 = Format(
    "nf4_pairwise_4of8",
    TableEncoding(bits=4, values=NF4_VALUES),
    GroupScale(64),
    sparsity=NMSparsity(2, 4, chunk=2),  # 2 of 4 two-wide sub-chunks = 4 of 8 values
    doc="NF4-like table, pair-wise 4:8 sparse (2 of 4 pairs), group 64",
)

# One metadata word covers 64 K positions, so K steps of 64; a 32-row tile keeps the
# double-buffered stages within 32 KB of threadgroup memory (2*32*64 + 2*64*64 + 32*64 halves).
db_32x64x64 = Schedule("db_32x64x64", tile_m=32, tile_n=64, tile_k=64, warps_m=1, warps_n=4,
                       pipeline=DoubleBuffered())
nf4_pairwise_db = Gemm("nf4_pairwise_4of8_db", nf4_pairwise_4of8, db_32x64x64)

# Metal's small-M kernel (issue 16): the weight stream with the lanes scattering their own kept
# pairs (metal_lane_stream, layouts/sparse_scatter.py): one 128-bit code load and one metadata
# word per lane a K step of 256 positions, each lane's 64 positions in one scale group; the
# tuned schedule for M <= 8. Metal only: on CUDA's 16-wide tiles 256 positions are two loads a
# step, which needs scale groups covering whole steps, not groups of 64.
stream_m8 = Schedule("metal_stream_m8", tile_m=8, tile_n=128, tile_k=256, warps_m=1, warps_n=8,
                     pipeline=WeightStream(k_warps=2), targets=("metal",))
nf4_pairwise_stream = Gemm("nf4_pairwise_4of8_stream", nf4_pairwise_4of8, stream_m8)
