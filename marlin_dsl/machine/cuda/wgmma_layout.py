"""Operand layouts of Hopper's warpgroup MMA (`wgmma.mma_async`, sm_90a), as numpy tables.

Pure numpy, no package imports: `bench/probes/wgmma_probe.py` loads this file by path and checks every
table here on an H100, so the pipelines that later use these tables use the checked ones.

Instructions modelled (PTX ISA 9.7.15 "Asynchronous Warpgroup Level Matrix Multiply-Accumulate
Instructions"; section numbers as in the PTX ISA 8.x/9.x documentation):

    wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16}
        d, a-desc|{a0..a3}, b-desc, scale-d, imm-scale-a, imm-scale-b[, imm-trans-a], imm-trans-b
    wgmma.mma_async.sp.sync.aligned.m64nNk32.f32.{f16,bf16}.{f16,bf16}
        d, a-desc|{a0..a3}, b-desc, sp-meta, sp-sel, scale-d, imm-scale-a, ...

D[64 x N] (+)= A[64 x K] @ B[K x N], issued by one warpgroup (4 consecutive warps, 128 threads).
Notation: T = thread in the warpgroup (0..127), w = T >> 5 (warp), L = T & 31 (lane),
g = L >> 2 ("groupID"), t = L & 3 ("threadID_in_group").  A 16-bit element e of a thread's
fragment sits in .b32 register e >> 1, low half first (e even).

1. A in registers (9.7.15.5 "Register Fragments and Shared Memory Matrix Layouts", wgmma
   .m64nNk16 "Matrix A" fragment): four .b32
   per thread (8 elements); warp w owns rows 16w..16w+15 and lays them out exactly as the A of
   mma.m16n8k16 (9.7.14.5.8): reg0 = (g, 2t..2t+1), reg1 = (g+8, 2t..), reg2 = (g, 2t+8..),
   reg3 = (g+8, 2t+8..), row offset 16w.  CUTLASS's ALayout_64x16 (= CLayout_64x16) agrees.
   The sparse k32 form takes the compressed 64 x 16 A in the same layout.
2. Accumulator D (same section, "Matrix fragment for accumulator D"), f32: N/2 registers d_i,
   row = 16w + g + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2t + (i & 1), i.e. N/8 m16n8 f32
   accumulators side by side per warp.
3. Shared memory (9.7.15.5, "Shared Memory Matrix Layout"):
   K-major operands (imm-trans = 0) are built from "core matrices" of 8 rows x 16 bytes.
   * no swizzle ("interleave"): a core matrix is 128 contiguous bytes (row r at 16 r); the
     leading-dimension byte offset (LBO) is the distance between core matrices adjacent in K,
     the stride-dimension byte offset (SBO) between core matrices adjacent in M/N.
   * 128-byte swizzle: rows are 128 bytes (64 16-bit elements of K) in atoms of 8 rows
     (1024 bytes, SBO between atoms adjacent in M/N); the 16-byte chunk c of row r is stored at
     chunk c ^ (r & 7): address bits [4, 7) ^= bits [7, 10) (CUTLASS Swizzle<3,4,3>, also what
     TMA's CU_TENSOR_MAP_SWIZZLE_128B writes).  The XOR acts on the absolute shared address, so
     tiles must be 1024-byte aligned; a k16 step inside an atom is a +32-byte start address
     (LBO unused: CUTLASS writes 1).
   The B operand (K x N) is K-major when stored as B^T: N rows of K elements.
4. Matrix descriptor (9.7.15.5.1 "Matrix Descriptor Format"; docs anchor
   #asynchronous-warpgroup-level-matrix-shared-memory-layout-matrix-descriptor), 64 bits:
   start address >> 4 in bits [0, 14), LBO >> 4 in [16, 30), SBO >> 4 in [32, 46), base
   offset in [49, 52) (0 for 1024-aligned swizzled tiles), swizzle mode in [62, 64): 0 none,
   1 128B, 2 64B, 3 32B.  CUTLASS cute/arch/mma_sm90_desc.hpp (GmmaDescriptor) agrees.
5. Sparse metadata (9.7.15.6.1 "Sparse matrix storage"; f16/bf16 m64nNk32): "a thread-pair
   within a group of four consecutive threads contributes the sparsity metadata", selector 0
   (threads T0, T1 of each quad) or 1 (T2, T3).  Modelled per warp exactly as mma.sp m16n8k32
   (machine/cuda/sparse_layout.py, checked on an H100), with warp w covering rows 16w..16w+15:
   lane 4g + 2F + h holds row 16w + g in bits [0, 16) and row 16w + g + 8 in bits [16, 32),
   groups 4h..4h+3 (a nibble each, group 4h + n at bit 4n), slot s's 2-bit index at +2s.

Hardware check: `python3 bench/probes/wgmma_probe.py --out DIR --bench` (see its docstring). On an
NVIDIA H100 80GB HBM3 (2026-11-25, bench/results/issue15_h100_2026-11-25/wgmma_probe.*) every
case passed: dense m64nNk16 and sparse m64nNk32 (both selectors), N = 8/64/128/256, f16 and
bf16, A and B from no-swizzle (K- and MN-inner core matrices) and 128-byte-swizzle shared memory
and A from registers, tiles filled by stores or by cp.async.bulk + mbarrier. Back-to-back
m64n256k16 reached 976 TFLOP/s, mma.sync m16n8k16 at best 661 (0.68x). The probe's records are
also read back on the CPU by tests/wgmma_emulator.py (written from the PTX rules).
"""
from __future__ import annotations

