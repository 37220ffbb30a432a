"""Lowering of seed 002's pipelines (`DoubleBuffered`, `FusedDequant`, `StripedKParallel`,
marlin_dsl/pipelines/seed.py) to kernel IR.

Y[M, N] = X[M, K] @ W[K, N]. A threadgroup owns a tile_m x tile_n tile of Y; its warps own
(tile_m / warps_m) x (tile_n / warps_n) sub-tiles covered by the target's MMA tiles. Per K
step the A tile (activations) is staged in threadgroup memory, the B tile is decoded from the
packed weight by `UnitDecoder`, and every warp runs its MMAs (parts/staged.py). The three
pipelines differ in one K step (`step`), the prologue, the arrays they stage through, and the
striped pipeline's outer loop over work units. Tails in M, N and K are handled by predicated
loads (which read as 0) and predicated stores.
"""
from __future__ import annotations

from ..ir import U32, GridDim, Kernel, SharedArray, Value
from .decode import UnitDecoder, encoding_tables
from .parts.context import GemmContext, Tile
from .parts.epilogues import SharedTileEpilogue
from .parts.shell import STRIPED_BUFFERS, gemm_buffers, gemm_kernel
from .parts.staged import StagedTiles


class StagedLowering(StagedTiles, SharedTileEpilogue):
    """The K loop of the staged pipelines; subclasses give `step` (and the hooks below)."""

    #: threadgroup-memory stages of the A and B tiles
    stages = 1
    #: where the B tile is staged: b_s (whole threadgroup) or b_w (per warp)
    b_array = "b_s"

    def __init__(self, ctx: GemmContext) -> None:
        super().__init__(ctx)
        self.decoder = UnitDecoder(ctx.b, ctx.fmt, ctx.act)

    def lower(self) -> Kernel:
        s = self.s
        self.ctx.emit_indices("tid", "warp", "lane")
        self.warp_m0 = self.op2("mul", self.op2("div", self.warp, s.warps_n, hint="wm"),
                                self.warp_m_tile, hint="wm")
        self.warp_n0 = self.op2("mul", self.op2("rem", self.warp, s.warps_n, hint="wn"),
                                self.warp_n_tile, hint="wn")
        self.k_steps = self.ceil_div(self.K, s.tile_k)
        grid = self.tiles()
        return gemm_kernel(self.ctx, grid=grid, buffers=gemm_buffers(self.ctx, self.extra_buffers()),
                           shared=self.shared_arrays(), tables=encoding_tables(self.fmt, ""),
                           attrs=self.extra_attrs())

    def tiles(self) -> tuple[GridDim, GridDim, GridDim]:
        """Emit the work of a threadgroup (one output tile by default); return the grid."""
        s, b = self.s, self.b
        gx, gy = b.index("group_x"), b.index("group_y")
        tile = Tile(self.op2("mul", gy, s.tile_m, hint="m0"), self.op2("mul", gx, s.tile_n, hint="n0"))
        accs = self.mainloop(tile, self.c(0), self.k_steps)
        self.epilogue(tile, accs)
        return (GridDim("N", s.tile_n), GridDim("M", s.tile_m), GridDim(None))

    def mainloop(self, tile: Tile, kt_begin: Value, kt_end: Value) -> list[Value]:
        """Reduce K steps [kt_begin, kt_end) into the warp's accumulators."""
        accs = self.ctx.zero_accumulators(self.grid_m * self.grid_n)
        self.prologue(tile, kt_begin, kt_end)

        def body(iv: Value, groups: list[list[Value]]) -> list[Value]:
            new = self.step(tile, iv, kt_begin, kt_end, groups[0])
            self.b.barrier()
            return new

        return self.carried_for(kt_begin, kt_end, 1, [("acc", accs)], body, iv_hint="kt", hint="acc")

    def prologue(self, tile: Tile, kt_begin: Value, kt_end: Value) -> None:
        """Before the K loop (nothing by default)."""

    def step(self, tile: Tile, kt: Value, kt_begin: Value, kt_end: Value, accs: list[Value]) -> list[Value]:
        """One K step, single stage through threadgroup memory."""
        self.load_stage(tile, self.c(0), kt)
        self.b.barrier()
        return self.compute(self.c(0), accs, "b_s")

    def extra_buffers(self) -> tuple:
        return ()

    def extra_attrs(self) -> dict:
        return {}

    def shared_arrays(self) -> list[SharedArray]:
        s = self.s
        arrays = [SharedArray("a_s", self.act, self.stages * s.tile_m * s.tile_k)]
        if self.b_array == "b_w":
            arrays.append(SharedArray("b_w", self.act, s.warps * s.tile_k * self.warp_n_tile))
        else:
            arrays.append(SharedArray("b_s", self.act, self.stages * s.tile_k * s.tile_n))
        arrays.append(self.result_array())
        return arrays

    def result_array(self) -> SharedArray:
        return SharedArray("c_s", self.act, self.s.tile_m * self.s.tile_n)


