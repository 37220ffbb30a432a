"""The K loop of a kernel and what one of its iterations costs one thread.

The K loop is the `for` whose body holds the most MMAs (mma, mma_sp, wgmma), the innermost
of those where loops nest (StripedKParallel's loop over work units holds the K loop; a
WeightStream with `unroll` has a main loop and a remainder loop, and the main one has more
MMAs). Its body is walked once, as the steady state runs it:
- an `if` or `switch` costs its most expensive region (the prefetch of the next stage runs
  on every iteration but the last; a block pattern's dispatch on its count is counted at the
  densest case);
- a nested `for` costs its body times its trip count where lb, ub and step are constants,
  else times its `specialise` bound, else once (noted);
- ops whose operands are all defined outside the loop (loop-invariant pure ops) are counted
  where the IR has them and tallied apart, since a target compiler would hoist them."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import CompileError
from ..ir.core import Block, Kernel, Op
from ..ir.ops import OPS
from .classify import CLASSES, op_cost


@dataclass
class Tally:
    """Per-thread costs of some ops: instructions by class, bytes by memory, barriers."""

    counts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0.0))
    device_read: dict[str, float] = field(default_factory=dict)  # buffer -> bytes
    shared_read: float = 0.0
    shared_written: float = 0.0
    barriers: dict[str, float] = field(default_factory=dict)  # scope -> count
    invariant: float = 0.0  # instructions of loop-invariant pure ops (included in counts)

    @property
    def instructions(self) -> float:
        return sum(self.counts.values())

    def add(self, other: "Tally", factor: float = 1.0) -> None:
        for cls, n in other.counts.items():
            self.counts[cls] += n * factor
        for buf, n in other.device_read.items():
            self.device_read[buf] = self.device_read.get(buf, 0.0) + n * factor
        for scope, n in other.barriers.items():
            self.barriers[scope] = self.barriers.get(scope, 0.0) + n * factor
        self.shared_read += other.shared_read * factor
        self.shared_written += other.shared_written * factor
        self.invariant += other.invariant * factor


@dataclass
class LoopCounts:
    """One K-loop iteration as one thread runs it (a collective op counts once per lane)."""

    loop: Op
    tally: Tally
    notes: list[str] = field(default_factory=list)


def _mma_count(block: Block) -> int:
    return sum(op.name in ("mma", "mma_sp", "wgmma") for op in block.walk())


def find_k_loop(kernel: Kernel) -> Op:
    """The `for` with the most MMAs in its body, the innermost of equals (module docstring)."""
    best: tuple[int, int] | None = None
    found: Op | None = None

    def visit(block: Block, depth: int) -> None:
        nonlocal best, found
        for op in block.ops:
            if op.name == "for":
                key = (_mma_count(op.regions[0]), depth)
                if key[0] and (best is None or key > best):
                    best, found = key, op
            for region in op.regions:
                visit(region, depth + 1)

    visit(kernel.body, 0)
    if found is None:
        raise CompileError(f"cost model: kernel {kernel.name!r} has no K loop (a `for` holding "
                           f"MMAs) to cost")
    return found


def _constants(kernel: Kernel) -> dict[int, int | float]:
    """id(value) -> constant for every `const` result of the kernel."""
    return {id(op.result): op.attrs["value"] for op in kernel.walk() if op.name == "const"}  # type: ignore[misc]


def _trip_count(op: Op, consts: dict[int, int | float], notes: list[str]) -> int:
    lb, ub, step = (consts.get(id(v)) for v in op.operands[:3])
    if lb is not None and ub is not None and step:
        return max(0, -(-(int(ub) - int(lb)) // int(step)))
    if "specialise" in op.attrs:
        notes.append(f"a nested loop with a dynamic trip count is counted at its bound "
                     f"{op.attrs['specialise']}")
        return int(op.attrs["specialise"])  # type: ignore[arg-type]
    notes.append("a nested loop with a dynamic trip count is counted once")
    return 1


class _Walker:
    """Walks a loop body into a Tally (see the module docstring for the rules)."""

    def __init__(self, kernel: Kernel, loop: Op) -> None:
        self.kernel = kernel
        self.consts = _constants(kernel)
        self.notes: list[str] = []
        # values defined inside the loop: everything else it reads is invariant
        self.inside: set[int] = {id(a) for a in loop.regions[0].args}
        for inner in loop.regions[0].walk():
            self.inside.update(id(r) for r in inner.results)
            for region in inner.regions:
                self.inside.update(id(a) for a in region.args)
        self.invariant_values: set[int] = set()

    def _is_invariant(self, op: Op) -> bool:
        definition = OPS[op.name]
        if not definition.pure or op.name == "const":
            return False
        return all(id(v) not in self.inside or id(v) in self.invariant_values for v in op.operands)

    def block(self, block: Block) -> Tally:
        tally = Tally()
        for op in block.ops:
            cost = op_cost(op, self.kernel)
            own = Tally()
            if cost.cls is not None:
                own.counts[cost.cls] += cost.count
            for cls, n in cost.extra:
                own.counts[cls] += n
            for buf, n in (cost.device_read or {}).items():
                own.device_read[buf] = n
            own.shared_read, own.shared_written = cost.shared_read, cost.shared_written
            if op.name == "barrier":
                own.barriers[str(op.attrs["scope"])] = 1.0
            if self._is_invariant(op):
                self.invariant_values.update(id(r) for r in op.results)
                own.invariant = own.instructions
            if op.name == "for":
                trips = _trip_count(op, self.consts, self.notes)
                own.add(self.block(op.regions[0]))
                tally.add(own, trips)
                continue
            if op.name in ("if", "switch"):
                arms = [self.block(region) for region in op.regions]
                heaviest = max(arms, key=lambda t: t.instructions)
                if op.name == "switch" and len({t.instructions for t in arms}) > 1:
                    self.notes.append(f"switch on %{op.operands[0].name}: its most expensive "
                                      f"case counted ({heaviest.instructions:g} instructions)")
                own.add(heaviest)
            tally.add(own)
        return tally


def count_loop(kernel: Kernel, loop: Op | None = None) -> LoopCounts:
    """What one iteration of `loop` (default: the kernel's K loop) costs one thread,
    including the loop's own counter, compare and branch."""
    loop = find_k_loop(kernel) if loop is None else loop
    walker = _Walker(kernel, loop)
    tally = walker.block(loop.regions[0])
    own = op_cost(loop, kernel)
    tally.counts[own.cls] += own.count  # type: ignore[index]
    for cls, n in own.extra:
        tally.counts[cls] += n
    return LoopCounts(loop, tally, sorted(set(walker.notes)))
