"""The weight stream's block-skipping layout (the target's `skip_layout`: CUDA's `lane_stream_skip`): seed 003's block
patterns turned into storage that a kernel does not read where a block is empty.

The weight-stream layout (`weight_stream.py`) stores, per N tile of 16 rows, every K vector
(one 128-bit load per lane: 64 K positions of 4-bit codes) in fragment order:
qweight[n_tile][k_vector][lane][word]. Here the N tiles are grouped into *blocks* of the
format's `block_n` rows (the seed's 32 rows a warp; a warp of a skipping kernel owns rows of
one block) and, per block, only the K vectors that hold a non-zero are stored:

    qweight[stored vector][block tile][lane][word]     (blocks one after another)
    vec_start[block]  u32 [blocks + 1]: the block's first stored vector (a row-pointer table)
    vec_k[stored vector]  u32: the K vector (dense K / chunk) the stored vector holds

A vector is empty when every pattern byte of the block's column over the vector's K positions
is 0 (`BlockPatternSparsity.patterns`; `validate` rejects patterns that omit a non-zero, so
skipping what they call empty is exact). A block with no non-zero keeps its first vector
(codes that decode to 0), so every block has a vector: a kernel clamps its prefetches to the
block's last vector without a test for an empty list. The skip unit is a whole vector of a
block: the pattern's 8 K positions are finer than one 128-bit load per lane, and a narrower
load would cost every block the instructions of four (see docs/notes/i33-block-skip.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ScheduleError, ShapeError
from ..formats import BlockPatternSparsity, Format
from ..formats.tensors import PackedWeights
from ..machine.target import Target
from .weight_stream import StreamLayout, stream_arrays, stream_layout

@dataclass(frozen=True)
class SkipLayout:
    stream: StreamLayout  # the dense weight-stream layout the stored vectors keep
    block_tiles: int  # MMA N tiles (16 rows) per block: the format's block_n / 16
    block_k: int  # K positions per pattern bit row (the format's block_k)

    @property
    def block_rows(self) -> int:
        return self.block_tiles * self.stream.tile_rows

    def blocks(self, n: int) -> int:
        return -(-n // self.block_rows)

    def vectors(self, k: int) -> int:
        return -(-k // self.stream.chunk)

    def nonempty(self, patterns: np.ndarray, k: int, n: int) -> np.ndarray:
        """bool [blocks, K vectors]: which vectors of which block hold a non-zero, from the
        format's patterns [K / block_k, ceil(N / block_n)]."""
        rows_per_vector = self.stream.chunk // self.block_k
        kv, nb = self.vectors(k), self.blocks(n)
        expected = (k // self.block_k, nb)
        if tuple(patterns.shape) != expected:
            raise ShapeError(f"patterns: shape {tuple(patterns.shape)}, expected {expected} for a "
                             f"[{k}, {n}] weight with {self.block_k} x {self.block_rows} blocks")
        padded = np.zeros((kv * rows_per_vector, nb), bool)
        padded[:expected[0]] = patterns != 0
        return padded.reshape(kv, rows_per_vector, nb).any(axis=1).T

    def kept(self, patterns: np.ndarray, k: int, n: int) -> np.ndarray:
        """`nonempty` with each all-empty block keeping its first vector."""
        keep = self.nonempty(patterns, k, n)
        keep[~keep.any(axis=1), 0] = True
        return keep

    def tables(self, patterns: np.ndarray, k: int, n: int) -> SkipTables:
        """The stored vectors of a [K, N] weight with these patterns, in stored order."""
        keep = self.kept(patterns, k, n)
        blocks, vectors = np.nonzero(keep)  # row-major: block by block, K vectors increasing
        return SkipTables(
            rows=(blocks * keep.shape[1] + vectors).astype(np.int64),
            vec_start=np.concatenate([[0], np.cumsum(keep.sum(axis=1))]).astype(np.uint32),
            vec_k=vectors.astype(np.uint32), share=float(keep.mean()))

    def by_vector_shape(self, k: int, n: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(the dense stream's qweight as [blocks, block tile, K vector, words] (its N tiles
        padded to whole blocks), the axes that make it [block, K vector][block tile, words]):
        the view whose rows `SkipTables.rows` gathers."""
        st = self.stream
        return (self.blocks(n), self.block_tiles, self.vectors(k), st.lanes * st.code_words), (0, 2, 1, 3)


@dataclass(frozen=True)
class SkipTables:
    rows: np.ndarray  # each stored vector's row of the [block, K vector] view (`by_vector_shape`)
    vec_start: np.ndarray  # u32 [blocks + 1]: each block's first stored vector
    vec_k: np.ndarray  # u32 [stored]: each stored vector's K vector
    share: float  # stored vectors over all (block, K vector) pairs


def skip_layout(fmt: Format, target: Target, where=None) -> SkipLayout:
    """The skipping layout of `fmt` on `target` (ScheduleError where the format has no block
    patterns or its blocks do not map onto the stream's tiles and vectors)."""
    sp = fmt.sparsity
    if target.skip_layout is None:
        raise ScheduleError(f"target {target.name!r} has no block-skipping weight layout "
                            "(Target.skip_layout)", where)
    if not isinstance(sp, BlockPatternSparsity):
        raise ScheduleError(f"format {fmt.name!r} has no block patterns (BlockPatternSparsity): "
                            "there is nothing to skip", where)
    stream = stream_layout(fmt, target, where)
    if stream.k_ratio != 1 or stream.scatter is not None:
        raise ScheduleError(f"format {fmt.name!r}: block skipping needs dense stored values", where)
    if sp.block_n % stream.tile_rows:
        raise ScheduleError(
            f"format {fmt.name!r}: block_n={sp.block_n} is not a multiple of {target.name}'s MMA "
            f"M ({stream.tile_rows}): a skipping warp owns whole MMA tiles of one block", where)
    if stream.chunk % sp.block_k:
        raise ScheduleError(
            f"format {fmt.name!r}: block_k={sp.block_k} does not divide the stream's vector of "
            f"{stream.chunk} K positions", where)
    return SkipLayout(stream, sp.block_n // stream.tile_rows, sp.block_k)


def skip_arrays(fmt: Format, target: Target, packed: PackedWeights) -> dict[str, np.ndarray]:
    """The arrays a skipping kernel reads: the stream's qweight with empty vectors left out,
    vec_start and vec_k (above); scales, zero points and patterns as packed."""
    layout = skip_layout(fmt, target)
    k, n = packed.shape
    arrays = stream_arrays(fmt, target, packed)
    tables = layout.tables(np.asarray(packed.arrays["patterns"]), k, n)
    shape, axes = layout.by_vector_shape(k, n)
    words = np.asarray(arrays["qweight"]).reshape(-1, shape[2], shape[3])
    tiles = np.zeros((shape[0] * shape[1], *words.shape[1:]), np.uint32)
    tiles[:words.shape[0]] = words  # the last block's missing tiles: zeros
    by_vector = tiles.reshape(shape).transpose(axes).reshape(shape[0] * shape[2], -1)
    arrays["qweight"] = np.ascontiguousarray(by_vector[tables.rows]).reshape(-1)
    arrays["vec_start"], arrays["vec_k"] = tables.vec_start, tables.vec_k
    return arrays


def stored_fraction(fmt: Format, target: Target, packed: PackedWeights) -> float:
    """Stored vectors over all (block, K vector) pairs: the share of the dense stream's weight
    bytes a skipping kernel reads."""
    k, n = packed.shape
    return skip_layout(fmt, target).tables(np.asarray(packed.arrays["patterns"]), k, n).share


__all__ = ["SkipLayout", "SkipTables", "skip_arrays", "skip_layout", "stored_fraction"]
