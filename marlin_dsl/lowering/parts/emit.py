"""The emitter helpers every lowering uses: constants, binary ops, counted and carried loops,
guarded blocks. SSA names come from the order of builder calls, so each helper emits in one
fixed order (the loop's induction variable and carried values first, then its bounds)."""
from __future__ import annotations

from typing import Callable, Sequence

from ...ir import U32, Builder, Value


class Emitter:
    """Builder plus the small helpers shared by all lowerings (kernel GEMMs, sparsify, the
    sparse activation GEMM)."""

    def __init__(self, builder: Builder | None = None) -> None:
        self.b = builder or Builder()

    def c(self, value: int) -> Value:
        return self.b.const(value)

    def op2(self, name: str, a: Value, x: Value | int | float, hint: str = "v") -> Value:
        return self.b.binary(name, a, x, hint=hint)

    def ceil_div(self, a: Value, d: int) -> Value:
        return self.op2("div", self.op2("add", a, d - 1, hint="cd"), d, hint="cd")

    def bound(self, v: Value | int) -> Value:
        return v if isinstance(v, Value) else self.c(v)

    def carried_for(self, begin: Value | int, end: Value | int, step: Value | int,
                    carried: Sequence[tuple[str, Sequence[Value]]],
                    body: Callable[[Value, list[list[Value]]], Sequence[Value] | None],
                    iv_hint: str, hint: str = "v") -> list[Value]:
        """`for iv in [begin, end) by step` carrying the groups of `carried` (hint, initial
        values); body(iv, carried groups) emits the body and returns the values it yields (in
        the groups' order). Returns the loop's results, flat."""
        b = self.b
        iv = b.fresh(iv_hint, U32)
        groups = [[b.fresh(h, v.type) for v in values] for h, values in carried]
        inits = [v for _, values in carried for v in values]
        loop = b.op("for", [self.bound(begin), self.bound(end), self.bound(step), *inits],
                    [v.type for v in inits], hint=hint)
        with b.region([iv, *(v for g in groups for v in g)]) as region:
            loop.regions.append(region)
            b.yield_(*(body(iv, groups) or ()))
        return loop.results

    def prefetched_loop(self, accs: list[Value], count: Value,
                        fetch: Callable[[Value, Value], list[Value]],
                        compute: Callable[[list[Value], list[Value]], list[Value]]) -> list[Value]:
        """for kt in 0 .. count: `compute(accumulators, step kt's loads)` while step kt + 1's
        loads are issued (`fetch(kt, in range)`: register double buffering, the loads carried
        round the loop); returns the final accumulators."""
        first = fetch(self.b.const(0), self.op2("lt", self.b.const(0), count, hint="has"))

        def body(kt: Value, carried: list[list[Value]]) -> list[Value]:
            carried_acc, carried_ld = carried
            nxt = self.op2("add", kt, 1, hint="nk")
            fetched = fetch(nxt, self.op2("lt", nxt, count, hint="has"))
            return [*compute(carried_acc, carried_ld), *fetched]

        results = self.carried_for(0, count, 1, [("acc", accs), ("ld", first)], body, iv_hint="kt", hint="acc")
        return results[:len(accs)]

    def counted_loop(self, trip: int, body: Callable[[Value], None], hint: str = "i") -> None:
        """A constant-trip `for` without carried values (the unroll pass unrolls it)."""
        self.carried_for(0, trip, 1, [], lambda iv, _: body(iv), iv_hint=hint)

    def guarded(self, cond: Value, emit: Callable[[], None]) -> None:
        """if (cond) { emit() } with no results."""
        b = self.b
        op = b.op("if", [cond], [])
        with b.region() as then:
            op.regions.append(then)
            emit()
            b.yield_()
        with b.region() as other:
            op.regions.append(other)
            b.yield_()

    def branch(self, cond: Value, then: Callable[[], None], other: Callable[[], None]) -> None:
        """if (cond) { then() } else { other() } with no results."""
        b = self.b
        op = b.op("if", [cond], [])
        for emit_region in (then, other):
            with b.region() as region:
                op.regions.append(region)
                emit_region()
                b.yield_()


__all__ = ["Emitter"]
