"""`pack_mx`: quantise, prune and pack float weights on the device with MLX ops, producing
exactly the bytes of the numpy packer `marlin_dsl.pack` (quantize -> prune -> pack_codes).

Why: converting a model packs every linear layer (7e9 weights for Llama-3-8B); the numpy
packer runs in float64 on one core. Here only the group extremes ([K/G, N], 1/G of the weight)
go to the host, where `quantize.group_parameters` (the numpy code itself) picks the scales,
zero points and biases; every per-element step runs on the device.

Exactness without float64 (GPUs have none in MLX). numpy rounds w / s in float64 and counts
the table midpoints m below it (ties go to the lower value). Here the same decision is an
exact float32 comparison of w with m * s:
- m * s is exact in float32 when the midpoint and the scale have few significant bits:
  float and integer codes of up to 8 bits (midpoints of <= 10 bits) times f16, bf16, E8M0 or
  E4M3 scales (<= 11 bits);
- `w > m * s` equals `fl64(w / s) > m`: w has <= 24 significant bits, so a w != m * s differs
  from m * s by far more than float64's rounding of the quotient could hide (the quotient is
  never rounded onto m).
Zero-point formats round w / s to an integer (ties to even) the same way, comparing w with
(r +- 0.5) * s. N:M pruning ranks |(t - z) * s|, exact in float32. Each MLX op rounds once
(nothing here is compiled or fused), so these float32 identities hold on every device.
(Weights and scales are taken to be normal float32 numbers, as any model's are: products in
float32's subnormal range would not be exact.)

Value tables such as NF4 have midpoints of 24+ bits: there the float32 quotient w / s decides
wherever it is clearly (2^-18, relative) away from every midpoint, and the few elements
nearer than that are decided on the host by numpy's float64 code (`_table_index`).

Formats outside these bounds (f32 scales, biases, whose w - b numpy rounds twice in float64,
N:M with chunks, N:M of value tables) are quantised by the numpy code on a host copy
of the weight; the result is the same, only slower. Every array of a format is [..., N]
(block patterns: [..., N / block_n]) and no step mixes columns, so the host path packs column
slices in a thread pool (numpy's loops release the GIL) and joins them: bit-identical to one
`pack` of the whole matrix (tested), and about as many times faster as there are cores.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import mlx.core as mx
import numpy as np

from ..errors import ShapeError
from ..formats import (BlockPatternSparsity, FloatEncoding, Format, GroupScale, IntEncoding, NMSparsity,
                      PackedWeights)
from ..formats.pack_weights import pack
from ..formats.quantize import GroupParameters, group_parameters
from ..formats.tensors import check_float_matrix
from .mlx_ops import pack_bits_mx, packed_to_mx

_FLOATS = (mx.float16, mx.bfloat16, mx.float32)
#: Scale types whose values have at most 11 significant bits (f16 11, bf16 8, E4M3 4, E8M0 1).
_SHORT_SCALES = ("f16", "bf16", "e8m0", "e4m3")


def device_exact(fmt: Format) -> bool:
    """True when `pack_mx` quantises `fmt` on the device (see the module docstring)."""
    enc = fmt.element
    short_codes = (isinstance(enc, IntEncoding) or
                   (isinstance(enc, FloatEncoding) and enc.man_bits <= 7)) and enc.bits <= 8
    sp = fmt.sparsity
    common = (isinstance(fmt.scale, GroupScale) and fmt.scale.dtype in _SHORT_SCALES
              and fmt.bias is None and enc.bits <= 8)
    if short_codes:
        return common and (not isinstance(sp, NMSparsity) or sp.chunk == 1)
    # Value tables (NF4): codes by quotient with an exact host pass for near-ties; N:M
    # pruning ranks products of long table values, which float32 does not keep exact.
    return common and fmt.zero_point is None and not isinstance(sp, NMSparsity)


def _short_midpoints(fmt: Format) -> bool:
    """Midpoints with <= 13 significant bits: m * s is exact in float32 for short scales."""
    midpoints = fmt.element._rounding[0]
    m32 = midpoints.astype(np.float32)
    if not np.array_equal(m32.astype(np.float64), midpoints):
        return False
    mantissa = np.frexp(np.abs(m32[m32 != 0]))[0] * (1 << 13)
    return bool(np.all(mantissa == np.round(mantissa)))


def pack_mx(fmt: Format, w: mx.array, on_device: bool | None = None) -> PackedWeights:
    """`marlin_dsl.pack(fmt, w)` for an MLX float16/bfloat16/float32 [K, N] weight, with MLX
    arrays in the format's linear layout (bf16 parameters as mx.bfloat16). Bit-identical to
    numpy's `pack` on the weight converted to float32 (exactly).

    `on_device` (default: when MLX's default device is a GPU) runs the per-element work as
    MLX ops where `device_exact(fmt)`; otherwise numpy packs a host copy (on a CPU, numpy's
    vectorised float64 loops are faster than MLX's CPU backend for this work)."""
    if not isinstance(fmt, Format):
        raise TypeError(f"fmt: expected a marlin_dsl Format, got {type(fmt).__name__}")
    if not isinstance(w, mx.array) or w.ndim != 2 or w.dtype not in _FLOATS:
        got = f"{w.dtype} rank {w.ndim}" if isinstance(w, mx.array) else type(w).__name__
        raise ShapeError(f"weights: expected a 2-D float16, bfloat16 or float32 mlx array [K, N], got {got}")
    k, n = (int(d) for d in w.shape)
    fmt.check_shape(k, n)
    w32 = w.astype(mx.float32)
    if on_device is None:
        on_device = mx.default_device().type == mx.DeviceType.gpu
    if not (on_device and device_exact(fmt)):
        return PackedWeights(fmt, (k, n), packed_to_mx(pack_columns(fmt, np.array(w32)), fmt))
    g = fmt.group_size_for(k)
    grouped = w32.reshape(k // g, g, n)
    extremes = mx.stack([mx.max(grouped, axis=1), mx.min(grouped, axis=1)])
    finite = mx.all(mx.isfinite(extremes))  # NaN propagates into max/min, inf stays
    host = np.array(extremes)  # the one sync: [2, K/G, N] float32
    if not bool(finite.item()):
        check_float_matrix(np.array(w32), "weights")  # raises, naming the first bad element
    params = group_parameters(fmt, host[0].astype(np.float64), host[1].astype(np.float64),
                              lambda: np.array(w32))
    codes = _codes(fmt, grouped, params).reshape(k, n)
    arrays = packed_to_mx(params.stored, fmt)
    sp = fmt.sparsity
    if isinstance(sp, NMSparsity):
        arrays.update(_prune_and_pack(fmt, sp, codes, arrays, params))
    else:
        arrays["qweight"] = pack_bits_mx(codes, fmt.element.bits, fmt.packing.word_bits)
        if isinstance(sp, BlockPatternSparsity):
            arrays["patterns"] = _block_patterns(fmt, sp, codes, params)
    order = [spec.name for spec in fmt.buffers(k, n)]
    return PackedWeights(fmt, (k, n), {name: arrays[name] for name in order})


#: Below this many weights a column split costs more than it saves.
_SPLIT_MIN_ELEMENTS = 1 << 22


def pack_columns(fmt: Format, w: np.ndarray, workers: int | None = None) -> dict[str, np.ndarray]:
    """`pack(fmt, w).arrays` computed on column slices in parallel threads (see the module
    docstring); slices are whole sparsity blocks wide. `workers=1` packs in one piece."""
    k, n = w.shape
    workers = workers or min(16, os.cpu_count() or 1)
    unit = getattr(fmt.sparsity, "block_n", 1)
    # Slices of at least 1M weights (64 columns at least), whole blocks, at most `workers`.
    per = max(64, (1 << 20) // max(k, 1), -(-n // workers))
    per = -(-per // unit) * unit
    if workers == 1 or w.size < _SPLIT_MIN_ELEMENTS or per >= n:
        return pack(fmt, w).arrays
    check_float_matrix(w, "weights")  # whole-matrix indices in the message, not a slice's
    starts = range(0, n, per)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        parts = list(pool.map(lambda c: pack(fmt, w[:, c:c + per]).arrays, starts))
    return {name: np.concatenate([part[name] for part in parts], axis=-1) for name in parts[0]}


# ----- codes ---------------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _rounding_tables(fmt: Format) -> tuple[mx.array, mx.array, int]:
    """(midpoints padded to a power of two minus one with +inf, the code of each distinct
    table value, binary-search steps): encodings._rounding as MLX arrays."""
    midpoints, unique_codes, _ = fmt.element._rounding
    steps = max(1, int(np.ceil(np.log2(len(midpoints) + 1))))
    padded = np.full((1 << steps) - 1, np.inf, np.float32)
    padded[: len(midpoints)] = midpoints.astype(np.float32)  # exact where _short_midpoints
    return mx.array(padded), mx.array(unique_codes.astype(np.uint8)), steps


def _count_below(fmt: Format, above) -> mx.array:
    """For each element, the number of midpoints m with `above(m)` true (m below the value),
    by a binary search over the sorted midpoints: every comparison is `above`, exact."""
    midpoints, _, steps = _rounding_tables(fmt)
    index = None
    for step in reversed(range(steps)):  # index += 2**step where the midpoint there is below
        probe = (1 << step) - 1 if index is None else index + ((1 << step) - 1)
        m = mx.take(midpoints, probe) if index is not None else midpoints[probe]
        go = above(m)
        index = mx.where(go, (1 << step) if index is None else index + (1 << step),
                         0 if index is None else index)
    return index.astype(mx.uint32)


def _codes(fmt: Format, grouped: mx.array, params: GroupParameters) -> mx.array:
    """[K/G, G, N] uint8 codes, as `quantize._round_to_codes` chooses them."""
    s = mx.array(params.scale.astype(np.float32))[:, None, :]  # exact: short scale types
    _, unique_codes, _ = _rounding_tables(fmt)
    if params.zero is not None:
        lo, hi = params.table_range
        zero = mx.array(params.zero.astype(np.float32))[:, None, :]
        r = _rint_quotient(grouped, s, lo - zero - 1, hi - zero + 1)
        level = mx.clip(r + zero, lo, hi)  # an integer value of the table
        index = _count_below(fmt, lambda m: level > m)
    elif _short_midpoints(fmt):
        index = _count_below(fmt, lambda m: grouped > m * s)
    else:
        index = _table_index(fmt, grouped, s, params)
    return mx.take(unique_codes, index)


#: Relative distance of the float32 quotient from a midpoint under which the host decides.
_NEAR = 2.0 ** -18


def _table_index(fmt: Format, grouped: mx.array, s: mx.array, params: GroupParameters) -> mx.array:
    """numpy's index (midpoints m < fl64(w / s)) for midpoints that float32 cannot hold (value
    tables such as NF4). The float32 quotient q is within 2^-21 of w / s even with an
    approximate division, and float32(m) within 2^-24 of m, so where q is further than 2^-18
    (relative) from every nonzero midpoint, q > float32(m) decides as float64 does; at m = 0
    the sign of w decides exactly. The few elements nearer than that (ties among them) are
    decided by numpy's own code on the host: one count, one gather, one scatter."""
    midpoints, _, _ = _rounding_tables(fmt)  # float32(m), padded with +inf
    q = grouped / s
    index = _count_below(fmt, lambda m: q > m)
    real = len(fmt.element._rounding[0])
    near = mx.zeros(q.shape, dtype=mx.bool_)
    for offset in (-1, 0):  # the midpoints either side of q
        i = mx.clip(index.astype(mx.int32) + offset, 0, real - 1)
        m = mx.take(midpoints, i)
        near = near | ((m != 0) & (mx.abs(q - m) <= _NEAR * mx.abs(m)))
    count = int(mx.sum(near).item())
    if count == 0:
        return index
    # Compact the near elements' flat indices into `where` [count]: each goes to its rank
    # among them; the others all go to one extra slot that is dropped.
    flat_near = near.reshape(-1)
    slot = mx.where(flat_near, mx.cumsum(flat_near.astype(mx.int32)) - 1, count)
    where = mx.zeros((count + 1,), dtype=mx.int32)
    where[slot] = mx.arange(flat_near.size, dtype=mx.int32)
    where = where[:count]
    g, n = grouped.shape[1], grouped.shape[2]
    rows = where // (g * n)  # group index of each element
    cols = where % n
    w64 = np.array(mx.take(grouped.reshape(-1), where)).astype(np.float64)
    s64 = params.scale[np.array(rows), np.array(cols)].astype(np.float64)
    exact = np.empty(count, np.uint8)
    m64 = fmt.element._rounding[0]
    exact[:] = np.searchsorted(m64, w64 / s64, side="left")  # numpy's index: m < x
    flat = index.reshape(-1)
    flat[where] = mx.array(exact.astype(np.uint32))
    return flat.reshape(index.shape)


def _rint_quotient(w: mx.array, s: mx.array, low: mx.array, high: mx.array) -> mx.array:
    """rint(w / s) (ties to even) as float32 integers, clipped to [low, high] (the range that
    survives the later clip), from exact comparisons of w with (r +- 0.5) * s."""
    r = mx.clip(mx.round(w / s), low, high)  # round: ties to even; off by at most one
    up_edge = (r + 0.5) * s
    up = (w > up_edge) | ((w == up_edge) & (mx.remainder(r, 2) != 0))
    r = mx.where(up & (r < high), r + 1, r)
    down_edge = (r - 0.5) * s
    down = (w < down_edge) | ((w == down_edge) & (mx.remainder(r, 2) != 0))
    return mx.where(down & (r > low), r - 1, r)


def _decoded(fmt: Format, codes: mx.array, params: GroupParameters) -> mx.array:
    """(t - z) * s in float32 per element of [K/G, G, N] codes (exact: short types)."""
    t = mx.take(mx.array(fmt.element.table().astype(np.float32)), codes.astype(mx.uint32))
    if params.zero is not None:
        t = t - mx.array(params.zero.astype(np.float32))[:, None, :]
    return t * mx.array(params.scale.astype(np.float32))[:, None, :]


# ----- N:M pruning and packing -------------------------------------------------------------------

def _prune_and_pack(fmt: Format, sp: NMSparsity, codes: mx.array, arrays: dict,
                    params: GroupParameters) -> dict[str, mx.array]:
    """prune(): keep the n largest |values| of every m (ties to the lower index), then the
    kept codes in order and the metadata fields, packed (single-position chunks)."""
    k, n = codes.shape
    g = fmt.group_size_for(k)
    magnitude = mx.abs(_decoded(fmt, codes.reshape(k // g, g, n), params)).reshape(k // sp.m, sp.m, n)
    rank = mx.zeros(magnitude.shape, dtype=mx.uint32)
    for j in range(sp.m):  # j's place in a stable sort on descending magnitude
        for i in range(sp.m):
            if i != j:
                before = magnitude[:, i] >= magnitude[:, j] if i < j else magnitude[:, i] > magnitude[:, j]
                rank[:, j] = rank[:, j] + before.astype(mx.uint32)
    keep = rank < sp.n  # [B, m, N]
    # The s-th kept position is the number of positions whose running count is <= s.
    running = mx.cumsum(keep.astype(mx.uint32), axis=1)
    positions = mx.stack([mx.sum((running <= s).astype(mx.uint32), axis=1) for s in range(sp.n)], axis=1)
    kept = mx.take_along_axis(codes.reshape(k // sp.m, sp.m, n), positions, axis=1)  # [B, n, N]
    fields = positions[:, 0]
    for i in range(1, sp.n):
        fields = fields + mx.left_shift(positions[:, i], i * sp.index_bits)
    return {"qweight": pack_bits_mx(kept.reshape(-1, n), fmt.element.bits, fmt.packing.word_bits),
            "meta": pack_bits_mx(fields, sp.meta_bits, fmt.packing.word_bits)}


def _block_patterns(fmt: Format, sp: BlockPatternSparsity, codes: mx.array,
                    params: GroupParameters) -> mx.array:
    """layout.block_patterns of the non-zero decoded values: one OR byte per block."""
    k, n = codes.shape
    g = fmt.group_size_for(k)
    nonzero = (_decoded(fmt, codes.reshape(k // g, g, n), params) != 0).reshape(k, n)
    nb = -(-n // sp.block_n)
    padded = mx.pad(nonzero, [(0, 0), (0, nb * sp.block_n - n)])
    any_col = mx.any(padded.reshape(k // sp.block_k, sp.block_k, nb, sp.block_n), axis=3)
    weights = mx.array((1 << np.arange(sp.block_k)).astype(np.uint32))[None, :, None]
    return mx.sum(any_col.astype(mx.uint32) * weights, axis=1).astype(mx.uint8)


__all__ = ["device_exact", "pack_columns", "pack_mx"]
