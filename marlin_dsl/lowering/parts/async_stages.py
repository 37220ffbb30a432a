"""Operand source of the multistage pipeline on a target with asynchronous copies
(`Target.async_copy_bytes`, CUDA's cp.async): each K step's weight vectors, sparse metadata and
activation tile copied into shared-memory stages (`issue`: one group per step); the warps read
them back with `stage_buffers.py`. Needs the stream setup (`stream_family.py`) and the
lowering's stage sizes (`x_ld`, `x_stage`, `w_stage`, `m_stage`, `x_copy`, `n_stages`,
`block_tiles`). A target without asynchronous copies stages through registers instead
(`register_stages.py`)."""
from __future__ import annotations

from ...ir import Value
from ...layouts.weight_stream import VECTOR_WORDS
from .stage_buffers import LazyRun, StageBuffers


class AsyncStages(StageBuffers):
    """Asynchronous copies into the stages."""

    def issue(self, kv: Value) -> None:
        """Start the copies of step kv into slot kv % stages, as one group (steps past the
        end of K copy nothing useful: their group is zero-filled and never read)."""
        slot = self.op2("rem", kv, self.n_stages, hint="slot")
        in_k = self.op2("lt", kv, self.KS, hint="kok")
        self.copy_x(kv, slot)
        self.copy_lanes(kv, slot, in_k, "qweight", "w_s", VECTOR_WORDS, self.w_stage)
        if self.sparse:
            self.copy_lanes(kv, slot, in_k, "meta", "meta_s", self.layout.meta_words, self.m_stage)
        self.b.op("async_commit")

    def copy_x(self, kv: Value, slot: Value) -> None:
        """The step's activation tile: tile_m rows x tile_k K, in pieces of x_copy elements."""
        s = self.s
        per_row = s.tile_k // self.x_copy
        k_step0 = self.op2("mul", kv, s.tile_k, hint="kx")
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
        block's N tiles; tiles past N read the last tile (valid contents, never stored). A
        tile's `vectors` consecutive vectors of the step are contiguous in `src` and in the
        stage: one run of vectors x lanes pieces per tile."""
        run = self.vectors * self.layout.lanes
        base = self.op2("mul", slot, stage, hint="ws")
        kv0 = self.step_vector(kv)

        def piece(e: Value, inside: Value | None) -> None:
            t, lane = self.op2("div", e, run, hint="t"), self.op2("rem", e, run, hint="l")
            nt = self.b.binary("min", self.op2("add", self.block_nt0, t, hint="nt"), self.last_tile, hint="nt")
            slot_i = self.op2("add", self.op2("mul", nt, self.KV, hint="wi"), kv0, hint="wi")
            src_i = self.op2("mul", self.op2("add", self.op2("mul", slot_i, self.layout.lanes, hint="wi"), lane, hint="wi"),
                             words, hint="wi")
            dst_i = self.op2("add", base, self.op2("mul", e, words, hint="wd"), hint="wd")
            self.async_copy(dst_i, src_i, in_k, dst, src, words, inside)

        self.per_thread(self.block_tiles * run, piece)

    def async_copy(self, dst: Value, src: Value, pred: Value | None, shared: str, buffer: str, size: int,
                   inside: Value | None) -> None:
        def copy() -> None:  # pred None: the source always exists
            operands = [dst, src] if pred is None else [dst, src, pred]
            self.b.op("async_copy", operands, attrs={"dst": shared, "src": buffer, "size": size})

        if inside is None:
            copy()
        else:  # threads past the end issue nothing (an if, so no copy is started for them)
            self.guarded(inside, copy)


__all__ = ["AsyncStages", "LazyRun"]
