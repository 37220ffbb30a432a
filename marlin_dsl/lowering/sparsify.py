"""Lowering of a `SparsifySpec` to a kernel: run-time 2:4 sparsification of an activation.

One thread is one *unit* of the operand layout (`layouts/sparse_activation.py`): rows (g, g + 8) of a
16-row tile of S and 16 logical columns (four 2:4 groups), looping over `tiles_per_thread`
tiles along X's rows, so that the per-column zero counts (`stats`) stay in registers and are
published with one atomic add per column per thread. Per group it loads 4 elements (zero past
the edges: the padding rule), optionally applies ReLU^2, selects two by the spec's method in
float32 exactly as `formats/activation_reference.py` does, and stores the pair as one u32 word plus
its nibble into the unit's metadata word. With `dense` it also stores the unit row's 16
elements of S [P, L] row-major (the kept values, 0 elsewhere) and of the kept mask (u8): 16
consecutive elements of an S row whichever the axis (`store_dense`). Everything target specific is the
layout's index maps; the printers see ordinary IR.

Launch scalars: R, C (X's shape), P, L (S's shape), KT, MT (the layout's K and row tiles),
HALF_L4 (pairs per S row, for the MVUE counter), KEY (lowbias32 of the MVUE seed), TASKS
(threads to launch), and for a gathering kernel LD.

A *gathering* kernel (`lower_sparsify(..., gather=True)`) reads X = H[:, cols] through the
column index `cols` [C] from H [R, LD] where it lies, instead of from a gathered copy (the
split dW2 sparsifies 95% of the forward's columns: gathering them first cost 1.2 ms at
T = 8192, hidden 14336 on the H100, more than the sparsify itself).
"""
from __future__ import annotations

from ..layouts.sparse_activation import ROW_TILE, ActivationLayout
from ..formats.activation_spec import SparsifySpec
from ..ir import BF16, BOOL, F16, F32, U8, U16, U32, BufferParam, ConstTable, GridDim, Kernel, Value, VectorType
from ..machine.target import TARGETS
from .parts.emit import Emitter
from .parts.shell import finish_kernel

#: Threads per threadgroup of a sparsify kernel.
THREADS = 256
#: Tiles each thread walks along X's rows (amortises the statistics' atomics).
TILES_PER_THREAD = 8
SCALARS = ("R", "C", "P", "L", "KT", "MT", "HALF_L4", "KEY", "TASKS")
_HASH_MUL = (0x7FEB352D, 0x846CA68B)


