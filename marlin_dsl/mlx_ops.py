"""Dequantisation built from MLX ops, derived from the format description.

`dequantize_mx` is the MLX twin of `marlin_dsl.dequantize` (the float64 numpy reference): the
same derivation from a `Format` (bit fields of the packing, N:M metadata, the encoding's value
table, group scales and zero points), expressed as MLX array ops so that it runs lazily on any
MLX device. It is the "mlx" backend of `marlin_dsl.nn.quantized_linear` (dequantise, then
matmul), which lets a model using `MarlinLinear` run where no kernel of ours does.

Nothing here branches on a format's name; every constant comes from the description.

Exactness: the value table is rounded to float32 and (t - z) * s is computed in float32. For
float and integer encodings every step is exact (table values and zero points are small
integers or short dyadic fractions, scales are fp16), so the result is the float64 reference
rounded to float32, bit for bit. For value tables (NF4) the rounded table entry and the product
are two roundings: within one float32 ulp of the reference.
"""
from __future__ import annotations

from typing import Mapping

import mlx.core as mx
import numpy as np

from .errors import ShapeError
from .formats import BlockPatternSparsity, Format, NMSparsity
from .formats.bitstream import fields_per_group

#: numpy dtypes of `Format.buffers` -> the MLX dtypes the arrays must have.
_MX_DTYPES: dict[np.dtype, mx.Dtype] = {
    np.dtype(np.uint8): mx.uint8,
    np.dtype(np.uint16): mx.uint16,
    np.dtype(np.uint32): mx.uint32,
    np.dtype(np.float16): mx.float16,
}


def mx_dtype(dtype: np.dtype) -> mx.Dtype:
    """The MLX dtype of a buffer's numpy dtype."""
    return _MX_DTYPES[np.dtype(dtype)]


def check_mx_arrays(fmt: Format, shape: tuple[int, int], arrays: Mapping[str, mx.array],
                    argument: str = "arrays") -> None:
    """Raise ShapeError unless `arrays` are exactly the buffers of `fmt` for a [K, N] weight,
    each an MLX array of the listed shape and dtype. Values are not inspected: that would
    force an evaluation (a device sync) on every call; `marlin_dsl.validate` checks them once
    when packed weights are loaded."""
    k, n = shape
    specs = fmt.buffers(k, n)
    expected = [s.name for s in specs]
    if sorted(arrays) != sorted(expected):
        raise ShapeError(f"{argument}: format {fmt.name!r} expects arrays {expected}, "
                         f"got {sorted(arrays)}")
    for spec in specs:
        array = arrays[spec.name]
        if not isinstance(array, mx.array):
            raise ShapeError(f"{argument}[{spec.name!r}]: expected an mlx.core.array, "
                             f"got {type(array).__name__}")
        if tuple(array.shape) != tuple(spec.shape):
            raise ShapeError(f"{argument}[{spec.name!r}]: expected shape {spec.shape}, "
                             f"got {tuple(array.shape)}")
        if array.dtype != mx_dtype(spec.dtype):
            raise ShapeError(f"{argument}[{spec.name!r}]: expected dtype "
                             f"{mx_dtype(spec.dtype)}, got {array.dtype}")


def _u32(values: np.ndarray | int) -> mx.array:
    return mx.array(np.asarray(values, dtype=np.uint32))


