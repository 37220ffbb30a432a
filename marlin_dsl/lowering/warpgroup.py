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
register they read may be written before the wait.) With A in registers and `decode_ahead`,
the decode of step kv+1 moves between the commit and the wait, so a warpgroup's own decode
runs while its tensor cores work; the loop then takes two steps a pass, whose A fragments are
distinct registers (one pass's loop-carried A is what ptxas saw written under the wgmmas).

2:4 formats take the sparse wgmma (k32, A compressed, each warp's metadata words from the
weight layout). Its metadata register is read when the instruction executes, so with A in
shared memory the loop runs `Warpgroup.sparse_pass` steps a pass and retires them all before
going round (`loop_shared_a`; docs/DECISIONS.md).

Rows past M read zero-filled activations and are not stored; N tiles past N decode zero
weights (their loads are predicated off) and are not stored; K past the matrix reads zero
activations and the layout's zero padding. The accumulators go straight to Y: each lane
stores its own elements (the target's lane table of the wide accumulator says where).
"""
from __future__ import annotations

import numpy as np

from ..errors import CompileError
from ..ir import F32, U32, ConstTable, FragmentType, Kernel, SharedArray, Value, VectorType
from .parts.async_stages import AsyncStages
from .parts.context import GemmContext
from .parts.registers import RegisterFetch
from .parts.shell import gemm_buffers, gemm_kernel
from .parts.stream_family import StreamFamily, lane_base_and_offsets
from .parts.swizzled_stages import SwizzledStages
from ..layouts.weight_stream import LAYOUT_NAME

#: decoded-weight buffers of the shared-A loop: step kv's is read by its wgmmas until every
#: warp's wait at step kv+1, and rewritten (for step kv+3) only after the barrier of step kv+2
A_BUFFERS = 3


class WarpgroupLowering(StreamFamily, RegisterFetch, SwizzledStages, AsyncStages):
    def __init__(self, ctx: GemmContext) -> None:
        super().__init__(ctx)
        self.init_stream()
        p, s, target = self.pipeline, self.s, self.target
        self.n_stages, self.depth = p.stages, p.depth
        #: dense K per instruction (B's rows) and A's columns per instruction (half of it for
        #: 2:4, whose A is given compressed with each warp's metadata words)
        self.wg_k = int(target.warpgroup_sparse_k if self.sparse else target.warpgroup_mma[2])  # type: ignore[index]
        self.a_k = self.wg_k // 2 if self.sparse else self.wg_k
        shared_a = p.a_source == "shared"
        self.init_swizzled(original_order=shared_a)
        self.b_layout = target.warpgroup_b_layout
        self.x_stage = self.atoms * self.atom_elems  # elements: whole swizzle atoms (tile_m % 8 == 0)
        #: K vectors per step (one swizzled row of stored weights each: layout.chunk == row)
        self.vectors = s.tile_k // self.layout.dense_chunk
        #: decoded weights of one step: one atom (tile_n rows of one K vector) per vector
        self.a_atom = s.tile_n * self.row
        self.a_stage = self.vectors * self.a_atom
        self._a_index: dict[tuple[int, int], Value] = {}
        #: decoded-weight slots in a_s (the specialised lowering has its own count)
        self.a_slots = A_BUFFERS
        self.frag_acc = FragmentType("c", F32, target.mma_m, s.tile_m)
        c_rows, c_cols = target.lane_elements("c", target.mma_m, s.tile_m)  # type: ignore[misc]
        self.acc_row_base, self.acc_row_off = lane_base_and_offsets(c_rows, "accumulator row")
        self.acc_col_base, self.acc_col_off = lane_base_and_offsets(c_cols, "accumulator column")
        if shared_a:
            self.a_store_plan()

    def lower(self) -> Kernel:
        self.stream_setup(("lane", "warp", "tid"), "wm", "wt", clamp=False)
        self.setup_fetch(self.vectors)
        self.steps = self.KS  # K steps (of `vectors` vectors each)
        self.setup_copies()
        if self.pipeline.a_source == "shared":
            mm = self.target.mma_m
            per = self.target.warpgroup_warps
            # this warp's first row in the A buffer, and its warpgroup's tile (m rows of it)
            self.warp_row = self.op2("add", self.op2("mul", self.warp, mm, hint="ar"), self.a_row0, hint="ar")
            self.wg_a0 = self.op2("mul", self.op2("div", self.warp, per, hint="wg"), per * mm * self.row, hint="wg")
            self.a_k0 = self.b.value("table", [self.lane], U32, {"name": "a_k0"}, hint="ak")
        shared = [SharedArray("x_s", self.act, self.n_stages * self.x_stage, align=self.b_layout.align)]
        if self.pipeline.a_source == "shared":
            acc = self.loop_shared_a()
            shared.append(SharedArray("a_s", self.act, A_BUFFERS * self.a_stage, align=self.b_layout.align))
        else:
            acc = self.loop_registers_a()
        self.b.op("async_wait", attrs={"pending": 0})  # the copies past K land before the group exits
        self.store_acc(acc, whole=self.whole_tile() if self.pipeline.epilogue == "branch" else None)
        return gemm_kernel(
            self.ctx, buffers=gemm_buffers(self.ctx), shared=shared,
            tables=self.stream_tables([*self.swizzled_tables(), *self.a_tables(), *self.acc_tables()]),
            attrs={"stages": self.n_stages, "weight_layout": LAYOUT_NAME},
            memory="shared memory (stages x tile_m activation rows, decoded weights)")

    def acc_tables(self) -> list[ConstTable]:
        return [ConstTable("acc_row0", U32, self.acc_row_base), ConstTable("acc_col0", U32, self.acc_col_base)]

    def a_tables(self) -> list[ConstTable]:
        return [ConstTable("a_k0", U32, self.a_k_base)] if self.pipeline.a_source == "shared" else []

    def loop_registers_a(self) -> Value:
        """The K loop with A in registers; returns the readable accumulator."""
        b = self.b
        stages, depth = self.n_stages, self.depth
        for step in range(stages - 1):  # prologue: the first stages-1 tiles in flight
            self.issue_x(self.c(step))
        fetched = [self.fetch(self.c(d)) for d in range(depth + 1)]
        first, meta = self.decode(self.c(0), fetched[0])
        ahead = [v for f in fetched[1:] for v in f]
        per_set = len(fetched[0])
        acc = b.value("frag_zero", [], self.frag_acc, hint="acc")

        def step(kv: Value, a_cur: list[Value], meta_cur: list[Value], carried: list[Value], acc_in: Value,
                 early: bool) -> list[Value]:
            """Step kv's wgmmas, then step kv+1's copies, loads and decode: with `early` while
            the wgmmas run (the caller keeps the two steps' A in distinct registers), else after
            their wait. Returns [A, metadata, carried loads, accumulator] of step kv+1."""
            self.step_ready(stages - 2)
            slot = self.op2("rem", kv, stages, hint="slot")
            b.op("wgmma_fence", [*a_cur, acc_in])
            acc_v = acc_in
            for t, a in enumerate(a_cur):
                acc_v = self.wgmma([a, self.b_offset(slot, t), acc_v], meta_cur, t, {})
            b.op("wgmma_commit")

            def wait() -> Value:  # step kv's A (and metadata) registers stay live until here
                return b.value("wgmma_wait", [acc_v, *a_cur, *meta_cur], self.frag_acc, {"pending": 0}, hint="acc")
            # Without `early`, wait at once: ptxas serialises the wgmmas of a batch when a
            # register they read may be written before the wait, and after their issue the a
            # registers are dead (free to reuse). The tensor cores meanwhile run the other
            # warpgroups' batches.
            done = None if early else wait()
            self.issue_x(self.op2("add", kv, stages - 1, hint="nx"))
            new = self.fetch(self.op2("add", kv, depth + 1, hint="nx"))
            a_next, meta_next = self.decode(self.op2("add", kv, 1, hint="nx"), carried[:per_set])
            return [*a_next, *meta_next, *carried[per_set:], *new, done if done is not None else wait()]

        n_a, n_meta = len(first), len(meta)

        def split(flat: list[Value]) -> tuple[list[Value], list[Value], list[Value], Value]:
            return flat[:n_a], flat[n_a:n_a + n_meta], flat[n_a + n_meta:-1], flat[-1]

        def body(kv: Value, groups: list[list[Value]]) -> list[Value]:
            a_cur, meta_cur, carried, (acc_in,) = groups
            return step(kv, a_cur, meta_cur, carried, acc_in, False)

        def body_pair(kv: Value, groups: list[list[Value]]) -> list[Value]:
            # two steps: the first's decode writes registers only the second's wgmmas read
            a_cur, meta_cur, carried, (acc_in,) = groups
            out = step(kv, a_cur, meta_cur, carried, acc_in, True)
            return step(self.op2("add", kv, 1, hint="ku"), *split(out), True)

        carried = [("fa", first), ("sm", meta), ("pf", ahead), ("acc", [acc])]
        rest = 0
        if self.pipeline.decode_ahead:
            # the steps in pairs, then the last one (odd step counts) as before
            rest = self.op2("mul", self.op2("div", self.bound(self.steps), 2, hint="ns"), 2, hint="ns")
            a, m_, c, d = split(self.carried_for(0, rest, 2, carried, body_pair, iv_hint="kv", hint="pre"))
            carried = [("fa", a), ("sm", m_), ("pf", c), ("acc", [d])]
        results = self.carried_for(rest, self.steps, 1, carried, body, iv_hint="kv", hint="fin")
        return results[-1]

    def loop_shared_a(self) -> Value:
        """The K loop with A in shared memory, one step's wgmmas in flight while the next is
        prepared; returns the readable accumulator. Step kv's decoded weights go in A buffer
        kv % 3 (read by step kv's wgmmas, retired by every warp's wait at step kv+1, free
        after the barrier of step kv+2); activation copies run stages-2 steps ahead."""
        b = self.b
        stages, depth = self.n_stages, self.depth
        for step in range(stages - 2):  # prologue: the first stages-2 tiles in flight
            self.issue_x(self.c(step))
        fetched = [self.fetch(self.c(d)) for d in range(depth + 1)]
        meta = self.store_a(self.c(0), fetched[0])
        ahead = [v for f in fetched[1:] for v in f]
        per_set = len(fetched[0])
        acc = b.value("frag_zero", [], self.frag_acc, hint="acc")

        def step(kv: Value, carried: list[Value], meta_cur: list[Value], acc_in: Value, pending: int,
                 keep: list[Value]) -> list[Value]:
            """Step kv; returns the next step's carried values (prefetches, metadata words,
            accumulator). `pending`: this warp's groups left in flight by the step's wait,
            which keeps `keep` (an earlier sparse step's metadata words) alive until then."""
            self.step_ready(stages - 3)  # step kv's activations and decoded weights are in place
            self.issue_x(self.op2("add", kv, stages - 2, hint="nx"))  # into step kv-2's slot
            slot = self.op2("rem", kv, stages, hint="slot")
            a_base = self.a_offset(kv)
            b.op("wgmma_fence", [acc_in])
            acc_v = acc_in
            for t in range(self.layout.tiles * self.vectors):  # K tiles of every vector of the step
                atom, col = divmod(t * self.a_k, self.row)
                off = atom * self.a_atom + col
                a_off = self.op2("add", a_base, off, hint="ab") if off else a_base
                acc_v = self.wgmma([a_off, self.b_offset(slot, t), acc_v], meta_cur, t, {"smem_a": "a_s"})
            b.op("wgmma_commit")
            b.op("wgmma_wait", keep, attrs={"pending": pending})
            new = self.fetch(self.op2("add", kv, depth + 1, hint="nx"))
            meta_next = self.store_a(self.op2("add", kv, 1, hint="nx"), carried[:per_set])
            return [*carried[per_set:], *new, *meta_next, acc_v]

        n_meta = len(meta)

        def split(flat: list[Value]) -> tuple[list[Value], list[Value], Value]:
            return flat[:-1 - n_meta], flat[-1 - n_meta:-1], flat[-1]

        groups = [("pf", ahead), ("sm", meta), ("acc", [acc])]
        if not self.sparse:
            # step kv-1's wgmmas are done (this warp), step kv's run on while kv+1 is prepared
            results = self.carried_for(0, self.steps, 1, groups, lambda kv, g: step(kv, g[0], g[1], g[2][0], 1, []),
                                       iv_hint="kv", hint="fin")
            return b.value("wgmma_wait", [results[-1]], self.frag_acc, {"pending": 0}, hint="acc")
        # 2:4: a sparse wgmma reads its metadata register when it executes, not when issued
        # (seen on the H100: a warp that rewrote the register for its next step while its
        # wgmmas were still queued got those 16 rows wrong), and a rolled loop rewrites that
        # register every step. So the loop takes `sparse_pass` steps a pass: each but the last
        # leaves its wgmmas running while the next step is prepared (whose metadata words are
        # new values, live beside the earlier steps', which the last step's wait keeps alive),
        # and the last retires them all before the loop goes round; the steps left over run one
        # at a time. The verifier holds sparse wgmmas to this.
        per_pass = self.pipeline.sparse_pass

        def one_pass(p: Value, g: list[list[Value]]) -> list[Value]:
            kv0 = self.op2("mul", p, per_pass, hint="kv")
            carried, meta_cur, acc_cur = g[0], g[1], g[2][0]
            kept: list[Value] = []
            for i in range(per_pass):
                last = i == per_pass - 1
                kv = self.op2("add", kv0, i, hint="kv") if i else kv0
                out = step(kv, carried, meta_cur, acc_cur, 0 if last else 1, kept if last else [])
                kept += meta_cur
                carried, meta_cur, acc_cur = split(out)
            return [*carried, *meta_cur, acc_cur]

        passes = self.op2("div", self.steps, per_pass, hint="kp") if per_pass > 1 else self.steps
        results = self.carried_for(0, passes, 1, groups, one_pass, iv_hint="kp", hint="fin")
        if per_pass == 1:
            return b.value("wgmma_wait", [results[-1]], self.frag_acc, {"pending": 0}, hint="acc")
        carried, meta_last, acc_last = split(results)
        results = self.carried_for(self.op2("mul", passes, per_pass, hint="kv"), self.steps, 1,
                                   [("pf", carried), ("sm", meta_last), ("acc", [acc_last])],
                                   lambda kv, g: step(kv, g[0], g[1], g[2][0], 0, []), iv_hint="kv", hint="fin")
        return b.value("wgmma_wait", [results[-1]], self.frag_acc, {"pending": 0}, hint="acc")

    def wgmma(self, operands: list[Value], meta: list[Value], tile: int, attrs: dict) -> Value:
        """One wgmma of the step's K tile `tile` (of all its vectors): dense, or 2:4 with the
        metadata word of the tile's pair (`meta`: the step's words, `meta_words`) and the
        tile's parity as the selector (tile pairs share a word, as the weight layout packs them)."""
        attrs = {"smem": "x_s", **attrs}
        if self.sparse:
            vector, t = divmod(tile, self.layout.tiles)
            operands = [*operands, meta[vector * self.layout.meta_words + t // 2]]
            attrs["selector"] = t % 2
        return self.b.value("wgmma", operands, self.frag_acc, attrs, hint="acc")

    def step_ready(self, pending: int) -> None:
        """Wait for this thread's copies of the step, make them and its stores of decoded
        weights visible to the tensor cores, and meet the threadgroup."""
        self.b.op("async_wait", attrs={"pending": pending})
        self.b.op("fence", attrs={"scope": "async_proxy"})
        self.b.barrier()

    def a_offset(self, kv: Value) -> Value:
        """The element offset of this warpgroup's A tile of step kv in a_s."""
        buf = self.op2("rem", kv, self.a_slots, hint="abuf")
        return self.op2("add", self.op2("mul", buf, self.a_stage, hint="ab"), self.wg_a0, hint="ab")

    def a_store_plan(self) -> None:
        """Where each lane's decoded elements go in an A buffer (no IR emitted). The buffer
        holds the threadgroup's tile_n rows x one step's K in the activations' own K order
        (so their copies move whole 16-byte chunks): a lane's element e of K tile t, at MMA
        K position 16 t + col[lane, e], is original offset o = k_perm[16 t + col] =
        a_k0[lane] + delta[t, e] (a per-lane base and per-element offsets, like every lane
        table here). Per row offset, the lane's deltas are grouped into aligned runs of
        `a_run` consecutive elements (16 bytes where the bases allow), one store each."""
        lay, target = self.layout, self.target
        a_rows, a_cols = target.lane_elements("a", target.mma_m, self.a_k)  # type: ignore[misc]
        tiles = lay.tiles
        mma_k = np.arange(tiles)[:, None, None] * lay.tile_cols + a_cols[None]  # [t, lane, e]
        orig = mma_k if lay.k_perm is None else np.asarray(lay.k_perm)[mma_k]
        table = orig.transpose(1, 0, 2).reshape(a_cols.shape[0], -1)  # [lane, (t, e)]
        base, delta = lane_base_and_offsets(table, "A K position")
        self.a_k_base = base
        per = a_cols.shape[1]
        pairs: dict[int, list[tuple[int, int, int]]] = {}  # row offset -> [(delta, tile, pair)]
        for t in range(tiles):
            for p_ in range(per // 2):
                d0, d1 = delta[t * per + 2 * p_], delta[t * per + 2 * p_ + 1]
                if d1 != d0 + 1:
                    raise CompileError("warpgroup: a lane's pair of weights is not two adjacent K positions")
                pairs.setdefault(int(self.a_row_off[2 * p_]), []).append((d0, t, p_))
        run = 2
        for g in (self.per_chunk, self.per_chunk // 2):
            if all(b % g == 0 for b in base) and all(
                    sorted(d for d, _, _ in items) == sorted({d - d % g + i for d, _, _ in items for i in range(0, g, 2)})
                    for items in pairs.values()):
                run = g
                break
        self.a_run = run
        self.a_runs = []  # (row offset, first delta, [(tile, pair)] in K order)
        for row_off, items in sorted(pairs.items()):
            items.sort()
            for i in range(0, len(items), run // 2):
                chunk = items[i:i + run // 2]
                self.a_runs.append((row_off, chunk[0][0], [(t, p_) for _, t, p_ in chunk]))

    def store_a(self, kv: Value, fetched: list[Value]) -> list[Value]:
        """Decode step kv's weights and store them in A buffer kv % 3 (`a_store_plan`): K
        vector j of the step in atom j. Returns the step's metadata words (`meta_words`: the
        wgmmas read them from registers)."""
        b, lay = self.b, self.layout
        words, meta, params = self.unpack_fetched(fetched)
        k_step0 = self.op2("mul", kv, self.s.tile_k, hint="kb")
        base = self.op2("mul", self.op2("rem", kv, self.a_slots, hint="abuf"), self.a_stage, hint="ab")
        pairs_per_tile = lay.per_lane // 2
        for j, vector in enumerate(words):
            atom = None
            for nt in range(self.nsub):  # the warp's N tiles (one but with warp roles)
                decoded: dict[tuple[int, int], Value] = {}
                for t in range(lay.tiles):
                    p = self.tile_params(params, k_step0, j, t, nt)
                    for p_ in range(pairs_per_tile):
                        word, shift = lay.pair_slot(t * pairs_per_tile + p_)
                        w = b.value("extract", [vector[nt]], U32, {"index": word}, hint="w")
                        decoded[(t, p_)] = self.pairs.dequant(w, shift, p[self.a_row_off[2 * p_]])
                if atom is None:
                    atom = self.op2("add", base, j * self.a_atom, hint="ab") if j else base
                for row_off, start, members in self.a_runs:
                    parts = [decoded[m] for m in members]
                    value = parts[0] if len(parts) == 1 else \
                        b.value("vec", parts, VectorType(self.act, 2 * len(parts)), hint="a4")
                    idx = self.op2("add", atom, self.a_run_index(row_off, start, nt), hint="ai")
                    b.op("vstore", [idx, value], attrs={"buffer": "a_s", "size": 2 * len(parts)})
        return self.meta_words(meta)

    def meta_words(self, meta: list[list[Value]]) -> list[Value]:
        """The step's metadata words (2:4), flat: [vector][tile pair] as u32 values, which the
        wgmmas read and the waits keep alive; [] for dense formats."""
        if not self.sparse:
            return []
        per = self.layout.meta_words
        return [vec[0] if per == 1 else self.b.value("extract", [vec[0]], U32, {"index": i}, hint="mw")
                for vec in meta for i in range(per)]

    def a_run_index(self, row_off: int, start: int, nt: int = 0) -> Value:
        """Element index (within an A buffer) of this lane's run at row offset `row_off` and
        K offset a_k0 + start of the warp's N tile nt, in the swizzled rows (computed once,
        before the K loop)."""
        key = (row_off, start) if nt == 0 else (row_off, start, nt)
        if key not in self._a_index:
            row_off += nt * self.target.mma_m
            row = self.op2("add", self.warp_row, row_off, hint="ar") if row_off else self.warp_row
            col = self.op2("add", self.a_k0, start, hint="ac") if start else self.a_k0
            # SwizzledRows.element as IR (as swizzled_element, emitted in the order the
            # kernels checked on the H100 were printed with)
            chunk = self.op2("xor", self.op2("div", col, self.per_chunk, hint="ac"),
                             self.op2("rem", row, self.atom_rows, hint="ac"), hint="ac")
            idx = self.op2("add", self.op2("mul", row, self.row, hint="ai"),
                           self.op2("add", self.op2("mul", chunk, self.per_chunk, hint="ai"),
                                    self.op2("rem", col, self.per_chunk, hint="ai"), hint="ai"), hint="ai")
            self._a_index[key] = idx
        return self._a_index[key]

    def decode(self, kv: Value, fetched: list[Value]) -> tuple[list[Value], list[Value]]:
        """Step kv's A fragments (one per K tile of each of its vectors), in K order, and its
        metadata words (`meta_words`)."""
        words, meta, params = self.unpack_fetched(fetched)
        k_step0 = self.op2("mul", kv, self.s.tile_k, hint="kb")
        out = []
        for j, vector in enumerate(words):
            for t in range(self.layout.tiles):
                out.append(self.a_fragment(vector[0], t, self.tile_params(params, k_step0, j, t)))
        return out, self.meta_words(meta)

    def tile_params(self, params: list | None, k_step0: Value, vector: int, tile: int, nt: int = 0):
        """The group parameters of K tile `tile` of the step's vector `vector` for the warp's
        N tile nt: the step's own where it lies in one scale group (prefetched with its
        weights), else loaded for the tile's first K position."""
        if params is not None:
            return params[nt]
        k = vector * self.layout.dense_chunk + tile * self.tile_k_dense
        return self.row_params(nt, self.op2("add", k_step0, k, hint="kt") if k else k_step0)

    def acc_bases(self) -> tuple[Value, Value]:
        """(N row, M column) of this lane's first accumulator element."""
        b = self.b
        row0 = b.value("table", [self.lane], U32, {"name": "acc_row0"}, hint="cr")
        col0 = b.value("table", [self.lane], U32, {"name": "acc_col0"}, hint="cc")
        n_lane = self.op2("add", self.op2("mul", self.n_tiles[0], self.target.mma_m, hint="yn"), row0, hint="yn")
        return n_lane, self.op2("add", self.m0, col0, hint="ym")

    def whole_tile(self) -> Value:
        """The warp's accumulator tile lies inside M and N, where its stores go unpredicated
        (`store_acc`; `Warpgroup.epilogue`). The branch also keeps ptxas pipelining the
        wgmmas: with the stores in the block of the final wgmma_wait (one predicated run) it
        serialised every wgmma of the loop (C7514, nvcc 13.0) in the warp-role kernels, fp4 bf16
        and uint4_zp f16 ones; with a branch there it does not."""
        mm = self.target.mma_m
        m_in = self.op2("le", self.op2("add", self.m0, self.s.tile_m, hint="w"), self.M, hint="w")
        n_in = self.op2("le", self.op2("mul", self.op2("add", self.n_tiles[0], 1, hint="w"), mm, hint="w"),
                        self.N, hint="w")
        return self.op2("and", m_in, n_in, hint="whole")

    def store_acc(self, acc: Value, bases: tuple[Value, Value] | None = None, whole: Value | None = None) -> None:
        """Each lane stores its own accumulator elements: row = N, column = M (from `bases`,
        `acc_bases`, computed here unless given). `whole`: the warp's tile lies inside M and
        N, where the stores go unpredicated (else each is predicated)."""
        b = self.b
        per = len(self.acc_row_off)
        n_lane, m_lane = self.acc_bases() if bases is None else bases
        elems = b.value("frag_elems", [acc], VectorType(F32, per), hint="ce")

        def stores(check: bool) -> None:
            for e in range(per):
                n = self.op2("add", n_lane, self.acc_row_off[e], hint="yn") if self.acc_row_off[e] else n_lane
                m = self.op2("add", m_lane, self.acc_col_off[e], hint="ym") if self.acc_col_off[e] else m_lane
                ok = self.op2("and", self.op2("lt", m, self.M, hint="p"), self.op2("lt", n, self.N, hint="p"),
                              hint="p") if check else None
                v = b.value("extract", [elems], F32, {"index": e}, hint="yv")
                b.store("y", self.op2("add", self.op2("mul", m, self.N, hint="yi"), n, hint="yi"),
                        b.cast(v, self.act, hint="yv"), ok)

        if whole is None:
            stores(True)
        else:
            self.branch(whole, lambda: stores(False), lambda: stores(True))


__all__ = ["WarpgroupLowering"]
