"""Issue 34, large M: a layer's two routes on the GPU, in one process. Route "gemm": our GEMM
for m rows (the tuned schedule: the warpgroup kernel on Hopper); route "dequantize": the
dequantize kernel (lowering/dequantize.py) writes W^T [N, K] once, then `mx.matmul` (cuBLAS).
Beside them fp16 / bf16 `mx.matmul` with the weight already in memory (the bound of the second
route) and the dequantize kernel alone.

Checks first (fresh random weights and activations, outputs NaN-poisoned): the dequantize
kernel's W^T equal to the float64 reference rounded once to the activation type (every
element; nf4 within one f16 ulp), and both routes' outputs under the error model's checks
(`checks.gpu_output`). Times: median per call of back-to-back calls rotating weight copies
past the L2 (`benchmarks.timing.kernel_time`), us.

    PYTHONPATH=/tmp/site:$PWD python3 bench/probes/dequantize_gpu.py --out $OUT/dq [--formats fp4,uint4_zp]
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096))
CHECK_SHAPES = ((3, 4096, 4096), (300, 4104, 4224), (1024, 1000, 512))  # (M, N, K): N tails


def routes(fmt, k: int, n: int, arrays: dict):
    """{"gemm": launch, "dequantize": launch}(x) for a weight already in the layer layout, and
    the dequantize kernel alone (x -> W^T)."""
    import mlx.core as mx

    from marlin_dsl.layers.dispatch import TargetDispatch
    from marlin_dsl.targets.cuda.runtime import cuda_dequantize, layer_binding

    gemm = TargetDispatch(fmt, k, n, "cuda")
    gemm._dequantize = lambda activation, m: None  # noqa: SLF001 - the route under test
    deq = TargetDispatch(fmt, k, n, "cuda")

    def forced(activation: str, m: int):  # the route whatever the rows
        return layer_binding(cuda_dequantize(fmt, activation), m, k, n)

    deq._dequantize = forced  # noqa: SLF001
    weights = tuple(arrays[name] for name in gemm.names)

    def alone(activation: str):
        dq = forced(activation, 1)
        dims = mx.array(dq.dims, dtype=mx.uint32)
        dt = mx.float16 if activation == "f16" else mx.bfloat16
        return lambda ws: dq.kernel(inputs=[*ws, dims], output_shapes=[(n, k)], output_dtypes=[dt], grid=dq.grid,
                                    threadgroup=dq.threadgroup)[0]
    return gemm, deq, weights, alone


def variants(a, res: dict, rng, layer_arrays) -> int:
    """The dequantize kernel's variants (`--variants`): each checked bit for bit against the
    reference on one shape, then timed alone and in the route; returns the failures."""
    if not a.variants:
        return 0
    import mlx.core as mx

    import marlin_dsl as md
    import marlin_dsl.lowering.dequantize as dq
    from marlin_dsl.benchmarks.timing import copies_for, kernel_time
    from marlin_dsl.checks.format_check import sample_weights
    from marlin_dsl.targets.cuda.runtime import cuda_dequantize

    fmt = md.builtin_format(a.formats.split(",")[0])
    m = int(a.ms.split(",")[0])
    failures = 0
    res["variants"] = []
    for spec in a.variants.split(","):
        dq.DEQUANT_VECTORS, dq.DEQUANT_DEPTH = (int(v) for v in spec.split(":"))
        cuda_dequantize.cache_clear()
        packed = md.pack(fmt, sample_weights(fmt, 4224, 1000, rng))
        _, _, weights, alone = routes(fmt, 4224, 1000, layer_arrays(fmt, packed))
        w = np.array(alone("f16")(weights).astype(mx.float32)).astype(np.float64)
        exact = bool(np.array_equal(w, md.dequantize(packed).T.astype(np.float16).astype(np.float64)))
        failures += not exact
        for shape in a.shapes.split(","):
            k, n = (int(v) for v in shape.split("x"))
            packed = md.pack(fmt, sample_weights(fmt, k, n, rng))
            copies = [layer_arrays(fmt, packed) for _ in range(copies_for(k * n // 2))]
            _, deq, _, alone = routes(fmt, k, n, copies[0])
            ws = [tuple(c[name] for name in deq.names) for c in copies]
            x = mx.array(rng.standard_normal((m, k)).astype(np.float16))
            mx.eval(x, *[v for c in copies for v in c.values()])
            run = alone("f16")
            row = {"variant": spec, "K": k, "N": n, "M": m, "exact": exact,
                   "alone_us": kernel_time(mx, lambda i: run(ws[i % len(ws)]), 5).per_launch_s * 1e6,
                   "dequantize_us": kernel_time(mx, lambda i: deq(x, ws[i % len(ws)]), 5).per_launch_s * 1e6}
            res["variants"].append(row)
            print(f"variant {spec} {k}x{n} M={m}: alone {row['alone_us']:.1f} route {row['dequantize_us']:.1f} "
                  f"{'exact' if exact else 'FAIL'}", flush=True)
    return failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--formats", default="fp4,uint4_zp")
    ap.add_argument("--acts", default="f16,bf16")
    ap.add_argument("--ms", default="256,512,1024,2048")
    ap.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES))
    ap.add_argument("--variants", default="", help="vectors:depth,... of the dequantize kernel "
                    "(DEQUANT_VECTORS, DEQUANT_DEPTH), each checked and timed alone and in the route "
                    "(f16, the first format, M = the first of --ms) after the main run")
    ap.add_argument("--no-main", action="store_true", help="only the variants")
    a = ap.parse_args()
    import mlx.core as mx

    import marlin_dsl as md
    from marlin_dsl.benchmarks.provenance import git_commit
    from marlin_dsl.benchmarks.timing import copies_for, kernel_time
    from marlin_dsl.checks.format_check import sample_weights
    from marlin_dsl.checks.gpu_output import check_gpu_output
    from marlin_dsl.ir.numerics import round_bf16
    from marlin_dsl.kernel_args import physical_arrays
    from marlin_dsl.targets.cuda.runtime import cuda_dequantize

    device = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                            text=True).stdout.strip()
    res = {"device": device, "date": _dt.date.today().isoformat(), "mlx": mx.__version__,
           "commit": git_commit(ROOT), "checks": [], "times": []}
    mxd = {"f16": mx.float16, "bf16": mx.bfloat16}
    rng = np.random.default_rng(20261129)
    failures = 0

    def layer_arrays(fmt, packed):
        attrs = cuda_dequantize(fmt, "f16").source.attrs  # the stream layout every route reads
        return {nm: mx.array(np.ascontiguousarray(v).ravel()) for nm, v in physical_arrays(attrs, packed).items()}

    for fmt_name in ([] if a.no_main else a.formats.split(",")):
        fmt = md.builtin_format(fmt_name)
        for act in a.acts.split(","):
            for m, n, k in CHECK_SHAPES:
                packed = md.pack(fmt, sample_weights(fmt, k, n, rng))
                arrays = layer_arrays(fmt, packed)
                gemm, deq, weights, alone = routes(fmt, k, n, arrays)
                w = np.array(alone(act)(weights).astype(mx.float32)).astype(np.float64)
                ref = md.dequantize(packed).T
                ref = np.asarray(round_bf16(ref) if act == "bf16" else ref.astype(np.float16), np.float64)
                ulp = np.spacing(np.abs(ref).astype(np.float16 if act == "f16" else np.float32)).astype(np.float64)
                tol = ulp if fmt_name == "nf4" and act == "f16" else 0.0
                exact = bool((np.abs(w - ref) <= tol).all())
                x = rng.standard_normal((m, k))
                xa = mx.array(x.astype(np.float32)).astype(mxd[act])
                xr = np.array(xa.astype(mx.float32)).astype(np.float64)
                row = {"format": fmt_name, "act": act, "shape": [m, n, k], "w_exact": exact,
                       "w_nan": int(np.isnan(w).sum())}
                for route, d in (("gemm", gemm), ("dequantize", deq)):
                    y = np.array(d(xa, weights).astype(mx.float32)).astype(np.float64)
                    chk = check_gpu_output(y, xr, packed, act)
                    row[f"{route}_ok"], row[f"{route}_rel"] = bool(chk.ok), float(chk.rel_error)
                ok = exact and row["w_nan"] == 0 and row["gemm_ok"] and row["dequantize_ok"]
                failures += not ok
                res["checks"].append(row)
                print("check", row, "ok" if ok else "FAIL", flush=True)
    for shape in ([] if a.no_main else a.shapes.split(",")):
        k, n = (int(v) for v in shape.split("x"))
        wt = mx.array(rng.standard_normal((n, k)).astype(np.float16))
        wb = wt.astype(mx.bfloat16)
        mx.eval(wt, wb)
        for fmt_name in a.formats.split(","):
            fmt = md.builtin_format(fmt_name)
            packed = md.pack(fmt, sample_weights(fmt, k, n, rng))
            copies = [layer_arrays(fmt, packed) for _ in range(copies_for(k * n // 2))]
            mx.eval(*[v for c in copies for v in c.values()])
            gemm, deq, _, alone = routes(fmt, k, n, copies[0])
            ws = [tuple(c[name] for name in gemm.names) for c in copies]
            for act in a.acts.split(","):
                dense = wt if act == "f16" else wb
                dq_alone = alone(act)
                t_alone = kernel_time(mx, lambda i: dq_alone(ws[i % len(ws)]), 5).per_launch_s * 1e6
                for m in (int(v) for v in a.ms.split(",")):
                    x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(mxd[act])
                    mx.eval(x)
                    row = {"format": fmt_name, "act": act, "M": m, "K": k, "N": n, "dequantize_alone_us": t_alone}
                    row["matmul_us"] = kernel_time(mx, lambda i: mx.matmul(x, dense.T), 5).per_launch_s * 1e6
                    for route, d in (("gemm", gemm), ("dequantize", deq)):
                        row[f"{route}_us"] = kernel_time(mx, lambda i: d(x, ws[i % len(ws)]), 5).per_launch_s * 1e6
                    res["times"].append(row)
                    print(f"time {fmt_name} {act} M={m:5d} {k}x{n}: matmul {row['matmul_us']:.1f} gemm "
                          f"{row['gemm_us']:.1f} dequantize {row['dequantize_us']:.1f} (alone {t_alone:.1f}) "
                          f"best/matmul {row['matmul_us'] / min(row['gemm_us'], row['dequantize_us']):.2f}x",
                          flush=True)
            copies.clear()
    failures += variants(a, res, rng, layer_arrays)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "dequantize_gpu.json").write_text(json.dumps(res, indent=1))
    print(f"checks: {len(res['checks']) - failures}/{len(res['checks'])} ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
