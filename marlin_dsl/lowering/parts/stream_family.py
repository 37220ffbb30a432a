"""The stream-layout family's shared parts (weight stream and multistage): both compute
Y^T = W^T X^T with the weights as the MMA's A operand in the fragment-ordered layout
(`layouts/weight_stream.py`). Here: the lane tables and layout facts (`init_stream`), the setup every
such kernel starts with (thread indices, lane tables, tile indices, K vectors, which N tiles
exist: `stream_setup`), the group parameters of a lane's rows, A fragments decoded pair by
pair, B fragments from a lane's activation run, and one K step's MMAs over the layout's K
tiles (`mma_k_tiles`)."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from ...errors import CompileError
from ...formats import NMSparsity
from ...ir import F32, U32, ConstTable, FragmentType, Value, VectorType
from ..decode import encoding_tables
from ..group_params import GroupValues
from ..pair_decode import PairDecoder
from ...layouts.weight_stream import StreamLayout, stream_layout
from .scatter import ScatterFragments


def lane_base_and_offsets(table: np.ndarray, what: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Split a lane table [lanes, elems] into base[lane] + offset[elem] (what every MMA layout
    of the targets we know satisfies), so a kernel computes one per-lane base, once."""
    base = table[:, 0]
    offsets = table - base[:, None]
    if not (offsets == offsets[0]).all():
        raise CompileError(f"weight_stream: the target's {what} lane table is not a per-lane base "
                           "plus per-element offsets")
    return tuple(int(v) for v in base), tuple(int(v) for v in offsets[0])


