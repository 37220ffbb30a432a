"""The physical weight layout of the weight-stream pipeline: codes in MMA-fragment order.

The weight-stream kernel computes Y^T = W^T X^T with the weights as the MMA's A operand
(tile_rows N rows x tile_cols stored-K columns per instruction). Each lane must find *its own*
fragment elements, for several consecutive K tiles, in one 128-bit load. The layout is derived
from two pieces of data only: the target's lane table for the A operand
(`Target.lane_elements`) and the format's code width, so a new format or target needs no edit.

Order of the u32 words (all dimensions padded with code 0; the kernel masks the padding out
through its activation loads and output stores):

    qweight[n_tile][k_vector][lane][word]       word in 0 .. VECTOR_WORDS-1

where a *k_vector* covers `tiles` consecutive K tiles (the number whose codes fill exactly
VECTOR_WORDS words for one lane). Inside a lane's words, the lane's elements (tile-major,
then the lane table's element order) are taken in pairs: pair j sits at bit offset
(j % per_half) * bits of word j // per_half, its first element in the low 16-bit half and its
second in the high half. So one mask and one shift expose a pair as two 16-bit lanes, which
the decoder turns into a half2 with two or three vector instructions (the same trick as
Marlin's interleaved INT4 layout; here derived rather than hard-coded).

Code widths that do not divide 16 (3, 5, 6, 7 bits) keep this pair layout: per_half =
floor(16 / bits) pairs per word, the remaining 16 % bits bits of each half left 0, and `tiles`
follows from the pairs a vector holds (VECTOR_WORDS * per_half) over the pairs one K tile
gives a lane (per_lane / 2): 3-bit codes take 5 pairs a word, 20 pairs a vector, so a vector
covers 20 of Metal's 8-wide K tiles (160 K) or 5 of CUDA's 16-wide ones (80 K). Storage is
16 / per_half bits a code (3-bit: 3.2, 6.7% above the format's bit stream, 20% below
int4; 5-bit: 5.33; 6-bit: 8; 7-bit: 8), plus the K padding to whole vectors (for 3-bit on
Metal at K = 4096, 4160 / 4096: 3.25 bits a code in all). Chosen over split bit planes
(3-bit: a 2-bit and a 1-bit plane, exactly 3 bits a code) with the cost model's counts
(`marlin-dsl compile --cost`; int3_zp at M = 1: 1.78 requested bytes and 7.19 lane
instructions a weight): planes would save 0.025 requested bytes a weight (1.4%) but every
pair then needs two masked fields merged under the magic number (a second LOP3 and about
three more shifts per 16 pairs: ~1.65 decode ops a weight instead of 1.1), +0.55 lane
instructions a weight (+8%), and a lane's 16 K tiles take 96 bits, which no single 128-bit
vector load fills. The decode stays the one of 4-bit codes (`lowering/pair_decode.py`).

N:M formats on a target without a sparse MMA for the pattern (Metal: none) keep only each
lane's own kept codes and metadata, which the lane scatters into dense fragments itself
(`sparse_scatter.py`, `StreamLayout.scatter`).

2:4 formats on a target with a sparse MMA (`Target.sparse_mma`, CUDA's mma.sp m16n8k32): the
values stream exactly as above over the *stored* K axis (a 16 x 16 compressed A tile covers
32 dense K; compressed columns 2j, 2j+1 are the two kept values of group j, lower position
first, which is the format's own stored order), and the metadata becomes

    meta[n_tile][k_vector][lane][tiles / 2]

one u32 per lane for each pair of consecutive K tiles: tile 2i is read with sparsity selector
0 and tile 2i+1 with selector 1, which read disjoint lanes (`Target.sparse_metadata`), so the
two tiles share one register. Padding groups get positions (0, 1), a valid ordered pair.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..errors import ScheduleError
from ..formats import Format, NMSparsity
from ..formats.bitstream import unpack_bits
from ..formats.packing import metadata_positions
from ..formats.tensors import PackedWeights
from ..machine.target import Target
from .bit_placement import BitPlacement, natural_placement, placement_for
from .sparse_scatter import ScatterPlan, scatter_plan

#: Words each lane loads at once (one 128-bit vector load).
VECTOR_WORDS = 4
#: The attribute value CUDA's lowered kernels carry in `attrs["weight_layout"]` (each target
#: names its own stream layout: `layout_name`).
LAYOUT_NAME = "lane_stream"


def layout_name(target: Target) -> str:
    """The name of `target`'s weight-stream layout (the first of `Target.weight_layouts`): one
    logical format, a physical layout per target, made from that target's lane tables."""
    if not target.weight_layouts:
        raise ScheduleError(f"target {target.name!r} declares no weight-stream layout (Target.weight_layouts)")
    return target.weight_layouts[0]


