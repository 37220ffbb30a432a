"""Common subexpression elimination of pure ops (`const`, `index`, `scalar` included).

Two ops are the same expression when they have the same name, attributes, operands (in any
order for commutative ops) and result types. A later op is replaced by an earlier one only
when the earlier definition is visible at the later op: earlier in the same block or in an
enclosing block (an op in a nested region may reuse a definition from outside, never the other
way round, and sibling regions do not share).
"""
from __future__ import annotations

from collections import ChainMap

from ..ir.core import Block, Kernel, Op, Value
from ..ir.ops import OPS
from .manager import Pass, register, resolve

Key = tuple


def _attr_key(v: object) -> object:
    # distinguishes 1 / 1.0 / True and 0.0 / -0.0, which compare equal in Python
    if isinstance(v, tuple):
        return ("tuple", tuple(_attr_key(x) for x in v))
    return (type(v).__name__, repr(v))


def expression_key(op: Op) -> Key | None:
    """The key under which `op` is a reusable expression, or None when it is not one."""
    d = OPS.get(op.name)
    if d is None or not d.pure or op.regions or not op.results:
        return None
    operands = [id(v) for v in op.operands]
    if d.commutative:
        operands.sort()
    attrs = tuple(sorted((k, _attr_key(v)) for k, v in op.attrs.items()))
    return (op.name, attrs, tuple(operands), tuple(str(r.type) for r in op.results))


@register
class CSEPass(Pass):
    name = "cse"

    def run(self, kernel: Kernel, log: list[str]) -> None:
        self.mapping: dict[Value, Value] = {}
        self.removed = 0
        self._block(kernel.body, ChainMap())
        log.append(f"cse: {self.removed} ops replaced by an earlier equal one")

    def _block(self, block: Block, available: ChainMap) -> None:
        out: list[Op] = []
        for op in block.ops:
            op.operands = [resolve(self.mapping, v) for v in op.operands]
            for region in op.regions:
                self._block(region, available.new_child())
            key = expression_key(op)
            if key is not None:
                earlier = available.get(key)
                if earlier is not None:
                    for old, new in zip(op.results, earlier.results):
                        self.mapping[old] = new
                    self.removed += 1
                    continue
                available[key] = op
            out.append(op)
        block.ops = out
