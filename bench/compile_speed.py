"""How long `marlin-dsl compile` takes per example spec (load, lower, all passes, print IR),
without executing the kernels. The issue's bar: under 5 s per example on a 2-core machine.

    python bench/compile_speed.py [--repeats 3] [--out bench/results/compile_speed.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import date
from pathlib import Path

from marlin_dsl.compiler import compile_gemm
from marlin_dsl.ir.text import print_kernel
from marlin_dsl.spec import load_spec
from marlin_dsl.machine import TARGETS

ROOT = Path(__file__).resolve().parent.parent


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def compile_spec(path: Path, target: str) -> tuple[int, int]:
    spec = load_spec(path)
    ops = 0
    for gemm in spec.gemms:
        kernel = compile_gemm(gemm, TARGETS[target]).kernel
        print_kernel(kernel)
        ops += sum(1 for _ in kernel.walk())
    return len(spec.gemms), ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "compile_speed.json")
    args = parser.parse_args()
    rows = []
    for path in sorted((ROOT / "examples").glob("*.py")):
        for target in ("metal", "cuda"):
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                kernels, ops = compile_spec(path, target)
                times.append(time.perf_counter() - start)
            rows.append({"example": path.name, "target": target, "kernels": kernels, "ops": ops,
                         "best_s": min(times), "median_s": statistics.median(times),
                         "under_5s": max(times) < 5.0})
    print(f"{'example':24} {'target':6} {'kernels':>7} {'ops':>7} {'best s':>7} {'median s':>8}  < 5 s")
    for r in rows:
        print(f"{r['example']:24} {r['target']:6} {r['kernels']:7d} {r['ops']:7d} {r['best_s']:7.2f} "
              f"{r['median_s']:8.2f}  {'yes' if r['under_5s'] else 'NO'}")
    result = {"date": date.today().isoformat(), "machine": {"platform": platform.platform(),
              "cpu": cpu_model(), "cores": os.cpu_count()}, "results": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
