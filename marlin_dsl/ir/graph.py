"""The dataflow graph of one block: which ops must stay before which.

`dataflow_graph(block)` is a networkx DiGraph whose nodes are the op indices of the block
(attribute `op`) and whose edges (attribute `kind`) are

- `data`: def -> use, where a use inside a nested region of an op counts as a use by that op;
- `order`: the memory rules of docs/IR.md. Two ops touching the same buffer or shared array,
  at least one of them writing, keep their order; barriers and fences keep their order with
  respect to every memory op; collective ops (`frag_*`, `mma`) keep their relative order; every
  op keeps its side of a schedule fence (`OpDef.schedule_fence`: the wgmma batch's fence and
  commit); the terminator (`yield`) stays last.

An op with regions has the union of the effects of the ops inside it (a loop containing a
barrier orders like a barrier). Every edge goes from a lower to a higher index, so the block's
own order is one topological order, and every topological order is a valid schedule. Memory
edges are kept transitively reduced per buffer (last writer, readers since), so the graph
stays linear in size for long unrolled blocks.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from .core import Block, Op, Value
from .ops import OPS


@dataclass(frozen=True)
class Effects:
    """What an op (with everything nested inside it) does to memory."""

    reads: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()
    barrier: bool = False  # a barrier or fence: ordered against every memory op
    collective: bool = False

    @property
    def memory(self) -> bool:
        return bool(self.reads or self.writes or self.barrier)

    @property
    def writes_anything(self) -> bool:
        return bool(self.writes or self.barrier)

    def __or__(self, other: "Effects") -> "Effects":
        return Effects(self.reads | other.reads, self.writes | other.writes,
                       self.barrier or other.barrier, self.collective or other.collective)


def op_effects(op: Op) -> Effects:
    """The memory effects of `op`, read from the op table, including its nested regions.
    Ops missing from the table are treated as barriers (the most conservative reading)."""
    d = OPS.get(op.name)
    if d is None:
        eff = Effects(barrier=True, collective=True)
    else:
        buf = op.attrs.get("buffer")
        named = frozenset([str(buf)]) if buf is not None else frozenset()
        eff = Effects(
            reads=named if d.reads_memory else frozenset(),
            writes=named if d.writes_memory else frozenset(),
            # a writing op without a named buffer (barrier, fence) orders all memory
            barrier=(d.writes_memory or d.reads_memory) and buf is None,
            collective=d.collective,
        )
    for region in op.regions:
        for inner in region.ops:
            eff = eff | op_effects(inner)
    return eff


def free_uses(op: Op) -> list[Value]:
    """The values `op` uses: its operands plus the values used inside its regions that are
    defined outside them (first-use order, no duplicates)."""
    seen: set[int] = set()
    out: list[Value] = []

    def use(v: Value) -> None:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)

    for v in op.operands:
        use(v)
    if op.regions:
        inner: set[int] = set()

        def visit(block: Block) -> None:
            inner.update(id(a) for a in block.args)
            for o in block.ops:
                for v in o.operands:
                    if id(v) not in inner:
                        use(v)
                for region in o.regions:
                    visit(region)
                inner.update(id(r) for r in o.results)

        for region in op.regions:
            visit(region)
    return out


def dataflow_graph(block: Block) -> nx.DiGraph:
    g = nx.DiGraph()
    ops = block.ops
    for i, op in enumerate(ops):
        g.add_node(i, op=op)

    def edge(i: int, j: int, kind: str) -> None:
        if i == j:
            return
        if g.has_edge(i, j):
            if kind == "data":
                g.edges[i, j]["kind"] = "data"
        else:
            g.add_edge(i, j, kind=kind)

    producer: dict[int, int] = {}
    for j, op in enumerate(ops):
        for v in free_uses(op):
            i = producer.get(id(v))
            if i is not None:
                edge(i, j, "data")
        for r in op.results:
            producer[id(r)] = j

    # schedule fences (OpDef.schedule_fence): every op keeps its side of each
    last_fence: int | None = None
    for j, op in enumerate(ops):
        d = OPS.get(op.name)
        if d is not None and d.schedule_fence:
            for i in range(last_fence + 1 if last_fence is not None else 0, j):
                edge(i, j, "order")
            last_fence = j
        elif last_fence is not None:
            edge(last_fence, j, "order")

    last_barrier: int | None = None
    since_barrier: list[int] = []
    last_write: dict[str, int] = {}
    reads_since: dict[str, list[int]] = {}
    last_collective: int | None = None
    for j, op in enumerate(ops):
        eff = op_effects(op)
        if eff.collective:
            if last_collective is not None:
                edge(last_collective, j, "order")
            last_collective = j
        if not eff.memory:
            continue
        if eff.barrier:
            if last_barrier is not None:
                edge(last_barrier, j, "order")
            for i in since_barrier:
                edge(i, j, "order")
            last_barrier, since_barrier = j, []
            last_write.clear()
            reads_since.clear()
            continue
        if last_barrier is not None:
            edge(last_barrier, j, "order")
        for name in sorted(eff.writes):
            if name in last_write:
                edge(last_write[name], j, "order")
            for i in reads_since.get(name, ()):
                edge(i, j, "order")
        for name in sorted(eff.reads - eff.writes):
            if name in last_write:
                edge(last_write[name], j, "order")
        for name in eff.writes:
            last_write[name] = j
            reads_since[name] = []
        for name in eff.reads - eff.writes:
            reads_since.setdefault(name, []).append(j)
        since_barrier.append(j)

    if ops:
        last = len(ops) - 1
        d = OPS.get(ops[last].name)
        if d is not None and d.terminator:
            for i in range(last):
                edge(i, last, "order")
    return g


def is_valid_order(block: Block, order: list[int], graph: nx.DiGraph | None = None) -> bool:
    """Whether `order` (a permutation of the block's op indices) respects its dataflow graph."""
    g = graph if graph is not None else dataflow_graph(block)
    if sorted(order) != list(range(len(block.ops))):
        return False
    pos = {n: k for k, n in enumerate(order)}
    return all(pos[i] < pos[j] for i, j in g.edges)