def unpack_bits_mx(words: mx.array, bits: int, word_bits: int) -> mx.array:
    """MLX twin of `formats.bitstream.unpack_bits`: [W, N] words -> [W*word_bits/bits, N]
    uint32 fields of an LSB-first bit stream along axis 0.

    Fields repeat with a period of `fields_per_group` fields (a whole number of words), so
    the word index and shift of each field in a period are host constants; a field that
    straddles two words ORs in the low bits of the next word. All arithmetic is in uint32
    (words of 8 or 16 bits are widened first), where shifts below 32 are well defined; the
    final mask drops whatever lies above the field.
    """
    per_group = fields_per_group(bits, word_bits)
    words_per_group = per_group * bits // word_bits
    rows, cols = words.shape
    grouped = words.astype(mx.uint32).reshape(rows // words_per_group, words_per_group, cols)
    word, shift = np.divmod(np.arange(per_group) * bits, word_bits)
    if words_per_group == 1:
        low = grouped  # [G, 1, N] broadcasts against the per-field shifts below
    else:
        low = mx.take(grouped, mx.array(word.astype(np.int32)), axis=1)
    value = mx.right_shift(low, _u32(shift)[None, :, None])
    straddles = shift + bits > word_bits
    if straddles.any():
        next_word = np.minimum(word + 1, words_per_group - 1).astype(np.int32)
        high = mx.take(grouped, mx.array(next_word), axis=1)
        # Fields that do not straddle shift by 0 here and are then discarded by the select.
        high = mx.left_shift(high, _u32(np.where(straddles, word_bits - shift, 0))[None, :, None])
        value = mx.bitwise_or(value, mx.where(mx.array(straddles)[None, :, None], high, _u32(0)))
    mask = _u32((1 << bits) - 1)  # bits <= 32, so the mask fits uint32
    return mx.bitwise_and(value, mask).reshape(rows // words_per_group * per_group, cols)


def _nm_scatter(fmt: Format, sp: NMSparsity, stored: mx.array, meta: mx.array,
                k: int) -> tuple[mx.array, mx.array]:
    """Stored codes [K*n/m, N] and metadata words -> dense codes [K, N] and the keep mask.

    A block's metadata field lists its kept chunk positions p_0 < ... < p_{n-1}. Instead of a
    scatter, each dense slot j gathers stored chunk #{i : p_i < j} (the number of kept chunks
    before it) and is kept iff some p_i == j; slots that are not kept get an arbitrary stored
    code, which the keep mask later replaces by 0.0.
    """
    n_cols = stored.shape[1]
    blocks = k // sp.block_k
    fields = unpack_bits_mx(meta, sp.meta_bits, fmt.packing.word_bits)  # [B, N]
    shifts = _u32(np.arange(sp.n) * sp.index_bits)[None, :, None]
    positions = mx.bitwise_and(mx.right_shift(fields[:, None, :], shifts),
                               _u32((1 << sp.index_bits) - 1))  # [B, n, N]
    slots = _u32(np.arange(sp.m))[None, None, :, None]  # [1, 1, m, 1]
    p = positions[:, :, None, :]  # [B, n, 1, N]
    source = mx.minimum(mx.sum((p < slots).astype(mx.int32), axis=1), sp.n - 1)  # [B, m, N]
    keep = mx.any(p == slots, axis=1)  # [B, m, N]
    chunks = stored.reshape(blocks, sp.n, sp.chunk, n_cols)
    index = mx.broadcast_to(source[:, :, None, :], (blocks, sp.m, sp.chunk, n_cols))
    dense = mx.take_along_axis(chunks, index, axis=1).reshape(k, n_cols)
    keep = mx.broadcast_to(keep[:, :, None, :], (blocks, sp.m, sp.chunk, n_cols)).reshape(k, n_cols)
    return dense, keep


def dequantize_mx(fmt: Format, shape: tuple[int, int], arrays: Mapping[str, mx.array]) -> mx.array:
    """[K, N] float32 weights from packed MLX arrays (named as `fmt.buffers(K, N)` lists them).

    value = (table[code] - zero) * scale with the scale and zero point of group k // G, and
    0.0 at positions an N:M format does not store; the MLX-op form of `marlin_dsl.dequantize`
    (see the module docstring for how exactly the two agree). Block patterns only say where
    a kernel may skip work, so, as in the reference, they do not enter the values.
    """
    k, n = (int(d) for d in shape)
    check_mx_arrays(fmt, (k, n), arrays)
    codes = unpack_bits_mx(arrays["qweight"], fmt.element.bits, fmt.packing.word_bits)
    keep = None
    sp = fmt.sparsity
    if isinstance(sp, NMSparsity):
        codes, keep = _nm_scatter(fmt, sp, codes, arrays["meta"], k)
    else:
        assert sp is None or isinstance(sp, BlockPatternSparsity)
    table = mx.array(fmt.element.table().astype(np.float32))
    g = fmt.group_size_for(k)
    values = mx.take(table, codes).reshape(k // g, g, n)
    if fmt.zero_point is not None:
        values = values - arrays["zeros"].astype(mx.float32)[:, None, :]
    values = (values * arrays["scales"].astype(mx.float32)[:, None, :]).reshape(k, n)
    if keep is not None:
        values = mx.where(keep, values, mx.array(0.0, dtype=mx.float32))
    return values


def packed_to_mx(arrays: Mapping[str, object]) -> dict[str, mx.array]:
    """numpy (or MLX) packed arrays -> MLX arrays, keeping dtypes (a copy for numpy input)."""
    return {name: a if isinstance(a, mx.array) else mx.array(np.ascontiguousarray(a))
            for name, a in arrays.items()}
