"""Lowering of the GEMM that consumes a run-time sparsified operand: C = S @ B on a target with
a 2:4 sparse MMA (CUDA's `mma.sp` m16n8k32), S [P, L] in the "cuda_mma_sp" activation layout
(`layouts/sparse_activation.py`), B [L, N] dense in the matching fragment layout (`pack_b`).
A target without a sparse MMA (Metal) gets seed 000's software scatter into its dense MMA
(`sparse_gemm_scatter.py`); `lower_sparse_gemm`, `b_lane_order` and `gemm_scalars` choose by the
target's data.

A threadgroup of 4 warps computes a 64 x 128 tile of C; a warp owns 32 rows (one tile pair:
one metadata word per lane feeds both tiles, selectors 0 and 1) x 64 columns (8 n8 tiles).
Each K step (32 logical columns) a lane makes one 16-byte load per A tile, one 4-byte metadata
load and one 16-byte load per B tile, and issues 16 `mma_sp`; the next step's loads are issued
before the current step's MMAs (registers carried through the loop), so memory latency hides
behind tensor work. C is stored from the accumulators' own lane elements (`frag_elems`).

Launch scalars: P, N (C's shape), KT (K tiles of 32), PAIRS (tile pairs of S, Pp / 32), NT
(n8 tiles of the packed B).
"""
from __future__ import annotations

import numpy as np

from ..errors import CompileError
from ..ir import BF16, F16, F32, U32, BufferParam, ConstTable, FragmentType, GridDim, Kernel, Value, VectorType
from ..targets.base import TARGETS
from ..layouts.sparse_activation import ActivationLayout
from .parts.emit import Emitter
from .parts.shell import finish_kernel
from .sparse_gemm_scatter import lower_scatter_gemm, scatter_possible, scatter_tables, store_c_elems

THREADS = 128
TILE_M, TILE_N = 64, 128
WARP_N_TILES = 8
SCALARS = ("P", "N", "KT", "PAIRS", "NT")


def b_lane_order(target: str) -> tuple[np.ndarray, np.ndarray]:
    """(k[lane, e], n[lane, e]): the B element each lane's e-th half holds in one 32 x 8 tile,
    from the target (the sparse MMA's B fragment, or the scatter GEMM's shuffled K steps)."""
    if not has_sparse_mma(target):
        tab = scatter_tables(target)
        return tab.b_k.copy(), tab.b_n.copy()
    lanes = TARGETS[target].lane_elements("b", 32, 8)
    if lanes is None:
        raise CompileError(f"{target}: no lane table for the sparse MMA's B fragment")
    return lanes


