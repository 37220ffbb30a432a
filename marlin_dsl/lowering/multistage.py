"""Lowering of the multistage pipeline (`Multistage`, marlin_dsl/pipelines/multistage.py) to
kernel IR: large M. Assembled from parts: the stream setup and MMAs (`parts/stream_family.py`),
an operand source chosen by target data (`Target.async_copy_bytes`): the asynchronous stages
(`parts/async_stages.py`, CUDA) or threadgroup buffers fed through registers
(`parts/register_stages.py`, Metal), the reads back from a stage (`parts/stage_buffers.py`) and
the per-lane store (`parts/epilogues.py`).

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

- Without asynchronous copies (Metal), `stages` - 1 threadgroup buffers are fed through
  registers, as MLX's steel GEMM loaders do (`lower_registers`):

      prologue: load step 0; store it into buffer 0; barrier
      for kv:   load step min(kv+1, KV-1) into registers   -> in flight during the MMAs
                compute step kv from buffer kv % buffers
                [one buffer: barrier]                      -> every warp done reading it
                store the registers into buffer (kv+1) % buffers; barrier

  With two buffers one barrier a step suffices: the buffer stored at step kv was last read at
  step kv-1, and every thread passed step kv-1's closing barrier after its reads.
- A warp reads its lanes' weight vectors back (one 128-bit load per N tile: conflict-free,
  consecutive lanes read consecutive 16 bytes), decodes each A fragment once per K tile and
  multiplies it with all of its msub B fragments. B fragments come from the activation tile as
  each lane's contiguous run (the layout's K shuffle: 128-bit loads) or, without the shuffle
  (2:4, groups smaller than a step), as (row, adjacent K) pairs, or where B pairs run along M
  (Metal) as tiles the warp loads (`frag_load`, transposed). Activation rows are padded
  (`Target.shared_row_pad_bytes`: 16 bytes) so the 8 rows one load instruction touches fall
  in different banks.
- Scales (and zero points) stay in registers, loaded from device memory one step ahead.
- The accumulators go straight to Y: each lane stores its own elements (`frag_elems`, the
  target's C lane table says where they are), rounded once.

Rows and K beyond the matrix: asynchronous activation copies zero-fill them (predicated
copies), register-staged ones read row M - 1 instead and zero-fill only K past K; weight and
metadata copies of N tiles past the end read the last tile instead (valid codes and valid 2:4
metadata; those rows and columns are never stored).
"""
from __future__ import annotations

from ..errors import CompileError
from ..ir import U32, ConstTable, Kernel, SharedArray, Value, VectorType
from .group_params import GroupValues
from .parts.async_stages import AsyncStages
from .parts.context import GemmContext
from .parts.epilogues import LaneStore
from .parts.register_stages import RegisterStages
from .parts.shell import gemm_buffers, gemm_kernel
from .parts.stream_family import StreamFamily, lane_base_and_offsets
from ..layouts.weight_stream import VECTOR_WORDS, layout_name

