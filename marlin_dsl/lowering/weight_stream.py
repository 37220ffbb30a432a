"""Lowering of the weight-stream pipeline (`WeightStream`, marlin_dsl/pipelines/weight_stream.py)
to kernel IR, assembled from parts: the stream setup and MMAs (`parts/stream_family.py`),
global-to-register loads (`parts/registers.py`) or, with `stages`, weight words through a
shared ring filled by asynchronous copies (`parts/ring_fetch.py`), the k-warps reduction
(`parts/epilogues.py`).

Y^T[N, M] = W^T[N, K] X^T[K, M]: the MMA's A operand is a 16 x 16 tile of W^T (N rows,
stored-K columns), B a 16 x 8 tile of X^T (K rows, M columns), C a 16 x 8 tile of Y^T.

Threadgroup (group_x, group_y) owns N rows [n0, n0 + tile_n) and M columns
[m0, m0 + tile_m). Warp w = wk * warps_n + wn owns N tiles of its `wn` slice and K vectors
wk, wk + k_warps, ... (one vector = one 128-bit load per lane = `layout.tiles` K tiles of
A). Per step the warp:

1. issues the next step's weight loads (carried through the loop: register double buffering),
2. loads each lane's scales (and zero points) for its two fragment rows,
3. builds the B fragments of X^T from pairs of activations (`vload` of 2, masked by M and K;
   with `x_ahead` it loads the next step's instead and uses those carried from the step before),
4. decodes its A fragments pair by pair (`PairDecoder`) and runs the MMAs.

The K loop runs `unroll` steps per iteration (its counters, compare and branch paid once per
`unroll` steps), then the warp's remaining steps in a second loop. Where K is a whole number of
vectors its loads are unpredicated (`parts/registers.py`: clamped indices). Then every warp
stores its accumulators to shared memory and the threadgroup adds the k_warps partial tiles
and writes Y (rounded once; times the decode's rebias where the sums left it out). Which lane holds which element comes from the
target's lane tables (`Target.lane_elements`); the weights were laid out to match at pack time
(`layouts/weight_stream.py`).
"""
from __future__ import annotations

from typing import Callable

from ..ir import F32, BufferParam, Kernel, SharedArray, Value
from .parts.context import GemmContext
from .parts.epilogues import KWarpReduce
from .parts.ring_fetch import RingFetch
from .parts.shell import gemm_buffers, gemm_kernel
from .parts.stream_family import StreamFamily
from .parts.x_transpose import ActivationTranspose
from ..layouts.weight_stream import layout_name