class DoubleBufferedLowering(StagedLowering):
    """Two stages: step k+1's tiles load while step k computes."""

    stages = 2

    def prologue(self, tile: Tile, kt_begin: Value, kt_end: Value) -> None:
        # stage 0 holds the first K step (if there is one)
        self.guarded(self.op2("lt", kt_begin, kt_end, hint="has"),
                     lambda: self.load_stage(tile, self.c(0), kt_begin))
        self.b.barrier()

    def step(self, tile: Tile, kt: Value, kt_begin: Value, kt_end: Value, accs: list[Value]) -> list[Value]:
        step = self.op2("sub", kt, kt_begin, hint="st")
        nxt = self.op2("add", kt, 1, hint="nx")
        self.guarded(self.op2("lt", nxt, kt_end, hint="nx"),
                     lambda: self.load_stage(tile, self.op2("and", self.op2("add", step, 1, hint="sg"), 1, hint="sg"), nxt))
        stage = self.op2("and", step, 1, hint="sg")
        return self.compute(stage, accs, "b_s")


class FusedDequantLowering(StagedLowering):
    """A through threadgroup memory; each warp decodes its own B slice into b_w."""

    b_array = "b_w"

    def step(self, tile: Tile, kt: Value, kt_begin: Value, kt_end: Value, accs: list[Value]) -> list[Value]:
        self.load_a(tile, self.c(0), kt)
        self.b.barrier()
        self.decode_b_warp(tile, kt)
        self.b.barrier("simdgroup")
        return self.compute(self.c(0), accs, "b_w")


class StripedLowering(StagedLowering):
    """Work units (M tile, N tile, K slice) over a 1-D grid; the last to arrive reduces."""

    def extra_buffers(self) -> tuple:
        return STRIPED_BUFFERS

    def extra_attrs(self) -> dict:
        return {"parallel": self.pipeline.parallel}

    def result_array(self) -> SharedArray:
        return SharedArray("flag_s", U32, 1)

    def tiles(self) -> tuple[GridDim, GridDim, GridDim]:
        """Seed 002's striped K-parallel GEMM with a last-arriving reduction (no float atomics).

        Work unit w -> tile = w / parallel, slice = w % parallel; tile -> (tile / tiles_n,
        tile % tiles_n). Threadgroup g takes units [g * per_group, min(+per_group, total)).
        Partial sums go to partials[(tile * parallel + slice) * TM * TN + r * TN + c] (f32);
        counters[tile] counts arrivals and is reset to 0 by the reducer, so the buffer stays
        zero between launches.
        """
        b, s, p = self.b, self.s, self.pipeline
        P, elems = p.parallel, s.tile_m * s.tile_n
        mm, mn, _ = self.target.mma
        tiles_n, tiles_m = self.ceil_div(self.N, s.tile_n), self.ceil_div(self.M, s.tile_m)
        total = self.op2("mul", self.op2("mul", tiles_m, tiles_n, hint="tot"), P, hint="tot")
        per_group = self.op2("div", self.op2("add", total, p.groups - 1, hint="pg"), p.groups, hint="pg")
        first = self.op2("mul", b.index("group_x"), per_group, hint="w0")
        last = self.op2("min", self.op2("add", first, per_group, hint="w1"), total, hint="w1")
        steps_per_slice = self.op2("div", self.op2("add", self.k_steps, P - 1, hint="sps"), P, hint="sps")

        def unit(wv: Value, _: list) -> None:
            tile_id, slice_id = self.op2("div", wv, P, hint="tl"), self.op2("rem", wv, P, hint="sl")
            tile = Tile(self.op2("mul", self.op2("div", tile_id, tiles_n, hint="tm"), s.tile_m, hint="m0"),
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

        self.carried_for(first, last, 1, [], unit, iv_hint="w")
        return (GridDim(None, 1, p.groups), GridDim(None), GridDim(None))


__all__ = ["DoubleBufferedLowering", "FusedDequantLowering", "StagedLowering", "StripedLowering"]
