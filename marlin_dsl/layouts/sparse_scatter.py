"""Software scatter of N:M sparse weights into dense MMA fragments: how the weight-stream layout
stores N:M values for a target without a sparse MMA (`Target.sparse_mma` is None: Metal).

The weight stream's K shuffle (`weight_stream.activation_permutation`) gives every lane, for
each A row it holds, one contiguous run of dense K positions per vector (Metal's 8x8 A: the
two columns (c, c + 1) of `tiles` K tiles are original offsets [c * tiles, (c + 2) * tiles)).
With runs of whole sparsity blocks (m chunks of `chunk` positions), every block lies inside
one lane: the lane needs its own kept codes and metadata only, no other lane's. So per lane
and vector the layout stores exactly that (`pack`): the kept codes, paired into 16-bit halves
as the dense stream pairs fragment elements, and the blocks' metadata fields, no redundancy.

In the kernel (`lowering/parts/scatter.py`) a lane decodes its kept pairs (half the decodes of
the dense stream for 2:4) and builds each dense fragment pair bitwise: the element of unit q
of a block is the kept unit the block's metadata puts at q, else 0. A fragment pair (`TilePair`)
holds unit q of two blocks (Metal: one in each half), and its candidates are the kept units
that can land at q (unit i lands in i .. i + m - n), so

    pair = mux(kept pair of candidate 0, kept pair of candidate 1, select) & keep[q]

(`ScatterPlan.programs`: one LOP3 per further candidate and one AND), where keep[q] and the
selects are constant tables indexed by the metadata field(s) of the pair's blocks, 0xFFFF in a
half whose block keeps q (or, for a select, puts the later candidate there). Zero bits are
+0.0 in every 16-bit float type, so the same masks serve any encoding, scale scheme and
activation type, and an invalid field (0: positions are strictly increasing, so no block of
n >= 2 has it) selects nothing: padding and absent tiles contribute exactly 0.

Why the value domain rather than scattering codes before a dense decode: the dense decode
would run on every position (twice the decodes for 2:4) and a code scatter needs uniform bit
shifts between slots, which the searched bit placements of float codes (`bit_placement.py`)
do not have; here the decode is the dense stream's own and the masks do not care how codes
are placed.

Everything is derived from the sparsity (n, m, chunk), the code width and the target's A lane
table with its K shuffle; `scatter_plan` picks the vector length (`tiles`) and refuses what it
cannot lay out with a reason.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import numpy as np

from ..errors import ScheduleError
from ..formats import NMSparsity
from .bit_placement import HALF, BitPlacement

#: Vector sizes (u32 words) a lane's codes or metadata may take: one load each.
_LOAD_WORDS = (1, 2, 4)
#: The widest mask-table index (bits): two blocks' fields (2:4 and 4:8 of pairs: 8 bits).
_MAX_INDEX_BITS = 10
#: Vector lengths (K tiles) tried; the layout takes whole blocks and whole words per lane.
_MAX_TILES = 64


@dataclass(frozen=True)
class TilePair:
    """One fragment pair (two elements in one 32-bit register) of one K tile."""

    field: int  # the metadata field (`MetaField`) of the pair's blocks
    q: int  # the unit (chunk) both elements hold within their blocks
    #: (kept unit i, kept pair index) for each unit the metadata may put at q, i increasing
    candidates: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class UnitProgram:
    """How a fragment pair of unit q is built (`ScatterPlan.programs`): the keep table, and
    per candidate after the first its select table and whether the mux's arms swap."""

    keep: str
    steps: tuple[tuple[str, bool], ...]


@dataclass(frozen=True)
class MetaField:
    """A lane's metadata field for one pair of blocks (low half's, high half's; one block's
    field where both halves lie in one block): bits [shift, shift + width) of word `word`."""

    lo: int  # block key (row index * blocks per row + block within the run)
    hi: int
    word: int
    shift: int
    width: int

    @property
    def double(self) -> bool:
        return self.lo != self.hi


