"""Register layout of the 2:4 structured-sparse tensor-core MMA, as data plus a numpy model.

The instruction modelled is

    mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32
        {d0,d1,d2,d3}, {a0,a1,a2,a3}, {b0,b1,b2,b3}, {c0,c1,c2,c3}, e, F;

(and the `.bf16.bf16` variant, whose layout is identical): D[16x8] = A[16x32] @ B[32x8] + C,
where A is 2:4 sparse along K and is passed compressed (16x16) together with a metadata word
`e` (one .b32 per lane) and an immediate sparsity selector F in {0, 1}.  Everything here is
pure numpy; nothing needs a GPU.  `bench/probes/mma_sp_probe.py` checks the model on a GPU.

Notation: L = %laneid (0..31), g = L >> 2 ("groupID"), t = L & 3 ("threadID_in_group").
Per lane, A and B are 4 .b32 registers holding 2 16-bit elements each; element e = 2*reg + half,
where half 0 is the low 16 bits of the register.  "Group" j (0..7) means logical A columns
4j..4j+3; its two kept values are compressed columns 2j (slot 0) and 2j+1 (slot 1).

Sources (NVIDIA PTX ISA, section numbers as in the PTX ISA 8.x/9.x documentation):

1. A operand - section 9.7.14.6.2.2 "Matrix Fragments for sparse mma.m16n8k32 with .f16 and
   .bf16 types" (Figure 120): four .b32 registers "each containing two non-zero .f16/.bf16
   elements out of 4 consecutive elements from matrix A";
       row = g       for a_i, 0 <= i < 2 or 4 <= i < 6   (registers 0 and 2)
             g + 8   otherwise                            (registers 1 and 3)
       logical cols [firstcol .. firstcol+3], firstcol = 4t (i < 4) or 4t + 16 (i >= 4).
   A 4-wide logical chunk starting at 4t (+16) is compressed columns 2t, 2t+1 (+8), so in the
   compressed 16x16 matrix:
       reg0 = (g,   2t, 2t+1)    reg1 = (g+8, 2t, 2t+1)
       reg2 = (g,   2t+8, 2t+9)  reg3 = (g+8, 2t+8, 2t+9)
   i.e. exactly the dense m16n8k16 A layout (9.7.14.5.8 "Matrix Fragments for mma.m16n8k16
   with floating point type", Figure 79) applied to the compressed matrix.  The kept value with
   the lower in-chunk index (slot 0) is the low half.  The low-half/slot-0 pairing is not
   stated in words: it follows from a_i being numbered low to high and from the metadata
   encoding in point 4, and LLVM's MLIR test
   mlir/test/Integration/Dialect/SparseTensor/GPU/CUDA/sparse-mma-2-4-f16.mlir (which has
   passed on sm_80) relies on it: compressed "A B" with nibble 0b1000 means row "A 0 B 0".
2. B operand (32x8, k x n) - same section, Figure 121 (a picture only):
       b-register r of lane L holds (k = 2t + 8r + half, n = g), r = 0..3,
   i.e. the dense m16n8k16 B layout (k = 2t + half (+8)) extended to K = 32 with two more
   registers.  The MLIR test above loads B this way (B^T[g][2t + 8r .. +1] into register r).
3. C / D - same section: "Matrix fragments for accumulators C and D are the same as in case of
   Matrix Fragments for mma.m16n8k16 with floating point type": with f32 accumulators,
   c0, c1 = (g, 2t), (g, 2t+1); c2, c3 = (g+8, 2t), (g+8, 2t+1).
4. Metadata and selector -
   * 9.7.14.6.1 "Sparse matrix storage", "Sparse mma.sp{::ordered_metadata} with half-precision
     and .bf16 type": each 4-wide chunk of a row keeps 2 values; "their positions in the
     four-wide chunk in matrix A are indicated by two 2-bit indices in the metadata operand.
     For mma.sp::ordered_metadata, 0b0100, 0b1000, 0b1001, 0b1100, 0b1101, 0b1110 are the
     meaningful values of indices; any other values result in an undefined behavior."  So a
     chunk's 4-bit field holds slot 0's index in bits [1:0] and slot 1's in bits [3:2], and
     the indices must be distinct and increasing (slot 0 < slot 1): that is what
     "ordered_metadata" requires.
   * Same section: "m16n8k32: A thread-pair within a group of four consecutive threads
     contributes the sparsity metadata. Hence, the sparsity selector must be either 0
     (threads T0, T1) or 1 (threads T2, T3); any other value results in an undefined
     behavior."  The selector must be an immediate (LLVM review D146110; ptxas rejects a
     register there).
   * 9.7.14.6.2.2, "Metadata: A .b32 register containing 16 2-bit vectors with each pair of
     2-bit vectors storing the indices of two non-zero element from a 4-wide chunk of matrix
     A", Figure 122 (a picture; cells read "Tk: [m..n]" = bits m..n of lane k's metadata, see
     the convention paragraph of 9.7.14.6.2).  The mapping, as implemented by XLA's Triton
     sparse-dot lowering (xla/service/gpu/fusions/triton/sparse_extensions.cc,
     SparseLocalLoadToLLVM: per lane, i16 metadata column `lane % 2` of rows `lane / 4` and
     `lane / 4 + 8`, packed `upper << 16 | lower`, selector 0) and by the MLIR test above:
         lane 4g + 2F + h (h = 0, 1) holds
             bits [15:0]  : row g,     groups 4h .. 4h+3 (logical columns 16h .. 16h+15)
             bits [31:16] : row g + 8, groups 4h .. 4h+3
         group j's field is the nibble at bit 16*(row >= 8) + 4*(j & 3),
         slot s's index is at bit offset 16*(row >= 8) + 4*(j & 3) + 2*s.
     Lanes 4g + 2(1 - F) and 4g + 2(1 - F) + 1 are not read by the instruction: their
     metadata words are ignored (so one register can carry the metadata of two consecutive
     16-row tiles, one read with F = 0 and the other with F = 1; `pack_metadata_pair`).
     The nibble order inside a 16-bit half (group 4h + n at bits 4n..4n+3, lowest group in the
     lowest bits) is the little-endian reading of Figure 122; neither XLA's code nor the MLIR
     test (whose metadata is the same nibble everywhere) pins it down independently, so
     `bench/probes/mma_sp_probe.py` checks it on the GPU.

Hardware check: `python3 bench/probes/mma_sp_probe.py` passed (every D entry exact) on an H100
(sm_90, driver 580.159) for f16 and bf16, selector 0 and 1 with other valid metadata in the
ignored lanes, and `pack_metadata_pair`; built for sm_90 and for sm_80.  With the model
replaced by any of the probe's alternative layouts (nibbles reversed, one full row per lane,
slots swapped, pair roles swapped) every case fails, so the probe does tell them apart.
"""
from __future__ import annotations

