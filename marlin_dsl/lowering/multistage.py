"""Lowering of the multistage pipeline (`Multistage`, marlin_dsl/pipelines/multistage.py) to
kernel IR: large M. Assembled from parts: the stream setup and MMAs (`parts/stream_family.py`),
the asynchronous stages (`parts/async_stages.py`), the per-lane store (`parts/epilogues.py`).

The product and the physical weight layout are the weight-stream kernel's (`stream.py`,
`layouts/weight_stream.py`): Y^T[N, M] = W^T[N, K] X^T[K, M], weights as the MMA's A operand, each
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
from ..ir import U32, ConstTable, Kernel, SharedArray, Value, VectorType
from .parts.async_stages import AsyncStages, LazyRun
from .parts.context import GemmContext
from .parts.epilogues import LaneStore
from .parts.shell import gemm_buffers, gemm_kernel
from .parts.stream_family import StreamFamily, lane_base_and_offsets
from ..layouts.weight_stream import LAYOUT_NAME, VECTOR_WORDS

class MultistageLowering(StreamFamily, AsyncStages, LaneStore):
    def __init__(self, ctx: GemmContext) -> None:
        super().__init__(ctx)
        self.init_stream()
        p, s, target = self.pipeline, self.s, self.target
        self.n_stages = p.stages
        mm, mn, _ = target.mma
        self.block_tiles = s.tile_n // mm  # A tiles of the threadgroup
        elem_bytes = self.act.bits // 8
        self.x_ld = self.layout.dense_chunk + target.shared_row_pad_bytes // elem_bytes  # activation row pitch
        self.x_stage = s.tile_m * self.x_ld
        lanes = self.layout.lanes
        self.w_stage = self.block_tiles * lanes * VECTOR_WORDS
        self.m_stage = self.block_tiles * lanes * self.layout.meta_words
        # activations are copied in pieces of x_copy elements: 16 bytes where the format's K
        # granule allows (so a piece never straddles the end of K), else the largest power of
        # two dividing it (K is always even here: see kernel_args.physical_arrays)
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
        b, s = self.b, self.s
        mn = self.target.mma_n
        _, wm = self.stream_setup(("lane", "warp", "tid"), "wm", "wt", clamp=True)
        # this warp's first activation row within the block's tile
        self.warp_m0 = self.op2("mul", wm, self.msub * mn, hint="wm0")
        stages = self.n_stages
        for step in range(stages - 1):  # prologue: the first stages-1 steps in flight
            self.issue(self.c(step))
        first = self.fetch_params(self.c(0)) if self.prefetch_params else []
        accs = self.ctx.zero_accumulators(self.nsub * self.msub)

        def body(iv: Value, groups: list[list[Value]]) -> list[Value]:
            carried_params, carried_accs = groups
            b.op("async_wait", attrs={"pending": stages - 2})
            b.barrier()
            self.issue(self.op2("add", iv, stages - 1, hint="nx"))
            nxt = self.fetch_params(self.op2("add", iv, 1, hint="nx")) if self.prefetch_params else []
            slot = self.op2("rem", iv, stages, hint="slot")
            return [*nxt, *self.compute(iv, slot, carried_params, carried_accs)]

        results = self.carried_for(0, self.KV, 1, [("pf", first), ("acc", accs)], body, iv_hint="kv", hint="fin")
        # Drain: the last stages-1 groups (past the end of K, never read) must land before
        # the threadgroup exits and its shared memory is handed to another.
        b.op("async_wait", attrs={"pending": 0})
        self.store_y(results[len(first):])

        shared = [SharedArray("x_s", self.act, stages * self.x_stage),
                  SharedArray("w_s", U32, stages * self.w_stage)]
        if self.sparse:
            shared.append(SharedArray("meta_s", U32, stages * self.m_stage))
        return gemm_kernel(
            self.ctx, buffers=gemm_buffers(self.ctx), shared=shared,
            tables=self.stream_tables([ConstTable("c_row0", U32, self.c_row_base),
                                       ConstTable("c_col0", U32, self.c_col_base)]),
            attrs={"stages": stages, "weight_layout": LAYOUT_NAME},
            memory="shared memory (stages x (tile_m activation rows + tile_n weight rows))")

    def compute(self, kv: Value, slot: Value, flat_params: list[Value], accs: list[Value]) -> list[Value]:
        """One K step from stage `slot`: the warp's weight vectors and metadata, B fragments
        from the activation tile, decode and MMAs."""
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
        runs = [LazyRun(self, row) for row in rows] if self.x_perm else None

        def b_frags_for(s_: int) -> list[Value]:
            if runs is not None:
                return [self.b_fragment_from_run(run, s_) for run in runs]  # type: ignore[arg-type]
            return [self.shared_b_fragment(row, s_ * mk) for row in rows]

        def params_for(j: int, s_: int) -> dict:
            if params is not None:
                return params[j]
            return self.row_params(j, self.op2("add", k_vec0, s_ * mk, hint="kt") if s_ else k_vec0)

        return self.mma_k_tiles(accs, words, meta, b_frags_for, params_for)


__all__ = ["MultistageLowering"]
