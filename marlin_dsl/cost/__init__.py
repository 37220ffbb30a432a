"""A static cost model of compiled kernels, read from the IR after the passes (an analysis:
nothing here rewrites a kernel). `kernel_cost(kernel, gemm)` gives, per dense weight, the
bytes moved from device memory, the K loop's instructions by class, threadgroup memory, an
estimate of registers per thread and barriers per K step; `marlin-dsl compile --cost` prints
it (`report.py`). Units and method: docs/COST_MODEL.md."""
from .classify import CLASSES, OpCost, op_cost
from .loop import LoopCounts, Tally, count_loop, find_k_loop
from .model import KernelCost, cost_from_counts, iteration_shape, kernel_cost, storage_per_weight
from .registers import live_registers, registers_of

__all__ = ["CLASSES", "KernelCost", "LoopCounts", "OpCost", "Tally", "cost_from_counts",
           "count_loop", "find_k_loop", "iteration_shape", "kernel_cost", "live_registers",
           "op_cost", "registers_of", "storage_per_weight"]
