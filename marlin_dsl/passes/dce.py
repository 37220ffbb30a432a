"""Dead code elimination, iterated to a fixed point.

An op is removed when none of its results is used and it has no effect that outlives it:
pure ops, reads (`load`, `vload`, `frag_load`: a dead read has no observable effect), and
`for`/`if`/`switch` ops whose regions contain no writing op (store, atomic, barrier, fence,
frag_store). Writing ops and terminators always stay.
"""
from __future__ import annotations

from ..ir.core import Block, Kernel, Op, Value
from ..ir.graph import op_effects
from ..ir.ops import OPS
from .manager import Pass, register


def _count_uses(block: Block, counts: dict[int, int]) -> None:
    for op in block.ops:
        for v in op.operands:
            counts[id(v)] = counts.get(id(v), 0) + 1
        for region in op.regions:
            _count_uses(region, counts)


def removable(op: Op) -> bool:
    """Whether `op` may go once its results are unused."""
    d = OPS.get(op.name)
    if d is None or d.terminator:
        return False
    return not op_effects(op).writes_anything


@register
class DCEPass(Pass):
    name = "dce"

    def run(self, kernel: Kernel, log: list[str]) -> None:
        removed = sweeps = 0
        while True:
            counts: dict[int, int] = {}
            _count_uses(kernel.body, counts)
            n = self._sweep(kernel.body, counts)
            sweeps += 1
            removed += n
            if n == 0:
                break
        log.append(f"dce: {removed} ops removed in {sweeps} sweeps")

    def _sweep(self, block: Block, counts: dict[int, int]) -> int:
        """Remove dead ops back to front, so the operands of a removed op can die in the
        same sweep; returns how many ops went."""
        removed = 0
        kept: list[Op] = []
        for op in reversed(block.ops):
            if removable(op) and not any(counts.get(id(r), 0) for r in op.results):
                for v in _all_uses(op):
                    counts[id(v)] -= 1
                removed += 1
                continue
            for region in op.regions:
                removed += self._sweep(region, counts)
            kept.append(op)
        kept.reverse()
        block.ops = kept
        return removed


def _all_uses(op: Op) -> list[Value]:
    """Every operand occurrence in `op` and its regions (with repeats, to match the counts)."""
    out = list(op.operands)
    for region in op.regions:
        for inner in region.ops:
            out.extend(_all_uses(inner))
    return out