class WeightStreamLowering(StreamFamily, RingFetch, ActivationTranspose, KWarpReduce):
    def __init__(self, ctx: GemmContext) -> None:
        super().__init__(ctx)
        self.init_stream()
        self.init_x_transpose(self.pipeline.x_shuffle)
        # Scales on the sums: per step 4 FMAs per accumulator tile instead of a multiply per
        # weight pair (16 per lane-step); with more than two M tiles per warp the FMAs cost more.
        self.scale_sums = self.sums_scalable() and self.msub <= 2
        self.rebias_at_end = self.scale_sums  # one multiply per output, not 2 per step
        g = self.fmt.scale.group_size
        if self.scale_sums and g != "K" and int(g) % self.layout.dense_chunk:
            self.sum_run = self.group_runs()  # groups shorter than a vector: scale each run

    def lower(self) -> Kernel:
        s, p = self.s, self.pipeline
        wn, wk = self.stream_setup(("lane", "warp"), "wk", "nt", clamp=False)
        self.setup_fetch(s.tile_k // self.layout.dense_chunk)  # vectors per step
        if self.x_plan is not None:
            self.setup_x_transpose()
        depth, unroll, kw = p.depth, p.unroll, p.k_warps  # steps in flight; steps per iteration
        first_step, end = self.step_range(wk, wn)  # this warp's steps: first_step, + kw, .. < end
        if p.stages:  # weight words through the shared ring, stages - 1 steps ahead
            self.setup_ring(p.stages)
            for d in range(p.stages - 1):
                self.issue_ring(first_step if d == 0 else self.op2("add", first_step, d * kw, hint="pk"))
        sets: list[list[Value]] = []
        for d in range(depth):  # each fetch may read what the one before it fetched (`previous`)
            sets.append(self.fetch(first_step if d == 0 else self.op2("add", first_step, d * kw, hint="pk"),
                                   previous=sets[-1] if sets else None))
        first = [v for fetched in sets for v in fetched]
        per_set = len(sets[0])
        # With x_ahead: the first step's B fragments, then each step loads the next one's.
        first_x = self.load_b_fragments(wk) if p.x_ahead else []
        accs = self.ctx.zero_accumulators(self.nsub * self.msub)

        def one_step(kv: Value, carried_fetch: list[Value], carried_x: list[Value], carried_accs: list[Value],
                     ahead_in_range: bool, next_in_range: bool) -> tuple[list[Value], list[Value], list[Value]]:
            ahead = self.op2("add", kv, depth * kw, hint="nx")
            prefetched = self.fetch(ahead, clamp=not ahead_in_range, previous=carried_fetch[-per_set:])
            next_x = self.load_b_fragments(self.op2("add", kv, kw, hint="nx"), clamp=not next_in_range) \
                if p.x_ahead else []
            words = []
            if p.stages:
                self.issue_ring(self.op2("add", kv, (p.stages - 1) * kw, hint="nx"))
                words = self.read_ring(kv)
            new_accs = self.step(kv, words + carried_fetch[:per_set], carried_accs, carried_x or None)
            return [*carried_fetch[per_set:], *prefetched], next_x, new_accs

        def body(steps: int) -> Callable[[Value, list[list[Value]]], list[Value]]:
            def emit(iv: Value, groups: list[list[Value]]) -> list[Value]:
                fetch, xs, accs_ = groups if p.x_ahead else (groups[0], [], groups[1])
                for u in range(steps):
                    kv = self.op2("add", iv, u * kw, hint="ku") if u else iv
                    # in the unrolled loop steps iv .. iv + (steps - 1) * k_warps exist
                    fetch, xs, accs_ = one_step(kv, fetch, xs, accs_, steps > 1 and u + depth < steps,
                                                steps > 1 and u + 1 < steps)
                return [*fetch, *xs, *accs_]
            return emit

        carried = [("pf", first), *([("xb", first_x)] if p.x_ahead else []), ("acc", accs)]
        if unroll > 1:
            # This warp's steps first_step, + k_warps, .. < end: `unroll` at a time, then the rest.
            steps = self.ceil_div(self.op2("sub", self.op2("max", end, first_step, hint="ns"), first_step, hint="ns"), kw)
            whole = self.op2("mul", self.op2("div", steps, unroll, hint="ns"), unroll * kw, hint="ns")
            split = self.op2("add", first_step, whole, hint="ke")
            results = self.carried_for(first_step, split, unroll * kw, carried, body(unroll), iv_hint="kv",
                                       hint="pre")
            nx = len(first) + len(first_x)
            carried = [("pf", results[:len(first)]), *([("xb", results[len(first):nx])] if p.x_ahead else []),
                       ("acc", results[nx:])]
            wk_rest = split
        else:
            wk_rest = first_step
        results = self.carried_for(wk_rest, end, kw, carried, body(1), iv_hint="kv", hint="fin")
        if p.stages:  # the copies past the warp's last step: none in flight beyond the loop
            self.b.op("async_wait", attrs={"pending": 0})
        self.reduce_and_store(results[len(first) + len(first_x):], wk, wn,
                              self.pairs.rebias if self.rebias_at_end else 1.0)
        return gemm_kernel(
            self.ctx, buffers=gemm_buffers(self.ctx, self.extra_buffers()),
            tables=self.stream_tables(self.x_transpose_tables()),
            shared=[SharedArray("red_s", F32, p.k_warps * s.tile_n * s.tile_m), *self.ring_arrays],
            attrs={"k_warps": p.k_warps, "weight_layout": self.weight_layout()},
            memory="shared memory for the K reduction (k_warps x tile_n x tile_m f32)"
                   + (" and the weight ring (warps x stages x a step's words)" if p.stages else ""))

    def step_range(self, wk: Value, wn: Value) -> tuple[Value, Value]:
        """(first step, end) of this warp's steps, k_warps apart: K warp wk's of the KS steps
        (a skipping kernel: of its block's stored vectors)."""
        return wk, self.KS

    def extra_buffers(self) -> list[BufferParam]:
        """Buffers beyond the format's that the kernel reads (a skipping kernel's tables)."""
        return []

    def weight_layout(self) -> str:
        """The physical weight layout the kernel reads (chosen at pack time)."""
        return layout_name(self.target)

    def group_runs(self) -> int | None:
        """K tiles per scale group where groups shorter than a vector cover whole K tiles
        (`tiles_per_group`), for scaling the sums per group run; else None."""
        g, tile, chunk = self.fmt.scale.group_size, self.tile_k_dense, self.layout.dense_chunk
        if (not self.target.scale_group_runs or self.sparse or self.layout.scatter is not None
                or g == "K" or int(g) % tile or chunk % int(g) or int(g) >= chunk):
            return None  # (sparse and scattered layouts keep whole-vector groups)
        return int(g) // tile

    def tiles_per_group(self) -> int:
        """K tiles of a vector that lie in one scale group: groups smaller than a vector that
        cover whole tiles and start at tile boundaries of every vector (the vector's dense K,
        a multiple of the group, keeps group starts in place). 1: load per tile."""
        g, tile, chunk = self.fmt.scale.group_size, self.tile_k_dense, self.layout.dense_chunk
        if g == "K" or int(g) % tile or chunk % int(g):
            return 1
        return int(g) // tile

    def load_b_fragments(self, ks: Value, clamp: bool = True) -> list[Value]:
        """Step ks's B fragments, [vector][K tile][M tile] flat: what `x_ahead` loads a step
        early and carries (with `x_shuffle`: the loads, [vector][K tile][M tile][unit], which
        the step transposes). With clamped loads, `clamp` reads step min(ks, KS - 1) (False:
        ks < KS is known); predicated loads read zeros past K."""
        if self.clamped and clamp:
            ks = self.op2("min", ks, self.last_step, hint="kc")
        out: list[Value] = []
        for kv in self.step_vectors(ks):
            k_vec0 = self.op2("mul", kv, self.layout.dense_chunk, hint="kb")
            out += self.b_fragments_of_vector(k_vec0)
        return out

    def b_fragment(self, k_tile0: Value, mt: int) -> Value:
        """The B fragment of K tile k_tile0 and M tile mt: with `x_shuffle` from wide loads
        transposed across lanes (parts/x_transpose.py), else RegisterFetch's."""
        if self.x_plan is not None:
            return self.transposed_fragment(self.shuffle_loads(k_tile0, mt))
        return super().b_fragment(k_tile0, mt)

    def b_fragments_of_vector(self, k_vec0: Value) -> list[Value]:
        """The B fragments of the K vector at dense K k_vec0, [K tile][M tile] flat."""
        runs = [self.x_runs(k_vec0, mt) for mt in range(self.msub)] if self.x_perm else None
        out: list[Value] = []
        for s_ in range(self.layout.tiles):
            if self.x_plan is not None:  # the loads; the step transposes them where it reads them
                k_tile0 = self.op2("add", k_vec0, s_ * self.tile_k_dense, hint="kt") if s_ else k_vec0
                out += [v for mt in range(self.msub) for v in self.shuffle_loads(k_tile0, mt)]
            elif runs is not None:
                out += [self.b_fragment_from_run(run, s_) for run in runs]
            else:
                k_tile0 = self.op2("add", k_vec0, s_ * self.tile_k_dense, hint="kt") if s_ else k_vec0
                out += [self.b_fragment(k_tile0, mt) for mt in range(self.msub)]
        return out

    def step(self, ks: Value, fetched: list[Value], accs: list[Value],
             b_ahead: list[Value] | None = None) -> list[Value]:
        """One K step (`vectors` consecutive K vectors): B fragments from device memory (or
        `b_ahead`, loaded a step earlier: `load_b_fragments`), A decoded from the fetched words."""
        mk = self.tile_k_dense
        words, meta, params = self.unpack_fetched(fetched)
        parts = []
        units = self.x_plan.units if self.x_plan is not None else 1  # carried values per B fragment
        per_vector = self.layout.tiles * self.msub * units
        for v, kv in enumerate(self.step_vectors(ks)):
            k_vec0 = self.op2("mul", kv, self.layout.dense_chunk, hint="kb")
            runs = [self.x_runs(k_vec0, mt) for mt in range(self.msub)] if self.x_perm and b_ahead is None else None
            k_tile: dict[int, Value] = {}

            def b_frags_for(s_: int, k_vec0: Value = k_vec0, runs=runs, k_tile=k_tile, v: int = v) -> list[Value]:
                k_tile[s_] = k_tile0 = self.op2("add", k_vec0, s_ * mk, hint="kt") if s_ else k_vec0
                if b_ahead is not None:
                    at = v * per_vector + s_ * self.msub * units
                    if self.x_plan is None:
                        return b_ahead[at:at + self.msub]
                    return [self.transposed_fragment(b_ahead[at + mt * units:at + (mt + 1) * units])
                            for mt in range(self.msub)]
                if runs is not None:
                    return [self.b_fragment_from_run(run, s_) for run in runs]
                return [self.b_fragment(k_tile0, mt) for mt in range(self.msub)]
            parts.append((words[v], meta[v], b_frags_for))
            if v == 0:
                first_k_tile = k_tile

        loaded: dict[tuple[int, int], dict] = {}
        share = self.tiles_per_group()

        def params_for(j: int, s_: int) -> dict:  # several vectors per step: prefetched (k_whole)
            if params is not None:
                return params[j]
            first = s_ - s_ % share  # the tiles of one scale group share its parameters
            if (j, first) not in loaded:
                loaded[j, first] = self.row_params(j, first_k_tile[first])
            return loaded[j, first]

        return self.mma_k_tiles(accs, *parts[0], params_for, more=parts[1:])


__all__ = ["WeightStreamLowering"]
