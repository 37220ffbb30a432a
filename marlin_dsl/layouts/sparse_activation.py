"""Where a target's sparse GEMM wants a run-time sparsified operand S [P, L].

The sparsify kernel works in *units*: a unit is the pair of rows (g, g + 8) of a 16-row tile
(`mt`) of S and 16 logical columns (half `h` of a 32-column K tile `kt`), i.e. two rows of four
2:4 groups. A unit writes 2 x 8 compressed values and exactly one u32 metadata word:
row g's four nibbles in bits [15:0] and row g + 8's in bits [31:16], group j's nibble at
4 j (+ 16 for the second row), nibble = idx0 | idx1 << 2 (the `mma.sp` ordered metadata).

That word shape is what CUDA's `mma.sp` m16n8k32 reads (`Target.sparse_metadata`): lane
4 g + 2 F + h of a metadata register holds exactly that unit's fields, F choosing one of two
consecutive 16-row tiles. So the layouts differ only in *where* values and words go:

- "cuda_mma_sp": values in fragment order, the compressed 16 x 16 tile of (mt, kt) as 32 lanes x
  8 halves (each lane's A fragment one 16-byte load; the order comes from
  `Target.lane_elements("a", 16, 16)`); metadata words for the tile pair (mt // 2, kt) as 32
  lanes (one register per lane serves both tiles, selector F = mt % 2). Rows are padded to 32.
- "row_major" (Metal, and any target without a sparse MMA): values row-major [Pp, Lp / 2];
  metadata words [Pp / 16, Lp / 32, 16] in unit order (2 g + h). Rows are padded to 16.

In both, L is padded with zeros to Lp = a multiple of 32 (one K tile) and the padded groups
are sparsified like any other (their values are 0; their nibbles valid). The layout is decided
here from the target's tables; nothing else hard-codes it.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..formats.activation_reference import SparseResult, decompress, nibbles_to_indices
from ..formats.activation_spec import SparsifyError
from ..machine.target import ROW_MAJOR, TARGETS, Target

K_TILE = 32          # logical columns of one K tile (the sparse MMA's k)
ROW_TILE = 16        # rows of one tile
UNIT_COLS = 16       # logical columns of one unit (4 groups)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class ActivationLayout:
    """The physical layout of a sparsified operand S [P, L] for one target."""

    target: str
    p: int
    length: int

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise SparsifyError(f"layout: unknown target {self.target!r}; known: {sorted(TARGETS)}")
        if self.p < 1 or self.length < 1:
            raise SparsifyError(f"layout: operand shape must be positive, got [{self.p}, {self.length}]")

    # ----- the target's choice ---------------------------------------------------------------

    @property
    def kind(self) -> str:
        """The target's name for the layout (`Target.activation_layout`)."""
        return TARGETS[self.target].activation_layout

    @property
    def fragment_order(self) -> bool:
        """Whether values and metadata are in the sparse MMA's fragment order (the target's
        sparse activation layout), not row-major."""
        return self.kind != ROW_MAJOR

    @property
    def row_pad(self) -> int:
        return 2 * ROW_TILE if self.fragment_order else ROW_TILE

    @property
    def pp(self) -> int:
        return _cdiv(self.p, self.row_pad) * self.row_pad

    @property
    def lp(self) -> int:
        return _cdiv(self.length, K_TILE) * K_TILE

    @property
    def m_tiles(self) -> int:
        return self.pp // ROW_TILE

    @property
    def k_tiles(self) -> int:
        return self.lp // K_TILE

    @property
    def value_words(self) -> int:
        """u32 words of compressed values (two 16-bit values each)."""
        return self.pp * self.lp // 4

    @property
    def meta_words(self) -> int:
        return self.m_tiles * self.k_tiles * 16

    @property
    def units(self) -> int:
        return self.m_tiles * self.k_tiles * 16

    # ----- index maps (numpy; the kernel lowering evaluates the same maps in IR) ------------

    @cached_property
    def value_pair_table(self) -> np.ndarray:
        """[16, 8]: u32 word of compressed pair (row r, pair c) inside its tile's block, for
        "cuda_mma_sp" (from the A lane table; both halves of a pair are one lane's one register)."""
        rows, cols = _a_lanes(TARGETS[self.target])
        pos = np.full((ROW_TILE, UNIT_COLS), -1, np.int64)
        pos[rows, cols] = np.arange(rows.size).reshape(rows.shape)
        if (pos < 0).any() or not np.array_equal(pos[:, 1::2], pos[:, 0::2] + 1) or (pos[:, 0::2] % 2).any():
            raise SparsifyError(f"{self.target}: the A lane table does not keep compressed pairs in one register")
        return pos[:, 0::2] // 2

    @cached_property
    def meta_lane_table(self) -> np.ndarray:
        """[2 (F), 8 (g), 2 (h)]: the lane whose metadata word holds unit (g, h) of tile F of a
        pair, for "cuda_mma_sp", checked field by field against `Target.sparse_metadata`."""
        target: Target = TARGETS[self.target]
        table = np.full((2, 8, 2), -1, np.int64)
        for f in (0, 1):
            fields = target.sparse_metadata(f)
            g = fields.rows % 8
            h = fields.groups // 4
            want_bit = 16 * (fields.rows // 8) + 4 * (fields.groups % 4) + 2 * fields.slots
            if not np.array_equal(fields.bit_offsets, want_bit):
                raise SparsifyError(f"{self.target}: sparse metadata bits are not in unit order")
            for gi, hi, lane in zip(g, h, fields.lanes):
                if table[f, gi, hi] not in (-1, lane):
                    raise SparsifyError(f"{self.target}: one unit's metadata spans two lanes")
                table[f, gi, hi] = lane
        if (table < 0).any():
            raise SparsifyError(f"{self.target}: sparse metadata misses a unit")
        return table

    # The index maps take numpy or MLX integer arrays (`lookup` reads a small table either
    # way), so the host decoder and the on-device decoder (`kernels.decode_mx`) are one code.

    def value_word_index(self, rows, pairs, lookup=None):
        """u32 word holding compressed pair `pairs` (0 .. Lp/4 - 1) of S row `rows`."""
        if not self.fragment_order:
            return rows * (self.lp // 4) + pairs
        mt, r = rows // ROW_TILE, rows % ROW_TILE
        kt, c = pairs // 8, pairs % 8
        lookup = lookup or _np_lookup
        return (mt * self.k_tiles + kt) * 128 + lookup(self.value_pair_table, r * 8 + c)

    def meta_word_index(self, mt, kt, g, h, lookup=None):
        """u32 metadata word of unit (mt, kt, g, h)."""
        if not self.fragment_order:
            return (mt * self.k_tiles + kt) * 16 + 2 * g + h
        lookup = lookup or _np_lookup
        return ((mt // 2) * self.k_tiles + kt) * 32 + lookup(self.meta_lane_table, (mt % 2) * 16 + g * 2 + h)

    @staticmethod
    def nibble_shift(row_in_tile, group_in_tile):
        """Bit offset of the nibble of (row 0..15 of a 16-row tile, group 0..7 of a K tile)
        inside its unit's metadata word (`meta_word_index`): row g's four groups in bits
        [15:0], row g + 8's in [31:16], group j of the unit at 4 j. Numpy or MLX arrays."""
        return 16 * (row_in_tile // 8) + 4 * (group_in_tile % 4)

    # ----- host-side encode / decode (independent of the kernels: for checks and tests) ------

    def encode(self, result: SparseResult, dtype: str) -> tuple[np.ndarray, np.ndarray]:
        """(values u32 words, metadata u32 words) of a reference result in this layout (values
        are float32 holding `dtype` numbers). Padding: zero values, the method's all-zero nibble."""
        vals, nib = self._padded(result)
        bits = _to_bits(vals, dtype).astype(np.uint32)                       # [Pp, Lp/2]
        words = bits[:, 0::2] | (bits[:, 1::2] << np.uint32(16))             # [Pp, Lp/4]
        rows, pairs = np.meshgrid(np.arange(self.pp), np.arange(self.lp // 4), indexing="ij")
        values = np.zeros(self.value_words, np.uint32)
        values[self.value_word_index(rows, pairs)] = words
        # nibble of (row, group): unit (mt, kt, g, h), bit 16 * (row // 8 % 2) + 4 * (group % 4)
        rows, groups = np.meshgrid(np.arange(self.pp), np.arange(self.lp // 4), indexing="ij")
        mt, r = rows // ROW_TILE, rows % ROW_TILE
        kt, gi = groups // 8, groups % 8
        word = self.meta_word_index(mt, kt, r % 8, gi // 4)
        shift = self.nibble_shift(r, gi).astype(np.uint32)
        meta = np.zeros(self.meta_words, np.uint32)
        np.bitwise_or.at(meta, word.ravel(), (nib.astype(np.uint32) << shift).ravel())
        return values, meta

    def decode(self, values: np.ndarray, meta: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
        """(dense S [P, L] float32, nibbles [P, ceil(L/4)]) read back from physical arrays."""
        values, meta = np.asarray(values, np.uint32).ravel(), np.asarray(meta, np.uint32).ravel()
        if values.size != self.value_words or meta.size != self.meta_words:
            raise SparsifyError(f"layout {self.kind} [{self.p}, {self.length}]: expected "
                                f"{self.value_words} value words and {self.meta_words} metadata "
                                f"words, got {values.size} and {meta.size}")
        rows, pairs = np.meshgrid(np.arange(self.pp), np.arange(self.lp // 4), indexing="ij")
        words = values[self.value_word_index(rows, pairs)]
        halves = np.stack([words & 0xFFFF, words >> 16], axis=-1).reshape(self.pp, self.lp // 2)
        vals = _from_bits(halves.astype(np.uint16), dtype)
        rows, groups = np.meshgrid(np.arange(self.pp), np.arange(self.lp // 4), indexing="ij")
        mt, r = rows // ROW_TILE, rows % ROW_TILE
        kt, gi = groups // 8, groups % 8
        word = meta[self.meta_word_index(mt, kt, r % 8, gi // 4)]
        nib = ((word >> self.nibble_shift(r, gi).astype(np.uint32)) & 0xF).astype(np.uint8)
        idx = nibbles_to_indices(nib)
        if not (idx[..., 0] < idx[..., 1]).all():
            bad = np.argwhere(~(idx[..., 0] < idx[..., 1]))[0]
            raise SparsifyError(f"metadata of row {bad[0]}, group {bad[1]} is not ordered "
                                f"(nibble {nib[tuple(bad)]:#x})")
        dense = decompress(vals, idx, self.lp)
        return dense[:self.p, :self.length], nib[:self.p, :_cdiv(self.length, 4)]

    def _padded(self, result: SparseResult) -> tuple[np.ndarray, np.ndarray]:
        vals = np.zeros((self.pp, self.lp // 2), np.float32)
        nib = np.full((self.pp, self.lp // 4), result.pad_nibble, np.uint8)
        p, c = result.values.shape
        vals[:p, :c] = result.values
        nib[:p, :result.nibbles.shape[1]] = result.nibbles
        return vals, nib


def _np_lookup(table: np.ndarray, flat_index: np.ndarray) -> np.ndarray:
    return table.ravel()[flat_index]


def _a_lanes(target: Target) -> tuple[np.ndarray, np.ndarray]:
    lanes = target.lane_elements("a", 16, 16)
    if lanes is None:
        raise SparsifyError(f"{target.name}: no lane table for the sparse MMA's compressed A")
    return lanes


def _to_bits(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "f16":
        return x.astype(np.float16).view(np.uint16)
    return (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)  # already bf16


def _from_bits(bits: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "f16":
        return bits.view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)
