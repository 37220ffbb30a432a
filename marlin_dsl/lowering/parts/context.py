"""The lowering context of one Gemm on one target, created once by `lower_gemm`: the builder,
the gemm, format, schedule, pipeline and target, the activation and fragment types, and (as a
lowering emits them, in its own order) the thread indices and the M, N, K scalars.

`GemmParts` is the base of every pipeline lowering and of the parts it is assembled from: it
holds the context and reads through to it, so a part's code says `self.M`, `self.op2(...)`."""
from __future__ import annotations

from dataclasses import dataclass

from ...ir import F32, FragmentType, ScalarType, Value
from ...machine.target import Target
from ...schedule import Gemm
from .emit import Emitter


@dataclass
class Tile:
    """Where the current output tile starts (M row, N column)."""

    m0: Value
    n0: Value


class GemmContext(Emitter):
    """What every part of a Gemm's lowering shares."""

    def __init__(self, gemm: Gemm, target: Target) -> None:
        super().__init__()
        self.gemm, self.target = gemm, target
        self.fmt, self.s = gemm.format, gemm.schedule
        self.s.check(self.fmt, target)
        self.pipeline = self.s.pipeline
        self.act = ScalarType(gemm.activation)
        self.threads = self.s.threads(target)
        self.warp_m_tile, self.warp_n_tile = self.s.warp_tile
        self.grid_m, self.grid_n = self.s.mma_grid(target)
        mm, mn, mk = target.mma
        self.frag_a = FragmentType("a", self.act, mm, mk)
        self.frag_b = FragmentType("b", self.act, mk, mn)
        self.frag_c = FragmentType("c", F32, mm, mn)
        self.tid: Value | None = None
        self.warp: Value | None = None
        self.lane: Value | None = None
        self.M: Value | None = None
        self.N: Value | None = None
        self.K: Value | None = None

    def emit_indices(self, *kinds: str) -> None:
        """Emit the thread indices `kinds` (tid, warp, lane), in that order, then M, N, K."""
        for kind in kinds:
            setattr(self, kind, self.b.index(kind))
        self.M, self.N, self.K = self.b.scalar("M"), self.b.scalar("N"), self.b.scalar("K")

    def zero_accumulators(self, count: int) -> list[Value]:
        return [self.b.value("frag_zero", [], self.frag_c, hint="acc") for _ in range(count)]


class GemmParts:
    """Base of a pipeline lowering and its parts: state of the context reads through (names
    not found on the lowering itself are looked up on `ctx`)."""

    ctx: GemmContext

    def __init__(self, ctx: GemmContext) -> None:
        self.ctx = ctx

    def __getattr__(self, name: str):
        if name == "ctx":
            raise AttributeError(name)
        return getattr(self.ctx, name)


__all__ = ["GemmContext", "GemmParts", "Tile"]