@dataclass(frozen=True, eq=False)
class ScatterPlan:
    """The per-lane storage and the kernel's scatter for one format on one target."""

    sp: NMSparsity
    bits: int
    tiles: int  # K tiles per vector
    tile_cols: int  # dense K of one MMA tile
    run: int  # dense positions of one lane row per vector
    lane_base: tuple[int, ...]  # [lane] where the lane's runs start in a vector's dense chunk
    lane_rows: np.ndarray  # [lanes, rows per lane] A tile row of each of a lane's row indices
    tile_pairs: tuple[tuple[TilePair, ...], ...]  # [tile][pair]
    kept: np.ndarray  # [pairs, 2 (lo/hi), 3]: (block key, kept unit, position in chunk)
    fields: tuple[MetaField, ...]
    code_words: int  # u32 words of kept codes per lane and vector
    meta_words: int  # u32 words of metadata per lane and vector

    @property
    def lanes(self) -> int:
        return len(self.lane_base)

    @property
    def dense_chunk(self) -> int:
        return self.tiles * self.tile_cols

    @property
    def blocks_per_vector(self) -> int:
        return self.dense_chunk // self.sp.block_k

    @property
    def stored_per_vector(self) -> int:
        """Stored (kept) K positions per column that one vector covers."""
        return self.blocks_per_vector * self.sp.kept_per_block

    @property
    def per_half(self) -> int:
        return HALF // self.bits

    def candidates(self, q: int) -> range:
        """The kept units the metadata may put at unit q (unit i lands in i .. i + m - n)."""
        return range(max(0, q - (self.sp.m - self.sp.n)), min(q, self.sp.n - 1) + 1)

    def _at(self, i: int, q: int) -> np.ndarray:
        """[2**meta_bits] bool: the block field puts kept unit i at unit q (valid fields only)."""
        sp = self.sp
        values = np.arange(1 << sp.meta_bits, dtype=np.int64)
        position = (values >> (i * sp.index_bits)) & ((1 << sp.index_bits) - 1)
        return np.isin(values, sp.valid_fields) & (position == q)

    @cached_property
    def programs(self) -> tuple[dict[int, UnitProgram], dict[str, np.ndarray]]:
        """Per unit q, how a fragment pair holding unit q is built from its candidates' kept
        pairs: `acc = kept(i0)`, then per further candidate `acc = mux(acc, kept(i), select)`
        (arms swapped where the select is the table's complement), then `acc &= keep`; and the
        tables by name ([2**meta_bits] bool over one block's field). keep[q] is 1 where the
        block keeps unit q; a select must be 1 where candidate i sits at q and 0 where an earlier
        one does, and is free elsewhere, so an existing table (another unit's keep mask, for
        2:4 always) serves where one fits: fewer tables, fewer lookups, the same ops."""
        tables = {f"keep{q}": np.any([self._at(i, q) for i in self.candidates(q)], axis=0)
                  for q in range(self.sp.m)}
        programs = {}
        for q in range(self.sp.m):
            units, steps = list(self.candidates(q)), []
            for t, i in enumerate(units[1:], 1):
                ones, zeros = self._at(i, q), np.any([self._at(u, q) for u in units[:t]], axis=0)
                found = next(((name, swap) for name, table in tables.items() for swap in (False, True)
                              if ((table != swap) >= ones).all() and not ((table != swap) & zeros).any()), None)
                if found is None:
                    found = (f"q{q}_u{i}", False)
                    tables[found[0]] = ones
                steps.append(found)
            programs[q] = UnitProgram(f"keep{q}", tuple(steps))
        return programs, tables

    def table_name(self, field: MetaField, name: str) -> str:
        return f"nm_{'pair' if field.double else 'one'}_{name}"

    def table(self, field: MetaField, name: str) -> np.ndarray:
        """[2**width] u32 of a mask table (`programs`): 0xFFFF in each half whose block's field
        has it (a double field's index: low block's field | high block's << meta_bits)."""
        half = np.where(self.programs[1][name], 0xFFFF, 0).astype(np.uint32)
        if not field.double:
            return half | (half << np.uint32(HALF))
        return ((half[:, None] << np.uint32(HALF)) | half[None, :]).reshape(-1)  # [hi, lo]

    # ----- the lanes' words (numpy, vectorised) -------------------------------------------------

    def lane_index(self) -> tuple[np.ndarray, ...]:
        """Per (lane, kept pair, half): block within the vector, kept unit, position in its
        chunk and tile row; per (lane, field): the low and high blocks and rows."""
        bpr = self.run // self.sp.block_k  # blocks per lane row
        base = np.asarray(self.lane_base)[:, None, None] // self.sp.block_k
        key, unit, sub = self.kept[..., 0], self.kept[..., 1], self.kept[..., 2]
        blk = base + (key % bpr)[None]
        row = self.lane_rows[:, key // bpr]  # [lanes, pairs, 2]
        f_keys = np.array([[f.lo, f.hi] for f in self.fields])  # [fields, 2]
        f_blk = base[..., 0][:, :, None] + (f_keys % bpr)[None]  # [lanes, fields, 2]
        f_row = self.lane_rows[:, f_keys // bpr]
        unit_b = np.broadcast_to(unit, blk.shape)
        sub_b = np.broadcast_to(sub, blk.shape)
        return blk, unit_b, sub_b, row, f_blk, f_row

    def dims(self, blocks: int, n: int, tile_rows: int) -> tuple[int, int]:
        """(N tiles, K vectors) of a weight with `blocks` sparsity blocks per column."""
        return -(-n // tile_rows), -(-blocks // self.blocks_per_vector)

    def pack(self, stored: np.ndarray, fields: np.ndarray, tile_rows: int,
             placement: BitPlacement) -> tuple[np.ndarray, np.ndarray]:
        """[stored K, N] kept codes (the format's order: per block, unit by unit) and [blocks,
        N] metadata fields -> flat u32 (qweight [n_tile][k_vector][lane][code_words], meta
        [n_tile][k_vector][lane][meta_words]). Padding: codes 0 and field 0 (selects nothing)."""
        sp = self.sp
        blocks, n = fields.shape
        nt, kv = self.dims(blocks, n, tile_rows)
        codes = np.zeros((kv * self.blocks_per_vector, sp.n, sp.chunk, nt * tile_rows), np.uint8)
        codes[:blocks, :, :, :n] = stored.reshape(blocks, sp.n, sp.chunk, n)
        padded = np.zeros((kv * self.blocks_per_vector, nt * tile_rows), np.uint32)
        padded[:blocks, :n] = fields
        blk, unit, sub, row, f_blk, f_row = self.lane_index()
        grid = codes.reshape(kv, self.blocks_per_vector, sp.n, sp.chunk, nt, tile_rows)
        lanes = grid[:, blk, unit, sub, :, row]  # [lanes, pairs, 2, kv, nt]
        pairs = lanes.transpose(4, 3, 0, 1, 2).reshape(nt, kv, self.lanes, self.code_words, self.per_half, 2)
        qweight = placement.pack(pairs[..., 0], pairs[..., 1]).reshape(-1)
        fgrid = padded.reshape(kv, self.blocks_per_vector, nt, tile_rows)
        per_field = fgrid[:, f_blk, :, f_row]  # [lanes, fields, 2, kv, nt]
        meta = np.zeros((nt, kv, self.lanes, self.meta_words), np.uint32)
        for i, f in enumerate(self.fields):  # a handful of fields, each over the whole matrix
            value = per_field[:, i, 0]
            if f.double:
                value = value | per_field[:, i, 1] << np.uint32(sp.meta_bits)
            meta[..., f.word] |= (value << np.uint32(f.shift)).transpose(2, 1, 0)
        return qweight, meta.reshape(-1)

    def unpack(self, qweight: np.ndarray, meta: np.ndarray, blocks: int, n: int, tile_rows: int,
               placement: BitPlacement) -> tuple[np.ndarray, np.ndarray]:
        """`pack`'s inverse: ([stored K, N] codes, [blocks, N] fields), padding dropped."""
        sp = self.sp
        nt, kv = self.dims(blocks, n, tile_rows)
        words = np.asarray(qweight, np.uint32).reshape(nt, kv, self.lanes, self.code_words)
        lo, hi = placement.unpack(words)  # [nt, kv, lanes, words, slots]
        pairs = np.stack([lo, hi], axis=-1).reshape(nt, kv, self.lanes, -1, 2).transpose(2, 3, 4, 1, 0)
        blk, unit, sub, row, f_blk, f_row = self.lane_index()
        grid = np.zeros((kv, self.blocks_per_vector, sp.n, sp.chunk, nt, tile_rows), np.uint8)
        grid[:, blk, unit, sub, :, row] = pairs
        codes = grid.reshape(kv * self.blocks_per_vector, sp.n, sp.chunk, nt * tile_rows)[:blocks, ..., :n]
        m_words = np.asarray(meta, np.uint32).reshape(nt, kv, self.lanes, self.meta_words)
        fgrid = np.zeros((kv, self.blocks_per_vector, nt, tile_rows), np.uint32)
        mask = np.uint32((1 << sp.meta_bits) - 1)
        for i, f in enumerate(self.fields):
            value = (m_words[..., f.word] >> np.uint32(f.shift)).transpose(2, 1, 0)  # [lanes, kv, nt]
            fgrid[:, f_blk[:, i, 0], :, f_row[:, i, 0]] = value & mask
            if f.double:
                fgrid[:, f_blk[:, i, 1], :, f_row[:, i, 1]] = (value >> np.uint32(sp.meta_bits)) & mask
        fields = fgrid.reshape(kv * self.blocks_per_vector, nt * tile_rows)[:blocks, :n]
        return codes.reshape(blocks * sp.n * sp.chunk, n), fields


# ----- choosing the plan -------------------------------------------------------------------------

def scatter_plan(sp: NMSparsity, bits: int, a_table: tuple[np.ndarray, np.ndarray], tile_cols: int,
                 permutation: Callable[[int], np.ndarray], group: int | str, name: str,
                 where=None) -> ScatterPlan:
    """The plan for `sp` with `bits`-bit codes on an A lane table (row[lane, e], col[lane, e]) of
    `tile_cols` K columns, K-shuffled by permutation(tiles) (the MMA position -> original
    offset of a vector). Of the vector lengths that work, the first of: a scale group covers
    whole vectors (loads need no K predicates, scales can multiply the MMA sums), each lane's
    run lies in one group (one scale per lane and vector); then the longest (fewest loads)."""
    why = _refusal(sp, bits)
    if why:
        raise ScheduleError(f"format {name!r}: the weight stream's software scatter of {sp.describe()} "
                            f"values {why}; use fused_dequant", where)
    reasons: dict[str, list[int]] = {}  # why a vector length fails -> the lengths (tiles) it fails
    best: tuple[tuple[int, int, int], ScatterPlan] | None = None
    for tiles in range(1, _MAX_TILES + 1):
        plan = _plan(sp, bits, a_table, tile_cols, tiles, permutation(tiles))
        if isinstance(plan, str):
            reasons.setdefault(plan, []).append(tiles)
            continue
        whole = group == "K" or int(group) % plan.dense_chunk == 0
        in_one = whole or all(b // int(group) == (b + plan.run - 1) // int(group) for b in plan.lane_base)
        if not in_one:
            reasons.setdefault(f"a lane's run spans scale groups of {group}", []).append(tiles)
            continue
        rank = (int(whole), 0, tiles)
        if best is None or rank > best[0]:
            best = (rank, plan)
    if best is None:
        detail = "; ".join(f"{r} (at {len(t)} of the {_MAX_TILES} vector lengths tried, the longest {t[-1]} "
                           "tiles)" for r, t in sorted(reasons.items(), key=lambda item: -item[1][-1]))
        raise ScheduleError(f"format {name!r}: no vector length lets each lane scatter its own "
                            f"{sp.describe()} values: {detail}; use fused_dequant", where)
    return best[1]


def _refusal(sp: NMSparsity, bits: int) -> str:
    """Why the scatter cannot take `sp` at all ('' where it can)."""
    if HALF % bits:
        return f"pairs codes in 16-bit halves; a {bits}-bit code width does not divide 16"
    if 0 in set(int(v) for v in sp.valid_fields):
        return "needs a metadata value that marks no kept position (0), and every field value is valid"
    if 2 * sp.meta_bits > _MAX_INDEX_BITS:
        return (f"indexes mask tables by two blocks' metadata ({2 * sp.meta_bits} bits), more than "
                f"{_MAX_INDEX_BITS}")
    return ""


def _plan(sp: NMSparsity, bits: int, a_table: tuple[np.ndarray, np.ndarray], tile_cols: int,
          tiles: int, k_perm: np.ndarray) -> ScatterPlan | str:
    """The plan for one vector length, or why there is none."""
    rows, cols = a_table
    lanes, elems = rows.shape
    orig = k_perm[np.arange(tiles)[None, :, None] * tile_cols + cols[:, None, :]]  # [lanes, tiles, e]
    row_off = rows - rows[:, :1]
    if (row_off != row_off[0]).any() or elems % 2:
        return "the A lane table is not a per-lane base plus offsets of pairs"
    offsets = sorted(set(int(v) for v in row_off[0]))
    r_idx = np.array([offsets.index(int(v)) for v in row_off[0]])
    lane_rows = rows[:, :1] + np.array(offsets)[None, :]
    base = np.stack([orig[:, :, r_idx == r].reshape(lanes, -1).min(axis=1) for r in range(len(offsets))], 1)
    if (base != base[:, :1]).any():
        return "a lane's rows start their runs at different K positions"
    rel = orig - base[:, :1, None]
    run = tiles * elems // len(offsets)
    for r in range(len(offsets)):
        got = np.sort(rel[:, :, r_idx == r].reshape(lanes, -1), axis=1)
        if (got != np.arange(run)[None, :]).any():
            return "a lane's K positions are not one contiguous run per row"
    if (rel != rel[0]).any():
        return "lanes hold their runs in different orders"
    if run % sp.block_k or (base[:, 0] % sp.block_k).any():
        return f"a lane's run does not hold whole blocks of {sp.block_k}"
    rel0 = rel[0]  # [tiles, e]
    bpr = run // sp.block_k
    key = r_idx[None, :] * bpr + rel0 // sp.block_k
    unit, sub = (rel0 % sp.block_k) // sp.chunk, rel0 % sp.chunk
    kept: dict[tuple, int] = {}
    combos: dict[tuple[int, int], int] = {}
    tile_pairs = []
    for s in range(tiles):
        pairs = []
        for p in range(elems // 2):
            lo, hi = 2 * p, 2 * p + 1
            q = int(unit[s, lo])
            if q != unit[s, hi]:
                return "a fragment pair's elements hold different units of their blocks"
            combo = (int(key[s, lo]), int(key[s, hi]))
            field = combos.setdefault(combo, len(combos))
            cands = []
            for i in range(max(0, q - (sp.m - sp.n)), min(q, sp.n - 1) + 1):  # ScatterPlan.candidates
                code_pair = ((combo[0], i, int(sub[s, lo])), (combo[1], i, int(sub[s, hi])))
                cands.append((i, kept.setdefault(code_pair, len(kept))))
            pairs.append(TilePair(field, q, tuple(cands)))
        tile_pairs.append(tuple(pairs))
    blocks = len(offsets) * bpr
    codes = [c for pair in kept for c in pair]
    if len(set(codes)) != len(codes) or len(codes) != blocks * sp.kept_per_block:
        return "the kept codes do not pair up one to one"
    used = [b for combo in combos for b in sorted(set(combo))]
    if sorted(used) != list(range(blocks)):
        return "the metadata fields do not pair up one to one"
    per_half = HALF // bits
    code_words, left = divmod(len(kept), per_half)
    if left or code_words not in _LOAD_WORDS:
        return "a lane's kept codes do not fill 1, 2 or 4 words"
    fields, bit = [], 0
    for lo, hi in combos:
        width = sp.meta_bits * (1 if lo == hi else 2)
        if bit // 32 != (bit + width - 1) // 32:
            return "a metadata field would straddle two words"
        fields.append(MetaField(lo, hi, bit // 32, bit % 32, width))
        bit += width
    meta_words, left = divmod(bit, 32)
    if left or meta_words not in _LOAD_WORDS:
        return "a lane's metadata fields do not fill 1, 2 or 4 words"
    kept_arr = np.array(list(kept), dtype=np.int64)  # [pairs, 2, 3]
    return ScatterPlan(sp, bits, tiles, tile_cols, run, tuple(int(v) for v in base[:, 0]),
                       lane_rows.astype(np.int64), tuple(tile_pairs), kept_arr, tuple(fields),
                       code_words, meta_words)


__all__ = ["MetaField", "ScatterPlan", "TilePair", "UnitProgram", "scatter_plan"]
