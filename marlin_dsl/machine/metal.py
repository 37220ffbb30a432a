"""The Metal target as data: Apple GPUs' 8x8 simdgroup matrices, the lanes' element ownership
of them (the lane tables the weight-stream layout and `frag_build` / `frag_elems` read) and
M-series limits.

Which elements of an 8x8 `simdgroup_matrix` a lane holds is not spelled out in Apple's Metal
Shading Language specification, which exposes a lane's share only as `thread_elements()`
(two elements). MLX's Metal GEMMs depend on it and state it: ml-explore/mlx,
`mlx/backend/metal/kernels/steel/gemm/mma.h` (commit 13619f4fc815a34f77079aa9c11fa920e094bdb9),
`BlockMMA`'s constructor:

    short qid = simd_lane_id / 4;
    sm = (qid & 4) + (simd_lane_id / 2) % 4;          // row
    sn = (qid & 2) * 2 + (simd_lane_id % 2) * 2;      // column

and its `mma` fills A, B and the stored C alike: `thread_elements()[0]` is (sm, sn) and
`thread_elements()[1]` is (sm, sn + 1) (`BaseMMAFrag::get_coord` in later MLX versions returns
the same (sn, sm)). The same table holds for every role. The CPU harness's shim
(codegen/metal_shim.h, `mtl_rt::lane_coord`) implements simdgroup matrices with this ownership;
tests/test_metal_stream.py checks that the two agree.
"""
from __future__ import annotations

import numpy as np

from .target import Target

#: The physical weight layout Metal's weight-stream kernels read (layouts/weight_stream.py,
#: made from the lane tables below at pack time).
STREAM_LAYOUT = "metal_lane_stream"


def simdgroup_lane_elements() -> tuple[np.ndarray, np.ndarray]:
    """(row[lane, e], col[lane, e]) of the two elements lane `lane` holds of an 8x8
    simdgroup matrix, in `thread_elements()` order (MLX's BlockMMA, see the module doc)."""
    lane = np.arange(32)[:, None]
    qid = lane // 4
    row = (qid & 4) + (lane // 2) % 4
    col = (qid & 2) * 2 + (lane % 2) * 2
    e = np.arange(2)[None, :]
    return row + 0 * e, col + e


_LANE_TABLES = {(role, 8, 8): simdgroup_lane_elements() for role in ("a", "b", "c")}

#: Apple GPUs: 8x8 simdgroup matrices, 32 KB of threadgroup memory (M-series). Vectors have at
#: most 4 elements (half4, uint4: 16 bytes for u32). No asynchronous copies into threadgroup
#: memory (the multistage pipeline stages through registers). Activation rows staged in
#: threadgroup memory are padded by 16 bytes, as MLX's Metal GEMMs pad theirs against bank
#: conflicts (`BK_padded = BK + 16 / sizeof(T)` in quantized.h's qmm_t, `tgp_padding` in
#: steel/gemm); only the multistage pipeline reads the padding.
METAL = Target("metal", (8, 8, 8), warp_size=32, max_threads=1024, max_shared_bytes=32 * 1024,
               lane_tables=_LANE_TABLES, shared_row_pad_bytes=16, weight_layouts=(STREAM_LAYOUT,),
               max_vector_elems=4)