@dataclass(frozen=True)
class StreamLayout:
    bits: int  # code width
    tile_rows: int  # N rows of one A tile
    tile_cols: int  # stored-K columns of one A tile
    rows: np.ndarray  # [lanes, per_lane] tile row of each lane element
    cols: np.ndarray  # [lanes, per_lane] tile column of each lane element
    sparse_target: Target | None = None  # set for 2:4 values fed to the target's sparse MMA
    #: k_perm[j]: the original K offset (within a vector chunk) of MMA K position j = 16 s + c
    #: (tile s, column c); None: the identity. See `activation_run`.
    k_perm: np.ndarray | None = None
    x_run: int = 0  # activations one lane reads contiguously per chunk (with k_perm)
    x_run_start: tuple[int, ...] = ()  # where each lane's run starts in a chunk (with k_perm)
    k_ratio: int = 1  # dense K positions per stored one (2 for 2:4)
    #: where each slot's code bits sit in a half (`bit_placement.py`); None: the natural order
    placement: BitPlacement | None = None
    #: N:M values on a target without a sparse MMA: each lane's kept codes and metadata, which
    #: it scatters into dense fragments itself (`sparse_scatter.py`); None otherwise
    scatter: ScatterPlan | None = None

    @property
    def bit_order(self) -> BitPlacement:
        return self.placement if self.placement is not None else natural_placement(self.bits)

    @property
    def dense_tile_k(self) -> int:
        """Dense K one MMA covers (the sparse MMA's A holds half as many columns; a scattered
        layout's MMA is the dense one)."""
        return self.tile_cols if self.scatter is not None else self.tile_cols * self.k_ratio

    @property
    def dense_chunk(self) -> int:
        """Dense K one vector load covers: the weight-stream kernel's step (tile_k)."""
        return self.scatter.dense_chunk if self.scatter is not None else self.chunk * self.k_ratio

    @property
    def lanes(self) -> int:
        return int(self.rows.shape[0])

    @property
    def per_lane(self) -> int:
        return int(self.rows.shape[1])

    @property
    def per_half(self) -> int:
        """Pairs side by side in one word (each pair: one code in each 16-bit half)."""
        return pairs_per_word(self.bits)

    @property
    def tiles(self) -> int:
        """K tiles whose codes one lane loads in one vector: the vector's pairs over a tile's
        (`stream_layout` checks that they divide)."""
        if self.scatter is not None:
            return self.scatter.tiles
        return VECTOR_WORDS * self.per_half // (self.per_lane // 2)

    @property
    def chunk(self) -> int:
        """Stored-K columns one vector load covers."""
        return self.scatter.stored_per_vector if self.scatter is not None else self.tiles * self.tile_cols

    @property
    def code_words(self) -> int:
        """u32 words of codes each lane loads per vector (VECTOR_WORDS but where scattered)."""
        return self.scatter.code_words if self.scatter is not None else VECTOR_WORDS

    def pair_slot(self, pair: int) -> tuple[int, int]:
        """(word, slot) of a lane's pair `pair`: the slot's bits are `bit_order.positions[slot]`."""
        return divmod(pair, self.per_half)

    def words(self, stored_k: int, n: int) -> int:
        return -(-n // self.tile_rows) * -(-stored_k // self.chunk) * self.lanes * self.code_words

    @property
    def sparse(self) -> bool:
        return self.sparse_target is not None

    @property
    def meta_words(self) -> int:
        """Metadata words per lane per vector (sparse layouts): one per pair of tiles; a
        scattered layout's: its blocks' fields."""
        return self.scatter.meta_words if self.scatter is not None else self.tiles // 2

    @property
    def has_meta(self) -> bool:
        """Each lane loads metadata words beside its codes (`meta_words` per vector)."""
        return self.sparse or self.scatter is not None

    def pack_metadata(self, positions: np.ndarray) -> np.ndarray:
        """[dense K / 4, 2, N] kept positions (increasing) -> flat u32 meta words."""
        assert self.sparse_target is not None
        blocks, _, n = positions.shape
        groups_per_tile = self.tile_cols // 2
        nt = -(-n // self.tile_rows)
        kv = -(-blocks // (groups_per_tile * self.tiles))
        padded = np.zeros((kv * self.tiles * groups_per_tile, 2, nt * self.tile_rows), np.uint32)
        padded[:, 1] = 1  # padding: the ordered pair (0, 1)
        padded[:blocks, :, :n] = positions
        # [kv, tiles, groups, slot, nt, rows] -> [nt, kv, tiles, rows, groups, slot]
        tiled = padded.reshape(kv, self.tiles, groups_per_tile, 2, nt, self.tile_rows).transpose(4, 0, 1, 5, 2, 3)
        words = np.zeros((nt, kv, self.lanes, self.meta_words), np.uint32)
        for tile in range(self.tiles):
            f = self.sparse_target.sparse_metadata(tile % 2)
            fields = tiled[:, :, tile, f.rows, f.groups, f.slots]  # [nt, kv, fields]
            shifted = fields << np.asarray(f.bit_offsets, np.uint32)
            _or_into_lanes(words[..., tile // 2], f.lanes, shifted)
        return words.reshape(-1)

    def pack(self, codes: np.ndarray) -> np.ndarray:
        """[stored K, N] codes -> flat u32 words in the order above (vectorised)."""
        ks, n = codes.shape
        nt, kv = -(-n // self.tile_rows), -(-ks // self.chunk)
        padded = np.zeros((kv * self.chunk, nt * self.tile_rows), np.uint8 if self.bits <= 8 else np.uint16)
        padded[:ks, :n] = codes
        if self.k_perm is not None:  # MMA position j of every chunk holds original offset k_perm[j]
            padded = padded.reshape(kv, self.chunk, -1)[:, self.k_perm].reshape(kv * self.chunk, -1)
        # [kv, tiles, cols, nt, rows] -> [nt, kv, tiles, rows, cols]: one A tile = W^T block.
        tiles = padded.reshape(kv, self.tiles, self.tile_cols, nt, self.tile_rows).transpose(3, 0, 1, 4, 2)
        lane_elems = tiles[:, :, :, self.rows, self.cols]  # [nt, kv, tiles, lanes, per_lane]
        # pair j = (word j // per_half, slot j % per_half): [nt, kv, lanes, words, slots, lo/hi]
        stream = lane_elems.transpose(0, 1, 3, 2, 4).reshape(nt, kv, self.lanes, VECTOR_WORDS, self.per_half, 2)
        return self.bit_order.pack(stream[..., 0], stream[..., 1]).reshape(-1)


def pairs_per_word(bits: int) -> int:
    """Code pairs one u32 word holds: floor(16 / bits) codes in each 16-bit half."""
    return 16 // bits


def _or_into_lanes(words: np.ndarray, lanes: np.ndarray, fields: np.ndarray) -> None:
    """words[..., lane] |= OR of fields[..., i] over the fields i of that lane (vectorised:
    a lane's fields are disjoint bit ranges, so their sum is their OR)."""
    lanes = np.asarray(lanes)
    for lane in np.unique(lanes):  # at most 32 lanes, each step over the whole matrix
        words[..., lane] |= fields[..., lanes == lane].sum(axis=-1, dtype=np.uint64).astype(np.uint32)


def activation_permutation(b_k: np.ndarray, tiles: int, tile_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Marlin's K shuffle, derived from the B lane table b_k[lane, e] (MMA K row of each of a
    lane's B elements): the product sums over K, so K may be visited in any order that the
    weights and activations share. Lanes with the same set of K rows form a class q; give
    class q the original offsets [q * tiles * E, (q + 1) * tiles * E) of a chunk, tile by tile
    and element by element. Then each lane reads its activations for a whole chunk as one
    contiguous run (wide loads) instead of 2-element pairs per tile.

    Returns (k_perm[chunk], lane_offset[lane]): the original offset of each MMA K position,
    and where each lane's run starts."""
    b_k = distinct_k_rows(b_k)
    lanes, per_lane = b_k.shape
    classes = sorted({tuple(sorted(row)) for row in b_k.tolist()})
    q = np.array([classes.index(tuple(sorted(row))) for row in b_k.tolist()])
    run = tiles * per_lane
    k_perm = np.full(tiles * tile_k, -1)
    for s in range(tiles):
        k_perm[s * tile_k + b_k] = q[:, None] * run + s * per_lane + np.arange(per_lane)[None, :]
    assert (np.sort(k_perm) == np.arange(tiles * tile_k)).all(), "B lane table is not a partition"
    return k_perm, q * run


def distinct_k_rows(b_k: np.ndarray) -> np.ndarray:
    """Each lane's distinct K rows of the B lane table, in first-occurrence order: CUDA's B
    elements are four different K rows; an element pair of Metal's 8x8 B shares its K row (the
    pair runs along N), so a lane needs one activation per K row and M column it holds."""
    rows = [list(dict.fromkeys(int(v) for v in lane)) for lane in b_k]
    if len({len(r) for r in rows}) != 1:
        raise ScheduleError("the target's B lane table gives lanes different numbers of K rows")
    return np.array(rows, dtype=b_k.dtype)


def _sparse_mma_ok(sp: NMSparsity, target: Target) -> bool:
    return target.sparse_mma is not None and (sp.n, sp.m, sp.chunk) == (2, 4, 1)


def stream_layout(fmt: Format, target: Target, where=None) -> StreamLayout:
    """The layout for `fmt` on `target`, or a ScheduleError saying why there is none."""
    bits = fmt.element.bits
    sp = fmt.sparsity
    # A sparsity whose values are stored dense (block patterns: only a hint of which K
    # positions a kernel may skip) streams as a dense format; the stream does not skip.
    if sp is not None and not isinstance(sp, NMSparsity) and not sp.values_dense:
        raise ScheduleError(f"format {fmt.name!r}: the weight-stream pipeline streams dense or "
                            f"N:M values, not {sp.describe()}; use fused_dequant", where)
    if isinstance(sp, NMSparsity) and not _sparse_mma_ok(sp, target):
        try:  # no sparse MMA for the pattern: the lanes scatter kept values (sparse_scatter.py)
            return scatter_layout(fmt, target, where)
        except ScheduleError as scatter:
            if target.sparse_mma is None:
                raise
            why = scatter.message.removeprefix(f"format {fmt.name!r}: ").removesuffix("; use fused_dequant")
        raise ScheduleError(f"format {fmt.name!r}: the weight-stream pipeline feeds N:M values to "
                            f"a sparse MMA, which {target.name} has only for 2:4 of single values, "
                            f"not {sp.describe()}; use fused_dequant ({why})", where)
    mm, _, mk = target.mma
    table = target.lane_elements("a", mm, mk)
    if table is None:
        raise ScheduleError(f"the weight-stream pipeline needs the lane layout of {target.name}'s "
                            "MMA A operand, which the target does not declare", where)
    rows, cols = table
    pairs, tile_pairs = VECTOR_WORDS * pairs_per_word(bits), rows.shape[1] // 2  # a vector's, a tile's
    if rows.shape[1] % 2 or not pairs or not tile_pairs or pairs % tile_pairs:
        raise ScheduleError(f"format {fmt.name!r}: the weight-stream layout pairs codes in 16-bit "
                            f"halves, {VECTOR_WORDS} words a lane: {pairs} pairs of {bits}-bit codes do "
                            f"not fill whole K tiles of {target.name}'s A fragment ({rows.shape[1]} "
                            "elements a lane)", where)
    sparse_target = target if isinstance(sp, NMSparsity) else None
    if sparse_target is not None:
        mm, _, sparse_k = target.sparse_mma  # type: ignore[misc]
        mk = sparse_k // 2  # compressed columns of A
    k_ratio = fmt.k_granule // fmt.stored_k(fmt.k_granule)
    placement = placement_for(fmt.element)
    layout = StreamLayout(bits, mm, mk, rows, cols, sparse_target, k_ratio=k_ratio, placement=placement)
    g = fmt.scale.group_size
    b_table = target.lane_elements("b", mk, target.mma_n)
    # The K shuffle mixes K positions across a chunk: only where scale groups hold whole chunks,
    # and not for 2:4 (its groups of 4 must stay groups of 4 for the sparse MMA).
    if sparse_target is None and b_table is not None and (g == "K" or int(g) % layout.chunk == 0):
        k_perm, run_start = activation_permutation(b_table[0], layout.tiles, mk)
        layout = StreamLayout(bits, mm, mk, rows, cols, None, k_perm, layout.tiles * distinct_k_rows(b_table[0]).shape[1],
                              tuple(int(v) for v in run_start), k_ratio, placement)
    return layout


def stream_arrays(fmt: Format, target: Target, packed: PackedWeights) -> dict[str, np.ndarray]:
    """The arrays a weight-stream kernel reads: qweight re-ordered, the rest as packed."""
    layout = stream_layout(fmt, target)
    stored = unpack_bits(np.asarray(packed.arrays["qweight"]), fmt.element.bits, fmt.packing.word_bits)
    arrays = dict(packed.arrays)
    if layout.scatter is not None:
        fields = unpack_bits(np.asarray(packed.arrays["meta"]), fmt.sparsity.meta_bits, fmt.packing.word_bits)
        arrays["qweight"], arrays["meta"] = layout.scatter.pack(stored, fields, layout.tile_rows, layout.bit_order)
        return arrays
    arrays["qweight"] = layout.pack(stored)
    if layout.sparse:
        positions = metadata_positions(np.asarray(packed.arrays["meta"]), fmt.sparsity, fmt.packing.word_bits)
        arrays["meta"] = layout.pack_metadata(positions)
    return arrays


def scatter_layout(fmt: Format, target: Target, where=None) -> StreamLayout:
    """The layout of N:M values on a target without a sparse MMA: the dense MMA's lane tables
    with the K shuffle, each lane holding its own kept codes and metadata (`sparse_scatter.py`;
    ScheduleError where the lane tables or the sparsity do not allow it)."""
    try:
        return _scatter_layout(fmt, target, id(target))
    except ScheduleError as e:  # (the cached search knows no spec line)
        raise ScheduleError(e.message, where) from None


@lru_cache(maxsize=None)
def _scatter_layout(fmt: Format, target: Target, _identity: int) -> StreamLayout:
    """`scatter_layout`, once per (format, target): the plan's search tries every vector length.
    Keyed by the target object too: targets compare without their lane tables, and a copy
    with other tables (a test's mutation) must not get this one's layout."""
    sp = fmt.sparsity
    assert isinstance(sp, NMSparsity)
    mm, mn, mk = target.mma
    a_table, b_table = target.lane_elements("a", mm, mk), target.lane_elements("b", mk, mn)
    if a_table is None or b_table is None:
        raise ScheduleError(f"the weight-stream pipeline needs the lane layout of {target.name}'s "
                            "MMA A operand, which the target does not declare")
    plan = scatter_plan(sp, fmt.element.bits, a_table, mk, lambda t: activation_permutation(b_table[0], t, mk)[0],
                        fmt.scale.group_size, fmt.name)
    k_perm, run_start = activation_permutation(b_table[0], plan.tiles, mk)
    rows, cols = a_table
    return StreamLayout(fmt.element.bits, mm, mk, rows, cols, None, k_perm,
                        plan.tiles * distinct_k_rows(b_table[0]).shape[1], tuple(int(v) for v in run_start),
                        sp.block_k // sp.kept_per_block, placement_for(fmt.element), plan)
