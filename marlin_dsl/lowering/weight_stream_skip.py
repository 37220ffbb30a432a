"""The weight stream that skips empty blocks (`WeightStream(skip_empty=True)`): seed 003's block
patterns as a kernel that neither reads nor multiplies an empty block.

The weights come in the target's skipping layout (`layouts/block_skip.py`): per block of the
format's block_n N rows only the K vectors holding a non-zero, block after block, with a
row-pointer table `vec_start` and each stored vector's K vector in `vec_k`. A warp's N tiles
lie in one block b, and its K warp wk takes the block's stored vectors
vec_start[b] + wk, + k_warps, .. < vec_start[b + 1]: the trip count of the loop is the
block's count of non-empty vectors, read once, so an empty vector costs nothing (the seed's
dispatch on a block's count, at the granularity of one 128-bit load per lane: a step's
unrolled body is the dense stream's, and the loop runs `count` of them).

Everything else is the dense stream's step (`WeightStreamLowering.step`): a stored vector is a
dense vector of the same N tiles, so the decode, the activations' B fragments (at the stored
vector's K, read with its weights a step or more ahead), the scales and the k-warps
reduction are shared. Every block stores at least one vector, so the prefetches clamp to
the block's last vector without a test for an empty list.
"""
from __future__ import annotations

from ..ir import U32, BufferParam, Value
from ..layouts.block_skip import skip_layout
from .weight_stream import WeightStreamLowering


class WeightStreamSkipLowering(WeightStreamLowering):
    """A weight stream over each block's stored vectors (the dense stream's step)."""

    def lower(self):
        self.skip = skip_layout(self.fmt, self.target, self.s.location)  # checked with the schedule
        assert self.skip.block_tiles % self.nsub == 0 and self.k_whole
        return super().lower()

    def step_range(self, wk: Value, wn: Value) -> tuple[Value, Value]:
        """The warp's block b (clamped to the last block: a warp past N computes rows no store
        reads) and its stored vectors [vec_start[b], vec_start[b + 1]); the prefetch clamp is
        the block's last stored vector."""
        bt = self.skip.block_tiles
        blocks = self.ceil_div(self.NT, bt)
        block = self.op2("div", self.n_tiles[0], bt, hint="bl") if bt > 1 else self.n_tiles[0]
        block = self.op2("min", block, self.op2("sub", blocks, 1, hint="bl"), hint="bl")
        # the warp's tiles inside its block (all of them when the warp owns the block)
        self.block_tile0 = None if bt == self.nsub else self.op2("rem", self.n_tiles[0], bt, hint="bt")
        start = self.b.load("vec_start", block, U32, hint="vs")
        end = self.b.load("vec_start", self.op2("add", block, 1, hint="bl"), U32, hint="ve")
        self.last_step = self.op2("sub", end, 1, hint="lk")
        return self.op2("add", start, wk, hint="ks"), end

    def extra_buffers(self) -> list[BufferParam]:
        return [BufferParam("vec_start", U32, "read"), BufferParam("vec_k", U32, "read")]

    def weight_layout(self) -> str:
        assert self.target.skip_layout is not None
        return self.target.skip_layout

    def fetch(self, ks: Value, clamp: bool = True, previous: list[Value] | None = None) -> list[Value]:
        """Stored vector ks's weight words and its K vector's scales, then that K vector and
        the next step's (the last two): what step ks reads, loaded a step or more ahead.
        The K vector comes from the fetch before (`previous`, which loaded it as its "next"),
        so the scales' addresses do not wait on a load issued in the same step: a warp issues
        in order, and a fresh `vec_k` load would stall it a memory latency every step."""
        if clamp:
            ks = self.op2("min", ks, self.last_step, hint="kc")
        kv = previous[-1] if previous is not None else self.b.load("vec_k", ks, U32, hint="kv")
        ahead = self.op2("min", self.op2("add", ks, self.pipeline.k_warps, hint="kn"), self.last_step, hint="kn")
        kv_next = self.b.load("vec_k", ahead, U32, hint="kv")
        out = self.fetch_words([ks])
        if self.prefetch_params:
            out += self.fetch_params(kv)
        return out + [kv, kv_next]

    def lane_slot(self, j: int, kv: Value, size: int, hint: str) -> tuple[Value, Value | None]:
        """This lane's `size` words of the warp's tile j in stored vector kv:
        qweight[stored vector][block tile][lane][size]; every stored vector exists."""
        bt = self.skip.block_tiles
        tile = j if self.block_tile0 is None else (
            self.op2("add", self.block_tile0, j, hint=hint) if j else self.block_tile0)
        slot = self.op2("add", self.op2("mul", kv, bt, hint=hint), tile, hint=hint) if bt > 1 else kv
        lane = self.op2("add", self.op2("mul", slot, self.layout.lanes, hint=hint), self.lane, hint=hint)
        return self.op2("mul", lane, size, hint=hint), None

    def step(self, ks: Value, fetched: list[Value], accs: list[Value],
             b_ahead: list[Value] | None = None) -> list[Value]:
        """The dense step at the stored vector's K vector (fetched with its words)."""
        return super().step(fetched[-2], fetched[:-2], accs, b_ahead)


__all__ = ["WeightStreamSkipLowering"]
