"""Dispatch of `for` loops marked `specialise = n` on their trip count (seed 003).

A loop `for (i = 0; i < ub; i += 1)` with a dynamic `ub` that is known to be at most `n`
becomes

    switch ub  case 0: <the loop with ub = const 0>  ...  case n: <ub = const n>
               default: <the original dynamic loop>

so that `unroll` turns every case into straight-line code (seed 003's switch on the pattern
count into compile-time unrolled specialisations). The switch takes over the loop's result
values; the loop in the default region gets fresh ones. The attribute is removed from every
copy, so the pass is idempotent. Marked loops whose lb is not const 0 or whose step is not
const 1 are left alone with a note; a marked loop whose ub is already constant just loses the
attribute (unroll handles it).
"""
from __future__ import annotations

from ..ir.core import Block, Kernel, Op, Value
from ..ir.types import U32
from .manager import Namer, Pass, clone_op, make_const, register


@register
class SpecialisePass(Pass):
    name = "specialise"

    def run(self, kernel: Kernel, log: list[str]) -> None:
        self.namer = Namer(kernel)
        self.consts: dict[Value, object] = {}
        self.log = log
        self.count = 0
        self._block(kernel.body)
        log.append(f"specialise: {self.count} loops dispatched on their trip count")

    def _block(self, block: Block) -> None:
        for k, op in enumerate(block.ops):
            if op.name == "const" and op.results:
                self.consts[op.results[0]] = op.attrs.get("value")
            for region in op.regions:
                self._block(region)
            if op.name == "for" and "specialise" in op.attrs:
                replacement = self._specialise(op)
                if replacement is not None:
                    block.ops[k] = replacement

    def _const(self, v: Value) -> int | None:
        c = self.consts.get(v)
        return c if isinstance(c, int) and not isinstance(c, bool) else None

    def _specialise(self, op: Op) -> Op | None:
        lb, ub, step = op.operands[:3]
        n = op.attrs["specialise"]
        where = f"loop -> {', '.join('%' + r.name for r in op.results) or '(no results)'}"
        if self._const(ub) is not None:
            del op.attrs["specialise"]
            self.log.append(f"specialise: {where}: trip count already constant, attribute dropped")
            return None
        if self._const(lb) != 0 or self._const(step) != 1:
            self.log.append(f"specialise: {where} left dynamic: needs lb = const 0 and step = const 1")
            return None
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            self.log.append(f"specialise: {where} left dynamic: specialise = {n!r} is not a count")
            return None
        del op.attrs["specialise"]
        regions: list[Block] = []
        for t in range(n + 1):
            c = make_const(self.namer, t, U32)
            clone = clone_op(op, {}, self.namer)
            clone.operands[1] = c.results[0]
            regions.append(Block([], [c, clone, Op("yield", list(clone.results))]))
        fresh = [self.namer.value_like(r) for r in op.results]
        switch = Op("switch", [ub], list(op.results), {"cases": tuple(range(n + 1))}, regions)
        op.results = fresh
        regions.append(Block([], [op, Op("yield", list(fresh))]))
        self.count += 1
        return switch
