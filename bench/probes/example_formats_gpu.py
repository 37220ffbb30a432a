"""The example formats through the layer on an NVIDIA GPU: what a user who converts a model to
one of `examples/`'s formats runs (`MarlinLinear`, MLX's CUDA backend), checked with the error
model. Written when issue 16 moved int3 (spare-bit weight stream), block patterns (dense
values) and pair-wise 4:8 (the scattered weight stream) onto CUDA kernels that had only run on
the CPU harness and in the interpreter.

Runs on the GPU machine (MLX with CUDA; /work/shared/GPU.md):

    MARLIN_DSL_POISON=1 PYTHONPATH=/tmp/site:$PWD python3 bench/probes/example_formats_gpu.py --out $OUT

Per example format, weight shape (a 4096 x 4096 matrix and one with K and N tails) and
M in 1, 3, 16, 65, 300: fresh random weights quantised on the device (`from_linear`), fresh
activations in f16 and bf16, outputs poisoned with NaN (MARLIN_DSL_POISON=1), y against the
float64 product of the layer's own packed weight (`checks/gpu_output.check_gpu_output`: the
error model's norm, bias and worst-element checks). Each row names the schedule the CUDA
tuning picks for that M (`targets/cuda/tuning.tuned_schedule`). A table is printed last;
results.json goes to --out; exit 1 if anything fails.

`--time` instead times the layers (`benchmarks/timing.kernel_time`: back-to-back calls in
batches, median, rotating weight copies) at 4096 x 14336 for M = 1 and 2048, with fp16
`nn.Linear` and MLX's 4-bit `nn.QuantizedLinear` (group 64) in the same run; timing.json.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SHAPES = ((4096, 4096), (4096 + 128, 4096 + 40))  # the tail: 4224 is whole groups of 128, not of 160 or 256
MS = (1, 3, 16, 65, 300)


def example_formats(names: list[str] | None) -> dict:
    import marlin_dsl as md

    out = {}
    for path in sorted((ROOT / "examples").glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        out.update({v.name: v for v in vars(module).values() if isinstance(v, md.Format)})
    return {k: v for k, v in out.items() if not names or k in names}


def schedule_name(fmt, m: int, k: int, n: int) -> str:
    from marlin_dsl.errors import ScheduleError
    from marlin_dsl.targets.cuda.tuning import tuned_schedule

    try:
        s = tuned_schedule(fmt, m, k=k, n=n, warpgroup=True)
    except ScheduleError:
        return "format's own kernels"
    return f"{s.pipeline.kind} {s.name}"


def main(argv: list[str] | None = None) -> int:
    import mlx.core as mx
    import mlx.nn as nn

    from marlin_dsl.benchmarks.provenance import git_commit, gpu_name
    from marlin_dsl.checks.gpu_output import check_gpu_output, record
    from marlin_dsl.nn import MarlinLinear

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--formats", nargs="*", help="example format names (default: all)")
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES), help="KxN,...")
    ap.add_argument("--time", action="store_true", help="time the layers instead (timing.json)")
    ap.add_argument("--time-ms", default="1,2048", help="M of the timing")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    if args.time:
        return time_layers(args, rng, ms=tuple(int(v) for v in args.time_ms.split(",")))
    if not os.environ.get("MARLIN_DSL_POISON"):
        print("set MARLIN_DSL_POISON=1: without it an output a kernel never writes is not caught")
        return 2
    ms = [int(v) for v in args.ms.split(",")]
    rows: list[dict] = []
    for name, fmt in example_formats(args.formats).items():
        for k, n in (tuple(int(v) for v in t.split("x")) for t in args.shapes.split(",")):
            linear = nn.Linear(k, n, bias=False)
            linear.weight = mx.array(rng.standard_normal((n, k)) * 0.02).astype(mx.float16)
            try:
                layer = MarlinLinear.from_linear(linear, fmt)
                packed = layer.to_packed()
            except Exception as exc:  # noqa: BLE001
                rows.append({"format": name, "K": k, "N": n, "ok": False, "error": repr(exc)[:300]})
                print(f"FAIL {name} {k}x{n}: {exc!r}"[:300], flush=True)
                continue
            for m in ms:
                for dtype, act in ((mx.float16, "f16"), (mx.bfloat16, "bf16")):
                    row = {"format": name, "K": k, "N": n, "M": m, "activation": act,
                           "layout": layer.layout, "schedule": schedule_name(fmt, m, k, n)}
                    try:
                        x = mx.array(rng.standard_normal((m, k))).astype(dtype)
                        t0 = time.perf_counter()
                        y = layer(x)
                        mx.eval(y)
                        row["seconds_first_call"] = round(time.perf_counter() - t0, 3)
                        xv = np.array(x.astype(mx.float32)).astype(np.float64)
                        yv = np.array(y.astype(mx.float32)).astype(np.float64)
                        row.update(record(check_gpu_output(yv, xv, packed, act)))
                    except Exception as exc:  # noqa: BLE001
                        row.update(ok=False, error=repr(exc)[:300], tb=traceback.format_exc()[-1500:])
                    rows.append(row)
                    print(f"{'ok  ' if row['ok'] else 'FAIL'} {name:20} {k}x{n} M={m:<4} {act:4} "
                          f"{row['schedule']:40} rel={row.get('rel_error', float('nan')):.2e} "
                          f"tol={row.get('tolerance', float('nan')):.2e} {row.get('error', '')}", flush=True)
    failed = [r for r in rows if not r["ok"]]
    (args.out / "results.json").write_text(json.dumps(
        {"date": time.strftime("%Y-%m-%d"), "commit": git_commit(ROOT), "device": gpu_name(),
         "rows": rows}, indent=1, default=str))
    print(f"\n{len(rows) - len(failed)}/{len(rows)} checks passed; results in {args.out / 'results.json'}")
    return 1 if failed else 0


def time_layers(args, rng: np.random.Generator, k: int = 4096, n: int = 14336, ms: tuple[int, ...] = (1, 2048)) -> int:
    """Median seconds per layer call, every example format against fp16 and MLX 4-bit."""
    import mlx.core as mx
    import mlx.nn as nn

    from marlin_dsl.benchmarks.provenance import git_commit, gpu_name
    from marlin_dsl.benchmarks.timing import copies_for, kernel_time
    from marlin_dsl.nn import MarlinLinear

    weights = [mx.array(rng.standard_normal((n, k)) * 0.02).astype(mx.float16) for _ in range(copies_for(k * n // 2))]

    def linear(w: mx.array) -> nn.Linear:
        layer = nn.Linear(k, n, bias=False)
        layer.weight = w
        return layer

    subjects = {"fp16": [linear(w) for w in weights],
                "mlx_4bit_g64": [nn.QuantizedLinear.from_linear(linear(w), group_size=64, bits=4) for w in weights]}
    for name, fmt in example_formats(args.formats).items():
        subjects[name] = [MarlinLinear.from_linear(linear(w), fmt) for w in weights]
    rows = []
    for m in ms:
        x = mx.array(rng.standard_normal((m, k))).astype(mx.float16)
        for name, layers in subjects.items():
            t = kernel_time(mx, lambda i, layers=layers: layers[i % len(layers)](x), 5)
            one = kernel_time(mx, lambda i, layer=layers[0]: layer(x), 5)  # one copy: from L2 where it fits
            rows.append({"subject": name, "K": k, "N": n, "M": m, "us": t.per_launch_s * 1e6,
                         "us_one_copy": one.per_launch_s * 1e6, "queue_us": t.queue_s * 1e6,
                         "single_us": t.estimate_s * 1e6, "first_s": t.first_s, "launches": t.launches,
                         "schedule": schedule_name(layers[0].format, m, k, n) if name not in ("fp16", "mlx_4bit_g64") else ""})
            print(f"{name:22} M={m:<5} {t.per_launch_s * 1e6:9.1f} us  one copy {one.per_launch_s * 1e6:8.1f}  "
                  f"queue {t.queue_s * 1e6:6.1f}  single {t.estimate_s * 1e6:8.1f}  {rows[-1]['schedule']}", flush=True)
    (args.out / "timing.json").write_text(json.dumps(
        {"date": time.strftime("%Y-%m-%d"), "commit": git_commit(ROOT), "device": gpu_name(),
         "copies": len(weights), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
