"""The CUDA target as data: mma.sync m16n8k16 and the 2:4 sparse mma.sp m16n8k32, their lanes'
register tables (PTX ISA, and `sparse_layout.py`, the hardware-checked model of mma.sp), the
sparse metadata table, limits and the constants of the memory system the lowering needs."""
from __future__ import annotations

import numpy as np

from ..target import SparseMetadataFields, SwizzledRows, Target
from . import sparse_layout as sl


def _dense_lane_elements(role: str) -> tuple[np.ndarray, np.ndarray]:
    """PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type": lane = 4 g + t; a
    .b32 register holds two 16-bit elements, the lower column (A) or lower row (B) in its low
    half."""
    lane = np.arange(32)[:, None]
    g, t = lane // 4, lane % 4
    if role == "a":  # registers: (g, 2t..), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)
        reg, half = np.arange(8)[None, :] // 2, np.arange(8)[None, :] % 2
        return g + 8 * (reg % 2), 2 * t + 8 * (reg // 2) + half
    if role == "b":  # k x n: (2t.., g), (2t+8.., g)
        reg, half = np.arange(4)[None, :] // 2, np.arange(4)[None, :] % 2
        return 2 * t + 8 * reg + half + 0 * g, g + 0 * reg
    reg, half = np.arange(4)[None, :] // 2, np.arange(4)[None, :] % 2  # c: (g, 2t..), (g+8, 2t..)
    return g + 8 * reg + 0 * half, 2 * t + half + 0 * reg


def _wide_c(n: int) -> tuple[np.ndarray, np.ndarray]:
    """One warp's accumulator of wgmma m64nNk16 (PTX ISA 9.7.15.5, "Matrix fragment for
    accumulator D"; machine/cuda/wgmma_layout.py `d_coords`, checked on an H100): its 16 rows x
    n columns, register i at row g + 8 ((i >> 1) & 1), column 8 (i >> 2) + 2 t + (i & 1), i.e.
    n / 8 m16n8 accumulators side by side."""
    lane = np.arange(32)[:, None]
    g, t = lane // 4, lane % 4
    i = np.arange(n // 2)[None, :]
    return g + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * t + (i & 1)


_LANE_TABLES = {
    ("a", 16, 16): _dense_lane_elements("a"),
    ("b", 16, 8): _dense_lane_elements("b"),
    ("c", 16, 8): _dense_lane_elements("c"),
    ("b", 32, 8): sl.b_coords(),  # the sparse m16n8k32's B (k x n)
    # a warp's accumulator of the warpgroup MMA, n = 16 .. 256 (n = 8 is mma.sync's C above)
    **{("c", 16, n): _wide_c(n) for n in range(16, 257, 8)},
}

_METADATA_TABLES = {sel: SparseMetadataFields(*sl.metadata_fields(sel)) for sel in (0, 1)}

#: NVIDIA: mma.sync m16n8k16. Shared memory per block: 48 KB statically, up to 163 KB (sm_80's
#: opt-in maximum; sm_90 allows 227 KB) as one dynamic block that the launch requests.
#: 2:4 sparse: mma.sp::ordered_metadata m16n8k32 (f16/bf16 in, f32 accumulate), whose
#: register layout is machine/cuda/sparse_layout.py (checked on an H100). Activation rows in
#: shared memory are padded by 16 bytes (bank conflicts of the ldmatrix-free fragment loads);
#: cp.async copies up to 16 bytes; 0x44444444 (every nibble 0b0100: positions 0 and 1) is an
#: ordered metadata word for tiles that are absent (zeros are undefined on the hardware).
CUDA = Target("cuda", (16, 8, 16), warp_size=32, max_threads=1024, max_shared_bytes=163 * 1024,
              sparse_mma=(sl.SPARSE_M, sl.SPARSE_N, sl.SPARSE_K), lane_tables=_LANE_TABLES,
              metadata_tables=_METADATA_TABLES, shared_row_pad_bytes=16, async_copy_bytes=16,
              sparse_idle_metadata=0x44444444, sparse_activation_layout="cuda_mma_sp",
              weight_layouts=("lane_stream",),  # layouts/weight_stream.py LAYOUT_NAME
              skip_layout="lane_stream_skip",  # layouts/block_skip.py
              # sm_90a: wgmma.mma_async m64nNk16 (N = 8..256), B from shared memory in
              # 128-byte-swizzled rows (wgmma_layout.py, checked on an H100)
              warpgroup_mma=(64, 256, 16), warpgroup_warps=4,
              # wgmma.mma_async.sp m64nNk32: per warp the A and metadata of mma.sp m16n8k32
              warpgroup_sparse_k=32,
              warpgroup_b_layout=SwizzledRows(row_bytes=128, atom_rows=8),
              warpgroup_max_shared_bytes=227 * 1024,  # sm_90's opt-in maximum per block
              warpgroup_arch="sm_90a",  # wgmma is not in plain sm_90 (or later) PTX
              registers_per_block=65536, max_registers=255,  # sm_90: 64K registers per SM
              scale_group_runs=True)