class MultistageLowering(StreamFamily, AsyncStages, RegisterStages, LaneStore):
    def __init__(self, ctx: GemmContext) -> None:
        super().__init__(ctx)
        self.init_stream()
        p, s, target = self.pipeline, self.s, self.target
        self.n_stages = p.stages
        #: the operand source, by target data: asynchronous copies into `stages` buffers, or
        #: (none: Metal) loads into registers stored into `stages` - 1 buffers
        self.async_copies = bool(target.async_copy_bytes)
        self.n_buffers = p.stages if self.async_copies else p.stages - 1
        mm, mn, _ = target.mma
        self.block_tiles = s.tile_n // mm  # A tiles of the threadgroup
        #: K vectors (one 128-bit load per lane and N tile) per step: several only inside one
        #: scale group (`check_stream`), so a step's group parameters are loaded once
        self.vectors = s.tile_k // self.layout.dense_chunk
        elem_bytes = self.act.bits // 8
        self.x_ld = s.tile_k + target.shared_row_pad_bytes // elem_bytes  # activation row pitch
        self.x_stage = s.tile_m * self.x_ld
        lanes = self.layout.lanes
        # a stage's per-lane arrays: [N tile][vector][lane][words]
        self.w_stage = self.block_tiles * self.vectors * lanes * VECTOR_WORDS
        self.m_stage = self.block_tiles * self.vectors * lanes * self.layout.meta_words
        # activations are copied in pieces of x_copy elements: 16 bytes where the format's K
        # granule allows (so a piece never straddles the end of K), else the largest power of
        # two dividing it (K is always even here: see kernel_args.physical_arrays); through
        # registers, at most the target's widest vector
        granule = self.fmt.k_granule & -self.fmt.k_granule
        widest = target.async_copy_bytes // elem_bytes if self.async_copies else \
            self.vector_cap(VECTOR_WORDS * 4 // elem_bytes)
        self.x_copy = min(widest, granule)
        if self.x_copy * elem_bytes < 4:
            raise CompileError(f"multistage: format {self.fmt.name!r} has K granule {self.fmt.k_granule}; "
                               "activation copies need K to be a multiple of 2")
        if self.x_perm:  # shared-memory runs are zero-filled past K: read them 16 bytes at a time
            self.x_vec = min(widest, self.layout.x_run)
        c_rows, c_cols = target.lane_elements("c", mm, mn)  # type: ignore[misc]
        self.c_row_base, self.c_row_off = lane_base_and_offsets(c_rows, "C row")
        self.c_col_base, self.c_col_off = lane_base_and_offsets(c_cols, "C column")
        #: K tiles of a step that share one scale group's parameters where they are loaded per
        #: tile (groups smaller than a step). Register staging only: the asynchronous kernels
        #: keep the text they were measured with on the H100 (one load per tile).
        g, tile = self.fmt.scale.group_size, self.tile_k_dense
        self.group_tiles = 1 if self.async_copies or g == "K" or int(g) % tile or \
            self.layout.dense_chunk % int(g) else int(g) // tile

    def lower(self) -> Kernel:
        return self.lower_async() if self.async_copies else self.lower_registers()

    def lower_async(self) -> Kernel:
        b = self.b
        mn = self.target.mma_n
        _, wm = self.stream_setup(("lane", "warp", "tid"), "wm", "wt", clamp=True)
        # this warp's first activation row within the block's tile
        self.warp_m0 = self.op2("mul", wm, self.msub * mn, hint="wm0")
        self.setup_steps()
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
            nxt = self.fetch_params(self.step_vector(self.op2("add", iv, 1, hint="nx"))) if self.prefetch_params else []
            slot = self.op2("rem", iv, stages, hint="slot")
            return [*nxt, *self.compute(iv, slot, carried_params, carried_accs)]

        results = self.carried_for(0, self.KS, 1, [("pf", first), ("acc", accs)], body, iv_hint="kv", hint="fin")
        # Drain: the last stages-1 groups (past the end of K, never read) must land before
        # the threadgroup exits and its shared memory is handed to another.
        b.op("async_wait", attrs={"pending": 0})
        return self.finish(results[len(first):], "shared memory (stages x (tile_m activation rows + tile_n weight rows))")

    def lower_registers(self) -> Kernel:
        """The register-staged loop (module docstring): no asynchronous copies."""
        b = self.b
        mn = self.target.mma_n
        _, wm = self.stream_setup(("lane", "warp", "tid"), "wm", "wt", clamp=True)
        self.warp_m0 = self.op2("mul", wm, self.msub * mn, hint="wm0")
        self.setup_steps()
        self.last_m = self.op2("sub", self.M, 1, hint="lm")
        last_step = self.op2("sub", self.KS, 1, hint="lk")
        # where K is whole steps every step's scales exist: load them clamped (no predicates)
        self.clamped = self.k_whole
        if self.clamped:
            self.last_n = self.op2("sub", self.N, 1, hint="ln")
        double = self.n_buffers == 2
        self.store_step(self.load_step(self.c(0)), self.c(0) if double else None)
        b.barrier()
        first = self.fetch_params(self.c(0)) if self.prefetch_params else []
        accs = self.ctx.zero_accumulators(self.nsub * self.msub)

        def body(iv: Value, groups: list[list[Value]]) -> list[Value]:
            carried_params, carried_accs = groups
            nx = self.op2("min", self.op2("add", iv, 1, hint="nx"), last_step, hint="nx")
            loaded = self.load_step(nx)  # in flight while this step's MMAs run
            nxt = []
            if self.prefetch_params:
                nxt = self.fetch_params(self.step_vector(nx if self.clamped else self.op2("add", iv, 1, hint="nx")))
            slot = self.op2("and", iv, 1, hint="slot") if double else None
            new_accs = self.compute(iv, slot, carried_params, carried_accs)
            if not double:
                b.barrier()  # every warp is done reading the only buffer
            self.store_step(loaded, self.op2("xor", slot, 1, hint="slot") if double else None)
            b.barrier()  # the next step's buffer is complete
            return [*nxt, *new_accs]

        results = self.carried_for(0, self.KS, 1, [("pf", first), ("acc", accs)], body, iv_hint="kv", hint="fin")
        return self.finish(results[len(first):], "threadgroup memory ((stages - 1) x (tile_m activation rows + "
                                                 "tile_n weight rows))")

    def finish(self, accs: list[Value], memory: str) -> Kernel:
        """Y from the accumulators, and the kernel with its buffers."""
        self.store_y(accs)
        buffers = self.n_buffers
        shared = [SharedArray("x_s", self.act, buffers * self.x_stage),
                  SharedArray("w_s", U32, buffers * self.w_stage)]
        if self.sparse:
            shared.append(SharedArray("meta_s", U32, buffers * self.m_stage))
        return gemm_kernel(
            self.ctx, buffers=gemm_buffers(self.ctx), shared=shared,
            tables=self.stream_tables([ConstTable("c_row0", U32, self.c_row_base),
                                       ConstTable("c_col0", U32, self.c_col_base)]),
            attrs={"stages": self.n_stages, "weight_layout": layout_name(self.target)}, memory=memory)

    def compute(self, ks: Value, slot: Value | None, flat_params: list[Value], accs: list[Value]) -> list[Value]:
        """One K step from stage `slot` (None: the only buffer): the warp's weight vectors and
        metadata, B fragments from the activation tile, decode and MMAs (the step's vectors
        after the first add into the same scaled sums: one scale group)."""
        b, lay = self.b, self.layout
        lanes, vectors = lay.lanes, self.vectors
        mk = self.tile_k_dense
        params = self.unpack_params(flat_params) if self.prefetch_params else None
        k_vec0 = self.op2("mul", ks, self.s.tile_k, hint="kb")
        slot_w = None if slot is None else self.op2("mul", slot, self.w_stage, hint="wb")
        lane_w = self.op2("mul", self.op2("add", self.op2("mul", self.warp_tile0, vectors * lanes, hint="wb"),
                                          self.lane, hint="wb"), VECTOR_WORDS, hint="wb")
        w_base = lane_w if slot_w is None else self.op2("add", slot_w, lane_w, hint="wb")
        words: list[list[Value]] = [[] for _ in range(vectors)]
        for j in range(self.nsub):
            for v in range(vectors):
                off = (j * vectors + v) * lanes * VECTOR_WORDS
                idx = self.op2("add", w_base, off, hint="wb") if off else w_base
                words[v].append(b.value("vload", [idx], VectorType(U32, VECTOR_WORDS),
                                        {"buffer": "w_s", "size": VECTOR_WORDS}, hint="qw"))
        meta = [[self.meta_words(slot, j, v) for j in range(self.nsub)] if self.sparse else []
                for v in range(vectors)]
        x_base = None if slot is None else self.op2("mul", slot, self.x_stage, hint="xb")
        #: B fragments as tiles the warp loads (no K shuffle, B pairs along M: Metal)
        tiles = not self.x_perm and not self.b_pairs_k
        rows = []
        for mt in range(self.msub):
            m_row = self.op2("add", self.warp_m0, mt * self.target.mma_n, hint="xr")
            row = self.op2("mul", m_row if tiles else self.op2("add", m_row, self.b_n0, hint="xr"), self.x_ld, hint="xr")
            rows.append(row if x_base is None else self.op2("add", x_base, row, hint="xr"))

        def b_frags(v: int):
            """b_frags_for(tile) of the step's vector v (K offset v * chunk in the stage)."""
            k0 = v * lay.dense_chunk
            # Each lane's run vectors are loaded when a K tile first needs them (not all up
            # front: that would hold msub x run registers through the step).
            runs = [self.lane_runs(self.op2("add", row, k0, hint="xr") if k0 else row) for row in rows] \
                if self.x_perm else None

            def b_frags_for(s_: int) -> list[Value]:
                if runs is not None:
                    return [self.b_fragment_from_run(run, s_) for run in runs]  # type: ignore[arg-type]
                if tiles:
                    return [self.shared_b_tile(row, k0 + s_ * mk) for row in rows]
                return [self.shared_b_fragment(row, k0 + s_ * mk) for row in rows]
            return b_frags_for

        loaded: dict[tuple[int, int], dict[int, GroupValues]] = {}

        def params_for(j: int, s_: int) -> dict[int, GroupValues]:
            if params is not None:  # several vectors a step: always (one scale group)
                return params[j]
            first = s_ - s_ % self.group_tiles  # the tiles of one scale group share its parameters
            if (j, first) not in loaded:
                loaded[j, first] = self.row_params(
                    j, self.op2("add", k_vec0, first * mk, hint="kt") if first else k_vec0)
            return loaded[j, first]

        more = [(words[v], meta[v], b_frags(v)) for v in range(1, vectors)]
        return self.mma_k_tiles(accs, words[0], meta[0], b_frags(0), params_for, more=more)


__all__ = ["MultistageLowering"]
