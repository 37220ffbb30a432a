"""`marlin-dsl bench`: our GEMM kernels against MLX's own and the bandwidth floor, on a GPU.

The benchmark runner sits above the compiler: it compiles and launches kernels through the
public stages, and nothing in the core (formats/, ir/, lowering/, passes/, targets/,
the compiler) imports it (tests/test_import_graph.py checks the direction).

- `cases`: what a run measures (shapes, Ms, pipelines, formats, bench.json's definitions) and
  the Subject / Runner protocols;
- `timing`: the batch and single-call timing loops;
- `device`: which GPU backend MLX has here;
- `mlx_runner`: subjects on MLX's GPU device (our kernels, MLX's baselines);
- `results`: floors, ratios, the table, bench.json and bench.png;
- `runner`: `run_bench`, the run itself, and its log.
"""
from .cases import (DEFAULT_MS, DEFAULT_PIPELINES, DEFAULT_REPEATS, DEFAULT_SHAPES, DEFINITIONS, FP16, FP16_FORMAT,
                    PIPELINES, QMM, QMM_FORMAT, QUICK_FORMATS, QUICK_MS, QUICK_SHAPES, REL_TOL, Measurement, Runner,
                    Subject, bench_schedule, kernel_label)
from .device import gpu_backend
from .mlx_runner import MLXRunner
from .results import best_pipelines, finish_rows, floor_bytes, floor_us, format_table, plot_bench, sort_rows, table_rows
from .runner import Log, run_bench
from .timing import (BATCH_LAUNCHES, MAX_COPIES, MIN_BATCH_LAUNCHES, MIN_COPIES, ROTATE_BYTES, TimedLaunches, copies_for,
                     e2e_time, kernel_time)

__all__ = [
    "BATCH_LAUNCHES", "DEFAULT_MS", "DEFAULT_PIPELINES", "DEFAULT_REPEATS", "DEFAULT_SHAPES", "DEFINITIONS", "FP16",
    "FP16_FORMAT", "Log", "MAX_COPIES", "MIN_BATCH_LAUNCHES", "MIN_COPIES", "MLXRunner", "Measurement", "PIPELINES",
    "QMM", "QMM_FORMAT", "QUICK_FORMATS", "QUICK_MS", "QUICK_SHAPES", "REL_TOL", "ROTATE_BYTES", "Runner", "Subject",
    "TimedLaunches", "bench_schedule", "best_pipelines", "copies_for", "e2e_time", "finish_rows", "floor_bytes",
    "floor_us", "format_table", "gpu_backend", "kernel_label", "kernel_time", "plot_bench", "run_bench", "sort_rows",
    "table_rows",
]
