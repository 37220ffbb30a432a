"""Operand source of the weight stream on a target with asynchronous copies
(`WeightStream(stages=S)`, CUDA's cp.async): each lane copies its own weight words (and sparse
metadata) into a per-warp ring of S shared-memory slots, S - 1 steps ahead of the step that
decodes them, and reads them back from its own slot. The group parameters (scales, zero
points) stay in registers (`RegisterFetch.fetch`, `depth` steps ahead).

Why: the register fetch holds every prefetched step's words in registers (4 a vector and N
tile), so fetching further ahead costs occupancy (at M = 16, 68 registers instead of 60 left
one 512-thread block per SM instead of two). Bytes in flight in the ring cost shared memory
only, which the weight stream barely uses. Measured on the H100 it was 11-22% slower than the
register fetch at M = 1 and 16 (its copies, addresses and shared reads add instructions to an
issue-bound loop; bench/results/issue15_h100_2026-11-27e): a schedule option to sweep
(`bench/probes/decode_sweep.py --stages`), which `tuned_schedule` does not pick.

No barrier is needed: a lane reads only the words it copied itself, after an `async_wait`
that retires its own copy (per-thread completion), and it overwrites a slot only after the
step that read it (program order). Copies past the warp's last step read the last step
clamped (or are zero-filled where loads are predicated); the loop ends with `async_wait 0`
so that no copy is in flight when the warps reduce."""
from __future__ import annotations

from ...ir import SharedArray, U32, Value, VectorType
from .registers import RegisterFetch


class RingFetch(RegisterFetch):
    """Weight words through a per-warp ring of shared slots (`stages` > 0)."""

    stages: int = 0  # 0 until setup_ring: the register fetch
    ring_arrays: tuple[SharedArray, ...] = ()

    def fetch_words(self, kvs: list[Value]) -> list[Value]:
        """With the ring the words come from `read_ring`, not from `fetch`."""
        return [] if self.stages else super().fetch_words(kvs)

    def setup_ring(self, stages: int) -> None:
        """The ring's sizes (after `setup_fetch`): per step and warp, every vector's and N
        tile's words for the 32 lanes (and as much metadata)."""
        self.stages = stages
        lanes = self.layout.lanes
        self.ring_w = self.vectors * self.nsub * lanes * self.layout.code_words  # words a step
        self.ring_m = self.vectors * self.nsub * lanes * self.layout.meta_words if self.layout.has_meta else 0
        warps = self.pipeline.warps(self.s)
        self.ring_arrays = (SharedArray("w_ring", U32, warps * stages * self.ring_w),) + (
            (SharedArray("m_ring", U32, warps * stages * self.ring_m),) if self.ring_m else ())
        self.ring_warp_w = self.op2("mul", self.warp, stages * self.ring_w, hint="rw")
        self.ring_warp_m = self.op2("mul", self.warp, stages * self.ring_m, hint="rm") if self.ring_m else None

    def ring_slot(self, ks: Value) -> Value:
        """Step ks's slot: its place in the warp's sequence (wk + i * k_warps, wk < k_warps)
        modulo the ring."""
        return self.op2("rem", self.op2("div", ks, self.pipeline.k_warps, hint="ri"), self.stages, hint="slot")

    def ring_index(self, slot: Value, piece: int, words: int, per_step: int, warp_base: Value) -> Value:
        """This lane's first word of piece `piece` (vector v, N tile j: v * nsub + j) in a slot."""
        step0 = self.op2("add", warp_base, self.op2("mul", slot, per_step, hint="rs"), hint="rs")
        lane = self.op2("mul", self.lane, words, hint="rl")
        first = piece * self.layout.lanes * words
        at = self.op2("add", step0, first, hint="rs") if first else step0
        return self.op2("add", at, lane, hint="ri")

    def issue_ring(self, ks: Value) -> None:
        """Copy step ks's words (clamped: step min(ks, KS - 1); predicated: zeros past the
        end) into its slot, as one committed group."""
        slot = self.ring_slot(ks)
        src_ks = self.op2("min", ks, self.last_step, hint="kc") if self.clamped else ks
        kvs = self.step_vectors(src_ks)
        lay = self.layout
        for v, kv in enumerate(kvs):
            for j in range(self.nsub):
                piece = v * self.nsub + j
                self.ring_copy(j, kv, lay.code_words, "qweight", "w_ring",
                               self.ring_index(slot, piece, lay.code_words, self.ring_w, self.ring_warp_w))
                if self.ring_m:
                    self.ring_copy(j, kv, lay.meta_words, "meta", "m_ring",
                                   self.ring_index(slot, piece, lay.meta_words, self.ring_m, self.ring_warp_m))
        self.b.op("async_commit")

    def ring_copy(self, j: int, kv: Value, words: int, src: str, dst: str, at: Value) -> None:
        idx, pred = self.lane_slot(j, kv, words, "wi")
        operands = [at, idx] + ([pred] if pred is not None else [])
        self.b.op("async_copy", operands, attrs={"dst": dst, "src": src, "size": words})

    def read_ring(self, ks: Value) -> list[Value]:
        """Step ks's words, after the wait that retires its copy: in `fetch`'s order (every
        vector's N tiles' words, then their metadata). A sparse tile past N reads the
        clamped last tile's metadata (valid fields); where copies are predicated its copy is
        zero-filled and `idle_if_absent` gives its MMA valid fields instead (its rows are
        never stored)."""
        self.b.op("async_wait", attrs={"pending": self.stages - 1})
        slot = self.ring_slot(ks)
        lay = self.layout
        pieces = range(self.vectors * self.nsub)
        out = [self.ring_load("w_ring", self.ring_index(slot, p, lay.code_words, self.ring_w, self.ring_warp_w),
                              lay.code_words, "qw") for p in pieces]
        if self.ring_m:
            out += [self.idle_if_absent(p % self.nsub, self.ring_load(
                "m_ring", self.ring_index(slot, p, lay.meta_words, self.ring_m, self.ring_warp_m),
                lay.meta_words, "meta")) for p in pieces]
        return out

    def idle_if_absent(self, j: int, meta: Value) -> Value:
        """Predicated copies: an absent N tile's zero-filled metadata replaced by the target's
        idle metadata (`idle_unless`), as `RegisterFetch.load_meta` does (a scattered
        layout's 0 selects no kept value: kept)."""
        if self.clamped or self.layout.scatter is not None:
            return meta
        return self.idle_unless(self.tile_ok[j], meta)

    def ring_load(self, shared: str, idx: Value, words: int, hint: str) -> Value:
        if words == 1:
            return self.b.load(shared, idx, U32, hint=hint)
        return self.b.value("vload", [idx], VectorType(U32, words), {"buffer": shared, "size": words}, hint=hint)


__all__ = ["RingFetch"]
