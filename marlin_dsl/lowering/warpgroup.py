"""Lowering of the warpgroup pipeline (`Warpgroup`, marlin_dsl/pipelines/warpgroup.py) to
kernel IR: large M with the warpgroup MMA (`wgmma`). Assembled from parts: the stream setup
and A-fragment decode (`parts/stream_family.py`), weight vectors from device memory to
registers (`parts/registers.py`), the activation tile into swizzled shared-memory stages
(`parts/swizzled_stages.py`, with the asynchronous copies of `parts/async_stages.py`).

The product and the physical weight layout are the weight stream's: Y^T[N, M] = W^T[N, K]
X^T[K, M]. Threadgroup (group_x, group_y) owns N rows [n0, n0 + tile_n) and M rows
[m0, m0 + tile_m); warp w owns N rows 16 w .. 16 w + 15 of it (its MMA M tile), so a
warpgroup of 4 warps covers 64 rows: one wgmma m64nNk16 with N = tile_m multiplies the
warpgroup's four decoded A fragments with the whole activation tile. Per K step kv:

    async_wait(stages-2); fence async_proxy; barrier    step kv's tile has landed, every
                                                        thread's writes are visible to the
                                                        tensor cores, every warp is past step
                                                        kv-1's wgmmas (their wait)
    wgmma_fence(A_kv, acc)                              A_kv was decoded by ordinary code
    acc = wgmma(A_kv[s], stage kv, tile s, acc)   x tiles
    wgmma_commit
    acc = wgmma_wait(acc, A_kv; pending 0)              A_kv's registers stay live until here
    issue the copies of step kv+stages-1 (into step kv-1's slot, now free)
    load the weight vectors of step kv+depth+1 (registers)
    A_{kv+1} = decode(weights of step kv+1)             while other warpgroups' wgmmas run

(Waiting before the decode keeps one batch's wgmmas back to back: ptxas serialises them if a
register they read may be written before the wait.)

Rows past M read zero-filled activations and are not stored; N tiles past N decode zero
weights (their loads are predicated off) and are not stored; K past the matrix reads zero
activations and the layout's zero padding. The accumulators go straight to Y: each lane
stores its own elements (the target's lane table of the wide accumulator says where).
"""
from __future__ import annotations

from ..ir import F32, U32, ConstTable, FragmentType, Kernel, SharedArray, Value, VectorType
from .parts.async_stages import AsyncStages
from .parts.context import GemmContext
from .parts.registers import RegisterFetch
from .parts.shell import gemm_buffers, gemm_kernel
from .parts.stream_family import StreamFamily, lane_base_and_offsets
from .parts.swizzled_stages import SwizzledStages
from ..layouts.weight_stream import LAYOUT_NAME