import numpy as np

SPARSE_M = 16
SPARSE_N = 8
SPARSE_K = 32                 # logical K of one mma.sp (A is 16 x 32 before compression)
SPARSE_K_COMPRESSED = 16      # columns of the compressed A
GROUPS = SPARSE_K // 4        # 4-wide chunks per row (8)
WARP = 32

# Meaningful ordered_metadata nibbles (9.7.14.6.1): (hi index << 2) | lo index, lo < hi.
ORDERED_NIBBLES = (0b0100, 0b1000, 0b1001, 0b1100, 0b1101, 0b1110)

PTX_F16 = "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32"
PTX_BF16 = "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.bf16.bf16.f32"


def _lane_g_t():
    lanes = np.arange(WARP)
    return lanes, lanes >> 2, lanes & 3


def a_compressed_coords() -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols), int arrays [32, 8]: lane L's element e = 2*reg + half is compressed
    A[rows[L, e], cols[L, e]] (cols in 0..15).  Group = cols // 2, slot = cols % 2 = half."""
    _, g, t = _lane_g_t()
    e = np.arange(8)
    reg, half = e >> 1, e & 1
    rows = g[:, None] + 8 * (reg[None, :] & 1)
    cols = 2 * t[:, None] + 8 * (reg[None, :] >> 1) + half[None, :]
    return rows.astype(np.int64), cols.astype(np.int64)


def b_coords() -> tuple[np.ndarray, np.ndarray]:
    """(ks, ns), int arrays [32, 8]: lane L's element e = 2*reg + half is B[ks[L, e], ns[L, e]]
    of the 32 x 8 (k x n) B."""
    _, g, t = _lane_g_t()
    e = np.arange(8)
    reg, half = e >> 1, e & 1
    ks = 2 * t[:, None] + 8 * reg[None, :] + half[None, :]
    ns = np.broadcast_to(g[:, None], ks.shape)
    return ks.astype(np.int64), ns.astype(np.int64).copy()


