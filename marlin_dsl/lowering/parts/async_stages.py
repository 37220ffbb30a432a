"""Operand source of the multistage pipeline: asynchronous copies of each K step's weight
vectors, sparse metadata and activation tile into shared-memory stages (`issue`: one group per
step), and the warps' reads back from a stage (weight vectors, metadata, activation runs or
pairs). Needs the stream setup (`stream_family.py`) and the lowering's stage sizes (`x_ld`,
`x_stage`, `w_stage`, `m_stage`, `x_copy`, `n_stages`, `block_tiles`)."""
from __future__ import annotations

from ...ir import U32, Value, VectorType
from ...layouts.weight_stream import VECTOR_WORDS
from .context import GemmParts


class AsyncStages(GemmParts):
    """Copies into the stages and reads back from them."""

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

    def async_copy(self, dst: Value, src: Value, pred: Value | None, shared: str, buffer: str, size: int,
                   inside: Value | None) -> None:
        def copy() -> None:  # pred None: the source always exists
            operands = [dst, src] if pred is None else [dst, src, pred]
            self.b.op("async_copy", operands, attrs={"dst": shared, "src": buffer, "size": size})

        if inside is None:
            copy()
        else:  # threads past the end issue nothing (an if, so no copy is started for them)
            self.guarded(inside, copy)

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


class LazyRun:
    """A lane's activation run for one M tile, indexed like a list of vectors, each vector
    loaded from shared memory at its first use."""

    def __init__(self, lowering: AsyncStages, row: Value) -> None:
        self.lowering = lowering
        self.start = lowering.op2("add", row, lowering.x_run0, hint="xi")
        self.vectors: dict[int, Value] = {}

    def __getitem__(self, i: int) -> Value:
        if i not in self.vectors:
            self.vectors[i] = self.lowering.shared_run_vector(self.start, i)
        return self.vectors[i]



__all__ = ["AsyncStages", "LazyRun"]
