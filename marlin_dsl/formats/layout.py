"""Packing logical codes into a format's arrays and back, derived from the description."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError, ValueRangeError
from .bitstream import pack_bits, unpack_bits
from .format import Format
from .prune import kept_chunk_positions
from .reference import dequantize
from .sparsity import BlockPatternSparsity, NMSparsity
from .tensors import PackedWeights, QuantizedWeights, check_array, first_index


def pack_codes(weights: QuantizedWeights) -> PackedWeights:
    """QuantizedWeights -> PackedWeights in the format's linear layout.

    N:M formats must be pruned first (`prune`); the stored codes are the kept ones in
    dense-K order, so block b of a 2:4 values word sits at bits 8*(b%4) and 8*(b%4)+4.
    """
    fmt = weights.format
    k, n = weights.codes.shape
    fmt.check_shape(k, n, "weights.codes")
    _check_logical(weights)
    bits, word = fmt.element.bits, fmt.packing.word_bits
    arrays: dict[str, np.ndarray] = {}
    sp = fmt.sparsity
    if isinstance(sp, NMSparsity):
        if weights.keep is None:
            raise ValueRangeError(
                f"weights: format {fmt.name!r} is {sp.describe()} sparse; prune() the weights "
                "before packing (keep mask is missing)"
            )
        positions = kept_chunk_positions(weights.keep, sp)  # [B, n, N]
        chunks = weights.codes.reshape(k // sp.block_k, sp.m, sp.chunk, n)
        kept = np.take_along_axis(chunks, positions[:, :, None, :], axis=1)
        arrays["qweight"] = pack_bits(kept.reshape(-1, n), bits, word)
    else:
        arrays["qweight"] = pack_bits(weights.codes, bits, word)
    arrays["scales"] = weights.scales
    if fmt.zero_point is not None:
        arrays["zeros"] = weights.zeros
    if isinstance(sp, NMSparsity):
        shifts = (np.arange(sp.n) * sp.index_bits)[None, :, None]
        fields = (positions.astype(np.int64) << shifts).sum(axis=1)
        arrays["meta"] = pack_bits(fields, sp.meta_bits, word)
    elif isinstance(sp, BlockPatternSparsity):
        arrays["patterns"] = block_patterns(fmt, dequantize(weights) != 0)
    return PackedWeights(fmt, (k, n), arrays)


def unpack(packed: PackedWeights) -> QuantizedWeights:
    """PackedWeights -> QuantizedWeights (validating the arrays first)."""
    from .validate import validate

    validate(packed)
    fmt = packed.format
    k, n = packed.shape
    bits, word = fmt.element.bits, fmt.packing.word_bits
    stored = unpack_bits(packed["qweight"], bits, word)
    zeros = packed.arrays.get("zeros")
    sp = fmt.sparsity
    keep = None
    if isinstance(sp, NMSparsity):
        positions = metadata_positions(packed["meta"], sp, word)
        blocks = k // sp.block_k
        chunks = np.zeros((blocks, sp.m, sp.chunk, n), dtype=np.uint8)
        values = stored.reshape(blocks, sp.n, sp.chunk, n)
        np.put_along_axis(chunks, positions[:, :, None, :], values, axis=1)
        kept = np.zeros((blocks, sp.m, n), dtype=bool)
        np.put_along_axis(kept, positions, True, axis=1)
        codes = chunks.reshape(k, n)
        keep = np.repeat(kept, sp.chunk, axis=1).reshape(k, n)
    else:
        codes = stored
    return QuantizedWeights(fmt, codes, packed["scales"], zeros, keep)


def metadata_positions(meta: np.ndarray, sp: NMSparsity, word_bits: int) -> np.ndarray:
    """Packed metadata words -> [blocks, n, N] kept chunk positions."""
    fields = unpack_bits(meta, sp.meta_bits, word_bits).astype(np.int64)
    shifts = (np.arange(sp.n) * sp.index_bits)[None, :, None]
    return (fields[:, None, :] >> shifts) & ((1 << sp.index_bits) - 1)


def block_patterns(fmt: Format, nonzero: np.ndarray) -> np.ndarray:
    """[K, N] non-zero mask -> [K/block_k, ceil(N/block_n)] uint8 OR patterns."""
    sp = fmt.sparsity
    assert isinstance(sp, BlockPatternSparsity)
    k, n = nonzero.shape
    nb = -(-n // sp.block_n)
    padded = np.zeros((k, nb * sp.block_n), dtype=bool)
    padded[:, :n] = nonzero
    any_col = padded.reshape(k // sp.block_k, sp.block_k, nb, sp.block_n).any(axis=3)
    weights = (1 << np.arange(sp.block_k, dtype=np.uint16))[None, :, None]
    return (any_col * weights).sum(axis=1).astype(np.uint8)


def _check_logical(weights: QuantizedWeights) -> None:
    fmt = weights.format
    k, n = weights.codes.shape
    groups = fmt.scale.groups(k)
    check_array(weights.codes, "weights.codes", (k, n), np.dtype(np.uint8))
    if (weights.codes >> fmt.element.bits).any():
        bad = first_index(weights.codes >> fmt.element.bits != 0)
        raise ValueRangeError(
            f"weights.codes{bad} = {weights.codes[bad]} does not fit in {fmt.element.bits} bits"
        )
    check_array(weights.scales, "weights.scales", (groups, n), fmt.scale.numpy_dtype)
    if fmt.zero_point is not None:
        if weights.zeros is None:
            raise ShapeError(f"weights.zeros: format {fmt.name!r} needs zero points, got None")
        check_array(weights.zeros, "weights.zeros", (groups, n), fmt.zero_point.numpy_dtype)
    if weights.keep is not None:
        check_array(weights.keep, "weights.keep", (k, n), np.dtype(bool))
        sp = fmt.sparsity
        if isinstance(sp, NMSparsity):
            chunks = weights.keep.reshape(k // sp.block_k, sp.m, sp.chunk, n)
            per_chunk_uniform = (chunks == chunks[:, :, :1, :]).all(axis=2)
            counts = chunks[:, :, 0, :].sum(axis=1)
            if not per_chunk_uniform.all() or (counts != sp.n).any():
                bad = first_index((counts != sp.n) | ~per_chunk_uniform.all(axis=1))
                raise ValueRangeError(
                    f"weights.keep: block {bad[0]} of column {bad[1]} does not keep exactly "
                    f"{sp.n} of {sp.m} whole chunks"
                )
