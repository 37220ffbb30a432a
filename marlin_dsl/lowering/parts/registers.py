"""Operand source of the weight stream: straight from device memory to registers. Each lane
loads its weight vector (and sparse metadata) per N tile with one 128-bit load, a step or more
ahead (`fetch`), and builds its activation B fragments from `vload`s of device memory (pairs, or
runs with the layout's K shuffle). Needs the stream setup (`stream_family.py`).

Where K is a whole number of vectors (`k_whole`: scale groups cover whole vectors, and K is a
multiple of the group size), nothing in the loop needs a predicate: every K position a step
reads exists, and what lies beyond M and N is read *clamped* instead of masked: the last N
tile's weights, the last row's scales, the last activation row. Those rows and columns of the
product are garbage that no store ever reads (the MMA keeps rows of A and columns of B
apart). Prefetches past the warp's last step read the last vector (`fetch(clamp=True)`): their
values are never used. So the loop issues no compares and no zero-fills for its loads."""
from __future__ import annotations

import math

from ...ir import U32, Value, VectorType
from .context import GemmParts


class RegisterFetch(GemmParts):
    """Global -> registers loads of the weight stream."""

    def setup_fetch(self, vectors: int = 1) -> None:
        """Steps of `vectors` consecutive K vectors (`KS` of them), and the loop-invariant
        clamps where K is whole vectors (after `stream_setup`)."""
        self.vectors = vectors
        self.KS = self.KV if vectors == 1 else self.op2("div", self.KV, vectors, hint="ks")
        self.clamped = self.k_whole
        if not self.clamped:
            return
        if self.x_perm:  # K, a multiple of the group, keeps every row's run aligned: one vload
            self.x_vec = self.vector_cap(math.gcd(int(self.fmt.scale.group_size), self.layout.x_run,
                                                  self.layout.dense_chunk))
        self.last_step = self.op2("sub", self.KS, 1, hint="lk")
        last_tile = self.op2("sub", self.NT, 1, hint="lt")
        self.fetch_tiles = [self.op2("min", nt, last_tile, hint="ntc") for nt in self.n_tiles]
        self.last_n = self.op2("sub", self.N, 1, hint="ln")
        self.last_m = self.op2("sub", self.M, 1, hint="lm")

    def step_vectors(self, ks: Value) -> list[Value]:
        """The K vectors of step ks: ks * vectors + v."""
        if self.vectors == 1:
            return [ks]
        kv0 = self.op2("mul", ks, self.vectors, hint="kv")
        return [kv0] + [self.op2("add", kv0, v, hint="kv") for v in range(1, self.vectors)]

    def fetch(self, ks: Value, clamp: bool = True, previous: list[Value] | None = None) -> list[Value]:
        """What step ks reads from device memory before it computes: every vector's and N
        tile's weight words (and sparse metadata), then (when prefetched) each tile's scales
        and zero points per row offset, once: a step lies in one group. With clamped loads,
        `clamp` reads step min(ks, KS - 1) (False: ks < KS is known). `previous`: what the
        fetch of step ks - k_warps returned (unused here; a skipping stream reads its step's
        K from it)."""
        if self.clamped and clamp:
            ks = self.op2("min", ks, self.last_step, hint="kc")
        kvs = self.step_vectors(ks)
        out = self.fetch_words(kvs)
        if self.prefetch_params:
            out += self.fetch_params(kvs[0])
        return out

    def fetch_words(self, kvs: list[Value]) -> list[Value]:
        """The weight words (and sparse metadata) of K vectors kvs, loaded into registers."""
        out = [self.load_words(j, kv) for kv in kvs for j in range(self.nsub)]
        if self.layout.has_meta:
            out += [self.load_meta(j, kv) for kv in kvs for j in range(self.nsub)]
        return out

    def unpack_fetched(self, fetched: list[Value]) -> tuple[list[list[Value]], list[list[Value]], list[dict] | None]:
        """fetch's values back as (weight vectors [vector][N tile], metadata [vector][N tile],
        group parameters or None)."""
        per = self.vectors * self.nsub
        words = [fetched[v * self.nsub:(v + 1) * self.nsub] for v in range(self.vectors)]
        used = 2 * per if self.layout.has_meta else per
        meta = [fetched[per + v * self.nsub:per + (v + 1) * self.nsub] for v in range(self.vectors)] \
            if self.layout.has_meta else [[] for _ in range(self.vectors)]
        if not self.prefetch_params:
            return words, meta, None
        return words, meta, self.unpack_params(fetched[used:])

    def load_meta(self, j: int, kv: Value) -> Value:
        """One lane's sparse-MMA metadata words for N tile j and K vector kv (one per tile pair);
        a scattered layout's metadata words (absent: 0, which selects no kept value)."""
        size = self.layout.meta_words
        idx, pred = self.lane_slot(j, kv, size, "mi")
        b = self.b
        # Clamped: a real tile's metadata. Scattered: a predicated load's 0 where the tile is
        # absent, a field that selects no kept value.
        if pred is None or self.layout.scatter is not None:
            operands = [idx] + ([pred] if pred is not None else [])
            if size == 1:
                return b.value("load", operands, U32, {"buffer": "meta"}, hint="meta")
            return b.value("vload", operands, VectorType(U32, size), {"buffer": "meta", "size": size}, hint="meta")
        if size == 1:
            return self.idle_unless(pred, b.load("meta", idx, U32, pred, hint="meta"))
        return self.idle_unless(pred, b.value("vload", [idx, pred], VectorType(U32, size),
                                              {"buffer": "meta", "size": size}, hint="meta"))

    def idle_unless(self, present: Value, meta: Value) -> Value:
        """`meta` where `present`, else the target's idle metadata: where the tile is absent the
        sparse MMA still runs (its rows are never stored), so give it the valid ordered
        positions (0, 1) in every group (0b0100 per field), not zeros, whose result is
        undefined on the hardware."""
        b = self.b
        valid = b.const(self.target.sparse_idle_metadata)
        if isinstance(meta.type, VectorType):
            valid = b.value("vec", [valid] * meta.type.size, meta.type, hint="meta")
        return b.select(present, meta, valid, hint="meta")

    def lane_slot(self, j: int, kv: Value, size: int, hint: str) -> tuple[Value, Value | None]:
        """(index, exists) of this lane's `size` words for N tile j and K vector kv in an array
        laid out [n_tile][k_vector][lane][size] (qweight; the sparse metadata). Clamped: the
        last tile for tiles past the end, and no predicate."""
        tile = self.fetch_tiles[j] if self.clamped else self.n_tiles[j]
        pred = None if self.clamped else \
            self.op2("and", self.op2("lt", kv, self.KV, hint="kok"), self.tile_ok[j], hint="vok")
        slot = self.op2("add", self.op2("mul", tile, self.KV, hint=hint), kv, hint=hint)
        lane = self.op2("add", self.op2("mul", slot, self.layout.lanes, hint=hint), self.lane, hint=hint)
        return self.op2("mul", lane, size, hint=hint), pred

    def load_words(self, j: int, kv: Value) -> Value:
        """One lane's vector of weight words for N tile j and K vector kv (0 where absent):
        VECTOR_WORDS, or a scattered layout's `code_words` (one word: a scalar load)."""
        b = self.b
        size = self.layout.code_words
        idx, pred = self.lane_slot(j, kv, size, "wi")
        operands = [idx] + ([pred] if pred is not None else [])
        if size == 1:
            return b.value("load", operands, U32, {"buffer": "qweight"}, hint="qw")
        return b.value("vload", operands, VectorType(U32, size), {"buffer": "qweight", "size": size}, hint="qw")

    def x_row(self, mt: int, hint: str, col: int = 0) -> tuple[Value | None, Value]:
        """(this lane's activation row m < M, m * K) for M tile mt and the lane's M column
        offset `col` (m from the B lane table); clamped: (None, min(m, M - 1) * K)."""
        m = self.op2("add", self.op2("add", self.m0, mt * self.target.mma_n, hint="m"), self.b_n0, hint="m")
        if col:
            m = self.op2("add", m, col, hint="m")
        if self.clamped:
            return None, self.op2("mul", self.op2("min", m, self.last_m, hint="mc"), self.K, hint=hint)
        return self.op2("lt", m, self.M, hint="mok"), self.op2("mul", m, self.K, hint=hint)

    def x_pred(self, m_ok: Value | None, k: Value) -> Value | None:
        """The predicate of an activation load at K position k: none where clamped (k < K
        holds for every step of a whole number of vectors)."""
        if m_ok is None:
            return None
        return self.op2("and", m_ok, self.op2("lt", k, self.K, hint="kok"), hint="xok")

    def b_fragment(self, k_tile0: Value, mt: int) -> Value:
        """The B fragment of X^T rows [k_tile0, +16), columns [m0 + 8 mt, +8): pairs of
        adjacent activations along K, masked by M and K (K is even: see kernel_args.physical_arrays)."""
        b = self.b
        if not self.b_pairs_k:
            return self.b_fragment_elements(k_tile0, mt)
        m_ok, row = self.x_row(mt, "xr")
        lane_k = self.op2("add", k_tile0, self.b_k0, hint="k")
        pairs = []
        for i in range(0, len(self.b_k_off), 2):
            k = self.op2("add", lane_k, self.b_k_off[i], hint="k") if self.b_k_off[i] else lane_k
            pred = self.x_pred(m_ok, k)
            pairs.append(b.value("vload", [self.op2("add", row, k, hint="xi")] + ([pred] if pred is not None else []),
                                 VectorType(self.act, 2), {"buffer": "x", "size": 2}, hint="xp"))
        return b.value("frag_build", pairs, self.frag_b_stream, hint="fb")

    def b_fragment_elements(self, k_tile0: Value, mt: int) -> Value:
        """The B fragment element by element (a target whose B pairs do not run along K, as
        Metal's 8x8 pairs run along M): one activation load each, masked by M and K."""
        b = self.b
        rows = {col: self.x_row(mt, "xr", col) for col in self.b_n_cols}
        lane_k = self.op2("add", k_tile0, self.b_k0, hint="k")
        elems = []
        for k_off, col in zip(self.b_k_off, self.b_n_off):
            m_ok, row = rows[col]
            k = self.op2("add", lane_k, k_off, hint="k") if k_off else lane_k
            pred = self.x_pred(m_ok, k)
            elems.append(b.load("x", self.op2("add", row, k, hint="xi"), self.act, pred, hint="xe"))
        return b.value("frag_build", elems, self.frag_b_stream, hint="fb")

    def x_runs(self, k_vec0: Value, mt: int) -> list[Value] | dict[int, list[Value]]:
        """`x_run` of each M column offset the lane's B elements have (one: the run itself)."""
        if len(self.b_n_cols) == 1 and self.b_n_cols[0] == 0:
            return self.x_run(k_vec0, mt)
        return {col: self.x_run(k_vec0, mt, col) for col in self.b_n_cols}

    def x_run(self, k_vec0: Value, mt: int, col: int = 0) -> list[Value]:
        """This lane's activations for the chunk at dense K k_vec0, M tile mt and M column
        offset `col`, as vectors of x_vec elements: original K [k_vec0 + x_run0, + x_run) of
        row m (zero outside M, K)."""
        b = self.b
        m_ok, row = self.x_row(mt, "xi", col)
        start = self.op2("add", k_vec0, self.x_run0, hint="xk")
        row = self.op2("add", row, start, hint="xi")
        out = []
        for i in range(self.layout.x_run // self.x_vec):
            off = i * self.x_vec
            k = self.op2("add", start, off, hint="xk") if off and m_ok is not None else start
            pred = self.x_pred(m_ok, k)
            idx = self.op2("add", row, off, hint="xi") if off else row
            out.append(b.value("vload", [idx] + ([pred] if pred is not None else []),
                               VectorType(self.act, self.x_vec), {"buffer": "x", "size": self.x_vec}, hint="xv"))
        return out


__all__ = ["RegisterFetch"]
