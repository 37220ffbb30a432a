"""Kernel text inline or by #include (targets/cuda/launch_text.py): same output, host cost per call.

For each format's layer kernel (the schedule a MarlinLinear picks at M rows), builds the same
compact text twice as `mx.fast.cuda_kernel`: once with the text inline (how MLX was handed it
before) and once as two #include lines of files holding it (the default now). Checks that both
produce bit-identical y on random inputs (NaN-poisoned outputs), then times each the way
bench/probes/launch_overhead.py does: "call" is the Python call (graph building), "batched" the wall
time per launch of `--calls` launches evaluated together, at 256 x 256 where the device time is
negligible, next to `mx.quantized_matmul` on the same shape. Run on the GPU machine.

    python bench/probes/launch_text_bench.py --out bench/results/<dir>
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from marlin_dsl.formats.builtin import builtin_format  # noqa: E402
from marlin_dsl.formats.pack_weights import pack  # noqa: E402
from marlin_dsl.targets.cuda.launch_text import mlx_strings  # noqa: E402
from marlin_dsl.targets.cuda.runtime import cuda_gemm, cuda_schedule, cuda_weights  # noqa: E402


def timed(fn, calls: int, repeats: int) -> tuple[float, float]:
    mx.eval(fn())
    build, total = [], []
    for _ in range(repeats):
        mx.synchronize()
        t0 = time.perf_counter()
        outs = [fn() for _ in range(calls)]
        t1 = time.perf_counter()
        mx.eval(outs)
        mx.synchronize()
        t2 = time.perf_counter()
        build.append((t1 - t0) / calls * 1e6)
        total.append((t2 - t0) / calls * 1e6)
    return statistics.median(build), statistics.median(total)


def kernels(gemm, mode_names: tuple[str, ...]) -> dict:
    """The gemm's compact text as one mx.fast.cuda_kernel per mode."""
    src = gemm.source.compact()
    out = {}
    for mode in mode_names:
        header, body = mlx_strings(f"{gemm.name}_{mode}", src.header, src.body, mode=mode)
        out[mode] = (mx.fast.cuda_kernel(name=f"{gemm.name}_{mode}", input_names=list(src.input_names),
                                         output_names=list(src.output_names), source=body, header=header,
                                         **src.shared_memory_kwargs), len(header) + len(body))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", nargs="+", default=["fp4", "uint4_zp", "nf4", "fp4_2of4"])
    parser.add_argument("--m", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    k = n = 256
    rng = np.random.default_rng(0)
    w = rng.standard_normal((k, n)).astype(np.float32)
    rows, failures = [], 0
    for name in args.formats:
        fmt = builtin_format(name)
        packed = pack(fmt, w)
        for m in args.m:
            gemm = cuda_gemm(fmt, "f16", cuda_schedule(fmt, m, k, n))
            weights = cuda_weights(gemm, packed)
            s = gemm.source
            x = mx.array(rng.standard_normal((m, k)).astype(np.float16))
            dims = mx.array(s.dims({"M": m, "N": n, "K": k}))
            grid, tg = s.launch_dims({"M": m, "N": n, "K": k})
            inputs = [x if nm == "x" else dims if nm == "dims" else weights.arrays[nm] for nm in s.input_names]
            ys = {}
            for mode, (kern, chars) in kernels(gemm, ("inline", "include")).items():
                def call(kern=kern, poison=None):
                    return kern(inputs=inputs, output_shapes=[(m, n)], output_dtypes=[mx.float16],
                                grid=grid, threadgroup=tg, init_value=poison)[0]
                ys[mode] = np.array(call(poison=float("nan")))
                c, b = timed(call, args.calls, args.repeats)
                rows.append({"format": name, "m": m, "mode": mode, "chars_per_call": chars,
                             "call_us": c, "batched_us": b})
                print(f"{name:>9} M={m:<3} {mode:>8} ({chars:6d} chars handed to MLX): "
                      f"call {c:6.2f} us  batched {b:6.2f} us/launch", flush=True)
            same = bool(np.array_equal(ys["inline"].view(np.uint16), ys["include"].view(np.uint16)))
            finite = bool(np.isfinite(ys["include"]).all())
            failures += not (same and finite)
            print(f"{name:>9} M={m:<3} outputs bit-identical: {same}, all written: {finite}", flush=True)
            rows[-1]["same_as_inline"] = same
            rows[-1]["all_written"] = finite
    wq = mx.array(w.T).astype(mx.float16)
    q, sc, bi = mx.quantize(wq, group_size=64, bits=4)
    x1 = mx.array(rng.standard_normal((1, k)).astype(np.float16))
    c, b = timed(lambda: mx.quantized_matmul(x1, q, sc, bi, transpose=True, group_size=64, bits=4),
                 args.calls, args.repeats)
    rows.append({"format": "mx.quantized_matmul", "m": 1, "mode": "builtin", "call_us": c, "batched_us": b})
    print(f"mx.quantized_matmul M=1: call {c:6.2f} us  batched {b:6.2f} us/launch")
    doc = {"device": mx.device_info() if hasattr(mx, "device_info") else str(mx.default_device()),
           "mlx": mx.__version__, "date": date.today().isoformat(), "shape": [k, n], "rows": rows}
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "launch_text.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print("ALL PASS" if failures == 0 else f"FAILURES: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