class WarpgroupLowering(StreamFamily, RegisterFetch, SwizzledStages, AsyncStages):
    def __init__(self, ctx: GemmContext) -> None:
        super().__init__(ctx)
        self.init_stream()
        p, s, target = self.pipeline, self.s, self.target
        self.n_stages, self.depth = p.stages, p.depth
        _, _, self.wg_k = target.warpgroup_mma  # type: ignore[misc]
        self.init_swizzled()
        self.x_stage = s.tile_m * self.row  # elements: whole atoms, since tile_m % 8 == 0
        self.frag_acc = FragmentType("c", F32, target.mma_m, s.tile_m)
        c_rows, c_cols = target.lane_elements("c", target.mma_m, s.tile_m)  # type: ignore[misc]
        self.acc_row_base, self.acc_row_off = lane_base_and_offsets(c_rows, "accumulator row")
        self.acc_col_base, self.acc_col_off = lane_base_and_offsets(c_cols, "accumulator column")

    def lower(self) -> Kernel:
        b = self.b
        stages, depth = self.n_stages, self.depth
        self.stream_setup(("lane", "warp", "tid"), "wm", "wt", clamp=False)
        self.setup_copies()
        for step in range(stages - 1):  # prologue: the first stages-1 tiles in flight
            self.issue_x(self.c(step))
        fetched = [self.fetch(self.c(d)) for d in range(depth + 1)]
        first = self.decode(self.c(0), fetched[0])
        ahead = [v for f in fetched[1:] for v in f]
        per_set = len(fetched[0])
        acc = b.value("frag_zero", [], self.frag_acc, hint="acc")

        def body(kv: Value, groups: list[list[Value]]) -> list[Value]:
            a_cur, carried, (acc_in,) = groups
            b.op("async_wait", attrs={"pending": stages - 2})
            b.op("fence", attrs={"scope": "async_proxy"})
            b.barrier()
            slot = self.op2("rem", kv, stages, hint="slot")
            b.op("wgmma_fence", [*a_cur, acc_in])
            acc_v = acc_in
            for t, a in enumerate(a_cur):
                acc_v = b.value("wgmma", [a, self.b_offset(slot, t), acc_v], self.frag_acc,
                                {"smem": "x_s"}, hint="acc")
            b.op("wgmma_commit")
            # Wait at once: ptxas serialises the wgmmas of a batch when any register they read
            # is written before the wait, and after their issue the a registers are dead to it
            # (free to reuse). The next step's copies, loads and decode follow; the tensor cores
            # meanwhile run the other warpgroups' batches.
            done = b.value("wgmma_wait", [acc_v, *a_cur], self.frag_acc, {"pending": 0}, hint="acc")
            self.issue_x(self.op2("add", kv, stages - 1, hint="nx"))
            new = self.fetch(self.op2("add", kv, depth + 1, hint="nx"))
            a_next = self.decode(self.op2("add", kv, 1, hint="nx"), carried[:per_set])
            return [*a_next, *carried[per_set:], *new, done]

        results = self.carried_for(0, self.KV, 1, [("fa", first), ("pf", ahead), ("acc", [acc])],
                                   body, iv_hint="kv", hint="fin")
        b.op("async_wait", attrs={"pending": 0})  # the copies past K land before the group exits
        self.store_acc(results[-1])
        shared = [SharedArray("x_s", self.act, stages * self.x_stage,
                              align=self.target.warpgroup_b_layout.align)]  # type: ignore[union-attr]
        return gemm_kernel(
            self.ctx, buffers=gemm_buffers(self.ctx), shared=shared,
            tables=self.stream_tables([*self.swizzled_tables(),
                                       ConstTable("acc_row0", U32, self.acc_row_base),
                                       ConstTable("acc_col0", U32, self.acc_col_base)]),
            attrs={"stages": stages, "weight_layout": LAYOUT_NAME},
            memory="shared memory (stages x tile_m activation rows)")

    def decode(self, kv: Value, fetched: list[Value]) -> list[Value]:
        """Step kv's A fragments (one per K tile of the layout) from its fetched weight vector."""
        words, _, params = self.unpack_fetched(fetched)
        k_vec0 = self.op2("mul", kv, self.layout.dense_chunk, hint="kb")
        out = []
        for t in range(self.layout.tiles):
            if params is not None:
                p = params[0]
            else:
                p = self.row_params(0, self.op2("add", k_vec0, t * self.tile_k_dense, hint="kt") if t else k_vec0)
            out.append(self.a_fragment(words[0], t, p))
        return out

    def store_acc(self, acc: Value) -> None:
        """Each lane stores its own accumulator elements: row = N, column = M."""
        b = self.b
        mm = self.target.mma_m
        per = len(self.acc_row_off)
        row0 = b.value("table", [self.lane], U32, {"name": "acc_row0"}, hint="cr")
        col0 = b.value("table", [self.lane], U32, {"name": "acc_col0"}, hint="cc")
        n_lane = self.op2("add", self.op2("mul", self.n_tiles[0], mm, hint="yn"), row0, hint="yn")
        m_lane = self.op2("add", self.m0, col0, hint="ym")
        elems = b.value("frag_elems", [acc], VectorType(F32, per), hint="ce")
        for e in range(per):
            n = self.op2("add", n_lane, self.acc_row_off[e], hint="yn") if self.acc_row_off[e] else n_lane
            m = self.op2("add", m_lane, self.acc_col_off[e], hint="ym") if self.acc_col_off[e] else m_lane
            ok = self.op2("and", self.op2("lt", m, self.M, hint="p"), self.op2("lt", n, self.N, hint="p"), hint="p")
            v = b.value("extract", [elems], F32, {"index": e}, hint="yv")
            b.store("y", self.op2("add", self.op2("mul", m, self.N, hint="yi"), n, hint="yi"),
                    b.cast(v, self.act, hint="yv"), ok)


__all__ = ["WarpgroupLowering"]
