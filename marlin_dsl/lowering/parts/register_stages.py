"""Operand source of the multistage pipeline on a target without asynchronous copies
(`Target.async_copy_bytes` = 0: Metal). The classic software pipeline of MLX's steel GEMM
loaders (`BlockLoader::load_unsafe` into registers, `threadgroup_barrier`, store): step kv+1's
activation tile, weight vectors and 2:4 metadata are loaded from device memory into registers
(`load_step`) while step kv computes from threadgroup memory, then stored into a threadgroup
buffer (`store_step`); the lowering places the barriers (`lowering/multistage.py`). The warps
read a buffer back with `stage_buffers.py`, exactly as from an asynchronous stage.

A thread's pieces are rows r0, r0 + R, r0 + 2R, .. of the activation tile at one K offset
(R = threads / pieces per row), and its lane of N tiles warp, warp + warps, .. of a per-lane
array (with several vectors a step, its piece of every few tiles): so each piece's device
index is the previous one's plus a loop-invariant stride, and its threadgroup index the first
one's plus a constant. The store side recomputes its indices from the thread index
(loop-invariant ops), so no index is live across the step's MMAs, only the loaded vectors.

Reads are clamped where that keeps them valid, so the loop's loads need no predicate: rows
past M read row M - 1 and N tiles past the end the last tile (those rows and columns of the
product are never stored); the step is clamped by the caller. Only K positions past K read
zeros (a predicate), where K is not a whole number of steps (`k_whole`)."""
from __future__ import annotations

from ...errors import CompileError
from ...ir import U32, Value, VectorType
from ...layouts.weight_stream import VECTOR_WORDS
from .stage_buffers import StageBuffers


