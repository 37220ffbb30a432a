"""Sparsity descriptions along K: N:M structured sparsity and block-pattern sparsity."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

import numpy as np

from ..errors import FormatError, SourceLocation
from ..source import caller_location


@dataclass(frozen=True)
class NMSparsity:
    """Keep `n` of every `m` chunks of `chunk` consecutive K positions.

    2:4 (seed 000) is `NMSparsity(2, 4)`; the pair-wise 4:8 sparsity of seed 001 (u4/s4,
    e2m1 with mxf4) is `NMSparsity(2, 4, chunk=2)`: two two-wide sub-chunks of each
    eight-wide chunk are kept. 1:2 is `NMSparsity(1, 2)`.

    Metadata: each block of m chunks records its kept chunk positions p_0 < ... < p_{n-1},
    each in `index_bits = ceil(log2 m)` bits, as `sum(p_i << (i * index_bits))`: for 2:4
    this is seed 000's nibble `(pos1 << 2) | pos0`. Block fields are packed along K into
    32-bit words LSB first (8 nibbles a word for 2:4, so metadata is [K/32, N]).
    """

    n: int
    m: int
    chunk: int = 1
    location: SourceLocation | None = field(default=None, compare=False, repr=False, kw_only=True)
    #: Only the kept values are stored (compressed along K), with metadata saying where.
    values_dense: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.location is None:
            object.__setattr__(self, "location", caller_location())
        for name in ("n", "m", "chunk"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise FormatError(f"NMSparsity: {name} must be a positive integer, got {value!r}",
                                  self.location)
        if not self.n < self.m:
            raise FormatError(f"NMSparsity: need n < m, got {self.n}:{self.m}", self.location)
        if self.m > 256:
            raise FormatError(f"NMSparsity: m must be at most 256, got {self.m}", self.location)

    @property
    def index_bits(self) -> int:
        return max(1, (self.m - 1).bit_length())

    @property
    def meta_bits(self) -> int:
        """Metadata bits per block of m chunks."""
        return self.n * self.index_bits

    @property
    def block_k(self) -> int:
        """Dense K positions covered by one block."""
        return self.m * self.chunk

    @property
    def kept_per_block(self) -> int:
        return self.n * self.chunk

    @cached_property
    def valid_fields(self) -> np.ndarray:
        """Every valid metadata field value (strictly increasing positions below m), sorted."""
        positions = np.array(_increasing_tuples(self.m, self.n), dtype=np.int64)
        shifts = np.arange(self.n, dtype=np.int64) * self.index_bits
        values = np.sort((positions << shifts).sum(axis=1))
        values.setflags(write=False)
        return values

    def describe(self) -> str:
        text = f"{self.n}:{self.m}"
        return text + (f" in chunks of {self.chunk}" if self.chunk != 1 else "")


def _increasing_tuples(m: int, n: int) -> list[tuple[int, ...]]:
    from itertools import combinations

    return list(combinations(range(m), n))


@dataclass(frozen=True)
class BlockPatternSparsity:
    """Seed 003's block patterns: per block of `block_k` K positions x `block_n` columns, one
    byte whose bit j is set when any column of the block is non-zero at K position j.

    Values stay dense; patterns [K/block_k, ceil(N/block_n)] uint8 let a kernel skip empty
    K positions. The 2**block_k-entry (count, offsets) table is `pattern_table(block_k)`.
    This pays off only for clustered zeros (pruned channels, ReLU-like structure): a random
    50%-sparse matrix almost never has an empty K position across 32 columns.
    """

    block_k: int = 8
    block_n: int = 32
    location: SourceLocation | None = field(default=None, compare=False, repr=False, kw_only=True)
    #: Every value is stored, zeros included: the patterns only let a kernel skip K positions
    #: that hold zeros (packing derives them from the dequantised values and `validate`
    #: rejects patterns that omit a non-zero), so a kernel that ignores them is still exact.
    values_dense: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.location is None:
            object.__setattr__(self, "location", caller_location())
        if not isinstance(self.block_k, int) or isinstance(self.block_k, bool) or not 1 <= self.block_k <= 8:
            raise FormatError(
                f"BlockPatternSparsity: block_k must be 1..8 (one pattern byte), got {self.block_k!r}",
                self.location,
            )
        if not isinstance(self.block_n, int) or isinstance(self.block_n, bool) or self.block_n < 1:
            raise FormatError(
                f"BlockPatternSparsity: block_n must be a positive integer, got {self.block_n!r}",
                self.location,
            )

    def patterns(self, nonzero: np.ndarray) -> np.ndarray:
        """[K, N] non-zero mask -> [K/block_k, ceil(N/block_n)] uint8 OR patterns."""
        k, n = nonzero.shape
        nb = -(-n // self.block_n)
        padded = np.zeros((k, nb * self.block_n), dtype=bool)
        padded[:, :n] = nonzero
        any_col = padded.reshape(k // self.block_k, self.block_k, nb, self.block_n).any(axis=3)
        weights = (1 << np.arange(self.block_k, dtype=np.uint16))[None, :, None]
        return (any_col * weights).sum(axis=1).astype(np.uint8)

    def describe(self) -> str:
        return f"block pattern {self.block_k}x{self.block_n}"


def pattern_table(block_k: int) -> tuple[np.ndarray, np.ndarray]:
    """The (count, offsets) lookup table of seed 003 for `block_k`-bit patterns.

    Returns `counts[2**block_k]` (uint8, popcount) and `offsets[2**block_k, block_k]` (uint8:
    the set bit positions in increasing order, then zero padding).
    """
    patterns = np.arange(2**block_k, dtype=np.int64)
    bits = ((patterns[:, None] >> np.arange(block_k)) & 1).astype(bool)
    counts = bits.sum(axis=1).astype(np.uint8)
    # A stable sort on "bit clear" lists the set positions first, in increasing order.
    ordered = np.argsort(~bits, axis=1, kind="stable")
    offsets = np.where(np.arange(block_k)[None, :] < counts[:, None], ordered, 0).astype(np.uint8)
    return counts, offsets
