"""List scheduling of every block: critical path first, integer and float ops interleaved.

Each block's ops are reordered to a topological order of its dataflow graph
(`marlin_dsl.ir.graph`), so data dependences and the memory rules of docs/IR.md are kept.

Machine model (a deliberately small one, used both to schedule and to report):

| class | ops | latency | issue |
|---|---|---|---|
| int | integer/bool arithmetic, shifts, masks, int compares, int selects, casts to int, bitcasts | 1 | int pipe, 1 per cycle |
| float | f16/bf16/f32 arithmetic, fma, float compares and selects, casts to float | 2 | float pipe, 1 per cycle |
| memory | load, vload, store, atomic_add, frag_load, frag_store, table, barrier, fence | 8 | memory pipe, 1 per cycle |
| mma | mma, frag_zero | 8 | mma pipe, 1 per cycle |
| other | index, scalar, extract, for, if, switch, yield | 1 | other pipe, 1 per cycle |
| free | const (an immediate) | 0 | no slot |

Issue is in order: an op issues no earlier than the op before it and once its data operands
are ready (producer's issue + latency; memory-order edges only require issue order); ops of
different pipes issue in the same cycle, so an int op and a float op dual-issue. The
estimated cycle count of an order is when its last result is ready. (Region ops count as
one `other` op in their parent; their bodies are scheduled and reported separately.)

The scheduler is cycle driven: each cycle it issues, per pipe, the ready op with the longest
latency-weighted path to the end of the block (ties: original order), emitting the int op
before the float op of a cycle, so ready integer work (metadata decode) and float work
(dequant) alternate (seed 000 section 5.3). When the result is not estimated faster than the
original order, the original order is kept; so the estimate never gets worse.
"""
from __future__ import annotations

import heapq

import networkx as nx

from ..ir.core import Block, Kernel, Op
from ..ir.graph import dataflow_graph
from ..ir.ops import OPS
from ..ir.types import ScalarType, VectorType
from .manager import Pass, block_paths, register

LATENCY = {"int": 1, "float": 2, "memory": 8, "mma": 8, "other": 1, "free": 0}
PIPE_ORDER = ("int", "float", "memory", "mma", "other")



def _is_float(t: object) -> bool:
    if isinstance(t, VectorType):
        t = t.elem
    return isinstance(t, ScalarType) and t.is_float


def op_class(op: Op) -> str:
    """The model's class of an op: int, float, memory, mma, other or free."""
    d = OPS.get(op.name)
    if d is not None and d.pipe in ("free", "int"):
        return d.pipe
    if d is not None and d.pipe == "alu":
        if d.operand_typed:
            t = op.operands[0].type if op.operands else None
        else:
            t = op.results[0].type if op.results else None
        return "float" if _is_float(t) else "int"
    if d is not None and (d.pipe == "memory" or (not op.regions and (d.reads_memory or d.writes_memory))):
        return "memory"
    if d is not None and d.collective:
        return "mma"
    return "other"


def _edge_delay(g: nx.DiGraph, i: int, j: int, lat: dict[int, int]) -> int:
    return lat[i] if g.edges[i, j]["kind"] == "data" else 0


def critical_path(g: nx.DiGraph, lat: dict[int, int]) -> tuple[int, dict[int, int]]:
    """(length of the longest latency-weighted path, per node its path length to the end)."""
    tail: dict[int, int] = {}
    for n in reversed(list(nx.topological_sort(g))):
        tail[n] = max([lat[n]] + [_edge_delay(g, n, s, lat) + tail[s] for s in g.successors(n)])
    return (max(tail.values()) if tail else 0), tail


def estimate_cycles(order: list[int], g: nx.DiGraph, cls: dict[int, str]) -> int:
    """Cycles until the last result of `order` is ready, under the in-order model above."""
    lat = {n: LATENCY[c] for n, c in cls.items()}
    issue: dict[int, int] = {}
    cycle = 0
    used: set[str] = set()
    end = 0
    for n in order:
        t = max([cycle] + [issue[p] + _edge_delay(g, p, n, lat) for p in g.predecessors(n)])
        if t > cycle:
            cycle, used = t, set()
        pipe = cls[n]
        if pipe != "free":
            if pipe in used:
                cycle, used = cycle + 1, set()
            used.add(pipe)
        issue[n] = cycle
        end = max(end, cycle + lat[n])
    return end


def list_schedule(g: nx.DiGraph, cls: dict[int, str], tail: dict[int, int]) -> list[int]:
    """A topological order of `g` from cycle-driven list scheduling (see the module doc)."""
    lat = {n: LATENCY[c] for n, c in cls.items()}
    missing = {n: g.in_degree(n) for n in g.nodes}
    earliest = {n: 0 for n in g.nodes}
    waiting: list[tuple[int, int]] = []  # (earliest cycle, node): all predecessors issued
    ready: dict[str, list[tuple[int, int]]] = {p: [] for p in (*PIPE_ORDER, "free")}
    for n in sorted(g.nodes):
        if missing[n] == 0:
            heapq.heappush(waiting, (0, n))
    order: list[int] = []
    cycle = 0
    while len(order) < g.number_of_nodes():
        while waiting and waiting[0][0] <= cycle:
            _, n = heapq.heappop(waiting)
            heapq.heappush(ready[cls[n]], (-tail[n], n))
        issued: list[int] = []
        while ready["free"]:
            issued.append(heapq.heappop(ready["free"])[1])
        for pipe in PIPE_ORDER:
            if ready[pipe]:
                issued.append(heapq.heappop(ready[pipe])[1])
        if not issued:
            cycle = waiting[0][0] if waiting else cycle + 1
            continue
        for n in issued:
            order.append(n)
            for s in g.successors(n):
                earliest[s] = max(earliest[s], cycle + _edge_delay(g, n, s, lat))
                missing[s] -= 1
                if missing[s] == 0:
                    heapq.heappush(waiting, (max(earliest[s], cycle + 1), s))
        cycle += 1
    return order


@register
class InterleavePass(Pass):
    name = "interleave"

    def __init__(self, min_ops: int = 2) -> None:
        self.min_ops = min_ops  # blocks with fewer ops (the terminator included) are skipped

    def run(self, kernel: Kernel, log: list[str]) -> None:
        total_before = total_after = 0
        blocks = 0
        for path, block in list(block_paths(kernel.body)):
            if len(block.ops) < self.min_ops:
                continue
            before, after, note = self.schedule_block(block, path)
            total_before += before
            total_after += after
            blocks += 1
            log.append(note)
        log.append(f"interleave: kernel {kernel.name}: {blocks} blocks, original order "
                   f"{total_before} cycles, scheduled {total_after} cycles (sum over blocks)")

    def schedule_block(self, block: Block, path: str = "block") -> tuple[int, int, str]:
        g = dataflow_graph(block)
        cls = {n: op_class(g.nodes[n]["op"]) for n in g.nodes}
        lat = {n: LATENCY[c] for n, c in cls.items()}
        length, tail = critical_path(g, lat)
        original = list(range(len(block.ops)))
        before = estimate_cycles(original, g, cls)
        order = list_schedule(g, cls, tail)
        after = estimate_cycles(order, g, cls)
        kept = ""
        if after >= before:
            order, after = original, before
            kept = " (original order kept)"
        else:
            block.ops = [block.ops[n] for n in order]
        note = (f"interleave: block {path}: {len(original)} ops, critical path {length}, "
                f"original order {before} cycles, scheduled {after} cycles{kept}")
        return before, after, note
