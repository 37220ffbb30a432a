"""Lowering of the multistage pipeline (`schedule.Multistage`) to kernel IR: large M.

The product and the physical weight layout are the weight-stream kernel's (`stream.py`,
`stream_layout.py`): Y^T[N, M] = W^T[N, K] X^T[K, M], weights as the MMA's A operand, each
lane's fragments for one K step in one 128-bit vector. What changes is where operands come from:

- Threadgroup (group_x, group_y) owns N rows [n0, n0 + tile_n) and M rows [m0, m0 + tile_m);
  warp w = wm * warps_n + wn owns N tiles wn*nsub .. and M tiles wm*msub .. of it.
- Every K step, the threadgroup's threads copy the step's weight vectors (tile_n/16 tiles x
  32 lanes x 16 bytes; the 2:4 metadata likewise) and its activation tile (tile_m rows x
  tile_k) into shared memory with `async_copy`, one group per step, `stages` steps ahead:

      prologue: issue steps 0 .. stages-2, one group each
      for kv:   async_wait(stages-2); barrier      -> step kv's group has landed, and every
                                                      thread is done with step kv-1's slot
                issue step kv+stages-1 into that slot; commit
                compute step kv from slot kv % stages
      async_wait(0)                                -> nothing in flight when the group exits

- A warp reads its lanes' weight vectors back (one 128-bit load per N tile: conflict-free,
  consecutive lanes read consecutive 16 bytes), decodes each A fragment once per K tile and
  multiplies it with all of its msub B fragments. B fragments come from the activation tile as
  each lane's contiguous run (the layout's K shuffle: 128-bit loads) or, without the shuffle
  (2:4), as (row, adjacent K) pairs. Activation rows are padded by 16 bytes so the 8 rows one
  load instruction touches fall in different banks.
- Scales (and zero points) stay in registers, loaded from device memory one step ahead.
- The accumulators go straight to Y: each lane stores its own elements (`frag_elems`, the
  target's C lane table says where they are), rounded once.

Rows and K beyond the matrix: activation copies zero-fill them (predicated copies); weight
and metadata copies of N tiles past the end read the last tile instead (valid codes and valid
2:4 metadata; those rows are never stored).
"""
from __future__ import annotations

from ..errors import CompileError
from ..formats import NMSparsity
from ..ir import U32, ConstTable, GridDim, Kernel, ScalarParam, SharedArray, Value, VectorType, verify
from ..schedule import Multistage
from .decode import encoding_tables
from .stream import StreamLowering, lane_base_and_offsets
from .stream_layout import LAYOUT_NAME, VECTOR_WORDS