def c_coords() -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols), int arrays [32, 4]: lane L's f32 accumulator register i is
    C/D[rows[L, i], cols[L, i]] (the dense m16n8k16 f32 accumulator layout)."""
    _, g, t = _lane_g_t()
    i = np.arange(4)
    rows = g[:, None] + 8 * (i[None, :] >> 1)
    cols = 2 * t[:, None] + (i[None, :] & 1)
    return rows.astype(np.int64), cols.astype(np.int64)


def _check_selector(selector: int) -> int:
    if selector not in (0, 1):
        raise ValueError(f"m16n8k32 f16/bf16 sparsity selector must be 0 or 1, got {selector!r}")
    return int(selector)


def metadata_lanes(selector: int) -> np.ndarray:
    """The 16 lanes whose metadata word the instruction reads for `selector`
    (4g + 2*selector and 4g + 2*selector + 1); the other 16 lanes' words are ignored."""
    sel = _check_selector(selector)
    g = np.arange(8)
    return np.sort(np.concatenate([4 * g + 2 * sel, 4 * g + 2 * sel + 1]))


def metadata_fields(selector: int):
    """Every 2-bit field that the instruction reads, as a table of 256 rows
    (16 rows x 8 groups x 2 slots), sorted by (lane, bit_offset).

    Returns (lanes, bit_offsets, rows, groups, slots), int arrays [256]: bits
    [bit_offset + 1 : bit_offset] of lane `lanes[i]`'s metadata word hold the in-group index
    (0..3) of slot `slots[i]` (0 = first/lower kept value, 1 = second/higher) of group
    `groups[i]` (logical columns 4*group .. 4*group + 3) of row `rows[i]` of the 16 x 32 A.
    Only `metadata_lanes(selector)` appear; the other lanes are ignored by the hardware.
    """
    sel = _check_selector(selector)
    r, j, s = np.meshgrid(np.arange(SPARSE_M), np.arange(GROUPS), np.arange(2), indexing="ij")
    r, j, s = r.ravel(), j.ravel(), s.ravel()
    lanes = 4 * (r & 7) + 2 * sel + (j >> 2)
    bits = 16 * (r >> 3) + 4 * (j & 3) + 2 * s
    order = np.lexsort((bits, lanes))
    return (lanes[order].astype(np.int64), bits[order].astype(np.int64),
            r[order].astype(np.int64), j[order].astype(np.int64), s[order].astype(np.int64))


def _check_positions(positions: np.ndarray) -> np.ndarray:
    pos = np.asarray(positions)
    if pos.shape != (SPARSE_M, GROUPS, 2):
        raise ValueError(f"positions must have shape (16, 8, 2), got {pos.shape}")
    if not np.issubdtype(pos.dtype, np.integer):
        raise ValueError("positions must be integers")
    if pos.min() < 0 or pos.max() > 3:
        raise ValueError("positions must lie in 0..3")
    if np.any(pos[..., 0] >= pos[..., 1]):
        raise ValueError("ordered_metadata needs the two indices of a group distinct and "
                         "increasing (positions[..., 0] < positions[..., 1])")
    return pos.astype(np.uint32)


def pack_metadata(positions: np.ndarray, selector: int) -> np.ndarray:
    """Per-lane metadata words, uint32 [32], for positions[16 rows, 8 groups, 2] (the in-group
    indices of the two kept values, increasing).  Lanes the selector does not read are 0."""
    pos = _check_positions(positions)
    lanes, bits, rows, groups, slots = metadata_fields(selector)
    vals = pos[rows, groups, slots] << bits.astype(np.uint32)
    meta = np.zeros(WARP, dtype=np.uint32)
    np.bitwise_or.at(meta, lanes, vals.astype(np.uint32))
    return meta


