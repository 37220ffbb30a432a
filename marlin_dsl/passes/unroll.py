"""Full unrolling of `for` loops whose bounds and step are `const` ops.

Loops with more than `max_trip` iterations stay, and so do loops that never end (step 0) or
whose index would wrap past 2^32 (run-time errors the unrolled code would hide). The body is cloned once per iteration with
fresh deterministic names: the index argument becomes a `const` of the iteration's index, the
carried arguments the values carried in (the loop's inits, then the previous clone's yield),
and the loop's results are replaced by the last yield (the inits when the loop runs zero
times). Loops are unrolled outer first, and the clones are unrolled in turn, so an inner loop
whose bounds are constants (or the outer index itself) is unrolled too; inner bounds computed
from the outer index need `fold` first (run unroll, fold, unroll). Dynamic loops stay and
their bodies are still visited.
"""
from __future__ import annotations

from ..ir.core import Block, Kernel, Op, Value
from ..ir.types import U32
from .manager import Namer, Pass, clone_op, make_const, name_hint, register, resolve

U32_MASK = (1 << 32) - 1


def trip_values(lb: int, ub: int, step: int, limit: int) -> list[int] | None:
    """The index values of `for (i = lb; i < ub; i += step)` in u32, or None past `limit`
    or when the index would wrap past 2^32 (a run-time error that unrolling must not hide)."""
    values: list[int] = []
    i = lb
    while i < ub:
        if len(values) == limit:
            return None
        values.append(i)
        i += step
        if i > U32_MASK:
            return None
    return values


@register
class UnrollPass(Pass):
    name = "unroll"

    def __init__(self, max_trip: int = 64) -> None:
        self.max_trip = max_trip

    def run(self, kernel: Kernel, log: list[str]) -> None:
        self.namer = Namer(kernel)
        self.mapping: dict[Value, Value] = {}
        self.consts: dict[Value, int] = {}
        self.unrolled = self.iterations = self.kept = 0
        kernel.body.ops = self._ops(kernel.body.ops)
        log.append(f"unroll: {self.unrolled} loops unrolled into {self.iterations} iterations, "
                   f"{self.kept} loops kept (dynamic or over {self.max_trip} iterations)")

    def _ops(self, ops: list[Op]) -> list[Op]:
        out: list[Op] = []
        for op in ops:
            op.operands = [resolve(self.mapping, v) for v in op.operands]
            if op.name == "const" and op.results and op.results[0].type == U32:
                value = op.attrs.get("value")
                if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U32_MASK:
                    self.consts[op.results[0]] = value
            if op.name == "for":
                trips = self._trips(op)
                if trips is not None:
                    self.unrolled += 1
                    self.iterations += len(trips)
                    out.extend(self._ops(self._expand(op, trips)))
                    continue
                self.kept += 1
            for region in op.regions:
                region.ops = self._ops(region.ops)
            out.append(op)
        return out

    def _trips(self, op: Op) -> list[int] | None:
        bounds = [self.consts.get(v) for v in op.operands[:3]]
        if any(b is None for b in bounds):
            return None
        lb, ub, step = bounds
        return trip_values(lb, ub, step, self.max_trip)  # type: ignore[arg-type]

    def _expand(self, op: Op, trips: list[int]) -> list[Op]:
        body: Block = op.regions[0]
        index, carried_args = body.args[0], body.args[1:]
        carried = list(op.operands[3:])
        out: list[Op] = []
        for i in trips:
            c = make_const(self.namer, i, U32, hint=name_hint(index.name))
            out.append(c)
            vmap: dict[Value, Value] = {index: c.results[0], **dict(zip(carried_args, carried))}
            for inner in body.ops[:-1]:
                out.append(clone_op(inner, vmap, self.namer))
            carried = [vmap.get(v, v) for v in body.ops[-1].operands]
        for r, v in zip(op.results, carried):
            self.mapping[r] = v
        return out