def launch_scalars(spec: SparsifySpec, layout: ActivationLayout, shape: tuple[int, int], key: int,
                   ld: int | None = None) -> dict[str, int]:
    """The launch scalars of a sparsify kernel for X of `shape` (R, C); `ld`: the row length of
    H for a gathering kernel."""
    r, c = shape
    extra = {} if ld is None else {"LD": ld}
    loop_tiles = layout.m_tiles if spec.axis == 1 else layout.k_tiles
    fixed_tiles = layout.k_tiles if spec.axis == 1 else layout.m_tiles
    blocks = -(-loop_tiles // TILES_PER_THREAD)
    return {"R": r, "C": c, "P": layout.p, "L": layout.length, "KT": layout.k_tiles,
            "MT": layout.m_tiles, "HALF_L4": -(-layout.length // 4) * 2, "KEY": int(key),
            "TASKS": 16 * fixed_tiles * blocks, **extra}


def lower_sparsify(spec: SparsifySpec, target: str, gather: bool = False) -> Kernel:
    """The sparsify kernel of `spec` for `target` (its layout decides where results go);
    `gather`: X's columns read through the index `cols` (module docstring)."""
    return _SparsifyLowering(spec, target, gather).lower()


class _SparsifyLowering(Emitter):
    def __init__(self, spec: SparsifySpec, target: str, gather: bool = False) -> None:
        super().__init__()
        self.spec, self.gather = spec, gather
        self.target = TARGETS[target]
        # The layout's kind is what matters here; its sizes come from launch scalars.
        self.layout = ActivationLayout(target, 1, 1)
        self.act = F16 if spec.dtype == "f16" else BF16

    # ----- small helpers ---------------------------------------------------------------------

    def f(self, v: float) -> Value:
        return self.b.const(v, F32)

    def sel(self, c: Value, a: Value, x: Value, hint: str = "v") -> Value:
        return self.b.select(c, a, x, hint=hint)

    def abs32(self, x: Value) -> Value:
        """|x| by clearing the sign bit: exact, and +0 for -0 (as numpy's abs)."""
        bits = self.op2("and", self.b.bitcast(x, U32, hint="xb"), 0x7FFFFFFF, hint="xb")
        return self.b.bitcast(bits, F32, hint="ax")

    def hash32(self, x: Value) -> Value:
        """lowbias32 (reference.lowbias32)."""
        x = self.op2("xor", x, self.op2("shr", x, 16, hint="h"), hint="h")
        x = self.op2("mul", x, _HASH_MUL[0], hint="h")
        x = self.op2("xor", x, self.op2("shr", x, 15, hint="h"), hint="h")
        x = self.op2("mul", x, _HASH_MUL[1], hint="h")
        return self.op2("xor", x, self.op2("shr", x, 16, hint="h"), hint="h")

    def round_act(self, x: Value) -> Value:
        """x rounded to the activation type and held in f32 again."""
        return self.b.cast(self.b.cast(x, self.act, hint="rd"), F32, hint="rd")

    # ----- kernel ----------------------------------------------------------------------------

    def lower(self) -> Kernel:
        b, spec = self.b, self.spec
        scalars = SCALARS + (("LD",) if self.gather else ())
        s = {name: b.scalar(name) for name in scalars}
        self.s = s
        if spec.dense:  # rows of S are whole 16-element runs: the wide stores (store_dense)
            self.l16 = self.op2("eq", self.op2("and", s["L"], 15, hint="l16"), 0, hint="l16")
            cap = self.target.max_vector_elems or 16
            self.dense_vec = (min(8, cap), min(16, cap))  # elements a store: S (16-bit), mask (u8)
        tid = b.index("tid")
        gx = b.index("group_x")
        u = self.op2("add", self.op2("mul", gx, THREADS, hint="u"), tid, hint="u")
        if spec.axis == 1:   # threads along X's columns, looping down X's rows (S's rows)
            h = self.op2("rem", u, 2, hint="h")
            kt = self.op2("rem", self.op2("div", u, 2, hint="q"), s["KT"], hint="kt")
            q = self.op2("div", u, self.op2("mul", s["KT"], 2, hint="q"), hint="q")
            g = self.op2("rem", q, 8, hint="g")
            block = self.op2("div", q, 8, hint="blk")
            loop_tiles = s["MT"]
        else:                # threads along X's columns (S's rows), looping down X's rows (S's K)
            g = self.op2("rem", u, 8, hint="g")
            h = self.op2("rem", self.op2("div", u, 8, hint="q"), 2, hint="h")
            q = self.op2("div", u, 16, hint="q")
            mt = self.op2("rem", q, s["MT"], hint="mt")
            block = self.op2("div", q, s["MT"], hint="blk")
            loop_tiles = s["KT"]
        self.g, self.h = g, h
        first = self.op2("mul", block, TILES_PER_THREAD, hint="t0")
        last = self.op2("min", self.op2("add", first, TILES_PER_THREAD, hint="t1"), loop_tiles, hint="t1")
        n_counts = 16 if spec.axis == 1 else 2
        inits = [self.c(0)] * (n_counts if spec.stats else 0)
        active = self.op2("lt", u, s["TASKS"], hint="act")
        first = self.sel(active, first, last, hint="t0")  # idle threads run no iteration


        def body(iv: Value, groups: list[list[Value]]) -> list[Value]:
            tile_m, tile_k = (iv, kt) if spec.axis == 1 else (mt, iv)
            return self.unit(tile_m, tile_k, groups[0])

        results = self.carried_for(first, last, 1, [("zc", inits)], body, iv_hint="t", hint="zs")
        if spec.stats:
            self.publish_counts(results, kt if spec.axis == 1 else mt)

        buffers = [BufferParam("x", self.act, "read"), *([BufferParam("cols", U32, "read")] if self.gather else []),
                   BufferParam("values", U32, "write"), BufferParam("meta", U32, "write")]
        if spec.stats:
            buffers.append(BufferParam("colz", U32, "readwrite"))
        if spec.dense:
            buffers += [BufferParam("dense", self.act, "write"), BufferParam("mask", U8, "write")]
        tables = []
        if self.layout.fragment_order:
            tables = [ConstTable("value_pair", U32, tuple(int(v) for v in self.layout.value_pair_table.ravel())),
                      ConstTable("meta_lane", U32, tuple(int(v) for v in self.layout.meta_lane_table.ravel()))]
        return finish_kernel(
            b, self.target, name=spec.name + ("_gather" if self.gather else ""), threads=THREADS,
            grid=(GridDim("TASKS", THREADS), GridDim(None), GridDim(None)), buffers=buffers,
            scalars=scalars, tables=tables,
            attrs={"target": self.target.name, "kind": "sparsify", "method": spec.method,
                   "axis": spec.axis, "activation": spec.dtype, "relu2": int(spec.relu2),
                   "stats": int(spec.stats), "dense": int(spec.dense), "gather": int(self.gather),
                   "layout": self.layout.kind})

    # ----- one unit: two rows x four groups ---------------------------------------------------

    def unit(self, mt: Value, kt: Value, counts: list[Value]) -> list[Value]:
        b, spec, s = self.b, self.spec, self.s
        counts = list(counts)
        word = self.c(0)
        for rowsel in (0, 1):
            srow = self.op2("add", self.op2("mul", mt, ROW_TILE, hint="sr"),
                           self.op2("add", self.g, 8 * rowsel, hint="sr"), hint="sr")
            row_ok = self.op2("lt", srow, s["P"], hint="rok")
            col0 = self.op2("add", self.op2("mul", kt, 32, hint="sc"), self.op2("mul", self.h, 16, hint="sc"), hint="sc")
            # axis 0 gathering: the row of S is one column of X, looked up once
            row_col = self.column(srow, row_ok) if self.gather and spec.axis == 0 else None
            dense_row: list[tuple[Value, Value]] = []  # (value, kept) of the row's 16 elements
            row_oks: list[Value] = []
            for j in range(4):
                xs, oks = [], []
                for i in range(4):
                    scol = self.op2("add", col0, 4 * j + i, hint="sc")
                    ok = self.op2("and", row_ok, self.op2("lt", scol, s["L"], hint="cok"), hint="ok")
                    r, c = (srow, scol) if spec.axis == 1 else (scol, srow)
                    if self.gather:
                        c = row_col if row_col is not None else self.column(c, ok)
                    idx = self.op2("add", self.op2("mul", r, s["LD" if self.gather else "C"], hint="xi"), c, hint="xi")
                    x = b.cast(b.load("x", idx, self.act, pred=ok, hint="x"), F32, hint="xf")
                    if spec.relu2:
                        x = self.op2("max", x, 0.0, hint="rl")
                        x = self.round_act(self.op2("mul", x, x, hint="sq"))
                    if spec.stats:
                        zero = self.op2("and", ok, self.op2("eq", x, 0.0, hint="z"), hint="z")
                        slot = 4 * j + i if spec.axis == 1 else rowsel
                        counts[slot] = self.op2("add", counts[slot], b.cast(zero, U32, hint="z"), hint="zc")
                    xs.append(x)
                    oks.append(ok)
                pair_index = self.op2("add", self.op2("mul", srow, s["HALF_L4"], hint="pi"),
                                     self.op2("div", self.op2("add", col0, 4 * j, hint="pi"), 2, hint="pi"), hint="pi")
                v0, v1, nibble = self.select_group(xs, pair_index)
                self.store_pair(mt, kt, rowsel, j, v0, v1)
                if spec.dense:
                    dense_row += self.dense_group(v0, v1, nibble)
                    row_oks += oks
                word = self.op2("or", word, self.op2("shl", nibble, 16 * rowsel + 4 * j, hint="nb"), hint="mw")
            if spec.dense:
                self.store_dense(self.op2("add", self.op2("mul", srow, s["L"], hint="di"), col0, hint="di"),
                                 row_ok, col0, dense_row, row_oks)
        self.store_meta(mt, kt, word)
        return counts

    def column(self, c: Value, exists: Value) -> Value:
        """Column c of X in H (a gathering kernel): cols[c] where c exists, else 0."""
        return self.b.load("cols", c, U32, pred=exists, hint="col")

    def select_group(self, xs: list[Value], pair_index: Value) -> tuple[Value, Value, Value]:
        """(value of slot 0, value of slot 1, nibble idx0 | idx1 << 2), f32 values."""
        if self.spec.method == "mvue":
            return self.mvue(xs, pair_index)
        mags = [self.abs32(x) for x in xs]
        # beats[i][j] (i < j): x_j ranks above x_i (strictly larger; ties go to the lower index)
        above = {(i, j): self.op2("gt", mags[j], mags[i], hint="gt") for i in range(4) for j in range(i + 1, 4)}
        keep = []
        for i in range(4):
            terms = [self.b.cast(above[(i, j)], U32, hint="rk") for j in range(i + 1, 4)]
            terms += [self.b.cast(self.op2("xor", above[(j, i)], self.b.const(True, BOOL), hint="nb"), U32, hint="rk")
                      for j in range(i)]
            rank = terms[0]
            for t in terms[1:]:
                rank = self.op2("add", rank, t, hint="rk")
            keep.append(self.op2("lt", rank, 2, hint="kp"))
        # idx0: the first kept (0, 1 or 2); idx1: the last kept (3, 2 or 1)
        idx0 = self.sel(keep[0], self.c(0), self.sel(keep[1], self.c(1), self.c(2), hint="i0"), hint="i0")
        v0 = self.sel(keep[0], xs[0], self.sel(keep[1], xs[1], xs[2], hint="v0"), hint="v0")
        idx1 = self.sel(keep[3], self.c(3), self.sel(keep[2], self.c(2), self.c(1), hint="i1"), hint="i1")
        v1 = self.sel(keep[3], xs[3], self.sel(keep[2], xs[2], xs[1], hint="v1"), hint="v1")
        if self.spec.method == "soft_threshold":
            dropped = [self.sel(keep[i], self.f(0.0), mags[i], hint="dm") for i in range(4)]
            t = self.op2("max", self.op2("max", dropped[0], dropped[1], hint="th"),
                        self.op2("max", dropped[2], dropped[3], hint="th"), hint="th")
            v0, v1 = (self.sel(self.op2("ge", v, 0.0, hint="sg"), self.op2("sub", v, t, hint="sh"),
                               self.op2("add", v, t, hint="sh"), hint="st") for v in (v0, v1))
        return v0, v1, self.op2("or", idx0, self.op2("shl", idx1, 2, hint="nb"), hint="nb")

    def mvue(self, xs: list[Value], pair_index: Value) -> tuple[Value, Value, Value]:
        vals, nib = [], self.c(0)
        for pair in (0, 1):
            a, c = xs[2 * pair], xs[2 * pair + 1]
            ma, mc = self.abs32(a), self.abs32(c)
            total = self.op2("add", ma, mc, hint="sm")
            h = self.hash32(self.op2("xor", self.op2("add", pair_index, pair, hint="pi"), self.s["KEY"], hint="hk"))
            u = self.op2("mul", self.b.cast(self.op2("shr", h, 8, hint="u"), F32, hint="u"), 2.0 ** -24, hint="u")
            first = self.op2("or", self.op2("lt", self.op2("mul", u, total, hint="us"), ma, hint="f"),
                            self.op2("eq", mc, 0.0, hint="f"), hint="f")
            chosen = self.sel(first, a, c, hint="ch")
            vals.append(self.sel(self.op2("lt", chosen, 0.0, hint="ng"), self.op2("sub", self.f(0.0), total, hint="ng"),
                                 total, hint="mv"))
            idx = self.sel(first, self.c(2 * pair), self.c(2 * pair + 1), hint="ix")
            nib = self.op2("or", nib, self.op2("shl", idx, 2 * pair, hint="nb"), hint="nb")
        return vals[0], vals[1], nib

    # ----- stores ------------------------------------------------------------------------------

    def store_pair(self, mt: Value, kt: Value, rowsel: int, j: int, v0: Value, v1: Value) -> None:
        b = self.b
        # slot 0 in the low half (the A fragment's element order); integer packing prints the
        # same on every target
        lo, hi = (b.cast(b.bitcast(b.cast(v, self.act, hint="o"), U16, hint="ob"), U32, hint="ow") for v in (v0, v1))
        word = self.op2("or", lo, self.op2("shl", hi, 16, hint="pw"), hint="pw")
        r = self.op2("add", self.g, 8 * rowsel, hint="r")        # row in tile
        c = self.op2("add", self.op2("mul", self.h, 4, hint="cp"), j, hint="cp")  # pair in tile
        if self.layout.fragment_order:
            tile = self.op2("add", self.op2("mul", mt, self.s["KT"], hint="tb"), kt, hint="tb")
            inner = b.value("table", [self.op2("add", self.op2("mul", r, 8, hint="ti"), c, hint="ti")], U32,
                            {"name": "value_pair"}, hint="vp")
            idx = self.op2("add", self.op2("mul", tile, 128, hint="vi"), inner, hint="vi")
        else:  # row-major [Pp, Lp / 2]: Lp / 4 words per row
            row = self.op2("add", self.op2("mul", mt, ROW_TILE, hint="vr"), r, hint="vr")
            col = self.op2("add", self.op2("mul", kt, 8, hint="vc"), c, hint="vc")
            idx = self.op2("add", self.op2("mul", row, self.op2("mul", self.s["KT"], 8, hint="ld"), hint="vi"), col, hint="vi")
        b.store("values", idx, word)

    def dense_group(self, v0: Value, v1: Value, nibble: Value) -> list[tuple[Value, Value]]:
        """A group's 4 elements of dense S (in the activation type) and its kept mask (u8):
        position i holds v0 where idx0 = i, v1 where idx1 = i, else 0."""
        b = self.b
        idx0, idx1 = self.op2("and", nibble, 3, hint="k0"), self.op2("shr", nibble, 2, hint="k1")
        out = []
        for i in range(4):
            is0, is1 = self.op2("eq", idx0, i, hint="k0"), self.op2("eq", idx1, i, hint="k1")
            value = self.sel(is0, v0, self.sel(is1, v1, self.f(0.0), hint="dv"), hint="dv")
            kept = b.cast(self.op2("or", is0, is1, hint="km"), U8, hint="km")
            out.append((b.cast(value, self.act, hint="dv"), kept))
        return out

    def store_dense(self, first: Value, row_ok: Value, col0: Value, elems: list[tuple[Value, Value]],
                    oks: list[Value]) -> None:
        """A unit row's 16 elements of dense S and of the kept mask at row-major index `first`.
        Where L is a multiple of 16 and the row exists, all 16 exist: two 16-byte stores of S
        and one of the mask (a warp's lanes then write whole runs of a row: element by
        element, each store instruction touched 32 sectors for 2 bytes each and took 1.8 ms
        at T = 8192, hidden 14336 on the H100); else element by element, each where it exists."""
        b, s = self.b, self.s
        whole = self.op2("and", self.op2("and", self.l16, row_ok, hint="dw"),
                         self.op2("lt", col0, s["L"], hint="dw"), hint="dw")

        def wide() -> None:  # vectors as wide as the target's values go (16 bytes at most)
            for name, part, per in (("dense", 0, self.dense_vec[0]), ("mask", 1, self.dense_vec[1])):
                for start in range(0, 16, per):
                    vec = b.value("vec", [e[part] for e in elems[start:start + per]],
                                  VectorType(self.act if part == 0 else U8, per), hint="dv")
                    at = self.op2("add", first, start, hint="di") if start else first
                    b.op("vstore", [at, vec], attrs={"buffer": name, "size": per})

        def each() -> None:
            for i, ((value, kept), ok) in enumerate(zip(elems, oks)):
                at = self.op2("add", first, i, hint="di") if i else first
                b.store("dense", at, value, ok)
                b.store("mask", at, kept, ok)

        self.branch(whole, wide, each)

    def store_meta(self, mt: Value, kt: Value, word: Value) -> None:
        b = self.b
        if self.layout.fragment_order:
            tile = self.op2("add", self.op2("mul", self.op2("div", mt, 2, hint="tp"), self.s["KT"], hint="tb"), kt, hint="tb")
            sel = self.op2("add", self.op2("mul", self.op2("rem", mt, 2, hint="F"), 16, hint="ml"),
                          self.op2("add", self.op2("mul", self.g, 2, hint="ml"), self.h, hint="ml"), hint="ml")
            lane = b.value("table", [sel], U32, {"name": "meta_lane"}, hint="ln")
            idx = self.op2("add", self.op2("mul", tile, 32, hint="mi"), lane, hint="mi")
        else:
            tile = self.op2("add", self.op2("mul", mt, self.s["KT"], hint="tb"), kt, hint="tb")
            idx = self.op2("add", self.op2("mul", tile, 16, hint="mi"),
                          self.op2("add", self.op2("mul", self.g, 2, hint="mi"), self.h, hint="mi"), hint="mi")
        b.store("meta", idx, word)

    def publish_counts(self, counts: list[Value], fixed_tile: Value) -> None:
        """One atomic add per counted column of X (only columns that exist)."""
        b = self.b
        for slot, count in enumerate(counts):
            if self.spec.axis == 1:   # X column = S column 32 kt + 16 h + slot
                col = self.op2("add", self.op2("add", self.op2("mul", fixed_tile, 32, hint="zc"),
                                             self.op2("mul", self.h, 16, hint="zc"), hint="zc"), slot, hint="zc")
            else:                     # X column = S row 16 mt + g + 8 slot
                col = self.op2("add", self.op2("mul", fixed_tile, ROW_TILE, hint="zc"),
                              self.op2("add", self.g, 8 * slot, hint="zc"), hint="zc")
            ok = self.op2("and", self.op2("lt", col, self.s["C"], hint="zok"), self.op2("ne", count, 0, hint="zok"), hint="zok")
            self.guarded(ok, lambda: b.op("atomic_add", [col, count], [U32], {"buffer": "colz"}, hint="old"))