import numpy as np

WARPGROUP = 128
WG_M = 64
WG_K = 16              # dense f16/bf16 K per instruction
WG_K_SPARSE = 32       # logical K of the sparse instruction (A compressed to 16)
WG_NS = tuple(range(8, 257, 8))   # N = 8..256 step 8 for f16/bf16 (9.7.15.5, shapes table)

CORE_ROWS = 8          # a core matrix is 8 rows x 16 bytes
CORE_BYTES = 16
SWIZZLE128_ROW = 128
SWIZZLE128_ATOM = 1024

#: descriptor swizzle field (bits 62-63) by layout name
SWIZZLE_MODES = {"none": 0, "128B": 1, "64B": 2, "32B": 3}

_F14 = (1 << 14) - 1


def _thread_w_g_t():
    tid = np.arange(WARPGROUP)
    lane = tid & 31
    return tid, tid >> 5, lane >> 2, lane & 3


def a_reg_coords() -> tuple[np.ndarray, np.ndarray]:
    """(rows, ks), int64 [128, 8]: thread T's A element e (register e >> 1, half e & 1) is
    A[rows[T, e], ks[T, e]] of the 64 x 16 A (the compressed A for the sparse form)."""
    _, w, g, t = _thread_w_g_t()
    e = np.arange(8)
    reg, half = e >> 1, e & 1
    rows = 16 * w[:, None] + g[:, None] + 8 * (reg[None, :] & 1)
    ks = 2 * t[:, None] + 8 * (reg[None, :] >> 1) + half[None, :]
    return rows.astype(np.int64), ks.astype(np.int64)


def _check_n(n: int) -> int:
    if n not in WG_NS:
        raise ValueError(f"wgmma N must be a multiple of 8 in 8..256, got {n!r}")
    return int(n)


