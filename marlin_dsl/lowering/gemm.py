"""Lowering of a Gemm (format x schedule x activation type) to kernel IR for one target.

Y[M, N] = X[M, K] @ W[K, N]. A threadgroup owns a tile_m x tile_n tile of Y; its warps own
(tile_m / warps_m) x (tile_n / warps_n) sub-tiles covered by the target's MMA tiles. Per K
step the A tile (activations) is staged in threadgroup memory, the B tile is decoded from the
packed weight by `UnitDecoder`, and every warp runs its MMAs. The pipeline kind decides how
these steps are arranged (see `schedule.py`). Tails in M, N and K are handled by predicated
loads (which read as 0) and predicated stores.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import CompileError
from ..formats import BlockPatternSparsity, NMSparsity
from ..ir import (
    F32, U32, Block, BufferParam, Builder, FragmentType, GridDim, Kernel, ScalarParam,
    ScalarType, SharedArray, Value, verify,
)
from ..schedule import DoubleBuffered, FusedDequant, Gemm, StripedKParallel
from ..targets import Target
from .decode import UnitDecoder, UnitInputs, encoding_tables
from .group_params import GroupParams


@dataclass
class _Tile:
    """Where the current output tile starts, and the K-step range it reduces over."""

    m0: Value
    n0: Value


class GemmLowering:
    """Builds the kernel IR of one Gemm for one target."""

    def __init__(self, gemm: Gemm, target: Target) -> None:
        self.gemm, self.target = gemm, target
        self.fmt, self.s = gemm.format, gemm.schedule
        self.s.check(self.fmt, target)
        self.act = ScalarType(gemm.activation)
        self.threads = self.s.threads(target)
        self.warp_m_tile, self.warp_n_tile = self.s.warp_tile
        self.grid_m, self.grid_n = self.s.mma_grid(target)
        mm, mn, mk = target.mma
        self.frag_a = FragmentType("a", self.act, mm, mk)
        self.frag_b = FragmentType("b", self.act, mk, mn)
        self.frag_c = FragmentType("c", F32, mm, mn)
        self.pipeline = self.s.pipeline
        self.b = Builder()
        self.decoder = UnitDecoder(self.b, self.fmt, self.act)
        self.stages = 2 if isinstance(self.pipeline, DoubleBuffered) else 1

    # ----- small helpers -----------------------------------------------------------------

    def c(self, value: int) -> Value:
        return self.b.const(value)

    def op2(self, name: str, a: Value, x: Value | int, hint: str = "v") -> Value:
        return self.b.binary(name, a, x, hint=hint)

    def ceil_div(self, a: Value, d: int) -> Value:
        return self.op2("div", self.op2("add", a, d - 1, hint="cd"), d, hint="cd")

    def counted_loop(self, trip: int, body, hint: str = "i") -> None:
        """A constant-trip `for` without carried values (the unroll pass unrolls it)."""
        b = self.b
        iv = b.fresh(hint, U32)
        loop = b.op("for", [self.c(0), self.c(trip), self.c(1)], [])
        with b.region([iv]) as region:
            loop.regions.append(region)
            body(iv)
            b.yield_()

    # ----- kernel --------------------------------------------------------------------------

    def lower(self) -> Kernel:
        b, s, t = self.b, self.s, self.target
        self.tid = b.index("tid")
        self.warp = b.index("warp")
        self.lane = b.index("lane")
        self.M, self.N, self.K = b.scalar("M"), b.scalar("N"), b.scalar("K")
        self.warp_m0 = self.op2("mul", self.op2("div", self.warp, s.warps_n, hint="wm"),
                                self.warp_m_tile, hint="wm")
        self.warp_n0 = self.op2("mul", self.op2("rem", self.warp, s.warps_n, hint="wn"),
                                self.warp_n_tile, hint="wn")
        self.k_steps = self.ceil_div(self.K, s.tile_k)
        if isinstance(self.pipeline, StripedKParallel):
            self.lower_striped(self.pipeline)
            grid = (GridDim(None, 1, self.pipeline.groups), GridDim(None), GridDim(None))
        else:
            gx, gy = b.index("group_x"), b.index("group_y")
            tile = _Tile(self.op2("mul", gy, s.tile_m, hint="m0"), self.op2("mul", gx, s.tile_n, hint="n0"))
            accs = self.mainloop(tile, self.c(0), self.k_steps)
            self.epilogue(tile, accs)
            grid = (GridDim("N", s.tile_n), GridDim("M", s.tile_m), GridDim(None))
        kernel = Kernel(
            name=self.gemm.name, threads=self.threads, grid=grid, body=b.blocks[0],
            warp_size=t.warp_size, buffers=self.buffers(), scalars=[ScalarParam(n) for n in "MNK"],
            shared=self.shared_arrays(), tables=encoding_tables(self.fmt, ""),
            attrs={"target": t.name, "format": self.fmt.name, "schedule": s.name,
                   "pipeline": self.pipeline.kind, "activation": self.act.name,
                   "tile": (s.tile_m, s.tile_n, s.tile_k), "warps": (s.warps_m, s.warps_n),
                   "mma": tuple(t.mma)},
        )
        if isinstance(self.pipeline, StripedKParallel):
            kernel.attrs["parallel"] = self.pipeline.parallel
        if kernel.shared_bytes > t.max_shared_bytes:
            raise CompileError(
                f"gemm {self.gemm.name!r}: schedule {s.name!r} needs {kernel.shared_bytes} bytes of "
                f"threadgroup memory, over {t.name}'s limit of {t.max_shared_bytes}", s.location)
        verify(kernel)
        return kernel

    def buffers(self) -> list[BufferParam]:
        fmt, act = self.fmt, self.act
        bufs = [BufferParam("x", act, "read"), BufferParam("qweight", U32, "read"),
                *GroupParams(self.b, fmt, act).buffers()]
        if isinstance(fmt.sparsity, NMSparsity):
            bufs.append(BufferParam("meta", U32, "read"))
        if isinstance(fmt.sparsity, BlockPatternSparsity):
            bufs.append(BufferParam("patterns", ScalarType("u8"), "read"))
        if isinstance(self.pipeline, StripedKParallel):
            bufs += [BufferParam("partials", F32, "readwrite"), BufferParam("counters", U32, "readwrite")]
        bufs.append(BufferParam("y", act, "write"))
        return bufs

    def shared_arrays(self) -> list[SharedArray]:
        s = self.s
        arrays = [SharedArray("a_s", self.act, self.stages * s.tile_m * s.tile_k)]
        if isinstance(self.pipeline, FusedDequant):
            arrays.append(SharedArray("b_w", self.act, s.warps * s.tile_k * self.warp_n_tile))
        else:
            arrays.append(SharedArray("b_s", self.act, self.stages * s.tile_k * s.tile_n))
        if isinstance(self.pipeline, StripedKParallel):
            arrays.append(SharedArray("flag_s", U32, 1))
        else:
            arrays.append(SharedArray("c_s", self.act, s.tile_m * s.tile_n))
        return arrays

    # ----- main loop ----------------------------------------------------------------------

    def mainloop(self, tile: _Tile, kt_begin: Value, kt_end: Value) -> list[Value]:
        """Reduce K steps [kt_begin, kt_end) into the warp's accumulators."""
        b = self.b
        accs = [b.value("frag_zero", [], self.frag_c, hint="acc") for _ in range(self.grid_m * self.grid_n)]
        if isinstance(self.pipeline, DoubleBuffered):
            # Prologue: stage 0 holds the first K step (if there is one).
            self.guarded(self.op2("lt", kt_begin, kt_end, hint="has"),
                         lambda: self.load_stage(tile, self.c(0), kt_begin))
            b.barrier()
        iv = b.fresh("kt", U32)
        carried = [b.fresh("acc", self.frag_c) for _ in accs]
        loop = b.op("for", [kt_begin, kt_end, self.c(1), *accs], [self.frag_c] * len(accs), hint="acc")
        with b.region([iv, *carried]) as body:
            loop.regions.append(body)
            if isinstance(self.pipeline, DoubleBuffered):
                step = self.op2("sub", iv, kt_begin, hint="st")
                nxt = self.op2("add", iv, 1, hint="nx")
                self.guarded(self.op2("lt", nxt, kt_end, hint="nx"),
                             lambda: self.load_stage(tile, self.op2("and", self.op2("add", step, 1, hint="sg"), 1, hint="sg"), nxt))
                stage = self.op2("and", step, 1, hint="sg")
                new = self.compute(stage, carried, "b_s")
            elif isinstance(self.pipeline, FusedDequant):
                self.load_a(tile, self.c(0), iv)
                b.barrier()
                self.decode_b_warp(tile, iv)
                b.barrier("simdgroup")
                new = self.compute(self.c(0), carried, "b_w")
            else:  # striped: single stage through threadgroup memory
                self.load_stage(tile, self.c(0), iv)
                b.barrier()
                new = self.compute(self.c(0), carried, "b_s")
            b.barrier()
            b.yield_(*new)
        return loop.results

    def guarded(self, cond: Value, emit) -> None:
        """if (cond) { emit() } with no results (a uniform condition)."""
        b = self.b
        op = b.op("if", [cond], [])
        with b.region() as then:
            op.regions.append(then)
            emit()
            b.yield_()
        with b.region() as other:
            op.regions.append(other)
            b.yield_()

    def load_stage(self, tile: _Tile, stage: Value, kt: Value) -> None:
        self.load_a(tile, stage, kt)
        self.decode_b_tile(tile, stage, kt)

    def load_a(self, tile: _Tile, stage: Value, kt: Value) -> None:
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

    def decode_b_tile(self, tile: _Tile, stage: Value, kt: Value) -> None:
        """All threads decode the B tile (TK x TN) into b_s[stage], one unit per step."""
        s = self.s
        span = self.decoder.span
        units = (s.tile_k // span) * s.tile_n
        base = self.op2("mul", stage, s.tile_k * s.tile_n, hint="bb")
        self._decode_units(tile.n0, kt, units, s.tile_n, self.tid, self.threads, "b_s", base, s.tile_n)

    def decode_b_warp(self, tile: _Tile, kt: Value) -> None:
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
        iv = b.fresh("ks", U32)
        carried = [b.fresh("acc", self.frag_c) for _ in accs]
        loop = b.op("for", [self.c(0), self.c(s.k_substeps(t)), self.c(1), *accs],
                    [self.frag_c] * len(accs), hint="acc")
        with b.region([iv, *carried]) as body:
            loop.regions.append(body)
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
            new = [b.value("mma", [a_frags[i], b_frags[j], carried[i * self.grid_n + j]], self.frag_c, hint="acc")
                   for i in range(self.grid_m) for j in range(self.grid_n)]
            b.yield_(*new)
        return loop.results

    # ----- epilogues ----------------------------------------------------------------------

    def epilogue(self, tile: _Tile, accs: list[Value]) -> None:
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

    def out_pred(self, tile: _Tile, e: Value) -> Value:
        s = self.s
        gm = self.op2("add", tile.m0, self.op2("div", e, s.tile_n, hint="yr"), hint="ym")
        gn = self.op2("add", tile.n0, self.op2("rem", e, s.tile_n, hint="yc"), hint="yn")
        pred = self.op2("and", self.op2("lt", gm, self.M, hint="p"), self.op2("lt", gn, self.N, hint="p"), hint="p")
        extra = self.in_tile(e, s.tile_m * s.tile_n)
        return pred if extra is None else self.op2("and", pred, extra, hint="p")

    def y_index(self, tile: _Tile, e: Value) -> Value:
        s = self.s
        gm = self.op2("add", tile.m0, self.op2("div", e, s.tile_n, hint="yr"), hint="ym")
        gn = self.op2("add", tile.n0, self.op2("rem", e, s.tile_n, hint="yc"), hint="yn")
        return self.op2("add", self.op2("mul", gm, self.N, hint="yi"), gn, hint="yi")

    def lower_striped(self, p: StripedKParallel) -> None:
        """Seed 002's striped K-parallel GEMM with a last-arriving reduction (no float atomics).

        Work unit w -> tile = w / parallel, slice = w % parallel; tile -> (tile / tiles_n,
        tile % tiles_n). Threadgroup g takes units [g * per_group, min(+per_group, total)).
        Partial sums go to partials[(tile * parallel + slice) * TM * TN + r * TN + c] (f32);
        counters[tile] counts arrivals and is reset to 0 by the reducer, so the buffer stays
        zero between launches.
        """
        b, s = self.b, self.s
        P, elems = p.parallel, s.tile_m * s.tile_n
        mm, mn, _ = self.target.mma
        tiles_n, tiles_m = self.ceil_div(self.N, s.tile_n), self.ceil_div(self.M, s.tile_m)
        total = self.op2("mul", self.op2("mul", tiles_m, tiles_n, hint="tot"), P, hint="tot")
        per_group = self.op2("div", self.op2("add", total, p.groups - 1, hint="pg"), p.groups, hint="pg")
        first = self.op2("mul", b.index("group_x"), per_group, hint="w0")
        last = self.op2("min", self.op2("add", first, per_group, hint="w1"), total, hint="w1")
        steps_per_slice = self.op2("div", self.op2("add", self.k_steps, P - 1, hint="sps"), P, hint="sps")
        wv = b.fresh("w", U32)
        loop = b.op("for", [first, last, self.c(1)], [])
        with b.region([wv]) as body:
            loop.regions.append(body)
            tile_id, slice_id = self.op2("div", wv, P, hint="tl"), self.op2("rem", wv, P, hint="sl")
            tile = _Tile(self.op2("mul", self.op2("div", tile_id, tiles_n, hint="tm"), s.tile_m, hint="m0"),
                         self.op2("mul", self.op2("rem", tile_id, tiles_n, hint="tn"), s.tile_n, hint="n0"))
            kt0 = self.op2("min", self.op2("mul", slice_id, steps_per_slice, hint="kt0"), self.k_steps, hint="kt0")
            kt1 = self.op2("min", self.op2("add", kt0, steps_per_slice, hint="kt1"), self.k_steps, hint="kt1")
            accs = self.mainloop(tile, kt0, kt1)
            part_base = self.op2("mul", self.op2("add", self.op2("mul", tile_id, P, hint="pb"), slice_id, hint="pb"), elems, hint="pb")
            for i in range(self.grid_m):
                for j in range(self.grid_n):
                    row = self.op2("add", self.warp_m0, i * mm, hint="cr")
                    col = self.op2("add", self.warp_n0, j * mn, hint="cc")
                    off = self.op2("add", part_base, self.op2("add", self.op2("mul", row, s.tile_n, hint="co"), col, hint="co"), hint="co")
                    b.op("frag_store", [accs[i * self.grid_n + j], off], attrs={"buffer": "partials", "ld": s.tile_n})
            b.op("fence", attrs={"scope": "device"})
            b.barrier()
            is_first = self.op2("eq", self.tid, 0, hint="t0")
            self.guarded(is_first, lambda: b.store("flag_s", self.c(0),
                         b.value("atomic_add", [tile_id, self.c(1)], U32, {"buffer": "counters"}, hint="old")))
            b.barrier()
            arrived = b.load("flag_s", self.c(0), U32, hint="old")
            self.guarded(self.op2("eq", arrived, P - 1, hint="last"), lambda: self.reduce(tile, tile_id, P, is_first))
            b.barrier()
            b.yield_()

    def reduce(self, tile: _Tile, tile_id: Value, P: int, is_first: Value) -> None:
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


__all__ = ["GemmLowering", "Block"]
