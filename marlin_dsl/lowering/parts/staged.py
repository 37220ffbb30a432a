"""Operand source of the seed pipelines: the A tile (activations) and the decoded B tile staged
in threadgroup memory, then the warps' MMAs over the staged tiles. The lowering sets `decoder`
(a `UnitDecoder`) before using it."""
from __future__ import annotations

from ...ir import Value
from ..decode import UnitDecoder, UnitInputs
from .context import GemmParts, Tile


class StagedTiles(GemmParts):
    """Cooperative loads of A into a_s, unit decodes of B into b_s (whole threadgroup) or b_w
    (per warp), and `compute`: one K step's MMAs from those arrays."""

    decoder: UnitDecoder

    def load_stage(self, tile: Tile, stage: Value, kt: Value) -> None:
        self.load_a(tile, stage, kt)
        self.decode_b_tile(tile, stage, kt)

    def load_a(self, tile: Tile, stage: Value, kt: Value) -> None:
        """Cooperative copy of X[m0 : m0+TM, kt*TK : +TK] into a_s[stage] (zeros outside)."""
        s, T = self.s, self.threads
        elems = s.tile_m * s.tile_k
        base = self.op2("mul", stage, elems, hint="ab")
        k0 = self.op2("mul", kt, s.tile_k, hint="k0")

        def body(i: Value) -> None:
            e = self.op2("add", self.op2("mul", i, T, hint="e"), self.tid, hint="e")
            r, col = self.op2("div", e, s.tile_k, hint="r"), self.op2("rem", e, s.tile_k, hint="kc")
            gm, gk = self.op2("add", tile.m0, r, hint="gm"), self.op2("add", k0, col, hint="gk")
            pred = self.op2("and", self.op2("lt", gm, self.M, hint="p"), self.op2("lt", gk, self.K, hint="p"), hint="p")
            if elems % T:
                pred = self.op2("and", pred, self.op2("lt", e, elems, hint="p"), hint="p")
            idx = self.op2("add", self.op2("mul", gm, self.K, hint="xi"), gk, hint="xi")
            value = self.b.load("x", idx, self.act, pred, hint="xa")
            in_tile = None if elems % T == 0 else self.op2("lt", e, elems, hint="p")
            self.b.store("a_s", self.op2("add", base, e, hint="ai"), value, in_tile)

        self.counted_loop(-(-elems // T), body, hint="ia")

    def decode_b_tile(self, tile: Tile, stage: Value, kt: Value) -> None:
        """All threads decode the B tile (TK x TN) into b_s[stage], one unit per step."""
        s = self.s
        span = self.decoder.span
        units = (s.tile_k // span) * s.tile_n
        base = self.op2("mul", stage, s.tile_k * s.tile_n, hint="bb")
        self._decode_units(tile.n0, kt, units, s.tile_n, self.tid, self.threads, "b_s", base, s.tile_n)

    def decode_b_warp(self, tile: Tile, kt: Value) -> None:
        """Each warp decodes its own TK x (TN / warps_n) slice of B into its staging b_w[warp]."""
        s = self.s
        wn = self.warp_n_tile
        units = (s.tile_k // self.decoder.span) * wn
        base = self.op2("mul", self.warp, s.tile_k * wn, hint="bw")
        n0 = self.op2("add", tile.n0, self.warp_n0, hint="wn0")
        self._decode_units(n0, kt, units, wn, self.lane, self.target.warp_size, "b_w", base, wn)

    def _decode_units(self, n0: Value, kt: Value, units: int, cols: int, worker: Value, workers: int,
                      dest: str, base: Value, ld: int) -> None:
        span, dec = self.decoder.span, self.decoder
        words_per_unit = dec.value_words

        def body(i: Value) -> None:
            u = self.op2("add", self.op2("mul", i, workers, hint="u"), worker, hint="u")
            col, ku = self.op2("rem", u, cols, hint="col"), self.op2("div", u, cols, hint="ku")
            n = self.op2("add", n0, col, hint="n")
            dense_k = self.op2("add", self.op2("mul", kt, self.s.tile_k, hint="dk"),
                               self.op2("mul", ku, span, hint="dk"), hint="dk")
            pred = self.op2("and", self.op2("lt", n, self.N, hint="q"), self.op2("lt", dense_k, self.K, hint="q"), hint="q")
            if units % workers:
                pred = self.op2("and", pred, self.op2("lt", u, units, hint="q"), hint="q")
            word_row = self.op2("mul", self.op2("div", dense_k, span, hint="wr"), words_per_unit, hint="wr")
            row0 = self.op2("mul", ku, span, hint="r0")
            in_tile = None if units % workers == 0 else self.op2("lt", u, units, hint="q")

            def store(offset: Value, value: Value) -> None:
                row = self.op2("add", row0, offset, hint="br")
                idx = self.op2("add", self.op2("add", base, self.op2("mul", row, ld, hint="bi"), hint="bi"), col, hint="bi")
                self.b.store(dest, idx, value, in_tile)

            dec.emit_unit(UnitInputs(word_row, n, dense_k, pred), self.N, store)

        self.counted_loop(-(-units // workers), body, hint="iu")

    def compute(self, stage: Value, accs: list[Value], b_array: str) -> list[Value]:
        """K sub-steps of MMAs over the staged tiles (a `for` the unroll pass unrolls)."""
        b, s, t = self.b, self.s, self.target
        mm, mn, mk = t.mma
        a_base = self.op2("mul", stage, s.tile_m * s.tile_k, hint="ab")
        if b_array == "b_w":
            b_ld = self.warp_n_tile
            b_base = self.op2("mul", self.warp, s.tile_k * b_ld, hint="bw")
            col0 = self.c(0)
        else:
            b_ld = s.tile_n
            b_base = self.op2("mul", stage, s.tile_k * s.tile_n, hint="bb")
            col0 = self.warp_n0

        def body(iv: Value, groups: list[list[Value]]) -> list[Value]:
            carried = groups[0]
            k0 = self.op2("mul", iv, mk, hint="kk")
            a_frags, b_frags = [], []
            for i in range(self.grid_m):
                row = self.op2("add", self.warp_m0, i * mm, hint="fr")
                off = self.op2("add", a_base, self.op2("add", self.op2("mul", row, s.tile_k, hint="fa"), k0, hint="fa"), hint="fa")
                a_frags.append(b.value("frag_load", [off], self.frag_a, {"buffer": "a_s", "ld": s.tile_k}, hint="fa"))
            for j in range(self.grid_n):
                col = self.op2("add", col0, j * mn, hint="fc")
                off = self.op2("add", b_base, self.op2("add", self.op2("mul", k0, b_ld, hint="fb"), col, hint="fb"), hint="fb")
                b_frags.append(b.value("frag_load", [off], self.frag_b, {"buffer": b_array, "ld": b_ld}, hint="fb"))
            return [b.value("mma", [a_frags[i], b_frags[j], carried[i * self.grid_n + j]], self.frag_c, hint="acc")
                    for i in range(self.grid_m) for j in range(self.grid_n)]

        return self.carried_for(0, s.k_substeps(t), 1, [("acc", accs)], body, iv_hint="ks", hint="acc")


__all__ = ["StagedTiles"]
