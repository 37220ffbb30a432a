"""The threadgroup stage buffers of the multistage pipeline, whichever operand source fills
them (`async_stages.py`: asynchronous copies; `register_stages.py`: loads into registers, then
stores): how a copy is split into per-thread pieces (`per_thread`), and the warps' reads back
from a stage: weight vectors, 2:4 metadata, and B fragments from the activation tile as each
lane's run (the layout's K shuffle, `LazyRun`), as (row, adjacent K) pairs, or as a tile loaded
by the warp (a target whose B pairs run along M, as Metal's 8x8). Needs the stream setup
(`stream_family.py`) and the lowering's stage sizes (`x_ld`, `x_stage`, `m_stage`, `x_vec`,
`vectors`)."""
from __future__ import annotations

from ...ir import U32, Value, VectorType
from .context import GemmParts


class StageBuffers(GemmParts):
    """The steps, per-thread pieces of a stage's copy, and the reads back from a stage."""

    vectors: int  # K vectors per step (the lowering's)

    def setup_steps(self) -> None:
        """KS, the K steps (after `stream_setup`): KV vectors, `vectors` a step (several only
        inside one scale group, which K is a multiple of)."""
        self.KS = self.KV if self.vectors == 1 else self.op2("div", self.KV, self.vectors, hint="ks")

    def step_vector(self, ks: Value) -> Value:
        """The first K vector of step ks."""
        return ks if self.vectors == 1 else self.op2("mul", ks, self.vectors, hint="kv")

    def per_thread(self, total: int, body) -> None:
        """body(e, inside) for e = i * threads + tid over [0, total), unrolled (inside is None
        where every thread's e is in range)."""
        for i in range(-(-total // self.threads)):
            e = self.op2("add", self.tid, i * self.threads, hint="e") if i else self.tid
            inside = None if (i + 1) * self.threads <= total else self.op2("lt", e, total, hint="ein")
            body(e, inside)

    def meta_words(self, slot: Value | None, j: int, v: int = 0) -> Value:
        """This lane's 2:4 metadata of the warp's N tile j and the step's vector v from stage
        `slot` (None: the only one)."""
        lanes, size = self.layout.lanes, self.layout.meta_words
        tile = self.op2("add", self.warp_tile0, j, hint="mi") if j else self.warp_tile0
        if self.vectors > 1:  # [N tile][vector][lane][words]
            tile = self.op2("add", self.op2("mul", tile, self.vectors, hint="mi"), v, hint="mi")
        base = None if slot is None else self.op2("mul", slot, self.m_stage, hint="mi")
        lane = self.op2("mul", self.op2("add", self.op2("mul", tile, lanes, hint="mi"), self.lane, hint="mi"),
                        size, hint="mi")
        idx = lane if base is None else self.op2("add", base, lane, hint="mi")
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

    def shared_b_tile(self, tile_row: Value, k_tile0: int) -> Value:
        """A B fragment loaded by the warp as one tile (`frag_load`, transposed: B's K runs
        along a stage row), where there is no K shuffle and the target's B pairs do not run
        along K (Metal's 8x8 pairs run along M: element by element would be two loads and two
        index adds per fragment). `tile_row`: the stage index of the M tile's first row."""
        idx = self.op2("add", tile_row, k_tile0, hint="xt") if k_tile0 else tile_row
        return self.b.value("frag_load", [idx], self.frag_b_stream,
                            {"buffer": "x_s", "ld": self.x_ld, "transpose": True}, hint="fb")

    def lane_runs(self, row: Value) -> "LazyRun | dict[int, LazyRun]":
        """This lane's activation run(s) for the M tile whose lane row starts at `row`: one
        run, or one per M column offset of the lane's B elements (Metal's pairs run along M)."""
        if self.b_n_cols == (0,):
            return LazyRun(self, row)
        return {col: LazyRun(self, self.op2("add", row, col * self.x_ld, hint="xr") if col else row)
                for col in self.b_n_cols}


class LazyRun:
    """A lane's activation run for one M tile, indexed like a list of vectors, each vector
    loaded from shared memory at its first use."""

    def __init__(self, lowering: StageBuffers, row: Value) -> None:
        self.lowering = lowering
        self.start = lowering.op2("add", row, lowering.x_run0, hint="xi")
        self.vectors: dict[int, Value] = {}

    def __getitem__(self, i: int) -> Value:
        if i not in self.vectors:
            self.vectors[i] = self.lowering.shared_run_vector(self.start, i)
        return self.vectors[i]


__all__ = ["LazyRun", "StageBuffers"]
