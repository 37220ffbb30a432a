"""The activation-sparse GEMM C = S @ B on a target without a sparse MMA (Metal): seed 000's
software scatter. S [P, L] arrives in the "row_major" activation layout
(`layouts/sparse_activation.py`: compressed pairs row-major, one metadata word per unit of
rows (g, g + 8) x 16 columns); each lane expands its kept values into the dense A fragment
positions it owns and the target's dense MMA multiplies them with B.

Where a lane's A elements are is target data (`Target.lane_elements("a", m, k)`; Metal's 8x8
`simdgroup_matrix`: two adjacent K columns of one row per lane). A lane then holds half a 2:4
group per K tile, so the product visits K in a *shuffled* order (the sum is over K, so any
order is fine as long as A and B agree): within each 32-wide K step, lane chunk q of the
k-tile's columns takes logical K [q * 8, q * 8 + 8) across the step's four tiles (tile t: its
two columns hold logical q * 8 + 2 t and + 1). Each lane so owns two whole 2:4 groups per row
and step, whose compressed pairs are two adjacent u32 words of the row-major layout (one 8-byte
load) and whose nibbles sit side by side in one metadata word, which also holds the nibbles of
row g + 8, the lane's row in the second 8-row tile. The scatter is register-only: per group,
the two indices from the nibble, six compares and six selects place v0 / v1 at their in-group
positions and zeros elsewhere (`_scatter`). B is packed with the same shuffle
(`b_lane_order`, read by `sparse_gemm.pack_b` and the MLX-ops packer): each lane's B elements
of a step are one 16-byte load, as on CUDA. Nothing in the sparsify kernel changes.

A threadgroup of 4 simdgroups computes a 32 x 128 tile of C: a simdgroup owns one 16-row tile
of S (two 8-row MMA tiles sharing each metadata word) x 64 columns (8 n-tiles). Per K step a
lane makes 2 value loads (8 bytes), 1 metadata load and 8 B loads (16 bytes), scatters 4
groups and issues 64 MMAs; the next step's loads are issued before the current step's MMAs
(registers carried through the loop), as in the CUDA kernel. No threadgroup memory, no barrier.

Launch scalars: P, N (C's shape), KT (K tiles of 32), MT (16-row tiles of S, Pp / 16), NT
(n-tiles of the packed B).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..errors import CompileError
from ..ir import BF16, F16, F32, U32, BufferParam, ConstTable, FragmentType, GridDim, Kernel, Value, VectorType
from ..layouts.sparse_activation import K_TILE, ROW_TILE, ActivationLayout
from ..machine.target import ROW_MAJOR, TARGETS, Target
from .parts.emit import Emitter
from .parts.shell import finish_kernel

THREADS = 128
WARPS_M, WARPS_N = 2, 2
WARP_N_TILES = 8
SCALARS = ("P", "N", "KT", "MT", "NT")
#: positions of a 2:4 group
GROUP = 4


@dataclass(frozen=True)
class ScatterTables:
    """What the scatter GEMM reads of the target and the layout, per lane (32 lanes).

    k_order[t, c]: the logical K (0..31, inside a step) of column c of the step's k-tile t.
    a_row: the lane's A row in an 8-row tile; a_pair: its first compressed pair (= 2:4 group)
    in a K tile; meta_word: its unit word among a tile's 16; meta_shift[lane, m, i]: the nibble
    offset of its group i in row a_row + 8 m; slot[i, j]: (tile, element) of position j of
    group i in the lane's A fragments; b_k, b_n [lane, e]: the logical (K, column) of the e-th
    B element a lane loads in a step (tile e // 2, `thread_elements()` e % 2)."""

    mma: tuple[int, int, int]
    k_tiles: int
    k_order: np.ndarray
    a_row: np.ndarray
    a_pair: np.ndarray
    meta_word: np.ndarray
    meta_shift: np.ndarray
    slot: np.ndarray
    b_k: np.ndarray
    b_n: np.ndarray


def scatter_possible(target: Target) -> bool:
    """Whether `scatter_tables` applies: a dense MMA whose A, B and C lane tables the target
    exposes, and the row-major activation layout."""
    m, n, k = target.mma
    return (target.activation_layout == ROW_MAJOR and 2 * m == ROW_TILE and K_TILE % k == 0
            and all(target.lane_elements(r, *shape) is not None
                    for r, shape in (("a", (m, k)), ("b", (k, n)), ("c", (m, n)))))


@lru_cache(maxsize=None)
def scatter_tables(target_name: str) -> ScatterTables:
    """The lane tables of the scatter GEMM, derived from the target's MMA lane tables and the
    row-major layout's index maps (module docstring); CompileError where they do not fit."""
    target = TARGETS[target_name]
    if not scatter_possible(target):
        raise CompileError(f"{target_name}: the scatter GEMM needs the row-major activation layout, "
                           f"8-row MMA tiles and the A, B, C lane tables of the dense MMA {target.mma}")
    m, n, k = target.mma
    rows, cols = target.lane_elements("a", m, k)  # type: ignore[misc]
    lanes, per = cols.shape
    # A lane's A elements must be `per` adjacent columns of one row starting at a multiple of
    # `per` (a chunk q), and the lanes of a row must hold every chunk once.
    if ((rows != rows[:, :1]).any() or (cols != cols[:, :1] + np.arange(per)).any() or (cols[:, 0] % per).any()):
        raise CompileError(f"{target_name}: A lane elements are not adjacent K columns of one row")
    chunk = cols[:, 0] // per
    for r in range(m):
        if sorted(chunk[rows[:, 0] == r]) != list(range(k // per)):
            raise CompileError(f"{target_name}: row {r} of A is not covered once by the lanes' chunks")
    k_tiles = K_TILE // k
    span = k_tiles * per  # logical K a lane owns per step and row
    if span % GROUP:
        raise CompileError(f"{target_name}: a lane's {span} K positions per step are not whole 2:4 groups")
    tt, cc = np.meshgrid(np.arange(k_tiles), np.arange(k), indexing="ij")
    k_order = (cc // per) * span + tt * per + cc % per
    assert sorted(k_order.ravel()) == list(range(K_TILE))
    groups = span // GROUP
    a_row = rows[:, 0]
    a_pair = chunk * groups                   # compressed pair index = group index in the K tile
    # nibbles: the layout's own index maps (one unit word per lane for both 8-row tiles)
    lay = ActivationLayout(target_name, ROW_TILE, K_TILE)
    rr = a_row[:, None, None] + m * np.arange(2)[None, :, None]
    gg = a_pair[:, None, None] + np.arange(groups)[None, None, :]
    words = lay.meta_word_index(0, 0, rr % 8, gg // 4)          # [lane, row half, group]
    if (words != words[:, :1, :1]).any():
        raise CompileError(f"{target_name}: a lane's nibbles span two metadata words")
    meta_shift = lay.nibble_shift(rr, gg)
    # position j of group i: lane offset o = GROUP i + j = tile * per + element
    o = GROUP * np.arange(groups)[:, None] + np.arange(GROUP)[None, :]
    slot = np.stack([o // per, o % per], axis=-1)
    brows, bcols = target.lane_elements("b", k, n)  # type: ignore[misc]
    b_k = k_order[np.arange(k_tiles)[None, :, None], brows[:, None, :]].reshape(lanes, -1)
    b_n = np.broadcast_to(bcols[:, None, :], (lanes, k_tiles, bcols.shape[1])).reshape(lanes, -1)
    return ScatterTables(target.mma, k_tiles, k_order, a_row, a_pair, words[:, 0, 0], meta_shift,
                         slot, b_k, b_n.copy())


def lower_scatter_gemm(dtype: str, target: str) -> Kernel:
    """The scatter GEMM of `dtype` ("f16" / "bf16") for `target`."""
    return _ScatterLowering(dtype, target).lower()


def _table(name: str, values: np.ndarray) -> ConstTable:
    return ConstTable(name, U32, tuple(int(v) for v in np.asarray(values).ravel()))


class _ScatterLowering(Emitter):
    def __init__(self, dtype: str, target: str) -> None:
        super().__init__()
        self.target = TARGETS[target]
        self.tab = scatter_tables(target)
        self.act = F16 if dtype == "f16" else BF16
        self.dtype = dtype
        m, n, k = self.tab.mma
        self.frag_a = FragmentType("a", self.act, m, k)
        self.frag_b = FragmentType("b", self.act, k, n)
        self.frag_c = FragmentType("c", F32, m, n)
        self.tile_m, self.tile_n = WARPS_M * ROW_TILE, WARPS_N * WARP_N_TILES * n

    def lower(self) -> Kernel:
        b, tab = self.b, self.tab
        s = {nm: b.scalar(nm) for nm in SCALARS}
        self.s = s
        lane, warp = b.index("lane"), b.index("warp")
        gx, gy = b.index("group_x"), b.index("group_y")
        self.lane = lane
        self.mt = self.op2("add", self.op2("mul", gy, WARPS_M, hint="mt"), self.op2("div", warp, WARPS_N, hint="mt"), hint="mt")
        self.nt0 = self.op2("add", self.op2("mul", gx, WARPS_N * WARP_N_TILES, hint="nt"),
                            self.op2("mul", self.op2("rem", warp, WARPS_N, hint="nt"), WARP_N_TILES, hint="nt"), hint="nt")
        self.mt_ok = self.op2("lt", self.mt, s["MT"], hint="mok")
        self.n_ok = [self.op2("lt", self.op2("add", self.nt0, j, hint="ntj"), s["NT"], hint="nok")
                     for j in range(WARP_N_TILES)]
        # per-lane constants of the layout (outside the loop)
        row_words = self.op2("mul", s["KT"], K_TILE // GROUP, hint="ld")     # u32 words per S row
        row = self.op2("add", self.op2("mul", self.mt, ROW_TILE, hint="ar"),
                       b.value("table", [lane], U32, {"name": "a_row"}, hint="ar"), hint="ar")
        pair = b.value("table", [lane], U32, {"name": "a_pair"}, hint="ap")
        rows = [row, self.op2("add", row, self.frag_a.rows, hint="ar")]     # rows g and g + 8
        self.a_base = [self.op2("add", self.op2("mul", r, row_words, hint="ab"), pair, hint="ab") for r in rows]
        self.m_base = self.op2("add", self.op2("mul", self.op2("mul", self.mt, s["KT"], hint="mb"), ROW_TILE, hint="mb"),
                               b.value("table", [lane], U32, {"name": "meta_word"}, hint="mw"), hint="mb")
        groups = tab.meta_shift.shape[2]
        self.shifts = [[b.value("table", [self.op2("add", self.op2("mul", lane, 2 * groups, hint="si"),
                                                             sel * groups + i, hint="si")],
                                U32, {"name": "meta_shift"}, hint="sh") for i in range(groups)] for sel in (0, 1)]
        zero = b.op("frag_zero", [], [self.frag_c], hint="z").result
        accs = [zero] * (2 * WARP_N_TILES)
        self.store(self.prefetched_loop(accs, s["KT"], self.fetch, self.compute))
        m, n, _ = tab.mma
        c_rows, c_cols = self.target.lane_elements("c", m, n)  # type: ignore[misc]
        tables = [_table("a_row", tab.a_row), _table("a_pair", tab.a_pair), _table("meta_word", tab.meta_word),
                  _table("meta_shift", tab.meta_shift), _table("c_row", c_rows), _table("c_col", c_cols)]
        return finish_kernel(
            b, self.target, name=f"sparse_act_gemm_{self.dtype}", threads=THREADS,
            grid=(GridDim("N", self.tile_n), GridDim("P", self.tile_m), GridDim(None)),
            buffers=[BufferParam("values", U32, "read"), BufferParam("meta", U32, "read"),
                     BufferParam("bp", U32, "read"), BufferParam("y", self.act, "write")],
            scalars=SCALARS, tables=tables,
            attrs={"target": self.target.name, "kind": "sparse_act_gemm", "activation": self.dtype,
                   "tile": [self.tile_m, self.tile_n, K_TILE], "layout": ROW_MAJOR, "mma": list(tab.mma),
                   "scatter": 1})

    def fetch(self, kt: Value, has: Value) -> list[Value]:
        """K step kt's loads: [values of rows g, g + 8 (2 words each), metadata word, B x 8]."""
        b, s = self.b, self.s
        ok = self.op2("and", has, self.mt_ok, hint="aok")
        out = []
        for sel in (0, 1):
            idx = self.op2("add", self.a_base[sel], self.op2("mul", kt, K_TILE // GROUP, hint="ai"), hint="ai")
            out.append(b.value("vload", [idx, ok], VectorType(U32, 2), {"buffer": "values", "size": 2}, hint="aw"))
        # an absent tile reads 0: nibble 0 with zero values, so the scatter places zeros
        midx = self.op2("add", self.m_base, self.op2("mul", kt, ROW_TILE, hint="mi"), hint="mi")
        out.append(b.load("meta", midx, U32, pred=ok, hint="mw"))
        row = self.op2("mul", kt, s["NT"], hint="bt")
        per_lane = self.tab.b_k.shape[1] // 2           # u32 words of B per lane and step
        for j in range(WARP_N_TILES):
            tile = self.op2("add", row, self.op2("add", self.nt0, j, hint="bt"), hint="bt")
            idx = self.op2("add", self.op2("mul", tile, 32 * per_lane, hint="bi"),
                           self.op2("mul", self.lane, per_lane, hint="bi"), hint="bi")
            bok = self.op2("and", has, self.n_ok[j], hint="bok")
            out.append(b.value("vload", [idx, bok], VectorType(U32, per_lane), {"buffer": "bp", "size": per_lane},
                               hint="bw"))
        return out

    def _scatter(self, word: Value, meta: Value, shift: Value) -> list[Value]:
        """The dense group [d0, d1, d2, d3] of one compressed pair (v0 low half, v1 high half)
        and its nibble idx0 | idx1 << 2 (idx0 < idx1): d_j = v0 where idx0 = j, v1 where
        idx1 = j, else 0. idx0 is never 3 and idx1 never 0, so d0 and d3 need one compare."""
        b = self.b
        halves = b.bitcast(word, VectorType(self.act, 2), hint="hp")
        v0, v1 = (b.value("extract", [halves], self.act, {"index": i}, hint="v") for i in (0, 1))
        nib = self.op2("shr", meta, shift, hint="nb")
        idx0 = self.op2("and", nib, 3, hint="i0")
        idx1 = self.op2("and", self.op2("shr", nib, 2, hint="i1"), 3, hint="i1")
        zero = b.const(0.0, self.act)

        def at(j: int) -> Value:
            out = zero
            if j > 0:   # idx1 = j
                out = b.select(self.op2("eq", idx1, j, hint="eq"), v1, out, hint="d")
            if j < 3:   # idx0 = j
                out = b.select(self.op2("eq", idx0, j, hint="eq"), v0, out, hint="d")
            return out

        return [at(j) for j in range(GROUP)]

    def compute(self, accs: list[Value], loaded: list[Value]) -> list[Value]:
        b, tab = self.b, self.tab
        groups = tab.meta_shift.shape[2]
        meta = loaded[2]
        a_frags = []
        for sel in (0, 1):
            elems: dict[tuple[int, int], Value] = {}
            for i in range(groups):
                word = b.value("extract", [loaded[sel]], U32, {"index": i}, hint="w")
                for j, d in enumerate(self._scatter(word, meta, self.shifts[sel][i])):
                    elems[tuple(int(x) for x in tab.slot[i, j])] = d
            per = self.frag_a.cols * self.frag_a.rows // 32
            a_frags.append([b.value("frag_build", [elems[(t, e)] for e in range(per)], self.frag_a, hint="fa")
                            for t in range(tab.k_tiles)])
        new = list(accs)
        for j in range(WARP_N_TILES):
            words = loaded[3 + j]
            for t in range(tab.k_tiles):
                pair = b.bitcast(b.value("extract", [words], U32, {"index": t}, hint="w"), VectorType(self.act, 2), hint="hp")
                fb = b.value("frag_build", [pair], self.frag_b, hint="fb")
                for sel in (0, 1):
                    i = j * 2 + sel
                    new[i] = b.value("mma", [a_frags[sel][t], fb, new[i]], self.frag_c, hint="acc")
        return new

    def store(self, accs: list[Value]) -> None:
        b = self.b
        m, n, _ = self.tab.mma
        per = m * n // 32
        for j in range(WARP_N_TILES):
            for sel in (0, 1):
                elems = b.value("frag_elems", [accs[j * 2 + sel]], VectorType(F32, per), hint="ce")
                row0 = self.op2("add", self.op2("mul", self.mt, ROW_TILE, hint="r"), m * sel, hint="r")
                col0 = self.op2("mul", self.op2("add", self.nt0, j, hint="c"), n, hint="c")
                store_c_elems(self, elems, per, row0, col0)


def store_c_elems(em, elems: Value, per: int, row0: Value, col0: Value) -> None:
    """Store a lane's `per` accumulator elements of one C tile at (row0, col0) of y [P, N],
    where the target's C lane table (`c_row`, `c_col`) puts them, masked by P and N: the
    epilogue of both sparse GEMMs (`em`: the lowering, with b, s, lane, act)."""
    b, s = em.b, em.s
    for e in range(per):
        ti = em.op2("add", em.op2("mul", em.lane, per, hint="ti"), e, hint="ti")
        r = em.op2("add", row0, b.value("table", [ti], U32, {"name": "c_row"}, hint="cr"), hint="r")
        c = em.op2("add", col0, b.value("table", [ti], U32, {"name": "c_col"}, hint="cc"), hint="c")
        ok = em.op2("and", em.op2("lt", r, s["P"], hint="p"), em.op2("lt", c, s["N"], hint="p"), hint="p")
        v = b.value("extract", [elems], F32, {"index": e}, hint="yv")
        b.store("y", em.op2("add", em.op2("mul", r, s["N"], hint="yi"), c, hint="yi"), b.cast(v, em.act, hint="yv"), ok)
