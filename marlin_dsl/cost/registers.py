"""An estimate of registers per thread: the most values live at once in the K loop, in 32-bit
units, from the IR as scheduled (the order the printer prints).

At every op of the loop body the live values are: the values the loop reads but does not
define (loop-invariant operands: live through the whole loop), the loop's own arguments
(index and carried values) up to their last use, and the body's values from their
definition to their last use (a use inside a nested region counts at the op that holds the
region; a nested region adds its own peak on top of what is live around it). At an op the
count is the larger of what is live before it and what is live after it: an operand read for
the last time gives its registers to the result.

A value's size: a scalar takes one register whatever its width (a bool too: conservative
where the target has predicate registers; CUDA has no 16-bit registers, Apple GPUs do), a
vector ceil(bits / 32), a fragment its lane's share (rows x cols / 32 elements). Constants
are not counted (immediate operands); a move (ALIASING: a vector's lane, a fragment built
from registers, a bitcast) shares its operands' registers. This is a lower bound on what a compiler allocates
(addresses, temporaries and scheduling slack come on top); docs/COST_MODEL.md compares it
with ptxas's counts."""
from __future__ import annotations

from math import ceil

from ..errors import CompileError
from ..ir.core import Block, Kernel, Op, Value
from ..ir.types import FragmentType, ScalarType, Type, VectorType


def registers_of(t: Type, warp_size: int = 32) -> int:
    """32-bit registers one thread needs to hold a value of type `t`."""
    if isinstance(t, ScalarType):
        return 1
    if isinstance(t, VectorType):
        return ceil(t.size * t.elem.bits / 32)
    if isinstance(t, FragmentType):
        return ceil(t.rows * t.cols / warp_size * t.elem.bits / 32)
    raise CompileError(f"cost model: no register size for type {t}")


def _outer_uses(region: Block) -> set[int]:
    """Values the ops of `region` (nested ones included) read but do not define."""
    used: set[int] = set()
    defined = {id(a) for a in region.args}
    for inner in region.walk():
        used.update(id(v) for v in inner.operands)
        defined.update(id(r) for r in inner.results)
        for sub in inner.regions:
            defined.update(id(a) for a in sub.args)
    return used - defined


def _uses(op: Op) -> set[int]:
    """Values an op reads, its nested regions' reads of outer values included."""
    used = {id(v) for v in op.operands}
    for region in op.regions:
        used |= _outer_uses(region)
    return used


#: Ops whose result reuses its operands' registers (a lane of a vector, a vector or fragment
#: made of registers, a reinterpretation): no new registers, one group live while any member is.
ALIASING = frozenset({"extract", "vec", "frag_build", "frag_elems", "bitcast"})


class _Liveness:
    def __init__(self, kernel: Kernel) -> None:
        self.warp_size = kernel.warp_size
        self.consts = {id(op.result) for op in kernel.walk() if op.name == "const"}
        self.parent: dict[int, int] = {}
        self.group_size: dict[int, int] = {}
        for op in kernel.walk():
            for v in (*op.operands, *op.results):
                self.group_size.setdefault(self._find(id(v)), self.size(v))
            if op.name in ALIASING:
                for v in op.operands:
                    if id(v) not in self.consts:
                        self._union(id(op.result), id(v))

    def _find(self, v: int) -> int:
        root = v
        while self.parent.get(root, root) != root:
            root = self.parent[root]
        self.parent[v] = root
        return root

    def _union(self, a: int, b: int) -> None:
        ra, rb = self._find(a), self._find(b)
        if ra != rb:  # the group holds as many registers as its largest member
            self.parent[rb] = ra
            self.group_size[ra] = max(self.group_size.get(ra, 0), self.group_size.get(rb, 0))

    def size(self, v: Value) -> int:
        return 0 if id(v) in self.consts else registers_of(v.type, self.warp_size)

    def peak(self, block: Block) -> int:
        """The most registers live at once inside `block`, counting only values the block
        defines (its arguments included): what is live around it is added by the caller.
        Values are tracked by alias group (ALIASING)."""
        last_use: dict[int, int] = {}
        for i, op in enumerate(block.ops):
            for v in _uses(op):
                last_use[self._find(v)] = i
        live: dict[int, int] = {}  # group -> registers, groups defined in this block so far
        for arg in block.args:
            if self._find(id(arg)) in last_use:
                live[self._find(id(arg))] = self.group_size[self._find(id(arg))]
        best = sum(live.values())
        for i, op in enumerate(block.ops):
            inner = max((self.peak(region) for region in op.regions), default=0)
            results = {self._find(id(r)): self.group_size[self._find(id(r))] for r in op.results
                       if id(r) not in self.consts}
            new = {g: n for g, n in results.items() if g not in live}
            # before op i: everything it reads (its regions run on top); after it: what
            # survives it and its results (an operand read for the last time frees its
            # registers for the result: an MMA's accumulator is updated in place)
            before = sum(live.values()) + inner
            for g in [g for g in live if last_use.get(g, -1) <= i]:
                del live[g]
            best = max(best, before, sum(live.values()) + sum(new.values()))
            live.update({g: n for g, n in new.items() if last_use.get(g, -1) > i})
        return best


def live_registers(kernel: Kernel, loop: Op) -> tuple[int, int]:
    """(peak, invariant): the most 32-bit registers live at once in `loop`'s body, and how
    many of them hold loop-invariant values read from outside the loop."""
    liveness = _Liveness(kernel)
    body = loop.regions[0]
    outside = _outer_uses(body)
    # the loop reads these from outside: live for its whole duration
    groups = {liveness._find(v) for v in outside}  # noqa: SLF001
    invariant = sum(liveness.group_size[g] for g in groups if g in liveness.group_size)
    return invariant + liveness.peak(body), invariant
