"""What the lowering needs to know about a target: MMA shapes (dense and 2:4 sparse), the
lanes' register tables of the operands and hard limits.

Everything else target-specific (spelling, fragment layouts, physical weight layouts)
lives in the target's printer and packer, behind this boundary.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


@dataclass(frozen=True)
class Target:
    name: str
    mma: tuple[int, int, int]  # (m, n, k) of one MMA instruction
    warp_size: int
    max_threads: int
    max_shared_bytes: int
    #: (m, n, k) of the 2:4 structured-sparse MMA (k counts the logical, uncompressed A
    #: columns; A is passed compressed, m x k/2, with per-lane metadata), or None
    sparse_mma: tuple[int, int, int] | None = None

    @property
    def mma_m(self) -> int:
        return self.mma[0]

    @property
    def mma_n(self) -> int:
        return self.mma[1]

    @property
    def mma_k(self) -> int:
        return self.mma[2]

    def lane_elements(self, role: str, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Which elements of an MMA operand tile each lane holds in its registers, in register
        order: (row[lane, e], col[lane, e]), or None where the target keeps them opaque.
        `frag_build` and the weight layouts that feed fragments straight from registers
        (`lowering/stream_layout.py`) read this table; nothing else hard-codes it."""
        if self.name != "cuda":
            return None
        if (role, rows, cols) == ("b", 32, 8):  # the sparse m16n8k32's B (k x n)
            from .backends import cuda_sparse_layout as sl
            return sl.b_coords()
        if (role, rows, cols) not in _CUDA_SHAPES:
            return None
        return _cuda_lane_elements(role)

    def sparse_metadata(self, selector: int) -> "SparseMetadataFields | None":
        """Where the sparse MMA (`sparse_mma`) reads the positions of A's kept values, for
        sparsity selector `selector`: every 2-bit field of the per-lane u32 metadata words that
        the instruction reads, as parallel int arrays (see `SparseMetadataFields`), or None
        where the target has no sparse MMA. A selector the target does not have raises
        ValueError. `mma_sp` (interpreter) and the sparse weight layouts read this table."""
        if self.name != "cuda" or self.sparse_mma is None:
            return None
        from .backends import cuda_sparse_layout as sl  # the hardware-checked model
        return SparseMetadataFields(*sl.metadata_fields(selector))


class SparseMetadataFields(NamedTuple):
    """One row per 2-bit metadata field (sorted by lane, then bit offset): bits
    [bit_offsets[i] + 1 : bit_offsets[i]] of lane `lanes[i]`'s metadata word hold the in-group
    index (0..3) of the kept value in slot `slots[i]` (0: the lower of the two, 1: the higher;
    compressed column 2 * group + slot) of group `groups[i]` (logical columns 4 * group ..
    4 * group + 3) of row `rows[i]` of A. Lanes not listed are not read."""

    lanes: np.ndarray
    bit_offsets: np.ndarray
    rows: np.ndarray
    groups: np.ndarray
    slots: np.ndarray


# PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type": lane = 4 g + t; a
# .b32 register holds two 16-bit elements, the lower column (A) or lower row (B) in its low half.
_CUDA_SHAPES = {("a", 16, 16), ("b", 16, 8), ("c", 16, 8)}


def _cuda_lane_elements(role: str) -> tuple[np.ndarray, np.ndarray]:
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


#: Apple GPUs: 8x8 simdgroup matrices, 32 KB of threadgroup memory (M-series).
METAL = Target("metal", (8, 8, 8), warp_size=32, max_threads=1024, max_shared_bytes=32 * 1024)
#: NVIDIA: mma.sync m16n8k16. Shared memory per block: 48 KB statically, up to 163 KB (sm_80's
#: opt-in maximum; sm_90 allows 227 KB) as one dynamic block that the launch requests.
#: 2:4 sparse: mma.sp::ordered_metadata m16n8k32 (f16/bf16 in, f32 accumulate), whose
#: register layout is backends/cuda_sparse_layout.py (checked on an H100).
CUDA = Target("cuda", (16, 8, 16), warp_size=32, max_threads=1024, max_shared_bytes=163 * 1024,
              sparse_mma=(16, 8, 32))

TARGETS = {t.name: t for t in (METAL, CUDA)}
