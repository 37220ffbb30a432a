"""Lowering of the weight-stream pipeline (`schedule.WeightStream`) to kernel IR.

Y^T[N, M] = W^T[N, K] X^T[K, M]: the MMA's A operand is a 16 x 16 tile of W^T (N rows,
stored-K columns), B a 16 x 8 tile of X^T (K rows, M columns), C a 16 x 8 tile of Y^T.

Threadgroup (group_x, group_y) owns N rows [n0, n0 + tile_n) and M columns
[m0, m0 + tile_m). Warp w = wk * warps_n + wn owns N tiles of its `wn` slice and K vectors
wk, wk + k_warps, ... (one vector = one 128-bit load per lane = `layout.tiles` K tiles of
A). Per step the warp:

1. issues the next step's weight loads (carried through the loop: register double buffering),
2. loads each lane's scales (and zero points) for its two fragment rows,
3. builds the B fragments of X^T from pairs of activations (`vload` of 2, masked by M and K),
4. decodes its A fragments pair by pair (`PairDecoder`) and runs the MMAs.

Then every warp stores its accumulators to shared memory and the threadgroup adds the k_warps
partial tiles and writes Y (rounded once). Which lane holds which element comes from the
target's lane tables (`Target.lane_elements`); the weights were laid out to match at pack time
(`stream_layout.py`).
"""
from __future__ import annotations

import numpy as np

from ..errors import CompileError
from ..formats import NMSparsity
from ..ir import F32, U32, BufferParam, ConstTable, FragmentType, GridDim, Kernel, ScalarParam, ScalarType, SharedArray, Value, VectorType, verify
from ..schedule import Multistage, WeightStream
from .decode import encoding_tables
from .gemm import GemmLowering
from .group_params import GroupValues
from .pair_decode import PairDecoder
from .stream_layout import LAYOUT_NAME, VECTOR_WORDS, stream_layout