class MultistageLowering(StreamLowering):
    def __init__(self, gemm, target) -> None:
        super().__init__(gemm, target)
        p = self.pipeline
        assert isinstance(p, Multistage)
        s = self.s
        self.n_stages = p.stages
        mm, mn, _ = target.mma
        self.nsub = s.tile_n // s.warps_n // mm
        self.msub = s.tile_m // s.warps_m // mn
        self.block_tiles = s.tile_n // mm  # A tiles of the threadgroup
        elem_bytes = self.act.bits // 8
        self.x_ld = self.layout.dense_chunk + target.shared_row_pad_bytes // elem_bytes  # activation row pitch
        self.x_stage = s.tile_m * self.x_ld
        lanes = self.layout.lanes
        self.w_stage = self.block_tiles * lanes * VECTOR_WORDS
        self.m_stage = self.block_tiles * lanes * self.layout.meta_words
        # activations are copied in pieces of x_copy elements: 16 bytes where the format's K
        # granule allows (so a piece never straddles the end of K), else the largest power of
        # two dividing it (K is always even here: see runtime.physical_arrays)
        granule = self.fmt.k_granule & -self.fmt.k_granule
        self.x_copy = min(target.async_copy_bytes // elem_bytes, granule)
        if self.x_copy * elem_bytes < 4:
            raise CompileError(f"multistage: format {self.fmt.name!r} has K granule {self.fmt.k_granule}; "
                               "activation copies need K to be a multiple of 2")
        if self.x_perm:  # shared-memory runs are zero-filled past K: read them 16 bytes at a time
            self.x_vec = min(target.async_copy_bytes // elem_bytes, self.layout.x_run)
        c_rows, c_cols = target.lane_elements("c", mm, mn)  # type: ignore[misc]
        self.c_row_base, self.c_row_off = lane_base_and_offsets(c_rows, "C row")
        self.c_col_base, self.c_col_off = lane_base_and_offsets(c_cols, "C column")

    def lower(self) -> Kernel:
        b, s, t = self.b, self.s, self.target
        lay = self.layout
        mm, mn, _ = t.mma
        self.lane, self.warp, self.tid = b.index("lane"), b.index("warp"), b.index("tid")
        self.M, self.N, self.K = b.scalar("M"), b.scalar("N"), b.scalar("K")
        wn = self.op2("rem", self.warp, s.warps_n, hint="wn")
        wm = self.op2("div", self.warp, s.warps_n, hint="wm")
        self.a_row0 = b.value("table", [self.lane], U32, {"name": "a_row0"}, hint="ar")
        self.b_k0 = b.value("table", [self.lane], U32, {"name": "b_k0"}, hint="bk")
        self.b_n0 = b.value("table", [self.lane], U32, {"name": "b_n0"}, hint="bn")
        if self.x_perm:
            self.x_run0 = b.value("table", [self.lane], U32, {"name": "x_run0"}, hint="xr")
        gx, gy = b.index("group_x"), b.index("group_y")
        self.m0 = self.op2("mul", gy, s.tile_m, hint="m0")
        self.block_nt0 = self.op2("mul", gx, self.block_tiles, hint="nt")
        self.warp_tile0 = self.op2("mul", wn, self.nsub, hint="wt")  # the warp's first tile in the block
        nt0 = self.op2("add", self.block_nt0, self.warp_tile0, hint="nt")
        self.n_tiles = [self.op2("add", nt0, j, hint="nt") if j else nt0 for j in range(self.nsub)]
        self.NT = self.ceil_div(self.N, mm)
        self.last_tile = self.op2("sub", self.NT, 1, hint="lt")
        sp = self.fmt.sparsity
        stored_k = self.op2("mul", self.op2("div", self.K, sp.m, hint="sk"), sp.n, hint="sk") \
            if isinstance(sp, NMSparsity) else self.K
        self.KV = self.ceil_div(stored_k, lay.chunk)
        self.tile_ok = [self.op2("lt", nt, self.NT, hint="ntok") for nt in self.n_tiles]
        # this warp's first activation row within the block's tile
        self.warp_m0 = self.op2("mul", wm, self.msub * mn, hint="wm0")

        g = self.fmt.scale.group_size
        self.prefetch_params = g == "K" or int(g) % lay.dense_chunk == 0
        stages = self.n_stages
        for step in range(stages - 1):  # prologue: the first stages-1 steps in flight
            self.issue(self.c(step))
        first = self.fetch_params(self.c(0)) if self.prefetch_params else []
        accs = [b.value("frag_zero", [], self.frag_c, hint="acc") for _ in range(self.nsub * self.msub)]
        iv = b.fresh("kv", U32)
        carried_params = [b.fresh("pf", v.type) for v in first]
        carried_accs = [b.fresh("acc", self.frag_c) for _ in accs]
        loop = b.op("for", [self.c(0), self.KV, self.c(1), *first, *accs],
                    [v.type for v in first] + [self.frag_c] * len(accs), hint="fin")
        with b.region([iv, *carried_params, *carried_accs]) as body:
            loop.regions.append(body)
            b.op("async_wait", attrs={"pending": stages - 2})
            b.barrier()
            self.issue(self.op2("add", iv, stages - 1, hint="nx"))
            nxt = self.fetch_params(self.op2("add", iv, 1, hint="nx")) if self.prefetch_params else []
            slot = self.op2("rem", iv, stages, hint="slot")
            new_accs = self.compute(iv, slot, carried_params, carried_accs)
            b.yield_(*nxt, *new_accs)
        # Drain: the last stages-1 groups (past the end of K, never read) must land before
        # the threadgroup exits and its shared memory is handed to another.
        b.op("async_wait", attrs={"pending": 0})
        self.store_y(loop.results[len(first):])

        tables = encoding_tables(self.fmt, "") + [
            ConstTable("a_row0", U32, self.a_row_base), ConstTable("b_k0", U32, self.b_k_base),
            ConstTable("b_n0", U32, self.b_n_base), ConstTable("c_row0", U32, self.c_row_base),
            ConstTable("c_col0", U32, self.c_col_base)]
        if self.x_perm:
            tables.append(ConstTable("x_run0", U32, self.layout.x_run_start))
        shared = [SharedArray("x_s", self.act, stages * self.x_stage),
                  SharedArray("w_s", U32, stages * self.w_stage)]
        if self.sparse:
            shared.append(SharedArray("meta_s", U32, stages * self.m_stage))
        kernel = Kernel(
            name=self.gemm.name, threads=self.threads,
            grid=(GridDim("N", s.tile_n), GridDim("M", s.tile_m), GridDim(None)), body=b.blocks[0],
            warp_size=t.warp_size, buffers=self.buffers(), scalars=[ScalarParam(n) for n in "MNK"],
            shared=shared, tables=tables,
            attrs={"target": t.name, "format": self.fmt.name, "schedule": s.name,
                   "pipeline": self.pipeline.kind, "activation": self.act.name,
                   "tile": (s.tile_m, s.tile_n, s.tile_k), "warps": (s.warps_m, s.warps_n),
                   "mma": tuple(t.mma), "stages": stages, "weight_layout": LAYOUT_NAME},
        )
        if kernel.shared_bytes > t.max_shared_bytes:
            raise CompileError(
                f"gemm {self.gemm.name!r}: schedule {s.name!r} needs {kernel.shared_bytes} bytes of "
                f"shared memory (stages x (tile_m activation rows + tile_n weight rows)), over "
                f"{t.name}'s limit of {t.max_shared_bytes}", s.location)
        verify(kernel)
        return kernel

    # ----- copies ------------------------------------------------------------------------

    def issue(self, kv: Value) -> None:
        """Start the copies of step kv into slot kv % stages, as one group (steps past the
        end of K copy nothing useful: their group is zero-filled and never read)."""
        slot = self.op2("rem", kv, self.n_stages, hint="slot")
        in_k = self.op2("lt", kv, self.KV, hint="kok")
        self.copy_x(kv, slot)
        self.copy_lanes(kv, slot, in_k, "qweight", "w_s", VECTOR_WORDS, self.w_stage)
        if self.sparse:
            self.copy_lanes(kv, slot, in_k, "meta", "meta_s", self.layout.meta_words, self.m_stage)
        self.b.op("async_commit")

    def per_thread(self, total: int, body) -> None:
        """body(e, inside) for e = i * threads + tid over [0, total), unrolled (inside is None
        where every thread's e is in range)."""
        for i in range(-(-total // self.threads)):
            e = self.op2("add", self.tid, i * self.threads, hint="e") if i else self.tid
            inside = None if (i + 1) * self.threads <= total else self.op2("lt", e, total, hint="ein")
            body(e, inside)

    def copy_x(self, kv: Value, slot: Value) -> None:
        """The step's activation tile: tile_m rows x tile_k K, in pieces of x_copy elements."""
        s = self.s
        chunk = self.layout.dense_chunk
        per_row = chunk // self.x_copy
        k_step0 = self.op2("mul", kv, chunk, hint="kx")
        base = self.op2("mul", slot, self.x_stage, hint="xs")

        def piece(e: Value, inside: Value | None) -> None:
            r, c = self.op2("div", e, per_row, hint="r"), self.op2("rem", e, per_row, hint="c")
            kc = self.op2("mul", c, self.x_copy, hint="kc")
            m = self.op2("add", self.m0, r, hint="m")
            k = self.op2("add", k_step0, kc, hint="k")
            ok = self.op2("and", self.op2("lt", m, self.M, hint="mok"), self.op2("lt", k, self.K, hint="kok"), hint="xok")
            src = self.op2("add", self.op2("mul", m, self.K, hint="xi"), k, hint="xi")
            dst = self.op2("add", base, self.op2("add", self.op2("mul", r, self.x_ld, hint="xd"), kc, hint="xd"), hint="xd")
            self.async_copy(dst, src, ok, "x_s", "x", self.x_copy, inside)

        self.per_thread(s.tile_m * per_row, piece)

    def copy_lanes(self, kv: Value, slot: Value, in_k: Value, src: str, dst: str, words: int,
                   stage: int) -> None:
        """The step's per-lane vectors of `src` ([n_tile][k_vector][lane][words]) for the
        block's N tiles; tiles past N read the last tile (valid contents, never stored)."""
        lanes = self.layout.lanes
        base = self.op2("mul", slot, stage, hint="ws")

        def piece(e: Value, inside: Value | None) -> None:
            t, lane = self.op2("div", e, lanes, hint="t"), self.op2("rem", e, lanes, hint="l")
            nt = self.b.binary("min", self.op2("add", self.block_nt0, t, hint="nt"), self.last_tile, hint="nt")
            slot_i = self.op2("add", self.op2("mul", nt, self.KV, hint="wi"), kv, hint="wi")
            src_i = self.op2("mul", self.op2("add", self.op2("mul", slot_i, lanes, hint="wi"), lane, hint="wi"), words, hint="wi")
            dst_i = self.op2("add", base, self.op2("mul", e, words, hint="wd"), hint="wd")
            self.async_copy(dst_i, src_i, in_k, dst, src, words, inside)

        self.per_thread(self.block_tiles * lanes, piece)

    def async_copy(self, dst: Value, src: Value, pred: Value, shared: str, buffer: str, size: int,
                   inside: Value | None) -> None:
        b = self.b
        if inside is None:
            b.op("async_copy", [dst, src, pred], attrs={"dst": shared, "src": buffer, "size": size})
            return
        # threads past the end issue nothing (an if, so no copy is started for them)
        op = b.op("if", [inside], [])
        with b.region() as then:
            op.regions.append(then)
            b.op("async_copy", [dst, src, pred], attrs={"dst": shared, "src": buffer, "size": size})
            b.yield_()
        with b.region() as other:
            op.regions.append(other)
            b.yield_()

    # ----- compute -------------------------------------------------------------------------

    def compute(self, kv: Value, slot: Value, flat_params: list[Value], accs: list[Value]) -> list[Value]:
        b, lay = self.b, self.layout
        lanes = lay.lanes
        mk = self.tile_k_dense
        params = self.unpack_params(flat_params) if self.prefetch_params else None
        k_vec0 = self.op2("mul", kv, lay.dense_chunk, hint="kb")
        w_base = self.op2("add", self.op2("mul", slot, self.w_stage, hint="wb"),
                          self.op2("mul", self.op2("add", self.op2("mul", self.warp_tile0, lanes, hint="wb"),
                                                   self.lane, hint="wb"), VECTOR_WORDS, hint="wb"), hint="wb")
        words = []
        for j in range(self.nsub):
            idx = self.op2("add", w_base, j * lanes * VECTOR_WORDS, hint="wb") if j else w_base
            words.append(b.value("vload", [idx], VectorType(U32, VECTOR_WORDS), {"buffer": "w_s", "size": VECTOR_WORDS}, hint="qw"))
        meta = [self.meta_words(slot, j) for j in range(self.nsub)] if self.sparse else []
        x_base = self.op2("mul", slot, self.x_stage, hint="xb")
        rows = [self.op2("add", x_base, self.op2("mul", self.op2("add", self.op2("add", self.warp_m0, mt * self.target.mma_n, hint="xr"),
                                                                  self.b_n0, hint="xr"), self.x_ld, hint="xr"), hint="xr")
                for mt in range(self.msub)]
        # Each lane's run vectors are loaded when a K tile first needs them (not all up front:
        # that would hold msub x run registers through the step).
        runs = [_LazyRun(self, row) for row in rows] if self.x_perm else None
        new = list(accs)
        for s_ in range(lay.tiles):
            if runs is not None:
                b_frags = [self.b_fragment_from_run(run, s_) for run in runs]  # type: ignore[arg-type]
            else:
                b_frags = [self.shared_b_fragment(row, s_ * mk) for row in rows]
            for j in range(self.nsub):
                if params is not None:
                    rp = params[j]
                else:
                    k_tile0 = self.op2("add", k_vec0, s_ * mk, hint="kt") if s_ else k_vec0
                    rp = self.row_params(j, k_tile0)
                a = self.a_fragment(words[j], s_, rp)
                if self.sparse:
                    m_word = meta[j] if lay.meta_words == 1 else \
                        b.value("extract", [meta[j]], U32, {"index": s_ // 2}, hint="mw")
                for mt in range(self.msub):
                    i = j * self.msub + mt
                    if self.sparse:
                        new[i] = b.value("mma_sp", [a, b_frags[mt], new[i], m_word], self.frag_c,
                                         {"selector": s_ % 2}, hint="acc")
                    else:
                        new[i] = b.value("mma", [a, b_frags[mt], new[i]], self.frag_c, hint="acc")
        return new

    def meta_words(self, slot: Value, j: int) -> Value:
        lanes, size = self.layout.lanes, self.layout.meta_words
        tile = self.op2("add", self.warp_tile0, j, hint="mi") if j else self.warp_tile0
        idx = self.op2("add", self.op2("mul", slot, self.m_stage, hint="mi"),
                       self.op2("mul", self.op2("add", self.op2("mul", tile, lanes, hint="mi"), self.lane, hint="mi"),
                                size, hint="mi"), hint="mi")
        if size == 1:
            return self.b.load("meta_s", idx, U32, hint="meta")
        return self.b.value("vload", [idx], VectorType(U32, size), {"buffer": "meta_s", "size": size}, hint="meta")

    def shared_run_vector(self, start: Value, i: int) -> Value:
        """Vector i of this lane's activation run from shared memory (start = the run's index)."""
        idx = self.op2("add", start, i * self.x_vec, hint="xi") if i else start
        return self.b.value("vload", [idx], VectorType(self.act, self.x_vec),
                            {"buffer": "x_s", "size": self.x_vec}, hint="xv")

    def shared_b_fragment(self, row: Value, k_tile0: int) -> Value:
        """A B fragment from shared memory as (row, adjacent K) pairs (no K shuffle)."""
        lane_k = self.op2("add", self.op2("add", row, k_tile0, hint="k") if k_tile0 else row, self.b_k0, hint="k")
        pairs = []
        for i in range(0, len(self.b_k_off), 2):
            k = self.op2("add", lane_k, self.b_k_off[i], hint="k") if self.b_k_off[i] else lane_k
            pairs.append(self.b.value("vload", [k], VectorType(self.act, 2), {"buffer": "x_s", "size": 2}, hint="xp"))
        return self.b.value("frag_build", pairs, self.frag_b_stream, hint="fb")

    # ----- epilogue ------------------------------------------------------------------------

    def store_y(self, accs: list[Value]) -> None:
        """Each lane stores its own accumulator elements: C row = N, C column = M."""
        b = self.b
        mm, mn, _ = self.target.mma
        c_row0 = b.value("table", [self.lane], U32, {"name": "c_row0"}, hint="cr")
        c_col0 = b.value("table", [self.lane], U32, {"name": "c_col0"}, hint="cc")
        per = len(self.c_row_off)
        for j in range(self.nsub):
            n_lane = self.op2("add", self.op2("mul", self.n_tiles[j], mm, hint="yn"), c_row0, hint="yn")
            for mt in range(self.msub):
                m_lane = self.op2("add", self.op2("add", self.m0, self.op2("add", self.warp_m0, mt * mn, hint="ym"), hint="ym"),
                                  c_col0, hint="ym")
                elems = b.value("frag_elems", [accs[j * self.msub + mt]], VectorType(self.frag_c.elem, per), hint="ce")
                for e in range(per):
                    n = self.op2("add", n_lane, self.c_row_off[e], hint="yn") if self.c_row_off[e] else n_lane
                    m = self.op2("add", m_lane, self.c_col_off[e], hint="ym") if self.c_col_off[e] else m_lane
                    ok = self.op2("and", self.op2("lt", m, self.M, hint="p"), self.op2("lt", n, self.N, hint="p"), hint="p")
                    v = b.value("extract", [elems], self.frag_c.elem, {"index": e}, hint="yv")
                    b.store("y", self.op2("add", self.op2("mul", m, self.N, hint="yi"), n, hint="yi"),
                            b.cast(v, self.act, hint="yv"), ok)


class _LazyRun:
    """A lane's activation run for one M tile, indexed like a list of vectors, each vector
    loaded from shared memory at its first use."""

    def __init__(self, lowering: MultistageLowering, row: Value) -> None:
        self.lowering = lowering
        self.start = lowering.op2("add", row, lowering.x_run0, hint="xi")
        self.vectors: dict[int, Value] = {}

    def __getitem__(self, i: int) -> Value:
        if i not in self.vectors:
            self.vectors[i] = self.lowering.shared_run_vector(self.start, i)
        return self.vectors[i]


__all__ = ["MultistageLowering"]