class StreamFamily(ScatterFragments):
    """Lane tables, setup, decode and MMAs of the stream-layout pipelines."""

    layout: StreamLayout

    def init_stream(self) -> None:
        """The layout and the lane tables (no IR emitted)."""
        target = self.target
        mm, mn, mk = target.mma
        self.layout = stream_layout(self.fmt, target, self.s.location)
        self.pairs = PairDecoder(self.b, self.fmt, self.act, self.layout.bit_order)
        mm, mn, mk = target.mma
        self.sparse = self.layout.sparse
        self.tile_k_dense = self.layout.dense_tile_k
        self.frag_b_stream = FragmentType("b", self.act, self.tile_k_dense, mn)
        self.nsub = self.s.tile_n // self.s.warps_n // mm  # A tiles (16 N rows) per warp
        self.msub = self.s.tile_m // self.s.warps_m // mn  # B tiles (8 M columns) per warp
        a_rows, _ = target.lane_elements("a", mm, mk)  # type: ignore[misc]
        b_k, b_n = target.lane_elements("b", self.tile_k_dense, mn)  # type: ignore[misc]
        self.a_row_base, self.a_row_off = lane_base_and_offsets(a_rows, "A row")
        #: with the layout's K shuffle each lane reads its activations as one run per chunk
        self.x_perm = self.layout.k_perm is not None
        if self.x_perm:
            granule = self.fmt.k_granule & -self.fmt.k_granule  # largest power of two dividing it
            # a whole number of vectors per run (3-bit codes on CUDA: runs of 20, vectors of 4)
            self.x_vec = self.vector_cap(math.gcd(8, granule, self.layout.x_run))
        c_rows, _ = target.lane_elements("c", mm, mn)  # type: ignore[misc]
        self.c_row_base, self.c_row_off = lane_base_and_offsets(c_rows, "C row")
        #: multiply each group's MMA sums by its scale instead of every weight (`sums_scalable`);
        #: a pipeline's lowering turns it on where that saves instructions
        self.scale_sums = False
        #: the decode's rebias (a power of two) is left out of the sums' factors; the pipeline
        #: applies it once to the final sums (exact: scaling by 2**e commutes with rounding)
        self.rebias_at_end = False
        #: K tiles of a vector whose sums one scale multiplies (a group's run): the whole step
        #: unless the lowering sets groups shorter than a vector (`group_runs`)
        self.sum_run: int | None = None
        g = self.fmt.scale.group_size
        #: K is a whole number of vector steps: groups cover whole vectors and K is a multiple
        #: of the group size (`Format.check_shape`), so no step reads past K
        self.k_whole = g != "K" and int(g) % self.layout.dense_chunk == 0
        #: loads read clamped indices without predicates (the weight stream turns it on where
        #: K is whole vectors: `RegisterFetch.setup_fetch`, which sets `last_n` and the rest)
        self.clamped = False
        #: a scattered layout whose vectors span several scale groups, each lane's run in one:
        #: each lane loads its own run's parameters (its run's start: the `a_run0` table)
        self.lane_groups = self.layout.scatter is not None and not (
            g == "K" or int(g) % self.layout.dense_chunk == 0)
        self.b_k_base, self.b_k_off = lane_base_and_offsets(b_k, "B k")
        self.b_n_base, self.b_n_off = lane_base_and_offsets(b_n, "B n")
        #: B elements come in (adjacent K, same M column) pairs (CUDA): one 2-wide activation
        #: load each; otherwise (Metal's 8x8 B pairs run along M) one load per element
        self.b_pairs_k = len(self.b_k_off) % 2 == 0 and all(
            self.b_k_off[2 * i + 1] == self.b_k_off[2 * i] + 1 and self.b_n_off[2 * i + 1] == self.b_n_off[2 * i]
            for i in range(len(self.b_k_off) // 2))
        #: a lane's distinct B K rows (first-occurrence order), each element's index among them,
        #: and its distinct M columns: with the K shuffle a lane reads one run per M column
        self.b_k_rows = tuple(dict.fromkeys(self.b_k_off))
        self.b_k_index = tuple(self.b_k_rows.index(o) for o in self.b_k_off)
        self.b_n_cols = tuple(dict.fromkeys(self.b_n_off))
        if any(self.a_row_off[2 * i] != self.a_row_off[2 * i + 1] for i in range(len(self.a_row_off) // 2)):
            raise CompileError("weight_stream: the target's A fragments do not hold elements in "
                               "(row, adjacent K) pairs")

    def vector_cap(self, elems: int) -> int:
        """`elems` capped at the target's widest vector (`Target.max_vector_elems`)."""
        cap = self.target.max_vector_elems
        return elems if cap is None else min(elems, cap)


    def sums_scalable(self) -> bool:
        """The scale can move from the weights to the MMA's sums: the format's scale factors
        out (`Scaling.scale_factors_out`), its codes decode exactly as f16 pairs, a K step lies
        in one group (so one step's MMAs sum one group), and each accumulator element's N row
        is one of the lane's A rows (whose scales the lane loads)."""
        g = self.fmt.scale.group_size
        scaling = self.fmt.scaling
        # A bias per group (SuperBlockScale's mins) adds bias * (the group's sum of x): an MMA
        # of a ones fragment, here only for dense unscattered layouts.
        factors = scaling.scale_factors_out() or (scaling.bias_factors_out() and not self.sparse
                                                  and self.layout.scatter is None)
        # Parameters computed in f32 (SuperBlockScale) take the sums path without a zero point
        # only: an f16 pair cannot subtract an f32 zero exactly.
        plain_codes = self.pairs.scalar.ctype == self.act or self.fmt.zero_point is None
        return (self.pairs.sums_scalable and factors and plain_codes
                and (g == "K" or int(g) % self.layout.dense_chunk == 0 or self.group_runs() is not None)
                and self.c_row_base == self.a_row_base and set(self.c_row_off) <= set(self.a_row_off))

    def group_runs(self) -> int | None:
        """K tiles per scale group where groups are shorter than a vector and each covers whole
        K tiles of one vector (the sums are then scaled once per group run); None where the
        pipeline does not scale runs (the default)."""
        return None

    def stream_setup(self, indices: Sequence[str], second: str, warp_tile_hint: str, clamp: bool,
                     warps_n: int | None = None) -> tuple[Value, Value]:
        """Thread indices, lane tables, the warp's N tiles, K vectors and which tiles exist.
        Warp w = second * warps_n + wn; returns (wn, second) (`second` names it: the weight
        stream's K warp "wk", the multistage M warp "wm"). `clamp`: also the last N tile.
        `warps_n`: the warps sharing the block's N tiles (default the schedule's; warp roles
        give the tiles to their producer warps, `nsub` each)."""
        b, s = self.b, self.s
        mm = self.target.mma_m
        warps_n = s.warps_n if warps_n is None else warps_n
        self.ctx.emit_indices(*indices)
        wn = self.op2("rem", self.warp, warps_n, hint="wn")
        w2 = self.op2("div", self.warp, warps_n, hint=second)
        self.a_row0 = b.value("table", [self.lane], U32, {"name": "a_row0"}, hint="ar")
        self.b_k0 = b.value("table", [self.lane], U32, {"name": "b_k0"}, hint="bk")
        self.b_n0 = b.value("table", [self.lane], U32, {"name": "b_n0"}, hint="bn")
        if self.x_perm:
            self.x_run0 = b.value("table", [self.lane], U32, {"name": "x_run0"}, hint="xr")
        if self.lane_groups:
            self.a_run0 = b.value("table", [self.lane], U32, {"name": "a_run0"}, hint="ak")
        gx, gy = b.index("group_x"), b.index("group_y")
        self.m0 = self.op2("mul", gy, s.tile_m, hint="m0")
        self.block_nt0 = self.op2("mul", gx, s.tile_n // mm, hint="nt")
        self.warp_tile0 = self.op2("mul", wn, self.nsub, hint=warp_tile_hint)  # the warp's first tile in the block
        nt0 = self.op2("add", self.block_nt0, self.warp_tile0, hint="nt")
        self.n_tiles = [self.op2("add", nt0, j, hint="nt") if j else nt0 for j in range(self.nsub)]
        self.NT = self.ceil_div(self.N, mm)
        if clamp:
            self.last_tile = self.op2("sub", self.NT, 1, hint="lt")
        sp = self.fmt.sparsity
        stored_k = self.op2("mul", self.op2("div", self.K, sp.m, hint="sk"), sp.n, hint="sk") \
            if isinstance(sp, NMSparsity) else self.K
        self.KV = self.ceil_div(stored_k, self.layout.chunk)
        self.tile_ok = [self.op2("lt", nt, self.NT, hint="ntok") for nt in self.n_tiles]
        g = self.fmt.scale.group_size
        # Scales change at most once per vector when groups cover whole vectors: then they
        # are fetched a step ahead, instead of stalling every step.
        self.prefetch_params = g == "K" or int(g) % self.layout.dense_chunk == 0 or self.lane_groups
        return wn, w2

    def stream_tables(self, extra: Sequence[ConstTable] = ()) -> list[ConstTable]:
        """The format's tables, the lane tables, `extra`, and the run starts (with the K shuffle)."""
        tables = encoding_tables(self.fmt, "") + [
            ConstTable("a_row0", U32, self.a_row_base), ConstTable("b_k0", U32, self.b_k_base),
            ConstTable("b_n0", U32, self.b_n_base), *extra]
        if self.x_perm:
            tables.append(ConstTable("x_run0", U32, self.layout.x_run_start))
        if self.lane_groups:
            tables.append(ConstTable("a_run0", U32, self.plan.lane_base))
        if self.layout.scatter is not None:
            tables += self.scatter_tables()
        return tables

    def fetch_params(self, kv: Value) -> list[Value]:
        """Step kv's group parameters of every N tile and row offset, flat (with `lane_groups`:
        of the group holding this lane's run)."""
        k_vec0 = self.op2("mul", kv, self.layout.dense_chunk, hint="kb")
        if self.lane_groups:
            k_vec0 = self.op2("add", k_vec0, self.a_run0, hint="ka")
        out: list[Value] = []
        for j in range(self.nsub):
            for params in self.row_params(j, k_vec0).values():
                out += params.flat()
        return out

    def unpack_params(self, flat) -> list[dict[int, GroupValues]]:
        """fetch_params' flat values back as [N tile]{row offset: GroupValues}."""
        rest = iter(flat)
        group_params = self.pairs.scalar.params
        return [{off: group_params.unflatten(rest) for off in sorted(set(self.a_row_off))}
                for _ in range(self.nsub)]

    def row_params(self, j: int, k_tile0: Value) -> dict[int, GroupValues]:
        """Group parameters of each distinct A row offset of this lane, for the group holding
        dense K position k_tile0 (with clamped loads, `RegisterFetch.clamped`: k_tile0 < K
        is known and rows past N read the last row)."""
        params = self.pairs.scalar.params
        group = params.group_of(k_tile0)
        clamped = self.clamped
        exists = None if clamped else self.op2("lt", k_tile0, self.K, hint="gok")
        out = {}
        for off in sorted(set(self.a_row_off)):
            n = self.op2("add", self.op2("mul", self.n_tiles[j], self.target.mma_m, hint="n"), self.a_row0, hint="n")
            n = self.op2("add", n, off, hint="n") if off else n
            if clamped:  # rows past N read the last row's parameters (never stored)
                out[off] = params.load_at(group, self.op2("min", n, self.last_n, hint="nc"), self.N, None)
                continue
            pred = self.op2("and", exists, self.op2("lt", n, self.N, hint="nok"), hint="sok")
            out[off] = params.load_at(group, n, self.N, pred)
        return out

    def b_fragment_from_run(self, run: list[Value] | dict[int, list[Value]], tile: int) -> Value:
        """Tile `tile`'s B fragment: element e is K row tile*R + (its row's index among the
        lane's R distinct rows) of the run of its M column (`run`: one run, or one per M
        column offset of the lane's elements)."""
        b = self.b
        runs = run if isinstance(run, dict) else {0: run}
        rows = len(self.b_k_rows)
        elems = []
        for e in range(len(self.b_k_off)):
            pos = tile * rows + self.b_k_index[e]
            vec = runs[self.b_n_off[e]][pos // self.x_vec]
            elems.append(vec if self.x_vec == 1 else
                         b.value("extract", [vec], self.act, {"index": pos % self.x_vec}, hint="xe"))
        return b.value("frag_build", elems, self.frag_b_stream, hint="fb")

    def mma_k_tiles(self, accs: list[Value], words: list[Value], meta: list[Value],
                    b_frags_for: Callable[[int], list[Value]],
                    params_for: Callable[[int, int], dict[int, GroupValues]],
                    more: Sequence[tuple[list[Value], list[Value], Callable[[int], list[Value]]]] = ()) -> list[Value]:
        """One K step's MMAs: per K tile of the layout, the B fragments (`b_frags_for(tile)`),
        then per N tile j its A fragment (decoded with `params_for(j, tile)`) times each B.
        `more`: further vectors of the step, (words, meta, b_frags_for) each, in the same
        scale group: their MMAs add into the same sums, scaled once."""
        b, lay = self.b, self.layout
        # Scale groups shorter than the vector (`sum_run` K tiles each): the sums of each run
        # are scaled into the accumulators as the run ends, and fresh sums start the next.
        run = self.sum_run if self.scale_sums and self.sum_run is not None and self.sum_run < lay.tiles else None
        assert run is None or (not more and lay.tiles % run == 0), "groups shorter than a vector: one vector a step"

        def fresh() -> tuple[list[Value], list[Value] | None]:
            return ([b.value("frag_zero", [], self.frag_c, hint="sum") for _ in accs], self.zero_xsums())

        new, xsums = fresh() if self.scale_sums else (list(accs), None)
        for words, meta, b_frags_for in [(words, meta, b_frags_for), *more]:
            caches: list[dict] = [{} for _ in range(self.nsub)]  # scattered: per N tile's vector
            for s_ in range(lay.tiles):
                b_frags = b_frags_for(s_)
                if xsums is not None:
                    xsums = self.add_xsums(xsums, b_frags)
                for j in range(self.nsub):
                    if lay.scatter is not None:
                        a = self.scatter_fragment(caches[j], words[j], meta[j], s_, params_for(j, s_))
                    else:
                        a = self.a_fragment(words[j], s_, params_for(j, s_))
                    if self.sparse:
                        m_word = meta[j] if lay.meta_words == 1 else \
                            b.value("extract", [meta[j]], U32, {"index": s_ // 2}, hint="mw")
                    for mt in range(self.msub):
                        i = j * self.msub + mt
                        if self.sparse:  # tile pairs share a metadata word: selector = tile parity
                            new[i] = b.value("mma_sp", [a, b_frags[mt], new[i], m_word], self.frag_c,
                                             {"selector": s_ % 2}, hint="acc")
                        else:
                            new[i] = b.value("mma", [a, b_frags[mt], new[i]], self.frag_c, hint="acc")
                if run is not None and (s_ + 1) % run == 0:
                    accs = self.flush_sums(accs, new, xsums, params_for, s_ + 1 - run)
                    if s_ + 1 < lay.tiles:
                        new, xsums = fresh()
        if not self.scale_sums:
            return new
        return accs if run is not None else self.flush_sums(accs, new, xsums, params_for, 0)

    def zero_xsums(self) -> list[Value] | None:
        """Per M tile, fresh sums of x over the run's K (a bias per group needs them), or None."""
        if not self.fmt.scaling.bias_factors_out():
            return None
        return [self.b.value("frag_zero", [], self.frag_c, hint="xs") for _ in range(self.msub)]

    def add_xsums(self, xsums: list[Value], b_frags: list[Value]) -> list[Value]:
        """xsums + (a fragment of ones) x B: every row of the C tile gets sum_k x[m, k]."""
        b = self.b
        pair = self.pairs.pair_type
        one = b.const(1.0, pair.elem)  # type: ignore[attr-defined]
        ones = b.value("vec", [one, one], pair, hint="one")
        a = b.value("frag_build", [ones] * (len(self.a_row_off) // 2), self.frag_a, hint="fo")
        return [b.value("mma", [a, b_frags[mt], xsums[mt]], self.frag_c, hint="xs") for mt in range(self.msub)]

    def flush_sums(self, accs: list[Value], sums: list[Value], xsums: list[Value] | None,
                   params_for: Callable[[int, int], dict[int, GroupValues]], tile: int) -> list[Value]:
        """accs + scale * sums (+ bias * xsums) with the parameters of K tile `tile`'s group."""
        out = []
        for j in range(self.nsub):
            params = params_for(j, tile)
            scales = self.sum_scales(params)
            biases = self.sum_biases(params) if xsums is not None else None
            out += [self.add_scaled(accs[j * self.msub + mt], sums[j * self.msub + mt], scales,
                                    biases, None if xsums is None else xsums[mt])
                    for mt in range(self.msub)]
        return out

    def sum_biases(self, params: dict[int, GroupValues]) -> dict[int, Value]:
        """Per A row offset: the f32 bias its group adds per unit of x (`Scaling.emit_bias`)."""
        b, scaling = self.b, self.fmt.scaling
        out = {}
        for off, values in params.items():
            bias = scaling.emit_bias(b, values)
            out[off] = bias if bias.type == F32 else b.cast(bias, F32, hint="sb")
        return out

    def sum_scales(self, params: dict[int, GroupValues]) -> dict[int, Value]:
        """Per A row offset: the f32 factor of its group's sums (scale times the decode's
        rebias, `PairDecoder.rebias`, unless `rebias_at_end`)."""
        b, scaling = self.b, self.fmt.scaling
        out = {}
        for off, values in params.items():
            scale = scaling.emit_scale(b, values)
            if scale.type != F32:
                scale = b.cast(scale, F32, hint="ss")
            rebias = 1.0 if self.rebias_at_end else self.pairs.rebias
            out[off] = scale if rebias == 1.0 else b.binary("mul", scale, b.const(rebias, F32), hint="ss")
        return out

    def add_scaled(self, acc: Value, sums: Value, scales: dict[int, Value],
                   biases: dict[int, Value] | None = None, xsums: Value | None = None) -> Value:
        """acc + scale[row] * sums (+ bias[row] * xsums), element by element (each C element's
        row from the lane table)."""
        b = self.b
        vec = VectorType(F32, len(self.c_row_off))
        acc_e = b.value("frag_elems", [acc], vec, hint="ae")
        sum_e = b.value("frag_elems", [sums], vec, hint="se")
        xs_e = None if xsums is None else b.value("frag_elems", [xsums], vec, hint="xe")
        elems = []
        for e, off in enumerate(self.c_row_off):
            a = b.value("fma", [b.value("extract", [sum_e], F32, {"index": e}, hint="s"),
                                scales[off], b.value("extract", [acc_e], F32, {"index": e}, hint="a")],
                        F32, hint="a")
            if xs_e is not None and biases is not None:
                a = b.value("fma", [b.value("extract", [xs_e], F32, {"index": e}, hint="x"), biases[off], a],
                            F32, hint="a")
            elems.append(a)
        return b.value("frag_build", elems, self.frag_c, hint="acc")

    def a_fragment(self, words: Value, tile: int, params: dict[int, GroupValues]) -> Value:
        """K tile `tile`'s A fragment, decoded pair by pair from a lane's vector of words with
        the group parameters of each row offset."""
        b, lay = self.b, self.layout
        pairs_per_tile = lay.per_lane // 2
        parts = []
        decode = self.pairs.unscaled if self.scale_sums else self.pairs.dequant
        for p_ in range(pairs_per_tile):
            word, slot = lay.pair_slot(tile * pairs_per_tile + p_)
            w = b.value("extract", [words], U32, {"index": word}, hint="w")
            parts.append(decode(w, slot, params[self.a_row_off[2 * p_]]))
        return b.value("frag_build", parts, self.frag_a, hint="fa")


__all__ = ["StreamFamily", "lane_base_and_offsets"]
