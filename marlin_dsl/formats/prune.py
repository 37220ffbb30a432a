"""N:M pruning by the magnitude of the *decoded* values (seed 000 section 8.1, erratum 3)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .chunking import block_rows, row_blocks
from .reference import blockwise_ok, dequantize, dequantize_rows
from .sparsity import NMSparsity
from .tensors import QuantizedWeights

#: Up to this many chunks a block, ranks are counted with m*(m-1)/2 vectorised comparisons
#: (6 for 2:4), much faster than an argsort along the short middle axis; larger m argsorts.
MAX_COMPARED_CHUNKS = 16


def prune(weights: QuantizedWeights) -> QuantizedWeights:
    """Keep the n largest of every m chunks along K; other formats pass through unchanged.

    Magnitude is |decoded value| (summed over a chunk), never the raw code: for a
    sign-magnitude code such as FP4 a negative value's code is larger than any positive
    one's. Ties go to the lower K index (a stable sort on descending magnitude). Pruned
    positions get code 0 and keep=False; dequantize returns 0.0 there.
    """
    sp = weights.format.sparsity
    if not isinstance(sp, NMSparsity):
        return weights
    if not blockwise_ok(weights):
        return _prune_whole(weights, sp)
    k, n = weights.codes.shape
    g = weights.format.group_size_for(k)
    if g % sp.block_k:  # only with a K that no block of m chunks divides: an error there
        return _prune_whole(weights, sp)
    # Every step below works within one block of m chunks (dequantising, summing a chunk,
    # ranking the m chunk sums), so running it over blocks of rows that hold whole blocks of
    # m chunks, each inside one scale group, changes no value.
    codes = np.empty((k, n), dtype=np.uint8)
    keep = np.empty((k, n), dtype=bool)
    scratch = np.empty((block_rows(n, g, sp.block_k), n), dtype=np.float64)
    for r0, r1, _ in row_blocks(k, n, g, sp.block_k):
        magnitude = scratch[: r1 - r0]
        dequantize_rows(weights, r0, r1, magnitude)
        np.abs(magnitude, out=magnitude)
        if weights.keep is not None:
            # Pruning twice changes nothing: positions already dropped rank below any kept one.
            np.copyto(magnitude, -1.0, where=~weights.keep[r0:r1])
        chunk_magnitude = magnitude.reshape(-1, sp.m, sp.chunk, n)
        if sp.chunk > 1:  # (the sum of one magnitude, never -0.0, is that magnitude)
            chunk_magnitude = chunk_magnitude.sum(axis=2)
        kept_chunks = _top_n(chunk_magnitude.reshape(-1, sp.m, n), sp.n)
        block_keep = keep[r0:r1]
        block_keep.reshape(-1, sp.m, sp.chunk, n)[...] = kept_chunks[:, :, None, :]
        np.multiply(weights.codes[r0:r1], block_keep, out=codes[r0:r1])  # code, or 0 if dropped
    return replace(weights, codes=codes, keep=keep)


def _prune_whole(weights: QuantizedWeights, sp: NMSparsity) -> QuantizedWeights:
    """`prune` on whole arrays, for weights `blockwise_ok` does not accept."""
    k, n = weights.codes.shape
    blocks = k // sp.block_k
    magnitude = np.abs(dequantize(weights))
    if weights.keep is not None:
        magnitude = np.where(weights.keep, magnitude, -1.0)
    chunk_magnitude = magnitude.reshape(blocks, sp.m, sp.chunk, n).sum(axis=2)
    kept_chunks = _top_n(chunk_magnitude, sp.n)
    keep = np.repeat(kept_chunks, sp.chunk, axis=1).reshape(k, n)
    codes = np.where(keep, weights.codes, np.uint8(0)).astype(np.uint8)
    return replace(weights, codes=codes, keep=keep)


def _top_n(magnitude: np.ndarray, n: int) -> np.ndarray:
    """[B, m, N] magnitudes -> [B, m, N] bool, True at the n largest of each [b, :, col],
    ties to the lower index: the first n of a stable argsort on descending magnitude."""
    blocks, m, cols = magnitude.shape
    if m > MAX_COMPARED_CHUNKS or np.isnan(magnitude).any():
        order = np.argsort(-magnitude, axis=1, kind="stable")
        kept = np.zeros((blocks, m, cols), dtype=bool)
        np.put_along_axis(kept, order[:, :n, :], True, axis=1)
        return kept
    # Without NaN the stable sort puts chunk i before chunk j exactly when a_i > a_j, or
    # a_i == a_j and i < j. So j's place in the sorted order is the number of earlier
    # chunks i < j with a_i >= a_j plus later chunks i > j with a_i > a_j, and j is among
    # the first n when that count is below n.
    rank = np.zeros((blocks, m, cols), dtype=np.uint8)
    for j in range(m):
        for i in range(j):
            before = magnitude[:, i] >= magnitude[:, j]  # i sorts before j, else j before i
            rank[:, j] += before
            rank[:, i] += ~before
    return rank < n


def kept_chunk_positions(keep: np.ndarray, sp: NMSparsity) -> np.ndarray:
    """[K, N] keep mask -> [K/block_k, n, N] increasing positions of the kept chunks."""
    k, n = keep.shape
    chunks = keep.reshape(k // sp.block_k, sp.m, sp.chunk, n)[:, :, 0, :]
    positions = first_kept_positions(chunks, sp.n)
    if positions is not None:
        return positions.astype(np.intp)
    # A stable sort on "not kept" lists kept positions first, in increasing order.
    order = np.argsort(~chunks, axis=1, kind="stable")
    return order[:, : sp.n, :]


def first_kept_positions(chunks: np.ndarray, n: int) -> np.ndarray | None:
    """[B, m, N] bool chunk mask -> [B, n, N] uint8 positions of the first n kept chunks of
    each block, in increasing order; None unless every block keeps at least n, the mask is
    bool and m is at most MAX_COMPARED_CHUNKS (then use a stable argsort on "not kept").

    The s-th kept position (from 0) is the number of positions p whose running count of
    kept chunks (0..p inclusive) is at most s: those before it.
    """
    blocks, m, cols = chunks.shape
    if m > MAX_COMPARED_CHUNKS or chunks.dtype != np.bool_:
        return None
    count = np.zeros((blocks, cols), dtype=np.uint8)
    positions = np.zeros((blocks, n, cols), dtype=np.uint8)
    for p in range(m):
        count += chunks[:, p]
        for s in range(n):
            positions[:, s] += count <= s
    if (count < n).any():
        return None
    return positions
