"""The sparse activation GEMM on a target with a 2:4 sparse MMA and asynchronous copies (CUDA's
`mma.sp` m16n8k32 and cp.async): C = S @ B with both operands staged through shared memory.

S keeps the layout the sparsify kernel writes (`layouts/sparse_activation.py`): its values as
compressed 16 x 16 tiles of 32 lanes x 16 bytes ([row tile][K tile][lane]), its metadata as one
32-lane word row per tile pair and K tile. B comes as it is stored in a model, transposed:
`bt` [N, Lp], each column of B a row of Lp = KT * 32 elements (a layer's weight [N, L] as it
is; zero-padded to whole K tiles only where L is not). So one K step of a threadgroup's block
is copied in 16-byte pieces with no repacking on the host:

    A stage: tile_m / 16 row tiles x 32 lanes x 4 words   (contiguous runs of S's values)
    M stage: tile_m / 32 tile pairs x 32 words            (S's metadata)
    B stage: tile_n rows of bt x 32 K                     (4 pieces a row, rows padded by
                                                           B_PAD so fragment reads are
                                                           conflict-free)

each times `k_tiles`, the K tiles a stage holds (one loop step: one wait and barrier).

A warp reads its A fragments back with one 128-bit load per tile (lanes read consecutive 16
bytes) and a B fragment as 4 32-bit pairs of adjacent K, at the offsets the target's B lane
table gives (`b_offsets`). This is the weight pipelines' multistage loop
(`lowering/multistage.py`):

    prologue: issue steps 0 .. stages-2, one group each
    for kt:   async_wait(stages-2); barrier      -> step kt has landed, step kt-1's slot is free
              issue step kt+stages-1 into that slot; commit
              compute step kt from slot kt % stages
    async_wait(0)

Why: the register-direct kernel it replaces (64 x 128 blocks, each warp loading its own
fragments from device memory) re-read B once per 64 rows of S and S once per 128 columns of
B, and measured 3.5-7x cuBLAS's dense time (bench/README.md, issue 6); B's repacking into
fragment order on every call (an MLX gather) cost more than the dense GEMM itself (1.7 ms at
L = 14336, N = 4096 on the H100: bench/results/issue15_h100_2026-11-27d). Blocks share each
staged byte between their warps, and the copies of later steps are in flight while the MMAs
run.

Tiles past the operands read clamped copies instead of predicated ones: row tiles past S's
last tile pair read its last pair (valid ordered metadata), rows of bt past N read row N - 1,
steps past K read the last step (their slot is never computed). Those rows and columns are
never stored. With one K tile a stage no copy is predicated; with more, a stage may end past
K, and its tiles there are zero-filled (values and B; the metadata stays the last tile's).

Measured on the H100 (bench/results/issue15_h100_2026-11-27d): 2.4-2.7 ms for the sparse FFN's
8192 x 14336 x 4096, 0.50-0.57x cuBLAS's dense GEMM; `mma.sp`'s own ceiling is 1.35x dense
(`bench/probes/mma_rate_probe.py`), and this kernel reaches 37% of it (docs/DECISIONS.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import CompileError
from ..ir import BF16, F16, F32, U32, BufferParam, ConstTable, FragmentType, GridDim, Kernel, SharedArray, Value, VectorType
from ..machine.target import Target
from .parts.emit import Emitter
from .parts.shell import finish_kernel
from .sparse_gemm_scatter import store_c_elems

#: Words of one lane's 16-byte piece, and of one 32-lane fragment tile.
PIECE = 4
TILE_WORDS = 32 * PIECE
#: Elements of a K step (the sparse MMA's k) and of one 16-byte piece of bt.
K_STEP, B_PIECE = 32, 8
#: Padding of a staged row of bt (`SparseGemmTiles.b_row`): one 16-byte piece.
B_PAD = 8
SCALARS = ("P", "N", "KT", "PAIRS")


@dataclass(frozen=True)
class SparseGemmTiles:
    """A threadgroup block of the staged sparse GEMM: tile_m rows of S (whole tile pairs) x
    tile_n columns of C (whole n8 tiles), warps_m x warps_n warps, `stages` K steps in flight."""

    tile_m: int
    tile_n: int
    warps_m: int
    warps_n: int
    stages: int
    k_tiles: int = 1  # 32-wide K tiles a stage holds (a step's MMAs between two barriers)

    def __post_init__(self) -> None:
        if self.tile_m % (32 * self.warps_m) or self.tile_n % (8 * self.warps_n):
            raise CompileError(f"sparse GEMM tiles {self}: each warp needs whole 32-row tile pairs "
                               f"and whole 8-column tiles")
        if self.stages < 2:
            raise CompileError(f"sparse GEMM tiles {self}: at least 2 stages")
        if self.k_tiles not in (1, 2, 4):
            raise CompileError(f"sparse GEMM tiles {self}: k_tiles must be 1, 2 or 4")

    @property
    def name(self) -> str:
        k = f"k{self.k_tiles}" if self.k_tiles > 1 else ""
        return f"{self.tile_m}x{self.tile_n}w{self.warps_m}x{self.warps_n}s{self.stages}{k}"

    @property
    def b_row(self) -> int:
        """Elements of a staged row of bt: the stage's K plus 8 of padding, so that the 8 rows x 4
        lanes of a fragment read fall in 32 different banks ((8 k_tiles + 2) 2g + t + 4r words,
        mod 32, is distinct for g < 8, t < 4 with k_tiles 1, 2 or 4)."""
        return self.k_tiles * K_STEP + B_PAD

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n


#: Large blocks: 4 warps, each 64 rows x 64 columns (32 MMAs a K step on 12 fragment reads),
#: 3 stages: the fastest of 7 blocks on both of the sparse FFN's GEMMs at T = 8192, hidden
#: 14336 on the H100 (2.44 / 2.58 ms against 3.34 / 3.31 for 128 x 256 with 8 warps, which
#: need 227 registers a thread; bench/results/issue15_h100_2026-11-27d/run2_time.log). Small
#: ones (4 warps of 32 x 64) where the large would leave the GPU's SMs idle.
LARGE = SparseGemmTiles(128, 128, 2, 2, 3)
SMALL = SparseGemmTiles(64, 128, 2, 2, 4)
#: Threadgroups below which the small blocks are used (an H100 has 132 SMs).
_FULL_GRID = 132


def b_offsets(target: Target, b_row: int) -> np.ndarray:
    """[32 lanes, 4]: where each lane's 4 B-fragment registers (pairs of adjacent K of one
    column n) start in a staged block of bt rows (b_row elements a row), from the target's
    lane table of the sparse MMA's B operand."""
    lanes = target.lane_elements("b", K_STEP, 8)
    if lanes is None:
        raise CompileError(f"{target.name}: no lane table for the sparse MMA's B fragment")
    k, n = lanes
    if k.shape != (32, 2 * PIECE) or np.any(k[:, 1::2] != k[:, 0::2] + 1) or np.any(n[:, 1::2] != n[:, 0::2]) \
            or np.any(k[:, 0::2] % 2):
        raise CompileError(f"{target.name}: the sparse MMA's B registers are not pairs of adjacent K "
                           f"of one column; the staged sparse GEMM reads them as such")
    return (n[:, 0::2] * b_row + k[:, 0::2]).astype(np.uint32)


