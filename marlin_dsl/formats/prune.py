"""N:M pruning by the magnitude of the *decoded* values (seed 000 section 8.1, erratum 3)."""
from __future__ import annotations

import numpy as np

from .reference import dequantize
from .sparsity import NMSparsity
from .tensors import QuantizedWeights


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
    k, n = weights.codes.shape
    blocks = k // sp.block_k
    magnitude = np.abs(dequantize(weights))
    if weights.keep is not None:
        # Pruning twice changes nothing: positions already dropped rank below any kept one.
        magnitude = np.where(weights.keep, magnitude, -1.0)
    chunk_magnitude = magnitude.reshape(blocks, sp.m, sp.chunk, n).sum(axis=2)
    order = np.argsort(-chunk_magnitude, axis=1, kind="stable")
    kept_chunks = np.zeros((blocks, sp.m, n), dtype=bool)
    np.put_along_axis(kept_chunks, order[:, : sp.n, :], True, axis=1)
    keep = np.repeat(kept_chunks, sp.chunk, axis=1).reshape(k, n)
    codes = np.where(keep, weights.codes, np.uint8(0)).astype(np.uint8)
    return QuantizedWeights(weights.format, codes, weights.scales, weights.zeros, keep)


def kept_chunk_positions(keep: np.ndarray, sp: NMSparsity) -> np.ndarray:
    """[K, N] keep mask -> [K/block_k, n, N] increasing positions of the kept chunks."""
    k, n = keep.shape
    chunks = keep.reshape(k // sp.block_k, sp.m, sp.chunk, n)[:, :, 0, :]
    # A stable sort on "not kept" lists kept positions first, in increasing order.
    order = np.argsort(~chunks, axis=1, kind="stable")
    return order[:, : sp.n, :]