def unpack_metadata(meta: np.ndarray, selector: int, *, check_ordered: bool = True) -> np.ndarray:
    """Inverse of `pack_metadata`: positions[16, 8, 2] (int64) read from the lanes that
    `selector` names (the other lanes are ignored, as by the hardware).  With `check_ordered`,
    a group whose indices are not increasing (undefined behaviour for ordered_metadata)
    raises ValueError."""
    m = np.asarray(meta)
    if m.shape != (WARP,):
        raise ValueError(f"meta must have shape (32,), got {m.shape}")
    m = m.astype(np.uint64)
    lanes, bits, rows, groups, slots = metadata_fields(selector)
    pos = np.zeros((SPARSE_M, GROUPS, 2), dtype=np.int64)
    pos[rows, groups, slots] = ((m[lanes] >> bits.astype(np.uint64)) & np.uint64(3)).astype(np.int64)
    if check_ordered and np.any(pos[..., 0] >= pos[..., 1]):
        bad = np.argwhere(pos[..., 0] >= pos[..., 1])[0]
        raise ValueError(f"metadata of row {bad[0]} group {bad[1]} is not ordered "
                         f"({pos[bad[0], bad[1]].tolist()}): undefined behaviour")
    return pos


def pack_metadata_pair(pos_tile0: np.ndarray, pos_tile1: np.ndarray) -> np.ndarray:
    """One metadata register serving two consecutive 16-row tiles: tile0 is read with
    selector 0 (lanes 4g, 4g+1), tile1 with selector 1 (lanes 4g+2, 4g+3).  The two lane sets
    are disjoint and each selector ignores the other's lanes, so the words are simply OR-ed."""
    return pack_metadata(pos_tile0, 0) | pack_metadata(pos_tile1, 1)