def choose_tiles(p: int, n: int) -> SparseGemmTiles:
    """The block for C [p, n]: LARGE where it still gives one threadgroup per SM, else SMALL."""
    blocks = -(-p // LARGE.tile_m) * -(-n // LARGE.tile_n)
    return LARGE if blocks >= _FULL_GRID else SMALL


class StagedSparseGemm(Emitter):
    """The lowering (module docstring)."""

    def __init__(self, dtype: str, target: Target, tiles: SparseGemmTiles) -> None:
        super().__init__()
        if target.async_copy_bytes < 16 or target.sparse_mma != (16, 8, 32):
            raise CompileError(f"{target.name}: the staged sparse GEMM needs asynchronous copies and "
                               f"the m16n8k32 sparse MMA")
        self.target, self.tiles, self.dtype = target, tiles, dtype
        self.act = act = F16 if dtype == "f16" else BF16
        self.frag_a = FragmentType("a", act, 16, 16)
        self.frag_b = FragmentType("b", act, 32, 8)
        self.frag_c = FragmentType("c", F32, 16, 8)
        t = tiles
        self.block_pairs, self.block_nt = t.tile_m // 32, t.tile_n // 8
        self.warp_pairs, self.warp_nt = self.block_pairs // t.warps_m, self.block_nt // t.warps_n
        self.a_sub, self.m_sub = 2 * self.block_pairs * TILE_WORDS, self.block_pairs * 32  # one K tile's
        self.a_stage, self.m_stage = t.k_tiles * self.a_sub, t.k_tiles * self.m_sub
        self.b_stage = t.tile_n * t.b_row  # elements of bt
        self.b_offsets = b_offsets(target, t.b_row)

    # ----- setup -------------------------------------------------------------------------

    def lower(self) -> Kernel:
        b, t = self.b, self.tiles
        s = {n: b.scalar(n) for n in SCALARS}
        self.s = s
        self.tid, self.lane, warp = b.index("tid"), b.index("lane"), b.index("warp")
        gx, gy = b.index("group_x"), b.index("group_y")
        wm, wn = self.op2("div", warp, t.warps_n, hint="wm"), self.op2("rem", warp, t.warps_n, hint="wn")
        self.pair0 = self.op2("mul", gy, self.block_pairs, hint="q0")     # the block's first tile pair
        self.nt0 = self.op2("mul", gx, self.block_nt, hint="n0")          # its first n8 tile
        self.last_tile = self.op2("sub", self.op2("mul", s["PAIRS"], 2, hint="lt"), 1, hint="lt")
        self.last_pair = self.op2("sub", s["PAIRS"], 1, hint="lq")
        self.last_n = self.op2("sub", s["N"], 1, hint="ln")
        self.last_kt = self.op2("sub", s["KT"], 1, hint="lk")
        self.ld = self.op2("mul", s["KT"], K_STEP, hint="ld")                # bt's row length
        # This warp's fragments inside a stage (lane offsets fixed for the whole loop).
        lane4 = self.op2("mul", self.lane, PIECE, hint="l4")
        self.warp_a = self.op2("add", self.op2("mul", wm, 2 * self.warp_pairs * TILE_WORDS, hint="wa"), lane4, hint="wa")
        self.warp_m = self.op2("add", self.op2("mul", wm, self.warp_pairs * 32, hint="wq"), self.lane, hint="wq")
        warp_rows = self.op2("mul", wn, self.warp_nt * 8 * t.b_row, hint="wb")
        self.warp_b = [self.op2("add", warp_rows, b.value("table", [self.op2("add", lane4, r, hint="bo")], U32,
                                                          {"name": "b_off"}, hint="bo"), hint="wb")
                       for r in range(PIECE)]
        self.row0 = self.op2("mul", self.op2("add", self.op2("mul", self.pair0, 2, hint="r0"),
                                             self.op2("mul", wm, 2 * self.warp_pairs, hint="r0"), hint="r0"), 16, hint="r0")
        self.col0 = self.op2("mul", self.op2("add", self.nt0, self.op2("mul", wn, self.warp_nt, hint="c0"), hint="c0"), 8, hint="c0")

        self.setup_copies()
        for step in range(t.stages - 1):  # prologue: the first stages-1 steps in flight
            self.issue(self.c(step))
        zero = b.op("frag_zero", [], [self.frag_c], hint="z").result
        accs = [zero] * (2 * self.warp_pairs * self.warp_nt)

        def body(ks: Value, groups: list[list[Value]]) -> list[Value]:
            b.op("async_wait", attrs={"pending": t.stages - 2})
            b.barrier()
            self.issue(self.op2("add", ks, t.stages - 1, hint="nx"))
            return self.compute(self.op2("rem", ks, t.stages, hint="slot"), groups[0])

        steps = s["KT"] if t.k_tiles == 1 else self.ceil_div(s["KT"], t.k_tiles)
        accs = self.carried_for(0, steps, 1, [("acc", accs)], body, iv_hint="ks", hint="acc")
        # Drain: the groups past K must land before the threadgroup's shared memory is reused.
        b.op("async_wait", attrs={"pending": 0})
        self.store(accs)
        c_rows, c_cols = self.target.lane_elements("c", 16, 8)  # type: ignore[misc]
        tables = [ConstTable("c_row", U32, tuple(int(v) for v in c_rows.ravel())),
                  ConstTable("c_col", U32, tuple(int(v) for v in c_cols.ravel())),
                  ConstTable("b_off", U32, tuple(int(v) for v in self.b_offsets.ravel()))]
        shared = [SharedArray("a_s", U32, t.stages * self.a_stage), SharedArray("m_s", U32, t.stages * self.m_stage),
                  SharedArray("b_s", self.act, t.stages * self.b_stage)]
        return finish_kernel(
            b, self.target, name=f"sparse_act_gemm_{self.dtype}_{t.name}", threads=t.threads,
            grid=(GridDim("N", t.tile_n), GridDim("P", t.tile_m), GridDim(None)),
            buffers=[BufferParam("values", U32, "read"), BufferParam("meta", U32, "read"),
                     BufferParam("bt", self.act, "read"), BufferParam("y", self.act, "write")],
            scalars=SCALARS, tables=tables, shared=shared,
            who=f"sparse activation GEMM {t.name}", memory="shared memory",
            attrs={"target": self.target.name, "kind": "sparse_act_gemm", "activation": self.dtype,
                   "tile": [t.tile_m, t.tile_n, K_STEP * t.k_tiles], "warps": [t.warps_m, t.warps_n], "stages": t.stages,
                   "layout": self.target.sparse_activation_layout})

    # ----- copies into a stage -------------------------------------------------------------

    def pieces(self, total: int) -> list[tuple[Value, Value | None]]:
        """(e, inside) for each piece e = i * threads + tid of a stage's copy of `total` pieces
        (inside: None where every thread's e is below total)."""
        threads = self.tiles.threads
        out = []
        for i in range(-(-total // threads)):
            e = self.op2("add", self.tid, i * threads, hint="e") if i else self.tid
            out.append((e, None if (i + 1) * threads <= total else self.op2("lt", e, total, hint="ein")))
        return out

    def setup_copies(self) -> None:
        """Each of this thread's pieces of a stage's copy, computed once before the loop: where
        it lands in a stage and where it comes from in K tile 0 (tile kt's source is that plus
        kt times the kind's stride). Clamped rows (past S's last tile pair, bt's last row) read
        the last one. (kind, source base, stage offset, inside) per piece."""
        s, t = self.s, self.tiles
        self.copies: list[tuple[str, Value, Value, Value | None]] = []
        for e, inside in self.pieces(2 * self.block_pairs * 32):     # e = block row tile * 32 + lane
            tile = self.b.binary("min", self.op2("add", self.op2("mul", self.pair0, 2, hint="at"),
                                                 self.op2("div", e, 32, hint="at"), hint="at"), self.last_tile, hint="at")
            src = self.op2("add", self.op2("mul", self.op2("mul", tile, s["KT"], hint="ai"), TILE_WORDS, hint="ai"),
                           self.op2("mul", self.op2("rem", e, 32, hint="al"), PIECE, hint="al"), hint="ai")
            self.copies.append(("a", src, self.op2("mul", e, PIECE, hint="ad"), inside))
        for e, inside in self.pieces(self.block_pairs * 8):            # e = block tile pair * 8 + quarter
            pair = self.b.binary("min", self.op2("add", self.pair0, self.op2("div", e, 8, hint="mq"), hint="mq"),
                                 self.last_pair, hint="mq")
            src = self.op2("add", self.op2("mul", self.op2("mul", pair, s["KT"], hint="mi"), 32, hint="mi"),
                           self.op2("mul", self.op2("rem", e, 8, hint="mw"), PIECE, hint="mw"), hint="mi")
            self.copies.append(("m", src, self.op2("mul", e, PIECE, hint="md"), inside))
        per_row = K_STEP // B_PIECE
        for e, inside in self.pieces(t.tile_n * per_row):              # e = block row of bt * 4 + piece
            row = self.op2("div", e, per_row, hint="br")
            piece = self.op2("mul", self.op2("rem", e, per_row, hint="bp"), B_PIECE, hint="bp")
            n = self.b.binary("min", self.op2("add", self.op2("mul", self.nt0, 8, hint="bn"), row, hint="bn"),
                              self.last_n, hint="bn")
            src = self.op2("add", self.op2("mul", n, self.ld, hint="bi"), piece, hint="bi")
            dst = self.op2("add", self.op2("mul", row, t.b_row, hint="bd"), piece, hint="bd")
            self.copies.append(("b", src, dst, inside))

    def issue(self, ks: Value) -> None:
        """Start the copies of step ks into slot ks % stages, as one group: its k_tiles K tiles,
        each clamped to the last. With several K tiles a step, a tile past K must add nothing
        (a step may end past it): its values and B rows are zero-filled instead (predicated
        copies); its metadata stays the last tile's (valid)."""
        t = self.tiles
        slot = self.op2("rem", ks, t.stages, hint="slot")
        first = ks if t.k_tiles == 1 else self.op2("mul", ks, t.k_tiles, hint="kt")
        for sub in range(t.k_tiles):
            kt = self.op2("add", first, sub, hint="kt") if sub else first
            inside = None if t.k_tiles == 1 else self.op2("lt", kt, self.s["KT"], hint="kin")
            self.issue_tile(slot, sub, self.op2("min", kt, self.last_kt, hint="ktc"), inside)
        self.b.op("async_commit")

    def issue_tile(self, slot: Value, sub: int, kt: Value, in_k: Value | None) -> None:
        """The copies of K tile kt (in range) into part `sub` of stage `slot`."""
        # per kind: (shared array, source buffer, elements a piece, source stride a K tile,
        # this part's offset in the stage, whether a tile past K zero-fills it)
        kinds = {"a": ("a_s", "values", PIECE, TILE_WORDS,
                       self.op2("add", self.op2("mul", slot, self.a_stage, hint="as"), sub * self.a_sub, hint="as"), True),
                 "m": ("m_s", "meta", PIECE, 32,
                       self.op2("add", self.op2("mul", slot, self.m_stage, hint="ms"), sub * self.m_sub, hint="ms"), False),
                 "b": ("b_s", "bt", B_PIECE, K_STEP,
                       self.op2("add", self.op2("mul", slot, self.b_stage, hint="bs"), sub * K_STEP, hint="bs"), True)}
        steps = {kind: self.op2("mul", kt, kinds[kind][3], hint="ks") for kind in kinds}
        for kind, src0, dst0, inside in self.copies:
            shared, buffer, size, _, part, zero_fill = kinds[kind]
            src = self.op2("add", src0, steps[kind], hint="src")
            dst = self.op2("add", part, dst0, hint="dst")
            pred = in_k if zero_fill else None

            def copy(src=src, dst=dst, shared=shared, buffer=buffer, size=size, pred=pred) -> None:
                operands = [dst, src] + ([pred] if pred is not None else [])
                self.b.op("async_copy", operands, attrs={"dst": shared, "src": buffer, "size": size})
            if inside is None:
                copy()
            else:  # threads past the end issue nothing
                self.guarded(inside, copy)

    # ----- the MMAs ---------------------------------------------------------------------------

    def frag(self, words: Value, frag_type: FragmentType) -> Value:
        b = self.b
        pairs = [b.bitcast(b.value("extract", [words], U32, {"index": i}, hint="w"), VectorType(self.act, 2), hint="hp")
                 for i in range(PIECE)]
        return b.value("frag_build", pairs, frag_type, hint="fr")

    def shared_piece(self, buffer: str, index: Value) -> Value:
        return self.b.value("vload", [index], VectorType(U32, PIECE), {"buffer": buffer, "size": PIECE}, hint="sw")

    def compute(self, slot: Value, accs: list[Value]) -> list[Value]:
        """Stage `slot`'s MMAs: per K tile, this warp's 2 x warp_pairs row tiles times its
        warp_nt n8 tiles."""
        a_base = self.op2("add", self.op2("mul", slot, self.a_stage, hint="as"), self.warp_a, hint="as")
        m_base = self.op2("add", self.op2("mul", slot, self.m_stage, hint="ms"), self.warp_m, hint="ms")
        b_step = self.op2("mul", slot, self.b_stage, hint="bs")
        b_base = [self.op2("add", b_step, w, hint="bs") for w in self.warp_b]
        for sub in range(self.tiles.k_tiles):
            if sub:
                a_base = self.op2("add", a_base, self.a_sub, hint="as")
                m_base = self.op2("add", m_base, self.m_sub, hint="ms")
                b_base = [self.op2("add", base, K_STEP, hint="bs") for base in b_base]
            accs = self.compute_tile(a_base, m_base, b_base, accs)
        return accs

    def compute_tile(self, a_base: Value, m_base: Value, b_base: list[Value], accs: list[Value]) -> list[Value]:
        b, t = self.b, self.tiles
        rows = 2 * self.warp_pairs
        a = [self.frag(self.shared_piece("a_s", self.op2("add", a_base, i * TILE_WORDS, hint="ai") if i else a_base), self.frag_a)
             for i in range(rows)]
        meta = [b.load("m_s", self.op2("add", m_base, q * 32, hint="mi") if q else m_base, U32, hint="mw")
                for q in range(self.warp_pairs)]
        new = list(accs)
        for j in range(self.warp_nt):
            pairs = [b.value("vload", [self.op2("add", base, j * 8 * t.b_row, hint="bi") if j else base],
                             VectorType(self.act, 2), {"buffer": "b_s", "size": 2}, hint="bp") for base in b_base]
            frag_b = b.value("frag_build", pairs, self.frag_b, hint="fr")
            for i in range(rows):
                k = j * rows + i
                new[k] = b.value("mma_sp", [a[i], frag_b, new[k], meta[i // 2]], self.frag_c,
                                 {"selector": i % 2}, hint="acc")
        return new

    def store(self, accs: list[Value]) -> None:
        b, rows = self.b, 2 * self.warp_pairs
        for j in range(self.warp_nt):
            col0 = self.op2("add", self.col0, j * 8, hint="c") if j else self.col0
            for i in range(rows):
                elems = b.value("frag_elems", [accs[j * rows + i]], VectorType(F32, 4), hint="ce")
                row0 = self.op2("add", self.row0, i * 16, hint="r") if i else self.row0
                store_c_elems(self, elems, 4, row0, col0)


__all__ = ["LARGE", "SMALL", "SparseGemmTiles", "StagedSparseGemm", "choose_tiles"]