class RegisterStages(StageBuffers):
    """Device -> registers -> threadgroup buffer copies of one K step (needs the stream setup
    with `clamp`, and the lowering's `x_copy`, `x_ld`, `x_stage`, `w_stage`, `m_stage`,
    `block_tiles`, `last_m`)."""

    def load_step(self, kv: Value) -> list[Value]:
        """Step kv's pieces, in registers (kv < KV: the caller clamps)."""
        out: list[Value] = []
        self.load_x(kv, out)
        self.load_lanes(kv, "qweight", VECTOR_WORDS, out)
        if self.sparse:
            self.load_lanes(kv, "meta", self.layout.meta_words, out)
        return out

    def store_step(self, values: list[Value], slot: Value | None) -> None:
        """`load_step`'s pieces into buffer `slot` (None: the only buffer)."""
        rest = iter(values)

        def base(stage: int, hint: str) -> Value | None:
            return None if slot is None else self.op2("mul", slot, stage, hint=hint)

        self.store_x(base(self.x_stage, "xs"), rest)
        self.store_lanes("w_s", VECTOR_WORDS, base(self.w_stage, "ws"), rest)
        if self.sparse:
            self.store_lanes("meta_s", self.layout.meta_words, base(self.m_stage, "ms"), rest)

    # ----- the activation tile: tile_m rows x the step's K, in pieces of x_copy ------------------

    @property
    def x_per_row(self) -> int:
        """Pieces of one activation row of a step."""
        return self.s.tile_k // self.x_copy

    def x_rounds(self) -> tuple[int, int]:
        """(rounds, rows per round): a thread's pieces are rows r0 + i * (rows per round) at
        one K offset. Where the threads are not a whole number of rows of pieces (a 3-bit
        layout's step of 160 K is 40 pieces), the last threads % pieces-per-row threads copy
        nothing (`x_idle`): their loads read a valid row, their stores are predicated off."""
        per_round = self.threads // self.x_per_row
        if not per_round:
            raise CompileError(f"multistage: {self.threads} threads cannot copy one activation row of "
                               f"{self.x_per_row} pieces; use more warps")
        return -(-self.s.tile_m // per_round), per_round

    def x_idle(self) -> Value | None:
        """The predicate of the threads that copy activations (None: all of them do)."""
        used = self.threads // self.x_per_row * self.x_per_row
        return None if used == self.threads else self.op2("lt", self.tid, used, hint="xact")

    def x_thread(self) -> tuple[Value, Value]:
        """(row r0 in the tile, K offset in the step) of this thread's first piece."""
        r0 = self.op2("div", self.tid, self.x_per_row, hint="r")
        kc = self.op2("mul", self.op2("rem", self.tid, self.x_per_row, hint="c"), self.x_copy, hint="kc")
        return r0, kc

    def load_x(self, kv: Value, out: list[Value]) -> None:
        """Piece i reads row min(m0 + r0 + i * per_round, M - 1): one add for its index from
        the previous piece's and one min against the last row's (a row past M is read as
        row M - 1), no predicate where K is whole steps."""
        rounds, per_round = self.x_rounds()
        r0, kc = self.x_thread()
        k = self.op2("add", self.op2("mul", kv, self.s.tile_k, hint="kx"), kc, hint="k")
        src = self.op2("add", self.op2("mul", self.op2("add", self.m0, r0, hint="m"), self.K, hint="xi"), k, hint="xi")
        last = self.op2("add", self.op2("mul", self.last_m, self.K, hint="xl"), k, hint="xl")
        stride = self.op2("mul", self.K, per_round, hint="xt") if rounds > 1 else None
        pred = None if self.k_whole else self.op2("lt", k, self.K, hint="kok")
        for i in range(rounds):
            if i:
                src = self.op2("add", src, stride, hint="xi")  # type: ignore[arg-type]
            out.append(self.load_vector("x", self.b.binary("min", src, last, hint="xi"), self.act, self.x_copy,
                                        pred, "xr"))

    def store_x(self, base: Value | None, values) -> None:
        rounds, per_round = self.x_rounds()
        r0, kc = self.x_thread()
        dst = self.offset(base, self.op2("add", self.op2("mul", r0, self.x_ld, hint="xd"), kc, hint="xd"), "xd")
        active = self.x_idle()
        for i in range(rounds):
            inside = None if (i + 1) * per_round <= self.s.tile_m else \
                self.op2("lt", r0, self.s.tile_m - i * per_round, hint="xin")
            if active is not None:
                inside = active if inside is None else self.op2("and", inside, active, hint="xin")
            idx = self.op2("add", dst, i * per_round * self.x_ld, hint="xd") if i else dst
            self.store_vector("x_s", idx, next(values), self.x_copy, inside)

    # ----- per-lane arrays: the block's N tiles x 32 lanes x words -------------------------------

    def lane_rounds(self) -> tuple[int, int, int]:
        """(rounds, tiles per round, pieces per tile): a tile's pieces are its `vectors` x 32
        lanes (contiguous in the array and in the stage), and threads cover whole tiles a
        round: this thread's pieces are piece r0 of tiles t0 + i * (tiles per round)."""
        run = self.vectors * self.layout.lanes
        if self.threads % run:
            raise CompileError(f"multistage: {self.threads} threads do not copy whole N tiles of {run} "
                               "vectors (vectors per step x 32 lanes); use more warps or fewer vectors")
        per_round = self.threads // run
        return -(-self.block_tiles // per_round), per_round, run

    def lane_thread(self) -> tuple[Value, Value]:
        """(tile t0, piece r0 in the tile) of this thread's first piece: its warp and lane
        where a step holds one vector."""
        if self.vectors == 1:
            return self.warp, self.lane
        _, _, run = self.lane_rounds()
        return self.op2("div", self.tid, run, hint="t"), self.op2("rem", self.tid, run, hint="l")

    def load_lanes(self, kv: Value, src: str, words: int, out: list[Value]) -> None:
        """The step's per-lane vectors of `src` ([n_tile][k_vector][lane][words]) for the
        block's N tiles, this thread's piece of tiles t0 + i * (tiles per round); tiles past
        N read the last tile (valid contents, never stored): one add and one min per piece."""
        lanes = self.layout.lanes
        rounds, per_round, _ = self.lane_rounds()
        t0, r0 = self.lane_thread()
        step = self.op2("mul", self.step_vector(kv), lanes * words, hint="wk")

        def index(tile: Value) -> Value:
            row = self.op2("add", self.op2("mul", self.op2("mul", tile, self.KV, hint="wi"), lanes, hint="wi"),
                           r0, hint="wi")
            return self.op2("add", self.op2("mul", row, words, hint="wi"), step, hint="wi")

        idx = index(self.op2("add", self.block_nt0, t0, hint="nt"))
        last = index(self.last_tile)
        stride = self.op2("mul", self.KV, per_round * lanes * words, hint="wt") if rounds > 1 else None
        hint = "qw" if src == "qweight" else "mw"
        for i in range(rounds):
            if i:
                idx = self.op2("add", idx, stride, hint="wi")  # type: ignore[arg-type]
            out.append(self.load_vector(src, self.b.binary("min", idx, last, hint="wi"), U32, words, None, hint))

    def store_lanes(self, dst: str, words: int, base: Value | None, values) -> None:
        rounds, per_round, _ = self.lane_rounds()
        t0, _ = self.lane_thread()
        first = self.offset(base, self.op2("mul", self.tid, words, hint="wd"), "wd")
        for i in range(rounds):
            inside = None if (i + 1) * per_round <= self.block_tiles else \
                self.op2("lt", t0, self.block_tiles - i * per_round, hint="tin")
            idx = self.op2("add", first, i * self.threads * words, hint="wd") if i else first
            self.store_vector(dst, idx, next(values), words, inside)

    def offset(self, base: Value | None, index: Value, hint: str) -> Value:
        return index if base is None else self.op2("add", base, index, hint=hint)

    def load_vector(self, buffer: str, index: Value, elem, size: int, pred: Value | None, hint: str) -> Value:
        """`size` elements of device buffer `buffer` (0 where `pred` is false)."""
        if size == 1:
            return self.b.load(buffer, index, elem, pred, hint=hint)
        return self.b.value("vload", [index] + ([pred] if pred is not None else []), VectorType(elem, size),
                            {"buffer": buffer, "size": size}, hint=hint)

    def store_vector(self, buffer: str, index: Value, value: Value, size: int, pred: Value | None) -> None:
        """One store of `size` elements into shared array `buffer` (where `pred`)."""
        if size == 1:
            self.b.store(buffer, index, value, pred)
            return
        self.b.op("vstore", [index, value] + ([pred] if pred is not None else []),
                  attrs={"buffer": buffer, "size": size})


__all__ = ["RegisterStages"]
