"""Epilogues: where the accumulators go after the K loop.

- `SharedTileEpilogue` (seed pipelines): accumulators -> c_s -> a predicated copy to Y; and
  the striped pipeline's reduction of K-slice partials by the last threadgroup to arrive.
- `KWarpReduce` (weight stream): the k_warps warps' partial tiles added through shared memory.
- `LaneStore` (multistage): each lane stores its own accumulator elements (`frag_elems`, the
  target's C lane table says where they are).
"""
from __future__ import annotations

from typing import Callable

from ...errors import ScheduleError
from ...ir import F32, U32, Value, VectorType
from ...machine.outputs import GATE_ROWS, GATES
from .context import GemmParts, Tile
from .epilogue_steps import EpilogueSteps


class SharedTileEpilogue(GemmParts):
    """Y through the threadgroup's c_s tile; Y's predicates and indices of a tile element."""

    def epilogue(self, tile: Tile, accs: list[Value]) -> None:
        """Accumulators -> c_s (rounded to the activation type) -> predicated copy to Y."""
        b, s = self.b, self.s
        mm, mn, _ = self.target.mma
        for i in range(self.grid_m):
            for j in range(self.grid_n):
                row = self.op2("add", self.warp_m0, i * mm, hint="cr")
                col = self.op2("add", self.warp_n0, j * mn, hint="cc")
                off = self.op2("add", self.op2("mul", row, s.tile_n, hint="co"), col, hint="co")
                b.op("frag_store", [accs[i * self.grid_n + j], off], attrs={"buffer": "c_s", "ld": s.tile_n})
        b.barrier()
        elems = s.tile_m * s.tile_n

        def body(i: Value) -> None:
            e = self.op2("add", self.op2("mul", i, self.threads, hint="e"), self.tid, hint="e")
            pred = self.out_pred(tile, e)
            value = b.load("c_s", e, self.act, self.in_tile(e, elems), hint="cv")
            b.store("y", self.y_index(tile, e), value, pred)

        self.counted_loop(-(-elems // self.threads), body, hint="ie")

    def in_tile(self, e: Value, elems: int) -> Value | None:
        return None if elems % self.threads == 0 else self.op2("lt", e, elems, hint="p")

    def out_pred(self, tile: Tile, e: Value) -> Value:
        s = self.s
        gm = self.op2("add", tile.m0, self.op2("div", e, s.tile_n, hint="yr"), hint="ym")
        gn = self.op2("add", tile.n0, self.op2("rem", e, s.tile_n, hint="yc"), hint="yn")
        pred = self.op2("and", self.op2("lt", gm, self.M, hint="p"), self.op2("lt", gn, self.N, hint="p"), hint="p")
        extra = self.in_tile(e, s.tile_m * s.tile_n)
        return pred if extra is None else self.op2("and", pred, extra, hint="p")

    def y_index(self, tile: Tile, e: Value) -> Value:
        s = self.s
        gm = self.op2("add", tile.m0, self.op2("div", e, s.tile_n, hint="yr"), hint="ym")
        gn = self.op2("add", tile.n0, self.op2("rem", e, s.tile_n, hint="yc"), hint="yn")
        return self.op2("add", self.op2("mul", gm, self.N, hint="yi"), gn, hint="yi")

    def reduce(self, tile: Tile, tile_id: Value, P: int, is_first: Value) -> None:
        """The last threadgroup at a tile sums the partials of all K slices into Y."""
        b, s = self.b, self.s
        elems = s.tile_m * s.tile_n
        b.op("fence", attrs={"scope": "device"})

        def body(i: Value) -> None:
            e = self.op2("add", self.op2("mul", i, self.threads, hint="e"), self.tid, hint="e")
            inside = self.in_tile(e, elems)
            total = b.const(0.0, F32)
            for sl in range(P):
                idx = self.op2("add", self.op2("mul", self.op2("add", self.op2("mul", tile_id, P, hint="rp"), sl, hint="rp"), elems, hint="rp"), e, hint="rp")
                total = self.op2("add", total, b.load("partials", idx, F32, inside, hint="pv"), hint="sum")
            b.store("y", self.y_index(tile, e), b.cast(total, self.act, hint="yv"), self.out_pred(tile, e))

        self.counted_loop(-(-elems // self.threads), body, hint="ir")
        self.guarded(is_first, lambda: b.store("counters", tile_id, self.c(0)))


class KWarpReduce(EpilogueSteps):
    """The weight stream's epilogue (needs `m0`, `nsub`, `msub` of the stream setup); it
    applies the Gemm's `Epilogue` (bias, gate, residual) on the reduced sums."""

    def reduce_and_store(self, accs: list[Value], wk: Value, wn: Value, factor: float = 1.0) -> None:
        """Every warp's partial tiles through shared memory, added, times `factor` (a power of
        two the K loop left out of its sums), rounded once to Y."""
        b, s = self.b, self.s
        mm, mn, _ = self.target.mma
        tile = s.tile_n * s.tile_m
        base = self.op2("add", self.op2("mul", wk, tile, hint="rb"),
                        self.op2("mul", self.op2("mul", wn, self.nsub * mm, hint="rb"), s.tile_m, hint="rb"), hint="rb")
        for j in range(self.nsub):
            for mt in range(self.msub):
                off = self.op2("add", base, j * mm * s.tile_m + mt * mn, hint="ro") if (j or mt) else base
                b.op("frag_store", [accs[j * self.msub + mt], off], attrs={"buffer": "red_s", "ld": s.tile_m})
        b.barrier()
        n0 = self.op2("mul", b.index("group_x"), s.tile_n, hint="n0")
        tid = b.index("tid")
        k_warps = self.pipeline.k_warps  # type: ignore[union-attr]

        def reduced(r: Value, col: Value, inside: Value | None) -> Value:
            """Tile element (N row r, M column col) summed over the K warps, times `factor`."""
            src = self.op2("add", self.op2("mul", r, s.tile_m, hint="si"), col, hint="si")
            total = None
            for w in range(k_warps):
                idx = self.op2("add", src, w * tile, hint="si") if w else src
                part = b.load("red_s", idx, F32, inside, hint="pv")
                total = part if total is None else self.op2("add", total, part, hint="sum")
            if factor != 1.0:
                total = self.op2("mul", total, b.const(factor, F32), hint="sum")  # type: ignore[arg-type]
            return total  # type: ignore[return-value]

        gate = next((st for st in self.epilogue_steps if st in GATES), None)
        if gate is not None:
            self.store_gated(gate, reduced, n0, tid)
            return

        def body(i: Value) -> None:
            e = self.op2("add", self.op2("mul", i, self.threads, hint="e"), tid, hint="e")
            r, col = self.op2("rem", e, s.tile_n, hint="r"), self.op2("div", e, s.tile_n, hint="c")
            inside = None if tile % self.threads == 0 else self.op2("lt", e, tile, hint="p")
            total = reduced(r, col, inside)
            gm, gn = self.op2("add", self.m0, col, hint="ym"), self.op2("add", n0, r, hint="yn")
            if self.epilogue_steps:
                self.store_epilogue(gm, gn, total, inside)
            else:
                self.store_columns(gm, gn, total, inside)

        self.counted_loop(-(-tile // self.threads), body, hint="ie")

    def store_epilogue(self, gm: Value, gn: Value, total: Value, inside: Value | None) -> None:
        """Y[gm, gn] = total + bias[gn] + residual[gm, gn] (the steps the epilogue has),
        rounded once, where gm < M, gn < N and `inside`."""
        b, steps = self.b, self.epilogue_steps
        ok = self.op2("and", self.op2("lt", gm, self.M, hint="p"), self.op2("lt", gn, self.N, hint="p"), hint="p")
        if inside is not None:
            ok = self.op2("and", ok, inside, hint="p")
        at = self.op2("add", self.op2("mul", gm, self.N, hint="yi"), gn, hint="yi")
        if "bias" in steps:
            total = self.add_bias(total, gn, ok)
        if "residual" in steps:
            total = self.add_residual(total, at, ok)
        b.store("y", at, b.cast(total, self.act, hint="yv"), ok)

    def store_gated(self, gate: str, reduced, n0: Value, tid: Value) -> None:
        """Y[gm, j] = act(G + bias) * (U + bias) (+ residual[gm, j]), rounded once: output j of
        the tile pairs its rows r_g = 16 (j // 8) + j % 8 (gate) and r_g + 8 (up); Y has N / 2
        columns (marlin_dsl/epilogue.py)."""
        s = self.s
        half_n = s.tile_n // 2
        half = half_n * s.tile_m
        n_out = self.op2("shr", self.N, 1, hint="no")

        def body(i: Value) -> None:
            e = self.op2("add", self.op2("mul", i, self.threads, hint="e"), tid, hint="e")
            r_out, col = self.op2("rem", e, half_n, hint="r"), self.op2("div", e, half_n, hint="c")
            inside = None if half % self.threads == 0 else self.op2("lt", e, half, hint="p")
            r_g = self.op2("add", r_out, self.op2("mul", self.op2("div", r_out, GATE_ROWS, hint="r"), GATE_ROWS,
                                                  hint="r"), hint="r")
            r_u = self.op2("add", r_g, GATE_ROWS, hint="r")
            g, u = reduced(r_g, col, inside), reduced(r_u, col, inside)
            gm = self.op2("add", self.m0, col, hint="ym")
            j = self.op2("add", self.op2("shr", n0, 1, hint="yn"), r_out, hint="yn")
            ok = self.op2("and", self.op2("lt", gm, self.M, hint="p"), self.op2("lt", j, n_out, hint="p"), hint="p")
            if inside is not None:
                ok = self.op2("and", ok, inside, hint="p")
            self.store_pair(gate, g, u, ok, lambda: self.op2("add", n0, r_g, hint="yn"),
                            lambda: self.op2("add", self.op2("mul", gm, n_out, hint="yi"), j, hint="yi"))

        self.counted_loop(-(-half // self.threads), body, hint="ie")

    def store_columns(self, gm: Value, gn: Value, total: Value, inside: Value | None) -> None:
        """Y[gm, gn] = total (rounded to the activation type) where gm < M, gn < N and
        `inside`: into y, or with `Gemm.outputs` into the part that holds column gn (part i:
        columns [o_i, o_i + w_i) as y_i[gm, gn - o_i], rows of w_i; one predicated store per
        part, one of them taken)."""
        b = self.b
        row_ok = self.op2("lt", gm, self.M, hint="p")
        rounded: list[Value] = []

        # Emitted in the order the one-output kernels always had: predicate, index, value.
        def store(name: str, col_ok: Callable[[], Value], index: Callable[[], Value]) -> None:
            ok = self.op2("and", row_ok, col_ok(), hint="p")
            if inside is not None:
                ok = self.op2("and", ok, inside, hint="p")
            at = index()
            if not rounded:
                rounded.append(b.cast(total, self.act, hint="yv"))
            b.store(name, at, rounded[0], ok)

        widths = self.gemm.outputs
        if not widths:
            store("y", lambda: self.op2("lt", gn, self.N, hint="p"),
                  lambda: self.op2("add", self.op2("mul", gm, self.N, hint="yi"), gn, hint="yi"))
            return
        start = 0
        for i, width in enumerate(widths):
            def col_ok(start: int = start, width: int = width) -> Value:
                below = self.op2("lt", gn, start + width, hint="p")
                return self.op2("and", below, self.op2("ge", gn, start, hint="p"), hint="p") if start else below

            def index(start: int = start, width: int = width) -> Value:
                col = self.op2("sub", gn, start, hint="yc") if start else gn
                return self.op2("add", self.op2("mul", gm, width, hint="yi"), col, hint="yi")

            store(f"y{i}", col_ok, index)
            start += width


class LaneStore(EpilogueSteps):
    """The multistage epilogue (needs the stream setup's `n_tiles`, `m0`, `warp_m0` and the
    C lane tables `c_row_off`, `c_col_off`, `c_row_base`); it applies the Gemm's `Epilogue`
    on each lane's own elements (a gate: `gate_pairs`)."""

    def store_y(self, accs: list[Value]) -> None:
        """Each lane stores its own accumulator elements: C row = N, C column = M."""
        b = self.b
        mm, mn, _ = self.target.mma
        c_row0 = b.value("table", [self.lane], U32, {"name": "c_row0"}, hint="cr")
        c_col0 = b.value("table", [self.lane], U32, {"name": "c_col0"}, hint="cc")
        per = len(self.c_row_off)
        gate = next((st for st in self.epilogue_steps if st in GATES), None)
        pairs = self.gate_pairs() if gate is not None else []
        for j in range(self.nsub):
            n_lane = self.op2("add", self.op2("mul", self.n_tiles[j], mm, hint="yn"), c_row0, hint="yn")
            for mt in range(self.msub):
                m_lane = self.op2("add", self.op2("add", self.m0, self.op2("add", self.warp_m0, mt * mn, hint="ym"), hint="ym"),
                                  c_col0, hint="ym")
                elems = b.value("frag_elems", [accs[j * self.msub + mt]], VectorType(self.frag_c.elem, per), hint="ce")
                if gate is not None:
                    self.store_gated_pairs(gate, pairs, elems, j, n_lane, m_lane)
                    continue
                for e in range(per):
                    n = self.op2("add", n_lane, self.c_row_off[e], hint="yn") if self.c_row_off[e] else n_lane
                    m = self.op2("add", m_lane, self.c_col_off[e], hint="ym") if self.c_col_off[e] else m_lane
                    ok = self.op2("and", self.op2("lt", m, self.M, hint="p"), self.op2("lt", n, self.N, hint="p"), hint="p")
                    v = b.value("extract", [elems], self.frag_c.elem, {"index": e}, hint="yv")
                    at = self.op2("add", self.op2("mul", m, self.N, hint="yi"), n, hint="yi")
                    if "bias" in self.epilogue_steps:
                        v = self.add_bias(v, n, ok)
                    if "residual" in self.epilogue_steps:
                        v = self.add_residual(v, at, ok)
                    b.store("y", at, b.cast(v, self.act, hint="yv"), ok)

    def gate_pairs(self) -> list[tuple[int, int]]:
        """(gate element, up element) of a lane's accumulator elements for a gated epilogue:
        elements GATE_ROWS apart in N at the same M, the gate in the first half of every lane's
        16-row run. From the target's C lane table (CUDA's m16n8: rows g and g + 8); a table
        without such pairs (Metal's 8x8 tiles hold one row a lane) raises ScheduleError."""
        mm = self.target.mma[0]
        rows, cols, base = self.c_row_off, self.c_col_off, self.c_row_base
        pairs = [(e, u) for e in range(len(rows)) for u in range(len(rows))
                 if rows[u] == rows[e] + GATE_ROWS and cols[u] == cols[e] and max(base) + rows[e] < GATE_ROWS]
        if mm != 2 * GATE_ROWS or min(base) < 0 or 2 * len(pairs) != len(rows):
            raise ScheduleError(
                f"gemm {self.gemm.name!r}: a gated epilogue in the {self.pipeline.kind} pipeline pairs each "
                f"lane's gate and up rows in registers; {self.target.name}'s {mm}-row C tile gives a lane no "
                f"such pairs (rows {GATE_ROWS} apart at one column): use the weight stream", self.gemm.location)
        return pairs

    def store_gated_pairs(self, gate: str, pairs: list[tuple[int, int]], elems: Value, j: int,
                          n_lane: Value, m_lane: Value) -> None:
        """Y[m, 8 n_tile + row] = act(G) * U (+ bias, + residual) for each (gate, up) pair of a
        lane's elements of N tile `j` (its gate rows are outputs 8 n_tile .. 8 n_tile + 7)."""
        b = self.b
        n_out = self.op2("shr", self.N, 1, hint="no")
        # n_lane = 16 n_tile + row0 (row0 < 8): the lane's gate row is output 8 n_tile + row0
        j_lane = self.op2("sub", n_lane, self.op2("mul", self.n_tiles[j], GATE_ROWS, hint="yn"), hint="yn")
        for e, u in pairs:
            m = self.op2("add", m_lane, self.c_col_off[e], hint="ym") if self.c_col_off[e] else m_lane
            out = self.op2("add", j_lane, self.c_row_off[e], hint="yn") if self.c_row_off[e] else j_lane
            ok = self.op2("and", self.op2("lt", m, self.M, hint="p"), self.op2("lt", out, n_out, hint="p"), hint="p")
            g = b.value("extract", [elems], self.frag_c.elem, {"index": e}, hint="yv")
            v = b.value("extract", [elems], self.frag_c.elem, {"index": u}, hint="yv")
            self.store_pair(gate, g, v, ok,
                            lambda e=e: self.op2("add", n_lane, self.c_row_off[e], hint="yn") if self.c_row_off[e]
                            else n_lane,
                            lambda m=m, out=out: self.op2("add", self.op2("mul", m, n_out, hint="yi"), out, hint="yi"))


__all__ = ["KWarpReduce", "LaneStore", "SharedTileEpilogue"]
