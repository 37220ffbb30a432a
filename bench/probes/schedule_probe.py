"""Probe: how much do tile shapes alone move our CUDA kernels at small M? (GPU only.)

Times fp4 and fp4_2of4 GEMMs at (K, N) = (4096, 14336), M in (1, 16), for a few schedules,
with `benchmarks.kernel_time` (back-to-back launches, weights rotated past L2), after checking
each output against the float64 reference. Writes a table and schedule_probe.json to --out.

    PYTHONPATH=/tmp/site:$PWD python3 bench/probes/schedule_probe.py --out $OUT
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MLX_MAX_OPS_PER_BUFFER", "1")  # one launch per graph, as marlin-dsl bench

import numpy as np  # noqa: E402

SCHEDULES = {  # name: (tile_m, tile_n, tile_k, warps_m, warps_n, pipeline, parallel, groups)
    "64x64x32 2x2 fused": (64, 64, 32, 2, 2, "fused", 0, 0),
    "64x64x32 2x2 db": (64, 64, 32, 2, 2, "db", 0, 0),
    "16x64x32 1x2 db": (16, 64, 32, 1, 2, "db", 0, 0),
    "16x128x32 1x4 db": (16, 128, 32, 1, 4, "db", 0, 0),
    "16x128x64 1x4 db": (16, 128, 64, 1, 4, "db", 0, 0),
    "16x64x64 1x2 striped p4": (16, 64, 64, 1, 2, "striped", 4, 264),
    "16x128x64 1x4 striped p4": (16, 128, 64, 1, 4, "striped", 4, 264),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import mlx.core as mx

    from marlin_dsl import builtin_format, pack, reference_matmul
    from marlin_dsl.targets.cuda.launch import build_cuda_kernel
    from marlin_dsl.compiler import compile_gemm
    from marlin_dsl.benchmarks import kernel_time
    from marlin_dsl.schedule import DoubleBuffered, FusedDequant, Gemm, Schedule, StripedKParallel
    from marlin_dsl.machine import CUDA

    k, n = 4096, 14336
    rng = np.random.default_rng(0)
    rows = []
    for fmt_name in ("fp4", "fp4_2of4"):
        fmt = builtin_format(fmt_name)
        packed = [pack(fmt, rng.standard_normal((k, n)).astype(np.float32)) for _ in range(4)]
        for label, (tm, tn, tk, wm, wn, kind, par, groups) in SCHEDULES.items():
            pipeline = {"fused": FusedDequant(), "db": DoubleBuffered(),
                        "striped": StripedKParallel(parallel=par or 2, groups=groups or 8)}[kind]
            sched = Schedule("probe", tile_m=tm, tile_n=tn, tile_k=tk, warps_m=wm, warps_n=wn, pipeline=pipeline)
            gemm = build_cuda_kernel(compile_gemm(Gemm(f"probe_{fmt_name}", fmt, sched), CUDA).kernel)
            weights = [gemm.weights(p) for p in packed]
            for m in (1, 16):
                x = mx.array(rng.standard_normal((m, k)).astype(np.float16))
                y = gemm(weights[0], x)
                ref = reference_matmul(np.array(x).astype(np.float64), packed[0])
                rel = float(np.linalg.norm(np.array(y).astype(np.float64) - ref) / np.linalg.norm(ref))
                t = kernel_time(mx, lambda i: gemm(weights[i % 4], x, poison=False), repeats=5)
                row = {"format": fmt_name, "schedule": label, "M": m, "K": k, "N": n,
                       "kernel_us": t.per_launch_s * 1e6, "rel_error": rel}
                rows.append(row)
                print(f"{fmt_name:9} {label:26} M={m:<3} {row['kernel_us']:8.1f} us  rel {rel:.1e}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "schedule_probe.json").write_text(json.dumps(
        {"device": str(mx.default_device()), "mlx": mx.__version__, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
