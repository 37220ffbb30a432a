"""Probe: weight-stream schedules on the GPU, checked and timed, next to MLX's 4-bit qmm.

For each format, (K, N), M and schedule: y is checked against the float64 reference
(relative Frobenius error), then kernel time is measured with `benchmarks.kernel_time`
(back-to-back launches, weights rotated through copies past L2). MLX's 4-bit
`quantized_matmul` (group 64) is timed the same way on the same shapes.

    PYTHONPATH=/tmp/site:$PWD python3 bench/probes/stream_probe.py --out $OUT [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MLX_MAX_OPS_PER_BUFFER", "1")

import numpy as np  # noqa: E402

# name: (tile_m, tile_n, warps_n, k_warps, depth)
SCHEDULES = {
    "m8 n16 k8": (8, 16, 1, 8, 1),
    "m8 n16 k8 d2": (8, 16, 1, 8, 2),
    "m8 n16 k8 d3": (8, 16, 1, 8, 3),
    "m8 n16 k16 d2": (8, 16, 1, 16, 2),
    "m8 n32 w2 k8 d2": (8, 32, 2, 8, 2),
    "m16 n16 k8 d2": (16, 16, 1, 8, 2),
    "m16 n32 w2 k4 d2": (16, 32, 2, 4, 2),
    "m32 n32 w2 k4 d2": (32, 32, 2, 4, 2),
    "m64 n32 w2 k2 d2": (64, 32, 2, 2, 2),
    "m8 n32 k4": (8, 32, 1, 4, 1),
    "m8 n32 w2 k4": (8, 32, 2, 4, 1),
    "m8 n64 w2 k4": (8, 64, 2, 4, 1),
    "m16 n32 w2 k4": (16, 32, 2, 4, 1),
    "m16 n16 k8": (16, 16, 1, 8, 1),
    "m32 n32 w2 k2": (32, 32, 2, 2, 1),
    "m64 n64 w4 k1": (64, 64, 4, 1, 1),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--formats", default="fp4,int4,uint4_zp")
    ap.add_argument("--shapes", default="4096x4096,4096x14336,14336x4096")
    ap.add_argument("--ms", default="1,16,64")
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    import mlx.core as mx

    from marlin_dsl import builtin_format, pack, reference_matmul
    from marlin_dsl.targets.cuda.launch import build_cuda_kernel
    from marlin_dsl.compiler import compile_gemm
    from marlin_dsl.benchmarks import kernel_time
    from marlin_dsl.schedule import Gemm, Schedule, WeightStream
    from marlin_dsl.machine import CUDA

    rng = np.random.default_rng(0)
    rows = []
    started = time.time()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    ms = [int(v) for v in args.ms.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)

    def dump() -> None:
        (args.out / "stream_probe.json").write_text(json.dumps(
            {"device": str(mx.default_device()), "mlx": mx.__version__,
             "date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=2))

    for k, n in shapes:
        w = rng.standard_normal((k, n)).astype(np.float32)
        wt = mx.array(np.ascontiguousarray(w.T).astype(np.float16))
        q = [mx.quantize(wt, group_size=64, bits=4) for _ in range(3)]
        mx.eval(*[a for t in q for a in t])
        for m in ms:
            x = mx.array(rng.standard_normal((m, k)).astype(np.float16))
            t = kernel_time(mx, lambda i: mx.quantized_matmul(x, *q[i % 3], transpose=True, group_size=64, bits=4),
                            repeats=args.repeats)
            rows.append({"subject": "mlx_q4", "K": k, "N": n, "M": m, "kernel_us": t.per_launch_s * 1e6})
            print(f"{k}x{n} M={m:<4} mlx_q4 {t.per_launch_s * 1e6:8.1f} us", flush=True)
        for fmt_name in args.formats.split(","):
            fmt = builtin_format(fmt_name)
            packed = [pack(fmt, w if i == 0 else rng.standard_normal((k, n)).astype(np.float32)) for i in range(3)]
            for label in args.schedules.split(","):
                tm, tn, wn, kw, depth = SCHEDULES[label]
                sched = Schedule("probe", tile_m=tm, tile_n=tn, tile_k=64, warps_m=1, warps_n=wn,
                                 pipeline=WeightStream(k_warps=kw, depth=depth))
                try:
                    gemm = build_cuda_kernel(compile_gemm(Gemm(f"ws_{fmt_name}", fmt, sched), CUDA).kernel)
                except Exception as e:  # noqa: BLE001
                    print(f"{fmt_name} {label}: {e}", flush=True)
                    continue
                weights = [gemm.weights(p) for p in packed]
                for m in ms:
                    x = mx.array(rng.standard_normal((m, k)).astype(np.float16))
                    y = gemm(weights[0], x)
                    ref = reference_matmul(np.array(x).astype(np.float64), packed[0])
                    yn = np.array(y).astype(np.float64)
                    rel = float(np.linalg.norm(np.nan_to_num(yn, nan=1e9) - ref) / np.linalg.norm(ref))
                    t = kernel_time(mx, lambda i: gemm(weights[i % 3], x, poison=False), repeats=args.repeats)
                    row = {"subject": f"ws {fmt_name}", "schedule": label, "K": k, "N": n, "M": m,
                           "kernel_us": t.per_launch_s * 1e6, "rel_error": rel}
                    rows.append(row)
                    print(f"{k}x{n} M={m:<4} {fmt_name:9} {label:16} {row['kernel_us']:8.1f} us  rel {rel:.1e}"
                          f"{'  FAIL' if not rel < 2e-3 else ''}", flush=True)
                dump()
    dump()
    print(f"done in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