def pack_b(b: np.ndarray, target: str = "cuda") -> np.ndarray:
    """B [L, N] (float32 holding f16/bf16 values) -> [KT, NT, 32 lanes, 8] in the target's
    fragment order (`b_lane_order`: on Metal with the scatter GEMM's K shuffle), zero padded to
    whole tiles; the kernel reads one lane's 8 halves as one 16-byte vector."""
    length, n = b.shape
    kt, nt = -(-length // 32), -(-n // 8)
    padded = np.zeros((kt * 32, nt * 8), b.dtype)
    padded[:length, :n] = b
    ks, ns = b_lane_order(target)
    tiles = padded.reshape(kt, 32, nt, 8).transpose(0, 2, 1, 3)      # [KT, NT, 32, 8]
    return tiles[:, :, ks, ns]                                       # [KT, NT, lane, e]


def has_sparse_mma(target: str) -> bool:
    """Whether `target` has the m16n8k32 sparse MMA this module's own lowering issues."""
    return TARGETS[target].sparse_mma == (16, 8, 32)


def has_sparse_gemm(target: str) -> bool:
    """Whether a sparse activation GEMM lowers for `target`: on its sparse MMA, or as the
    software scatter into its dense MMA (`sparse_gemm_scatter.scatter_possible`)."""
    return has_sparse_mma(target) or scatter_possible(TARGETS[target])


def lower_sparse_gemm(dtype: str, target: str = "cuda") -> Kernel:
    """C = S @ B for activations of `dtype` ("f16" / "bf16") on `target`."""
    if dtype not in ("f16", "bf16"):
        raise CompileError(f"dtype: expected 'f16' or 'bf16', got {dtype!r}")
    if has_sparse_mma(target):
        return _Lowering(dtype, target).lower()
    if scatter_possible(TARGETS[target]):
        return lower_scatter_gemm(dtype, target)
    raise CompileError(f"{target}: no m16n8k32 sparse MMA and no dense MMA lane tables for the "
                       f"software scatter; the sparse activation GEMM needs one of them")


def gemm_scalars(layout: ActivationLayout, n: int) -> dict[str, int]:
    """The launch scalars of `layout.target`'s sparse GEMM for S in `layout` and N columns."""
    base = {"P": layout.p, "N": n, "KT": layout.k_tiles}
    if has_sparse_mma(layout.target):
        return {**base, "PAIRS": layout.pp // 32, "NT": -(-n // 8)}
    return {**base, "MT": layout.m_tiles, "NT": -(-n // TARGETS[layout.target].mma_n)}


class _Lowering(Emitter):
    def __init__(self, dtype: str, target: str) -> None:
        super().__init__()
        self.target = TARGETS[target]
        self.act = F16 if dtype == "f16" else BF16
        self.dtype = dtype
        self.frag_a = FragmentType("a", self.act, 16, 16)
        self.frag_b = FragmentType("b", self.act, 32, 8)
        self.frag_c = FragmentType("c", F32, 16, 8)

    def lower(self) -> Kernel:
        b = self.b
        s = {n: b.scalar(n) for n in SCALARS}
        self.s = s
        lane, warp = b.index("lane"), b.index("warp")
        gx, gy = b.index("group_x"), b.index("group_y")
        self.lane = lane
        self.pair = self.op2("add", self.op2("mul", gy, 2, hint="q"), self.op2("div", warp, 2, hint="q"), hint="q")
        self.nt0 = self.op2("add", self.op2("mul", gx, TILE_N // 8, hint="nt"),
                           self.op2("mul", self.op2("rem", warp, 2, hint="nt"), WARP_N_TILES, hint="nt"), hint="nt")
        self.pair_ok = self.op2("lt", self.pair, s["PAIRS"], hint="qok")
        self.n_ok = [self.op2("lt", self.op2("add", self.nt0, j, hint="ntj"), s["NT"], hint="nok")
                     for j in range(WARP_N_TILES)]
        zero = b.op("frag_zero", [], [self.frag_c], hint="z").result
        accs = [zero] * (2 * WARP_N_TILES)
        self.store(self.prefetched_loop(accs, s["KT"], self.fetch, self.compute))
        c_rows, c_cols = self.target.lane_elements("c", 16, 8)  # type: ignore[misc]
        tables = [ConstTable("c_row", U32, tuple(int(v) for v in c_rows.ravel())),
                  ConstTable("c_col", U32, tuple(int(v) for v in c_cols.ravel()))]
        return finish_kernel(
            b, self.target, name=f"sparse_act_gemm_{self.dtype}", threads=THREADS,
            grid=(GridDim("N", TILE_N), GridDim("P", TILE_M), GridDim(None)),
            buffers=[BufferParam("values", U32, "read"), BufferParam("meta", U32, "read"),
                     BufferParam("bp", U32, "read"), BufferParam("y", self.act, "write")],
            scalars=SCALARS, tables=tables,
            attrs={"target": self.target.name, "kind": "sparse_act_gemm", "activation": self.dtype,
                   "tile": [TILE_M, TILE_N, 32], "layout": self.target.sparse_activation_layout})

    def fetch(self, kt: Value, has: Value) -> list[Value]:
        """K step kt's loads: [A words of tile 0, tile 1, metadata word, B words x 8]."""
        b, s = self.b, self.s
        vec4 = VectorType(U32, 4)
        out = []
        for mt in (0, 1):
            tile = self.op2("add", self.op2("mul", self.op2("add", self.op2("mul", self.pair, 2, hint="mt"), mt, hint="mt"),
                                                s["KT"], hint="at"), kt, hint="at")
            idx = self.op2("add", self.op2("mul", tile, 128, hint="ai"), self.op2("mul", self.lane, 4, hint="ai"), hint="ai")
            ok = self.op2("and", has, self.pair_ok, hint="aok")
            out.append(b.value("vload", [idx, ok], vec4, {"buffer": "values", "size": 4}, hint="aw"))
        midx = self.op2("add", self.op2("mul", self.op2("add", self.op2("mul", self.pair, s["KT"], hint="mi"), kt, hint="mi"),
                                      32, hint="mi"), self.lane, hint="mi")
        mok = self.op2("and", has, self.pair_ok, hint="mok")
        word = b.load("meta", midx, U32, pred=mok, hint="mw")
        out.append(b.select(mok, word, b.const(self.target.sparse_idle_metadata), hint="mw"))
        row = self.op2("mul", kt, s["NT"], hint="bt")
        for j in range(WARP_N_TILES):
            tile = self.op2("add", row, self.op2("add", self.nt0, j, hint="bt"), hint="bt")
            idx = self.op2("add", self.op2("mul", tile, 128, hint="bi"), self.op2("mul", self.lane, 4, hint="bi"), hint="bi")
            ok = self.op2("and", has, self.n_ok[j], hint="bok")
            out.append(b.value("vload", [idx, ok], vec4, {"buffer": "bp", "size": 4}, hint="bw"))
        return out

    def frag(self, words: Value, frag_type: FragmentType) -> Value:
        b = self.b
        pairs = [b.bitcast(b.value("extract", [words], U32, {"index": i}, hint="w"), VectorType(self.act, 2), hint="hp")
                 for i in range(4)]
        return b.value("frag_build", pairs, frag_type, hint="fr")

    def compute(self, accs: list[Value], loaded: list[Value]) -> list[Value]:
        b = self.b
        a = [self.frag(loaded[mt], self.frag_a) for mt in (0, 1)]
        meta = loaded[2]
        bs = [self.frag(loaded[3 + j], self.frag_b) for j in range(WARP_N_TILES)]
        new = list(accs)
        for j in range(WARP_N_TILES):
            for mt in (0, 1):
                i = j * 2 + mt
                new[i] = b.value("mma_sp", [a[mt], bs[j], new[i], meta], self.frag_c, {"selector": mt}, hint="acc")
        return new

    def store(self, accs: list[Value]) -> None:
        b = self.b
        per = 4
        for j in range(WARP_N_TILES):
            for mt in (0, 1):
                elems = b.value("frag_elems", [accs[j * 2 + mt]], VectorType(F32, per), hint="ce")
                row0 = self.op2("mul", self.op2("add", self.op2("mul", self.pair, 2, hint="r"), mt, hint="r"), 16, hint="r")
                col0 = self.op2("mul", self.op2("add", self.nt0, j, hint="c"), 8, hint="c")
                store_c_elems(self, elems, per, row0, col0)
