"""`marlin-dsl bench`: our kernels against MLX's own and the bandwidth floor, on a GPU."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..formats.builtin import BUILTIN_FORMATS
from .common import parse_shape, positive


def bench_settings(args: argparse.Namespace) -> dict:
    """run_bench's keyword arguments from `marlin-dsl bench` arguments (--quick fills in what
    is not given explicitly)."""
    from .. import benchmarks as gb

    quick = bool(args.quick)
    return {
        "formats": args.formats or (list(gb.QUICK_FORMATS) if quick else None),
        "pipelines": args.pipelines or None,
        "shapes_kn": args.shapes or (list(gb.QUICK_SHAPES) if quick else None),
        "ms": args.m or (list(gb.QUICK_MS) if quick else None),
        "repeats": args.repeats if args.repeats is not None else (3 if quick else gb.DEFAULT_REPEATS),
        "out_dir": args.out,
    }


def cmd_bench(args: argparse.Namespace) -> int:
    from .. import benchmarks as gb

    settings = bench_settings(args)
    gb.gpu_backend()  # says what this machine lacks before anything is written
    out = settings["out_dir"]
    log = gb.Log(out / "bench.log" if out is not None else None)
    doc = gb.run_bench(log=log, plot=not args.no_plot, **settings)
    return 1 if doc["failed"] else 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The `bench` subcommand."""
    bench = sub.add_parser(
        "bench", help="time the kernels on a GPU against MLX's own and the bandwidth floor (GPU only)",
        description="Time our kernels (format x pipeline), mx.quantized_matmul (4-bit affine, group 64) "
                    "and float16 mx.matmul per (K, N) and M, with the bandwidth floor; print a table and "
                    "write bench.json (+ bench.png with matplotlib) to --out. Needs MLX's CUDA (or Metal) "
                    "GPU backend.")
    bench.add_argument("--formats", nargs="+", metavar="FORMAT", choices=list(BUILTIN_FORMATS),
                       help="built-in formats (default: all; --quick: fp4 fp4_2of4)")
    bench.add_argument("--pipelines", nargs="+", metavar="PIPELINE",
                       choices=["double_buffered", "fused_dequant", "striped", "weight_stream"],
                       help="pipelines (default: all four; weight_stream picks its schedule by M "
                            "and skips formats it has no layout for)")
    bench.add_argument("--shapes", nargs="+", type=parse_shape, metavar="KxN",
                       help="weight shapes (default: 4096x4096 4096x14336 14336x4096; --quick: 4096x4096)")
    bench.add_argument("--m", nargs="+", type=positive, metavar="M",
                       help="rows of x (default: 1 16 64 256 2048; --quick: 1 16)")
    bench.add_argument("--repeats", type=positive, default=None,
                       help="timed batches per measurement (default: 5; --quick: 3)")
    bench.add_argument("--out", type=Path, default=Path("marlin-bench"),
                       help="folder for bench.json, bench.log and bench.png (default: ./marlin-bench)")
    bench.add_argument("--quick", action="store_true",
                       help="one shape (4096x4096), M in 1 16, formats fp4 and fp4_2of4")
    bench.add_argument("--no-plot", action="store_true", help="do not write bench.png")
    bench.set_defaults(func=cmd_bench)


__all__ = ["add_parsers", "bench_settings", "cmd_bench"]
