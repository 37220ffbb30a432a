"""2:4 structured sparse FP4 and INT4 (seed 000): of every 4 K positions 2 are stored.

Values are [K/16, N] uint32 (8 kept codes a word, dense-K order), metadata [K/32, N] uint32
(a nibble (pos1 << 2) | pos0 per block of 4, 8 nibbles a word, LSB first). Scales stay in
dense-K space: [K/128, N]. The kernels decode metadata and scatter the kept values into
dense K positions in registers before the MMA (seed 000 section 5).
"""
from marlin_dsl import (
    DoubleBuffered, FloatEncoding, Format, Gemm, GroupScale, IntEncoding, NMSparsity, Schedule,
    StripedKParallel, WeightStream,
)

fp4_2of4_g128 = Format(
    "fp4_2of4_g128",
    FloatEncoding(bits=4, exp_bits=2, man_bits=1, bias=1),
    GroupScale(128),
    sparsity=NMSparsity(n=2, m=4),
    doc="2:4 sparse FP4, group 128",
)

int4_2of4_g128 = Format(
    "int4_2of4_g128",
    IntEncoding(bits=4, offset=8),
    GroupScale(128),
    sparsity=NMSparsity(n=2, m=4),
    doc="2:4 sparse signed INT4, group 128",
)

double_buffered = Schedule("db_64x64x32", pipeline=DoubleBuffered())
striped = Schedule("striped_64x64x32_p2", pipeline=StripedKParallel(parallel=2, groups=8))

fp4_2of4_db = Gemm("fp4_2of4_g128_db", fp4_2of4_g128, double_buffered)
int4_2of4_striped = Gemm("int4_2of4_g128_striped", int4_2of4_g128, striped)

# Metal's small-M kernel (issue 16): Metal has no sparse MMA, so the weight stream stores each
# lane's own kept codes and metadata (metal_lane_stream, layouts/sparse_scatter.py) and the
# lane scatters them into dense simdgroup fragments in registers; one 64-bit code load and one
# metadata word per lane a K step of 128 positions; the tuned schedule for M <= 8.
stream_m8 = Schedule("metal_stream_m8", tile_m=8, tile_n=128, tile_k=128, warps_m=1, warps_n=8,
                     pipeline=WeightStream(k_warps=2))
fp4_2of4_stream = Gemm("fp4_2of4_g128_stream", fp4_2of4_g128, stream_m8)
int4_2of4_stream = Gemm("int4_2of4_g128_stream", int4_2of4_g128, stream_m8)