def lane_base_and_offsets(table: np.ndarray, what: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Split a lane table [lanes, elems] into base[lane] + offset[elem] (what every MMA layout
    of the targets we know satisfies), so a kernel computes one per-lane base, once."""
    base = table[:, 0]
    offsets = table - base[:, None]
    if not (offsets == offsets[0]).all():
        raise CompileError(f"weight_stream: the target's {what} lane table is not a per-lane base "
                           "plus per-element offsets")
    return tuple(int(v) for v in base), tuple(int(v) for v in offsets[0])


class StreamLowering(GemmLowering):
    def __init__(self, gemm, target) -> None:
        super().__init__(gemm, target)
        assert isinstance(self.pipeline, (WeightStream, Multistage))  # Multistage: see multistage.py
        self.layout = stream_layout(self.fmt, target, self.s.location)
        self.pairs = PairDecoder(self.b, self.fmt, self.act)
        mm, mn, mk = target.mma
        self.sparse = self.layout.sparse
        self.tile_k_dense = self.layout.dense_tile_k
        self.frag_b_stream = FragmentType("b", self.act, self.tile_k_dense, mn)
        self.nsub = self.s.tile_n // self.s.warps_n // mm  # A tiles (16 N rows) per warp
        self.msub = self.s.tile_m // mn  # B tiles (8 M columns) per warp
        a_rows, _ = target.lane_elements("a", mm, mk)  # type: ignore[misc]
        b_k, b_n = target.lane_elements("b", self.tile_k_dense, mn)  # type: ignore[misc]
        self.a_row_base, self.a_row_off = lane_base_and_offsets(a_rows, "A row")
        #: with the layout's K shuffle each lane reads its activations as one run per chunk
        self.x_perm = self.layout.k_perm is not None
        if self.x_perm:
            granule = self.fmt.k_granule & -self.fmt.k_granule  # largest power of two dividing it
            self.x_vec = min(8, granule, self.layout.x_run)
        self.b_k_base, self.b_k_off = lane_base_and_offsets(b_k, "B k")
        self.b_n_base, self.b_n_off = lane_base_and_offsets(b_n, "B n")
        pairs_ok = all(self.b_k_off[2 * i + 1] == self.b_k_off[2 * i] + 1 and
                       self.b_n_off[2 * i + 1] == self.b_n_off[2 * i] for i in range(len(self.b_k_off) // 2))
        if not pairs_ok or any(self.a_row_off[2 * i] != self.a_row_off[2 * i + 1] for i in range(len(self.a_row_off) // 2)):
            raise CompileError("weight_stream: the target's fragments do not hold elements in "
                               "(row, adjacent K) pairs")

    def lower(self) -> Kernel:
        b, s, t = self.b, self.s, self.target
        p = self.pipeline
        assert isinstance(p, WeightStream)
        lay = self.layout
        mm, mn, mk = t.mma
        self.lane, self.warp = b.index("lane"), b.index("warp")
        self.M, self.N, self.K = b.scalar("M"), b.scalar("N"), b.scalar("K")
        wn = self.op2("rem", self.warp, s.warps_n, hint="wn")
        wk = self.op2("div", self.warp, s.warps_n, hint="wk")
        self.a_row0 = b.value("table", [self.lane], U32, {"name": "a_row0"}, hint="ar")
        self.b_k0 = b.value("table", [self.lane], U32, {"name": "b_k0"}, hint="bk")
        self.b_n0 = b.value("table", [self.lane], U32, {"name": "b_n0"}, hint="bn")
        if self.x_perm:
            self.x_run0 = b.value("table", [self.lane], U32, {"name": "x_run0"}, hint="xr")
        gx, gy = b.index("group_x"), b.index("group_y")
        self.m0 = self.op2("mul", gy, s.tile_m, hint="m0")
        nt0 = self.op2("add", self.op2("mul", gx, s.tile_n // mm, hint="nt"),
                       self.op2("mul", wn, self.nsub, hint="nt"), hint="nt")
        self.n_tiles = [self.op2("add", nt0, j, hint="nt") if j else nt0 for j in range(self.nsub)]
        self.NT = self.ceil_div(self.N, mm)
        sp = self.fmt.sparsity
        stored_k = self.op2("mul", self.op2("div", self.K, sp.m, hint="sk"), sp.n, hint="sk") \
            if isinstance(sp, NMSparsity) else self.K
        self.KV = self.ceil_div(stored_k, lay.chunk)
        self.tile_ok = [self.op2("lt", nt, self.NT, hint="ntok") for nt in self.n_tiles]

        g = self.fmt.scale.group_size
        # Scales change at most once per vector when groups cover whole vectors: then they
        # are fetched with the weights, a step ahead, instead of stalling every step.
        self.prefetch_params = g == "K" or int(g) % lay.dense_chunk == 0
        depth = p.depth  # steps whose loads are in flight while one computes
        sets = [self.fetch(wk if d == 0 else self.op2("add", wk, d * p.k_warps, hint="pk")) for d in range(depth)]
        first = [v for fetched in sets for v in fetched]
        per_set = len(sets[0])
        accs = [b.value("frag_zero", [], self.frag_c, hint="acc") for _ in range(self.nsub * self.msub)]
        iv = b.fresh("kv", U32)
        carried_fetch = [b.fresh("pf", v.type) for v in first]
        carried_accs = [b.fresh("acc", self.frag_c) for _ in accs]
        loop = b.op("for", [wk, self.KV, self.c(p.k_warps), *first, *accs],
                    [v.type for v in first] + [self.frag_c] * len(accs), hint="fin")
        with b.region([iv, *carried_fetch, *carried_accs]) as body:
            loop.regions.append(body)
            ahead = self.op2("add", iv, depth * p.k_warps, hint="nx")
            prefetched = self.fetch(ahead)
            new_accs = self.step(iv, carried_fetch[:per_set], carried_accs)
            b.yield_(*carried_fetch[per_set:], *prefetched, *new_accs)
        final = loop.results[len(first):]
        self.reduce_and_store(final, wk, wn)

        tables = encoding_tables(self.fmt, "") + [
            ConstTable("a_row0", U32, self.a_row_base), ConstTable("b_k0", U32, self.b_k_base),
            ConstTable("b_n0", U32, self.b_n_base)]
        if self.x_perm:
            tables.append(ConstTable("x_run0", U32, self.layout.x_run_start))
        kernel = Kernel(
            name=self.gemm.name, threads=self.threads,
            grid=(GridDim("N", s.tile_n), GridDim("M", s.tile_m), GridDim(None)), body=b.blocks[0],
            warp_size=t.warp_size, buffers=self.buffers(), scalars=[ScalarParam(n) for n in "MNK"],
            shared=[SharedArray("red_s", F32, p.k_warps * s.tile_n * s.tile_m)], tables=tables,
            attrs={"target": t.name, "format": self.fmt.name, "schedule": s.name,
                   "pipeline": p.kind, "activation": self.act.name,
                   "tile": (s.tile_m, s.tile_n, s.tile_k), "warps": (s.warps_m, s.warps_n),
                   "mma": tuple(t.mma), "k_warps": p.k_warps, "weight_layout": LAYOUT_NAME},
        )
        if kernel.shared_bytes > t.max_shared_bytes:
            raise CompileError(
                f"gemm {self.gemm.name!r}: schedule {s.name!r} needs {kernel.shared_bytes} bytes of "
                f"shared memory for the K reduction (k_warps x tile_n x tile_m f32), over "
                f"{t.name}'s limit of {t.max_shared_bytes}", s.location)
        verify(kernel)
        return kernel

    def fetch(self, kv: Value) -> list[Value]:
        """What step kv reads from device memory before it computes: every N tile's weight
        vector, then (when prefetched) each tile's scales and zero points per row offset."""
        out = [self.load_words(j, kv) for j in range(self.nsub)]
        if self.sparse:
            out += [self.load_meta(j, kv) for j in range(self.nsub)]
        if self.prefetch_params:
            out += self.fetch_params(kv)
        return out

    def fetch_params(self, kv: Value) -> list[Value]:
        """Step kv's group parameters of every N tile and row offset, flat."""
        k_vec0 = self.op2("mul", kv, self.layout.dense_chunk, hint="kb")
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

    def unpack_fetched(self, fetched: list[Value]) -> tuple[list[Value], list[Value], list[dict] | None]:
        words = fetched[:self.nsub]
        used = 2 * self.nsub if self.sparse else self.nsub
        meta = fetched[self.nsub:used]
        if not self.prefetch_params:
            return words, meta, None
        return words, meta, self.unpack_params(fetched[used:])

    def load_meta(self, j: int, kv: Value) -> Value:
        """One lane's sparse-MMA metadata words for N tile j and K vector kv (one per tile pair)."""
        size = self.layout.meta_words
        idx, pred = self.lane_slot(j, kv, size, "mi")
        b = self.b
        # Where the tile is absent the MMA still runs (its rows are never stored): give it the
        # valid ordered positions (0, 1) in every group (0b0100 per field), not zeros, whose
        # result is undefined on the hardware.
        valid = b.const(0x44444444)
        if size == 1:
            return b.select(pred, b.load("meta", idx, U32, pred, hint="meta"), valid, hint="meta")
        loaded = b.value("vload", [idx, pred], VectorType(U32, size), {"buffer": "meta", "size": size}, hint="meta")
        return b.select(pred, loaded, b.value("vec", [valid] * size, VectorType(U32, size), hint="meta"), hint="meta")

    def lane_slot(self, j: int, kv: Value, size: int, hint: str) -> tuple[Value, Value]:
        """(index, exists) of this lane's `size` words for N tile j and K vector kv in an array
        laid out [n_tile][k_vector][lane][size] (qweight; the sparse metadata)."""
        pred = self.op2("and", self.op2("lt", kv, self.KV, hint="kok"), self.tile_ok[j], hint="vok")
        slot = self.op2("add", self.op2("mul", self.n_tiles[j], self.KV, hint=hint), kv, hint=hint)
        lane = self.op2("add", self.op2("mul", slot, self.layout.lanes, hint=hint), self.lane, hint=hint)
        return self.op2("mul", lane, size, hint=hint), pred

    def load_words(self, j: int, kv: Value) -> Value:
        """One lane's vector of weight words for N tile j and K vector kv (0 where absent)."""
        b = self.b
        idx, pred = self.lane_slot(j, kv, VECTOR_WORDS, "wi")
        return b.value("vload", [idx, pred], VectorType(U32, VECTOR_WORDS),
                       {"buffer": "qweight", "size": VECTOR_WORDS}, hint="qw")

    def row_params(self, j: int, k_tile0: Value) -> dict[int, GroupValues]:
        """Group parameters of each distinct A row offset of this lane, for the group holding
        dense K position k_tile0."""
        params = self.pairs.scalar.params
        group = params.group_of(k_tile0)
        exists = self.op2("lt", k_tile0, self.K, hint="gok")
        out = {}
        for off in sorted(set(self.a_row_off)):
            n = self.op2("add", self.op2("mul", self.n_tiles[j], self.target.mma_m, hint="n"), self.a_row0, hint="n")
            n = self.op2("add", n, off, hint="n") if off else n
            pred = self.op2("and", exists, self.op2("lt", n, self.N, hint="nok"), hint="sok")
            out[off] = params.load_at(group, n, self.N, pred)
        return out

    def x_row(self, mt: int, hint: str) -> tuple[Value, Value]:
        """(this lane's activation row m < M, m * K) for M tile mt (m from the B lane table)."""
        m = self.op2("add", self.op2("add", self.m0, mt * self.target.mma_n, hint="m"), self.b_n0, hint="m")
        return self.op2("lt", m, self.M, hint="mok"), self.op2("mul", m, self.K, hint=hint)

    def b_fragment(self, k_tile0: Value, mt: int) -> Value:
        """The B fragment of X^T rows [k_tile0, +16), columns [m0 + 8 mt, +8): pairs of
        adjacent activations along K, masked by M and K (K is even: see runtime.physical_arrays)."""
        b = self.b
        m_ok, row = self.x_row(mt, "xr")
        lane_k = self.op2("add", k_tile0, self.b_k0, hint="k")
        pairs = []
        for i in range(0, len(self.b_k_off), 2):
            k = self.op2("add", lane_k, self.b_k_off[i], hint="k") if self.b_k_off[i] else lane_k
            pred = self.op2("and", m_ok, self.op2("lt", k, self.K, hint="kok"), hint="xok")
            pairs.append(b.value("vload", [self.op2("add", row, k, hint="xi"), pred], VectorType(self.act, 2),
                                 {"buffer": "x", "size": 2}, hint="xp"))
        return b.value("frag_build", pairs, self.frag_b_stream, hint="fb")

    def x_run(self, k_vec0: Value, mt: int) -> list[Value]:
        """This lane's activations for the chunk at dense K k_vec0 and M tile mt, as vectors of
        x_vec elements: original K [k_vec0 + x_run0, + x_run) of row m (zero outside M, K)."""
        b = self.b
        m_ok, row = self.x_row(mt, "xi")
        start = self.op2("add", k_vec0, self.x_run0, hint="xk")
        row = self.op2("add", row, start, hint="xi")
        out = []
        for i in range(self.layout.x_run // self.x_vec):
            off = i * self.x_vec
            k = self.op2("add", start, off, hint="xk") if off else start
            pred = self.op2("and", m_ok, self.op2("lt", k, self.K, hint="kok"), hint="xok")
            idx = self.op2("add", row, off, hint="xi") if off else row
            out.append(b.value("vload", [idx, pred], VectorType(self.act, self.x_vec),
                               {"buffer": "x", "size": self.x_vec}, hint="xv"))
        return out

    def b_fragment_from_run(self, run: list[Value], tile: int) -> Value:
        """Tile `tile`'s B fragment: elements tile*E .. tile*E + E-1 of the lane's run."""
        b = self.b
        per = len(self.b_k_off)
        elems = []
        for e in range(per):
            pos = tile * per + e
            vec = run[pos // self.x_vec]
            elems.append(vec if self.x_vec == 1 else
                         b.value("extract", [vec], self.act, {"index": pos % self.x_vec}, hint="xe"))
        return b.value("frag_build", elems, self.frag_b_stream, hint="fb")

    def step(self, kv: Value, fetched: list[Value], accs: list[Value]) -> list[Value]:
        b, lay = self.b, self.layout
        mk = self.tile_k_dense
        k_vec0 = self.op2("mul", kv, lay.dense_chunk, hint="kb")
        words, meta, params = self.unpack_fetched(fetched)
        new = list(accs)
        runs = [self.x_run(k_vec0, mt) for mt in range(self.msub)] if self.x_perm else None
        for s_ in range(lay.tiles):
            k_tile0 = self.op2("add", k_vec0, s_ * mk, hint="kt") if s_ else k_vec0
            if runs is not None:
                b_frags = [self.b_fragment_from_run(run, s_) for run in runs]
            else:
                b_frags = [self.b_fragment(k_tile0, mt) for mt in range(self.msub)]
            for j in range(self.nsub):
                rp = params[j] if params is not None else self.row_params(j, k_tile0)
                a = self.a_fragment(words[j], s_, rp)
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
        return new

    def a_fragment(self, words: Value, tile: int, params: dict[int, GroupValues]) -> Value:
        """K tile `tile`'s A fragment, decoded pair by pair from a lane's vector of words with
        the group parameters of each row offset."""
        b, lay = self.b, self.layout
        pairs_per_tile = lay.per_lane // 2
        parts = []
        for p_ in range(pairs_per_tile):
            word, shift = lay.pair_slot(tile * pairs_per_tile + p_)
            w = b.value("extract", [words], U32, {"index": word}, hint="w")
            parts.append(self.pairs.dequant(w, shift, params[self.a_row_off[2 * p_]]))
        return b.value("frag_build", parts, self.frag_a, hint="fa")

    def reduce_and_store(self, accs: list[Value], wk: Value, wn: Value) -> None:
        b, s = self.b, self.s
        mm, mn, _ = self.target.mma
        tile = s.tile_n * s.tile_m
        base = self.op2("add", self.op2("mul", wk, tile, hint="rb"),
                        self.op2("mul", self.op2("mul", wn, self.nsub * mm, hint="rb"), s.tile_m, hint="rb"), hint="rb")
        for j in range(self.nsub):
            for mt in range(self.msub):
                off = self.op2("add", base, j * mm * s.tile_m + mt * mn, hint="ro") if (j or mt) else base
                b.op("frag_store", [accs[j * self.msub + mt], off], attrs={"buffer": "red_s", "ld": s.tile_m})
        b.barrier()
        n0 = self.op2("mul", b.index("group_x"), s.tile_n, hint="n0")
        tid = b.index("tid")
        k_warps = self.pipeline.k_warps  # type: ignore[union-attr]

        def body(i: Value) -> None:
            e = self.op2("add", self.op2("mul", i, self.threads, hint="e"), tid, hint="e")
            r, col = self.op2("rem", e, s.tile_n, hint="r"), self.op2("div", e, s.tile_n, hint="c")
            inside = None if tile % self.threads == 0 else self.op2("lt", e, tile, hint="p")
            src = self.op2("add", self.op2("mul", r, s.tile_m, hint="si"), col, hint="si")
            total = None
            for w in range(k_warps):
                idx = self.op2("add", src, w * tile, hint="si") if w else src
                part = b.load("red_s", idx, F32, inside, hint="pv")
                total = part if total is None else self.op2("add", total, part, hint="sum")
            gm, gn = self.op2("add", self.m0, col, hint="ym"), self.op2("add", n0, r, hint="yn")
            pred = self.op2("and", self.op2("lt", gm, self.M, hint="p"), self.op2("lt", gn, self.N, hint="p"), hint="p")
            if inside is not None:
                pred = self.op2("and", pred, inside, hint="p")
            y_idx = self.op2("add", self.op2("mul", gm, self.N, hint="yi"), gn, hint="yi")
            b.store("y", y_idx, b.cast(total, self.act, hint="yv"), pred)  # type: ignore[arg-type]

        self.counted_loop(-(-tile // self.threads), body, hint="ie")

    def buffers(self) -> list[BufferParam]:
        return [bp for bp in super().buffers() if bp.name not in ("partials", "counters")]
