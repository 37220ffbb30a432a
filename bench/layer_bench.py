"""What a layer call costs: MarlinLinear against mlx.nn.QuantizedLinear and fp16 nn.Linear.

Run on the GPU machine (MLX with its CUDA backend; see /work/shared/GPU.md). For each weight
shape and row count M, every layer type is called `--calls` times on fresh inputs, rotating
among weight copies that together exceed the 50 MB L2 (so weights come from DRAM as in a
model), and evaluated once: "batched per call" is the wall time over the calls. "graph build"
is the Python-side time of the calls alone (no evaluation). The tiny shape (256 x 256) makes
the device time negligible, so its batched per-call time is the host cost of one call
(Python + MLX's graph evaluation): the per-call overhead that issue 12 compares.

    python bench/layer_bench.py --out bench/results/layer_h100_DATE
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from marlin_dsl.nn import MarlinLinear  # noqa: E402

FORMATS = ("fp4", "uint4_zp", "nf4", "fp4_2of4")
SHAPES = ((256, 256), (4096, 4096), (4096, 14336), (14336, 4096))
L2_BYTES = 50 << 20


def layers_for(kind: str, linears: list[nn.Linear]) -> list[nn.Module]:
    if kind == "fp16":
        return linears
    if kind == "mlx_4bit_g64":
        return [nn.QuantizedLinear.from_linear(lin, group_size=64, bits=4) for lin in linears]
    return [MarlinLinear.from_linear(lin, kind) for lin in linears]


def nbytes(layer: nn.Module) -> int:
    from mlx.utils import tree_flatten

    return sum(a.nbytes for _, a in tree_flatten(layer.parameters()))


def time_calls(layers: list[nn.Module], m: int, k: int, calls: int, repeats: int,
               dtype: mx.Dtype = mx.float16) -> dict:
    xs = [mx.random.normal((m, k)).astype(dtype) for _ in range(4)]
    mx.eval(xs)
    for layer in layers:  # warm-up: compile, bind every launch
        mx.eval(layer(xs[0]))
    build, total = [], []
    for _ in range(repeats):
        mx.synchronize()
        t0 = time.perf_counter()
        outs = [layers[i % len(layers)](xs[i % len(xs)]) for i in range(calls)]
        t1 = time.perf_counter()
        mx.eval(outs)
        mx.synchronize()
        t2 = time.perf_counter()
        build.append((t1 - t0) / calls * 1e6)
        total.append((t2 - t0) / calls * 1e6)
    return {"graph_build_us": statistics.median(build), "batched_per_call_us": statistics.median(total),
            "batched_min_us": min(total)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--m", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--formats", nargs="+", default=list(FORMATS))
    parser.add_argument("--commit", default=None, help="the commit measured (default: git's HEAD)")
    parser.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16",
                        help="the activations' and the unquantised weights' dtype (fp16 rows: nn.Linear in it)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    dtype = getattr(mx, args.dtype)
    kinds = ["fp16", "mlx_4bit_g64", *args.formats]
    rows = []
    for k, n in SHAPES:
        copies = max(1, min(8, -(-L2_BYTES // (k * n // 2))))  # 4-bit copies beyond L2
        linears = [nn.Linear(k, n, bias=False) for _ in range(copies)]
        for lin in linears:
            lin.set_dtype(dtype)
        mx.eval([lin.parameters() for lin in linears])
        for kind in kinds:
            layers = layers_for(kind, linears)
            mx.eval([layer.parameters() for layer in layers])
            for m in args.m:
                r = time_calls(layers, m, k, args.calls, args.repeats, dtype)
                r.update(kind=kind, k=k, n=n, m=m, copies=copies, weight_bytes=nbytes(layers[0]), dtype=args.dtype)
                rows.append(r)
                print(f"{k:>6}x{n:<6} M={m:<4} {args.dtype} {kind:>13}: build {r['graph_build_us']:6.1f} us  "
                      f"batched {r['batched_per_call_us']:7.1f} us/call", flush=True)
            del layers
            mx.clear_cache()
    tiny = {r["kind"]: r for r in rows if (r["k"], r["n"], r["m"]) == (256, 256, 1)}
    base = tiny["mlx_4bit_g64"]["batched_per_call_us"]
    print("\nhost cost per call at 256x256, M=1 (device time negligible), minus mlx 4-bit's:")
    for kind, r in tiny.items():
        print(f"  {kind:>13}: {r['batched_per_call_us']:6.1f} us ({r['batched_per_call_us'] - base:+.1f})")
    doc = {"device": mx.device_info() if hasattr(mx, "device_info") else str(mx.default_device()),
           "mlx": mx.__version__, "date": date.today().isoformat(), "python": platform.python_version(),
           "commit": args.commit or _commit(), "calls": args.calls, "repeats": args.repeats, "rows": rows}
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "layer_bench.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return 0


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=False).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
