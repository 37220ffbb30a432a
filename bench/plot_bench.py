"""Turn a `marlin-dsl bench` bench.json into its plot (bench.png), where matplotlib is installed.

`marlin-dsl bench` writes bench.png itself when matplotlib is importable; on a machine without
it (the GPU machine need not have it) it writes bench.json only, and this script makes the PNG
elsewhere:

    python bench/plot_bench.py bench/results/gpu/bench_h100_2026-11-22/bench.json
    python bench/plot_bench.py RESULTS/bench.json -o /tmp/bench.png

One panel per (K, N): kernel time per launch (log) against M (log), a line per format (its
best pipeline at that shape), mx.quantized_matmul and float16 mx.matmul, and each line's
bandwidth floor dashed in the same colour (`marlin_dsl.benchmarks.plot_bench`).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from marlin_dsl.benchmarks import plot_bench  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", type=Path, help="bench.json written by `marlin-dsl bench`")
    ap.add_argument("-o", "--output", type=Path, default=None,
                    help="the PNG to write (default: bench.png beside the JSON)")
    args = ap.parse_args(argv)
    doc = json.loads(args.json.read_text())
    try:
        path = plot_bench(doc, args.output or args.json.with_name("bench.png"))
    except ImportError as exc:
        print(f"plot_bench.py needs matplotlib ({exc}): pip install matplotlib", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