def d_coords(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols), int64 [128, n/2]: thread T's f32 accumulator register i is D[rows, cols]."""
    n = _check_n(n)
    _, w, g, t = _thread_w_g_t()
    i = np.arange(n // 2)
    rows = 16 * w[:, None] + g[:, None] + 8 * ((i[None, :] >> 1) & 1)
    cols = 8 * (i[None, :] >> 2) + 2 * t[:, None] + (i[None, :] & 1)
    return rows.astype(np.int64), cols.astype(np.int64)


def a_lane_values(a: np.ndarray) -> np.ndarray:
    """[128, 8] per-thread A elements from the 64 x 16 A."""
    rows, ks = a_reg_coords()
    return np.asarray(a)[rows, ks]


def c_lane_values(c: np.ndarray) -> np.ndarray:
    """[128, N/2] per-thread accumulator values from the 64 x N C."""
    c = np.asarray(c)
    rows, cols = d_coords(c.shape[1])
    return c[rows, cols]


def d_from_lane_values(regs: np.ndarray, n: int) -> np.ndarray:
    """64 x n D from the [128, >= n/2] per-thread f32 registers (NaN where nothing lands)."""
    rows, cols = d_coords(n)
    d = np.full((WG_M, n), np.nan)
    d[rows, cols] = np.asarray(regs, dtype=np.float64)[:, : n // 2]
    return d


# --- 16-bit values ----------------------------------------------------------------------------

def half_bits(x: np.ndarray, dtype: str) -> np.ndarray:
    """uint16 bit patterns of x as 'f16' or 'bf16' (bf16 rounds to nearest even)."""
    v = np.asarray(x, dtype=np.float64)
    if dtype == "f16":
        return v.astype(np.float16).view(np.uint16)
    if dtype == "bf16":
        f = np.ascontiguousarray(v.astype(np.float32)).view(np.uint32)
        f = f + np.uint32(0x7FFF) + ((f >> np.uint32(16)) & np.uint32(1))
        return (f >> np.uint32(16)).astype(np.uint16)
    raise ValueError(f"dtype must be 'f16' or 'bf16', got {dtype!r}")


def pack_b32(lane_vals: np.ndarray, dtype: str) -> np.ndarray:
    """[T, 2r] 16-bit lane elements -> [T, r] uint32 registers, element 2j in the low half."""
    bits = half_bits(lane_vals, dtype).astype(np.uint32)
    return (bits[..., 0::2] | (bits[..., 1::2] << np.uint32(16))).astype(np.uint32)


# --- shared memory ----------------------------------------------------------------------------

def offset_interleave(rows: np.ndarray, ks: np.ndarray, lbo: int, sbo: int,
                      elem_bytes: int = 2) -> np.ndarray:
    """Byte offset of K-major element (row, k) in the no-swizzle canonical layout: core matrix
    (row // 8, k*eb // 16) at (row // 8) * sbo + (k*eb // 16) * lbo, row r of it at 16 (r % 8)."""
    r = np.asarray(rows, dtype=np.int64)
    kb = np.asarray(ks, dtype=np.int64) * elem_bytes
    return (r // CORE_ROWS) * sbo + (kb // CORE_BYTES) * lbo + (r % CORE_ROWS) * CORE_BYTES \
        + kb % CORE_BYTES


def swizzle128(addr: np.ndarray) -> np.ndarray:
    """The 128-byte swizzle of a byte address: bits [4, 7) ^= bits [7, 10) (an involution that
    keeps every address inside its 1024-byte atom)."""
    a = np.asarray(addr, dtype=np.int64)
    return a ^ (((a >> 7) & 7) << 4)


def offset_swizzle128(rows: np.ndarray, ks: np.ndarray, sbo: int = SWIZZLE128_ATOM,
                      k_atom_stride: int = 0, elem_bytes: int = 2) -> np.ndarray:
    """Byte offset of K-major element (row, k) in the 128-byte-swizzle canonical layout, for a
    tile whose base is 1024-byte aligned: 128-byte rows, 8-row atoms sbo apart, 64-element
    K blocks (one 128-byte row each) k_atom_stride apart."""
    r = np.asarray(rows, dtype=np.int64)
    kb = np.asarray(ks, dtype=np.int64) * elem_bytes
    linear = (r // CORE_ROWS) * sbo + (r % CORE_ROWS) * SWIZZLE128_ROW \
        + (kb // SWIZZLE128_ROW) * k_atom_stride + kb % SWIZZLE128_ROW
    return swizzle128(linear)


def smem_image(mat: np.ndarray, offsets: np.ndarray, dtype: str, size: int,
               image: np.ndarray | None = None) -> np.ndarray:
    """Write the 16-bit elements of mat[R, K] at byte offsets[R, K] of a uint8 image."""
    img = np.zeros(size, dtype=np.uint8) if image is None else image
    off = np.asarray(offsets, dtype=np.int64)
    if off.min() < 0 or off.max() + 2 > img.size or np.any(off % 2):
        raise ValueError("offsets must be even and inside the image")
    if np.unique(off).size != off.size:
        raise ValueError("two elements share an offset: not a layout")
    bits = half_bits(mat, dtype)
    img[off.ravel()] = (bits & 0xFF).astype(np.uint8).ravel()
    img[off.ravel() + 1] = (bits >> 8).astype(np.uint8).ravel()
    return img


def encode_descriptor(start_addr: int, lbo: int, sbo: int, swizzle: str = "none",
                      base_offset: int = 0) -> int:
    """The 64-bit wgmma matrix descriptor (9.7.15.5.1).  Byte values must be multiples of 16
    below 2**18 (14 bits after >> 4)."""
    for name, val in (("start_addr", start_addr), ("lbo", lbo), ("sbo", sbo)):
        if val < 0 or val % 16 or (val >> 4) > _F14:
            raise ValueError(f"{name} = {val}: must be a multiple of 16 in [0, 2**18)")
    if swizzle not in SWIZZLE_MODES:
        raise ValueError(f"swizzle must be one of {sorted(SWIZZLE_MODES)}, got {swizzle!r}")
    if not 0 <= base_offset < 8:
        raise ValueError(f"base_offset must be in 0..7, got {base_offset}")
    return ((start_addr >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (base_offset << 49)
            | (SWIZZLE_MODES[swizzle] << 62))


def decode_descriptor(desc: int) -> dict:
    """Inverse of `encode_descriptor` (byte values; swizzle by name)."""
    names = {v: k for k, v in SWIZZLE_MODES.items()}
    return {"start_addr": (desc & _F14) << 4, "lbo": ((desc >> 16) & _F14) << 4,
            "sbo": ((desc >> 32) & _F14) << 4, "base_offset": (desc >> 49) & 7,
            "swizzle": names[(desc >> 62) & 3]}


# --- sparse metadata --------------------------------------------------------------------------

SPARSE_GROUPS = WG_K_SPARSE // 4     # 4-wide chunks per row and instruction (8)


def _check_selector(selector: int) -> int:
    if selector not in (0, 1):
        raise ValueError(f"m64nNk32 f16/bf16 sparsity selector must be 0 or 1, got {selector!r}")
    return int(selector)


def sparse_metadata_fields(selector: int):
    """Every 2-bit field the sparse m64nNk32 f16/bf16 instruction reads: (threads, bit_offsets,
    rows, groups, slots), int64 [1024] (64 rows x 8 groups x 2 slots), sorted by (thread, bit):
    bits [bit + 1 : bit] of thread T's metadata register hold the in-group index (0..3) of slot s
    (0 = lower kept value) of group j (logical columns 4j..4j+3) of row r."""
    sel = _check_selector(selector)
    r, j, s = np.meshgrid(np.arange(WG_M), np.arange(SPARSE_GROUPS), np.arange(2), indexing="ij")
    r, j, s = r.ravel(), j.ravel(), s.ravel()
    threads = 32 * (r >> 4) + 4 * (r & 7) + 2 * sel + (j >> 2)
    bits = 16 * ((r >> 3) & 1) + 4 * (j & 3) + 2 * s
    order = np.lexsort((bits, threads))
    return tuple(x[order].astype(np.int64) for x in (threads, bits, r, j, s))


def pack_sparse_metadata(positions: np.ndarray, selector: int) -> np.ndarray:
    """uint32 [128] metadata registers for positions[64, 8, 2] (increasing in-group indices of
    the two kept values); threads the selector does not read get 0."""
    pos = np.asarray(positions)
    if pos.shape != (WG_M, SPARSE_GROUPS, 2) or pos.min() < 0 or pos.max() > 3:
        raise ValueError(f"positions must be [64, 8, 2] in 0..3, got shape {pos.shape}")
    if np.any(pos[..., 0] >= pos[..., 1]):
        raise ValueError("the two indices of a group must be distinct and increasing")
    threads, bits, rows, groups, slots = sparse_metadata_fields(selector)
    vals = pos[rows, groups, slots].astype(np.uint32) << bits.astype(np.uint32)
    meta = np.zeros(WARPGROUP, dtype=np.uint32)
    np.bitwise_or.at(meta, threads, vals.astype(np.uint32))
    return meta


def sparse_metadata_threads(selector: int) -> np.ndarray:
    """The 64 threads whose metadata register the instruction reads for `selector`."""
    return np.unique(sparse_metadata_fields(selector)[0])
