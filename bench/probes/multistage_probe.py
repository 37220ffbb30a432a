"""Probe: multistage (large-M) schedules on the GPU, checked and timed, next to MLX.

For each format and schedule: first a correctness pass on odd shapes (M = 1, 3, 65, 300; N and
K tails, group-32 variants for K not a multiple of the step) against the float64 reference,
then kernel time (`benchmarks.kernel_time`: back-to-back launches, weights rotated through
copies past L2) at each (K, N) and M, with MLX's 4-bit `quantized_matmul` (group 64) and fp16
`mx.matmul` timed the same way.

    PYTHONPATH=/tmp/site:$PWD python3 bench/probes/multistage_probe.py --out $OUT \\
        --schedules 128:256:4:2:4,64:256:2:4:4 [--formats fp4,fp4_2of4] [--ms 256,2048]
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

#: (M, N, K, group) of the correctness pass: M tails, N tails, K tails (group 32)
CHECK_SHAPES = ((1, 4096, 4096, None), (3, 1000, 1024, None), (65, 200, 512, None),
                (300, 520, 2048, None), (129, 264, 96 * 4, 32), (257, 4096, 4096, None))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--formats", default="fp4,fp4_2of4")
    ap.add_argument("--shapes", default="4096x4096,4096x14336,14336x4096")
    ap.add_argument("--ms", default="256,2048")
    ap.add_argument("--schedules", required=True, help="tile_m:tile_n:warps_m:warps_n:stages,...")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-check", action="store_true")
    args = ap.parse_args()
    import mlx.core as mx

    from marlin_dsl import builtin_format, pack, reference_matmul
    from marlin_dsl.targets.cuda.launch import build_cuda_kernel
    from marlin_dsl.compiler import compile_gemm
    from marlin_dsl.benchmarks import kernel_time
    from marlin_dsl.schedule import Gemm, Multistage, Schedule
    from marlin_dsl.targets.cuda.tuning import multistage_schedule
    from marlin_dsl.machine import CUDA

    rng = np.random.default_rng(0)
    rows: list[dict] = []
    started = time.time()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    ms = [int(v) for v in args.ms.split(",") if v]
    args.out.mkdir(parents=True, exist_ok=True)
    configs = [tuple(int(v) for v in c.split(":")) for c in args.schedules.split(",")]

    def dump() -> None:
        (args.out / "multistage_probe.json").write_text(json.dumps(
            {"device": str(mx.default_device()), "mlx": mx.__version__,
             "date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=2))

    def schedule(fmt, cfg) -> Schedule:
        tm, tn, wm, wn, st = cfg
        return Schedule(f"ms_{tm}x{tn}_{wm}x{wn}_s{st}", tile_m=tm, tile_n=tn,
                        tile_k=multistage_schedule(fmt, 2048).tile_k, warps_m=wm, warps_n=wn,
                        pipeline=Multistage(stages=st))

    def rel_error(gemm, weights, x, packed) -> float:
        y = gemm(weights, x)
        ref = reference_matmul(np.array(x.astype(mx.float32)).astype(np.float64), packed)
        yn = np.array(y.astype(mx.float32)).astype(np.float64)
        return float(np.linalg.norm(np.nan_to_num(yn, nan=1e9) - ref) / np.linalg.norm(ref))

    failures = 0
    if not args.no_check:
        for fmt_name in args.formats.split(","):
            for cfg in configs:
                for m, n, k, group in CHECK_SHAPES:
                    fmt = builtin_format(fmt_name, group) if group else builtin_format(fmt_name)
                    if group and "2of4" in fmt_name:
                        k = 160 * 4  # K tail of the 2:4 step (128 dense)
                    for act in ("f16", "bf16"):
                        try:
                            gemm = build_cuda_kernel(compile_gemm(Gemm(f"msc_{fmt_name}", fmt, schedule(fmt, cfg), act), CUDA).kernel)
                        except Exception as e:  # noqa: BLE001
                            print(f"{fmt_name} {cfg}: {e}", flush=True)
                            break
                        w = rng.standard_normal((k, n)).astype(np.float32)
                        packed = pack(fmt, w)
                        dt = mx.float16 if act == "f16" else mx.bfloat16
                        x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(dt)
                        rel = rel_error(gemm, gemm.weights(packed), x, packed)
                        tol = 2e-3 if act == "f16" else 1.6e-2
                        ok = rel < tol
                        failures += not ok
                        rows.append({"check": True, "format": fmt.name, "schedule": list(cfg), "activation": act,
                                     "M": m, "N": n, "K": k, "rel_error": rel, "tolerance": tol, "ok": ok})
                        print(f"check {fmt.name:14} {cfg} {act} M={m} N={n} K={k} rel {rel:.1e} {'ok' if ok else 'FAIL'}",
                              flush=True)
        dump()

    for k, n in shapes:
        w = rng.standard_normal((k, n)).astype(np.float32)
        wt = mx.array(np.ascontiguousarray(w.T).astype(np.float16))
        q = [mx.quantize(wt, group_size=64, bits=4) for _ in range(3)]
        w16 = [mx.array(w.astype(np.float16)) for _ in range(2)]
        mx.eval(*[a for t in q for a in t], *w16)
        xs = {m: mx.array(rng.standard_normal((m, k)).astype(np.float16)) for m in ms}
        for m in ms:
            x = xs[m]
            for subject, fn in (("mlx_q4", lambda i: mx.quantized_matmul(x, *q[i % 3], transpose=True, group_size=64, bits=4)),
                                ("fp16", lambda i: mx.matmul(x, w16[i % 2]))):
                t = kernel_time(mx, fn, repeats=args.repeats)
                rows.append({"subject": subject, "K": k, "N": n, "M": m, "kernel_us": t.per_launch_s * 1e6})
                print(f"{k}x{n} M={m:<5} {subject:10} {t.per_launch_s * 1e6:9.1f} us", flush=True)
        for fmt_name in args.formats.split(","):
            fmt = builtin_format(fmt_name)
            packed = [pack(fmt, w if i == 0 else rng.standard_normal((k, n)).astype(np.float32)) for i in range(3)]
            for cfg in configs:
                try:
                    gemm = build_cuda_kernel(compile_gemm(Gemm(f"ms_{fmt_name}", fmt, schedule(fmt, cfg)), CUDA).kernel)
                except Exception as e:  # noqa: BLE001
                    print(f"{fmt_name} {cfg}: {e}", flush=True)
                    continue
                weights = [gemm.weights(p) for p in packed]
                for m in ms:
                    x = xs[m]
                    t = kernel_time(mx, lambda i: gemm(weights[i % 3], x, poison=False), repeats=args.repeats)
                    row = {"subject": f"ms {fmt_name}", "schedule": list(cfg), "K": k, "N": n, "M": m,
                           "kernel_us": t.per_launch_s * 1e6}
                    rows.append(row)
                    print(f"{k}x{n} M={m:<5} {fmt_name:10} {str(cfg):22} {row['kernel_us']:9.1f} us", flush=True)
                dump()
    dump()
    print(f"failures {failures}; done in {time.time() - started:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