def compress_2of4(a_dense: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """2:4-compress A along its last axis: a_dense[M, K] (K % 4 == 0) ->
    (values[M, K/2], positions[M, K/4, 2]).  Each group of 4 keeps its nonzeros; a group with
    fewer than 2 nonzeros is padded with its lowest zero indices, so the two indices are always
    distinct and increasing; a group with more than 2 nonzeros raises ValueError."""
    a = np.asarray(a_dense)
    if a.ndim != 2 or a.shape[1] % 4:
        raise ValueError(f"a_dense must be [M, K] with K a multiple of 4, got {a.shape}")
    m, k = a.shape
    grp = a.reshape(m, k // 4, 4)
    nz = grp != 0
    if np.any(nz.sum(axis=-1) > 2):
        r, j = np.argwhere(nz.sum(axis=-1) > 2)[0]
        raise ValueError(f"row {r} group {j} has more than 2 nonzeros: not 2:4 sparse")
    idx = np.arange(4)
    key = np.where(nz, idx, idx + 4)               # nonzeros first, then zeros, each by index
    chosen = np.argsort(key, axis=-1, kind="stable")[..., :2]
    chosen = np.sort(chosen, axis=-1)
    values = np.take_along_axis(grp, chosen, axis=-1).reshape(m, k // 2)
    return values, chosen.astype(np.int64)


def decompress_2of4(values: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Inverse of `compress_2of4`: values[M, K/2], positions[M, K/4, 2] -> dense [M, K]."""
    v = np.asarray(values)
    pos = np.asarray(positions)
    m, kc = v.shape
    dense = np.zeros((m, kc // 2, 4), dtype=np.result_type(v.dtype, np.float64))
    np.put_along_axis(dense, pos.astype(np.int64), v.reshape(m, kc // 2, 2), axis=-1)
    return dense.reshape(m, kc * 2)


def a_lane_values(a_compressed: np.ndarray) -> np.ndarray:
    """[32, 8] per-lane A elements (e = 2*reg + half) from the compressed 16 x 16 A."""
    rows, cols = a_compressed_coords()
    return np.asarray(a_compressed)[rows, cols]


def b_lane_values(b: np.ndarray) -> np.ndarray:
    """[32, 8] per-lane B elements (e = 2*reg + half) from the 32 x 8 B."""
    ks, ns = b_coords()
    return np.asarray(b)[ks, ns]


def c_lane_values(c: np.ndarray) -> np.ndarray:
    """[32, 4] per-lane f32 accumulator values from the 16 x 8 C."""
    rows, cols = c_coords()
    return np.asarray(c)[rows, cols]


def d_from_lane_values(d_regs: np.ndarray) -> np.ndarray:
    """16 x 8 D from the [32, 4] per-lane f32 accumulator registers."""
    rows, cols = c_coords()
    d = np.full((SPARSE_M, SPARSE_N), np.nan, dtype=np.float64)
    d[rows, cols] = np.asarray(d_regs, dtype=np.float64)
    return d


def _from_lane_values(vals: np.ndarray, coords, shape) -> np.ndarray:
    rows, cols = coords
    out = np.zeros(shape, dtype=np.float64)
    out[rows, cols] = np.asarray(vals, dtype=np.float64)
    return out


def mma_sp_reference(a_regs_vals: np.ndarray, meta: np.ndarray, b_vals: np.ndarray,
                     selector: int, c: np.ndarray | None = None) -> np.ndarray:
    """What the warp computes, in float64: D[16, 8] = decompress(A) @ B (+ C).

    a_regs_vals[32, 8]: lane L's A element e = 2*reg + half (compressed A, `a_compressed_coords`);
    meta[32] uint32: the lanes' metadata words (only `metadata_lanes(selector)` are read);
    b_vals[32, 8]: lane L's B element e (`b_coords`); c: optional 16 x 8 accumulator.
    Element (L, e) is slot `e & 1` of group `(L & 3) + 4 * (e >> 2)` of row `g + 8*((e>>1)&1)`;
    its logical column is 4*group + positions[row, group, slot] from the metadata table."""
    a_c = _from_lane_values(a_regs_vals, a_compressed_coords(), (SPARSE_M, SPARSE_K_COMPRESSED))
    b = _from_lane_values(b_vals, b_coords(), (SPARSE_K, SPARSE_N))
    pos = unpack_metadata(meta, selector)
    a = decompress_2of4(a_c, pos)
    d = a @ b
    if c is not None:
        d = d + np.asarray(c, dtype=np.float64)
    return d


# --- 16-bit packing of lane values into .b32 registers ------------------------------------

def _f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    f = np.ascontiguousarray(np.asarray(x, dtype=np.float32)).view(np.uint32)
    rounding = np.uint32(0x7FFF) + ((f >> np.uint32(16)) & np.uint32(1))  # round to nearest even
    bits = ((f + rounding) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    return np.where(nan, np.uint16(0x7FC0), bits)


def to_b32_registers(lane_vals: np.ndarray, dtype: str) -> np.ndarray:
    """[32, 2n] 16-bit lane elements -> [32, n] uint32 registers, element 2r in the low half of
    register r.  dtype: 'f16' or 'bf16' (bf16 rounds to nearest even)."""
    v = np.asarray(lane_vals, dtype=np.float64)
    if dtype == "f16":
        bits = v.astype(np.float16).view(np.uint16)
    elif dtype == "bf16":
        bits = _f32_to_bf16_bits(v.astype(np.float32))
    else:
        raise ValueError(f"dtype must be 'f16' or 'bf16', got {dtype!r}")
    bits = bits.astype(np.uint32)
    return (bits[:, 0::2] | (bits[:, 1::2] << np.uint32(16))).astype(np.uint32)


def from_b32_registers(regs: np.ndarray, dtype: str) -> np.ndarray:
    """Inverse of `to_b32_registers`: [32, n] uint32 -> [32, 2n] float64."""
    r = np.asarray(regs, dtype=np.uint32)
    lo = (r & np.uint32(0xFFFF)).astype(np.uint16)
    hi = (r >> np.uint32(16)).astype(np.uint16)
    bits = np.stack([lo, hi], axis=-1).reshape(r.shape[0], -1)
    if dtype == "f16":
        return bits.view(np.float16).astype(np.float64)
    if dtype == "bf16":
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    raise ValueError(f"dtype must be 'f16' or 'bf16', got {dtype!r}")


def random_2of4(rng: np.random.Generator, m: int = SPARSE_M, k: int = SPARSE_K,
                lo: int = -4, hi: int = 4, allow_fewer: bool = True) -> np.ndarray:
    """A random 2:4-sparse [m, k] float64 matrix of small nonzero integers in [lo, hi]
    (exact in f16 and bf16).  With `allow_fewer`, some kept values are 0 too."""
    grp = np.zeros((m, k // 4, 4))
    keep = np.argsort(rng.random((m, k // 4, 4)), axis=-1)[..., :2]
    vals = rng.integers(lo, hi + 1, size=(m, k // 4, 2)).astype(np.float64)
    if not allow_fewer:
        vals[vals == 0] = 1.0
    np.put_along_axis(grp, keep, vals, axis=-1)
    return grp.reshape(m, k)
