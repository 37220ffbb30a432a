"""Packing logical codes into a format's arrays and back, derived from the description."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError, ValueRangeError
from .bitstream import WORD_DTYPES, pack_bits, unpack_bits
from .chunking import BLOCK_ELEMENTS
from .format import Format
from .prune import MAX_COMPARED_CHUNKS, first_kept_positions, kept_chunk_positions
from .reference import dequantized_nonzero
from .sparsity import BlockPatternSparsity, NMSparsity
from .tensors import PackedWeights, QuantizedWeights, check_array, first_index
from .validate import validate


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
        positions = _kept_positions(weights.keep, sp)  # [B, n, N]
        chunks = weights.codes.reshape(k // sp.block_k, sp.m, sp.chunk, n)
        kept = _take_chunks(chunks, positions)
        arrays["qweight"] = pack_bits(kept.reshape(-1, n), bits, word)
    else:
        arrays["qweight"] = pack_bits(weights.codes, bits, word)
    for name in fmt.parameters():
        arrays[name] = weights.parameter(name)
    if isinstance(sp, NMSparsity):
        arrays["meta"] = pack_bits(_metadata_fields(positions, sp), sp.meta_bits, word)
    elif isinstance(sp, BlockPatternSparsity):
        arrays["patterns"] = block_patterns(fmt, dequantized_nonzero(weights))
    return PackedWeights(fmt, (k, n), arrays)


def _kept_positions(keep: np.ndarray, sp: NMSparsity) -> np.ndarray:
    """[K, N] keep mask (exactly n whole chunks a block, checked) -> [B, n, N] increasing
    positions of the kept chunks: `kept_chunk_positions`, in uint8 where m allows."""
    k, n = keep.shape
    chunks = keep.reshape(k // sp.block_k, sp.m, sp.chunk, n)[:, :, 0, :]
    positions = first_kept_positions(chunks, sp.n)
    return kept_chunk_positions(keep, sp) if positions is None else positions


def _take_chunks(chunks: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """[B, m, c, N] uint8 codes, [B, n, N] positions (each below m) -> [B, n, c, N] codes of
    those chunks: np.take_along_axis(chunks, positions[:, :, None, :], axis=1).

    For small m, each kept slot starts as chunk 0 and takes chunk p where its position is p,
    as a branch-free bitwise select on cache-sized runs of blocks; far faster than the
    gather through [B, n, c, N] int64 indices that take_along_axis builds.
    """
    blocks, m, chunk, cols = chunks.shape
    slots = positions.shape[1]
    if m > MAX_COMPARED_CHUNKS:
        return np.take_along_axis(chunks, positions[:, :, None, :], axis=1)
    kept = np.empty((blocks, slots, chunk, cols), dtype=chunks.dtype)
    run = max(1, BLOCK_ELEMENTS // (m * chunk * cols))
    for b0 in range(0, blocks, run):
        source, place, out = chunks[b0:b0 + run], positions[b0:b0 + run], kept[b0:b0 + run]
        for s in range(slots):
            slot = out[:, s]
            slot[...] = source[:, 0]
            for p in range(1, m):
                # slot ^= (slot ^ chunk p) & (0xFF where the position is p, else 0)
                select = (place[:, s] == p).view(np.uint8)[:, None, :] * np.uint8(0xFF)
                slot ^= (slot ^ source[:, p]) & select
    return kept


def _metadata_fields(positions: np.ndarray, sp: NMSparsity) -> np.ndarray:
    """[B, n, N] kept positions -> [B, N] metadata fields sum(p_i << (i * index_bits)) (an OR:
    each p_i < m <= 2**index_bits has its own bits), in the smallest unsigned type that holds
    meta_bits bits; pack_bits converts them to words, so the type changes no word."""
    dtype = next((WORD_DTYPES[w] for w in sorted(WORD_DTYPES) if sp.meta_bits <= w), np.int64)
    fields = np.zeros((positions.shape[0], positions.shape[2]), dtype=dtype)
    for i in range(sp.n):
        fields |= positions[:, i].astype(dtype) << dtype(i * sp.index_bits)
    return fields


def unpack(packed: PackedWeights) -> QuantizedWeights:
    """PackedWeights -> QuantizedWeights (validating the arrays first)."""
    validate(packed)
    fmt = packed.format
    k, n = packed.shape
    bits, word = fmt.element.bits, fmt.packing.word_bits
    stored = unpack_bits(packed["qweight"], bits, word)
    sp = fmt.sparsity
    keep = None
    if isinstance(sp, NMSparsity):
        positions = _metadata_positions_u8(packed["meta"], sp, word)
        blocks = k // sp.block_k
        values = stored.reshape(blocks, sp.n, sp.chunk, n)
        chunks, kept = _place_chunks(values, positions, sp.m)
        codes = chunks.reshape(k, n)
        keep = (kept if sp.chunk == 1 else np.repeat(kept, sp.chunk, axis=1)).reshape(k, n)
    else:
        codes = stored
    return QuantizedWeights.from_arrays(fmt, codes, packed.arrays, keep)


def metadata_positions(meta: np.ndarray, sp: NMSparsity, word_bits: int) -> np.ndarray:
    """Packed metadata words -> [blocks, n, N] kept chunk positions."""
    return _metadata_positions_u8(meta, sp, word_bits).astype(np.int64)


def _metadata_positions_u8(meta: np.ndarray, sp: NMSparsity, word_bits: int) -> np.ndarray:
    """`metadata_positions` as uint8 (index_bits <= 8 as m <= 256), extracted in the fields'
    own unsigned type rather than through [blocks, n, N] int64 temporaries."""
    fields = unpack_bits(meta, sp.meta_bits, word_bits)
    mask = fields.dtype.type((1 << sp.index_bits) - 1)
    positions = np.empty((fields.shape[0], sp.n, fields.shape[1]), dtype=np.uint8)
    for i in range(sp.n):
        positions[:, i] = (fields >> fields.dtype.type(i * sp.index_bits)) & mask
    return positions


def _place_chunks(values: np.ndarray, positions: np.ndarray,
                  m: int) -> tuple[np.ndarray, np.ndarray]:
    """[B, n, c, N] stored codes and [B, n, N] validated positions (strictly increasing, so
    distinct, each below m) -> the [B, m, c, N] codes, 0 in dropped chunks, and the [B, m, N]
    kept mask that np.put_along_axis writes into zeros. As no two slots share a position,
    chunk p is the OR over slots s of (the codes of s if s's position is p, else 0)."""
    blocks, slots, chunk, cols = values.shape
    chunks = np.zeros((blocks, m, chunk, cols), dtype=values.dtype)
    kept = np.zeros((blocks, m, cols), dtype=bool)
    run = max(1, BLOCK_ELEMENTS // (m * chunk * cols))
    for b0 in range(0, blocks, run):
        source, place = values[b0:b0 + run], positions[b0:b0 + run]
        out, out_kept = chunks[b0:b0 + run], kept[b0:b0 + run]
        for s in range(slots):
            for p in range(m):
                here = place[:, s] == p
                out_kept[:, p] |= here
                out[:, p] |= source[:, s] & (here.view(np.uint8)[:, None, :] * np.uint8(0xFF))
    return chunks, kept


def block_patterns(fmt: Format, nonzero: np.ndarray) -> np.ndarray:
    """[K, N] non-zero mask -> [K/block_k, ceil(N/block_n)] uint8 OR patterns."""
    sp = fmt.sparsity
    assert isinstance(sp, BlockPatternSparsity)
    return sp.patterns(nonzero)


def _check_logical(weights: QuantizedWeights) -> None:
    fmt = weights.format
    k, n = weights.codes.shape
    check_array(weights.codes, "weights.codes", (k, n), np.dtype(np.uint8))
    if int(weights.codes.max()) >> fmt.element.bits:  # uint8 (checked): some code >= 2**bits
        bad = first_index(weights.codes >> fmt.element.bits != 0)
        raise ValueRangeError(
            f"weights.codes{bad} = {weights.codes[bad]} does not fit in {fmt.element.bits} bits"
        )
    roles = {"scales": "scales", "zeros": "zero points", "biases": "biases"}
    for spec in fmt.scaling.arrays():
        name = spec.name
        array = weights.parameter(name)
        if array is None:
            raise ShapeError(f"weights.{name}: format {fmt.name!r} needs "
                             f"{roles.get(name, spec.role)}, got None")
        check_array(array, f"weights.{name}", (spec.rows(fmt.scaling, k), n), spec.storage.numpy_dtype)
    if weights.keep is not None:
        check_array(weights.keep, "weights.keep", (k, n), np.dtype(bool))
        sp = fmt.sparsity
        if isinstance(sp, NMSparsity):
            chunks = weights.keep.reshape(k // sp.block_k, sp.m, sp.chunk, n)
            counts = chunks[:, :, 0, :].sum(axis=1, dtype=np.uint16)  # m <= 256
            wrong = counts != sp.n
            if sp.chunk > 1:  # (a chunk of one position is always uniform)
                per_chunk_uniform = (chunks == chunks[:, :, :1, :]).all(axis=2)
                wrong |= ~per_chunk_uniform.all(axis=1)
            if wrong.any():
                bad = first_index(wrong)
                raise ValueRangeError(
                    f"weights.keep: block {bad[0]} of column {bad[1]} does not keep exactly "
                    f"{sp.n} of {sp.m} whole chunks"
                )
