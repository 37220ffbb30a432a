"""`marlin-dsl compile --cost`: the cost model as two tables with a legend, and as JSON.

The tables are returned as headers and rows; the command line lays them out with its own
table writer (passed in), so this module stays below the tools."""
from __future__ import annotations

from dataclasses import asdict
from typing import Callable

from .classify import CLASSES
from .model import ACTIVATIONS, KernelCost

#: Short column names of the instruction classes.
SHORT = {"int": "int", "float": "flt", "cvt": "cvt", "ld.dev": "ld.d", "ld.shared": "ld.s",
         "ld.const": "ld.c", "st.shared": "st.s", "st.dev": "st.d", "mma": "mma",
         "sync": "sync", "move": "move", "other": "oth"}

LEGEND = """
Cost model, read from each kernel's IR after the passes (docs/COST_MODEL.md). Per weight: per
  dense element of W that the threadgroup multiplies. Instructions: the K loop's IR ops (one
  op one instruction; half2 counts one) one thread runs per iteration x threads / weights per
  iteration = lane instructions per weight (/32: SIMD-group issue slots). int: integer and
  bit ops, compares, selects, the loop counter; flt: float ops; cvt: conversions; ld.d / ld.s
  / ld.c: device / threadgroup / constant-table loads (ld.d includes async copies); st.s /
  st.d: stores; mma: MMAs (8x8x8 simdgroup on Metal, m16n8k16 / m16n8k32 sp / wgmma on CUDA);
  sync: barriers, fences, async waits; move: vector lanes and fragment elements (mostly free
  in machine code); oth: branches, thread indices. inv/w: loop-invariant ops among them.
M: activation rows assumed (the tile's tile_m unless --cost-m). B/w: bytes per weight the
  threadgroup needs from device memory = weights (codes, scales, zero points, metadata: their
  storage, codes in the layout the kernel reads, arrays it never reads left out) + act (M x 2
  bytes / tile_n); req: bytes per weight the loop's loads ask for, every
  thread's repeats included. tgmem: threadgroup memory bytes; regs: most 32-bit values live
  at once in the loop (estimate); bar/step: threadgroup barriers per K step (+ simdgroup
  barriers after '+')."""


def _num(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 10:
        return f"{x:.1f}"
    if abs(x) >= 0.1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def instruction_table(costs: list[KernelCost]) -> tuple[list[str], list[list[str]]]:
    """Lane instructions per weight by class: the classes some kernel has, then the total."""
    shown = [c for c in CLASSES if any(k.per_weight[c] for k in costs)]
    headers = ["gemm", "target", *(SHORT[c] for c in shown), "total", "inv/w"]
    rows = [[k.gemm, k.target, *(_num(k.per_weight[c]) for c in shown),
             _num(k.instructions_per_weight), _num(k.invariant_per_weight)] for k in costs]
    return headers, rows


def _barriers(k: KernelCost) -> str:
    text = _num(k.barriers_per_step.get("threadgroup", 0.0))
    simd = k.barriers_per_step.get("simdgroup", 0.0)
    return f"{text}+{_num(simd)}" if simd else text


def memory_table(costs: list[KernelCost]) -> tuple[list[str], list[list[str]]]:
    """Bytes per weight, threadgroup memory, registers, barriers."""
    headers = ["gemm", "pipeline", "M", "B/w", "weights", "act", "req", "tgmem", "regs",
               "bar/step"]
    rows = []
    for k in costs:
        act = k.unique_bytes.get(ACTIVATIONS, 0.0)
        rows.append([k.gemm, k.pipeline, str(k.m), _num(k.unique_bytes_per_weight),
                     _num(k.unique_bytes_per_weight - act), _num(act),
                     _num(k.requested_bytes_per_weight), str(k.shared_bytes), str(k.registers),
                     _barriers(k)])
    return headers, rows


def cost_report(costs: list[KernelCost], table: Callable[[list[str], list[list[str]]], str]) -> str:
    """The two tables (laid out by `table`), the kernels' notes and the legend."""
    parts = [table(*instruction_table(costs)), "", table(*memory_table(costs))]
    notes = [f"  {k.gemm}: {note}" for k in costs for note in k.notes]
    if notes:
        parts += ["", "notes:", *notes]
    return "\n".join(parts) + "\n" + LEGEND


def cost_json(costs: list[KernelCost]) -> list[dict]:
    """Every field of every kernel's cost, with the totals, for machines."""
    out = []
    for k in costs:
        doc = asdict(k)
        doc["tile"] = list(k.tile)
        doc["shared_traffic"] = {"read": k.shared_traffic[0], "written": k.shared_traffic[1]}
        doc["totals"] = {"instructions_per_weight": k.instructions_per_weight,
                         "unique_bytes_per_weight": k.unique_bytes_per_weight,
                         "requested_bytes_per_weight": k.requested_bytes_per_weight}
        doc["units"] = {"per_weight": "lane instructions per dense weight of W",
                        "bytes": "bytes per dense weight of W",
                        "per_iteration": "one thread's ops per K-loop iteration",
                        "registers": "32-bit values live at once in the K loop (estimate)"}
        out.append(doc)
    return out
