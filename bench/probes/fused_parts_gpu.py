"""Fused layers whose kernel writes the parts (`Gemm.outputs`) on the GPU, against two oracles.

Runs on the GPU machine (MLX with CUDA; /work/shared/GPU.md), outputs NaN-poisoned:

    MARLIN_DSL_POISON=1 python bench/probes/fused_parts_gpu.py --out $OUT

For every built-in format the weight stream takes, f16 and bf16, the q/k/v widths of
Llama-3-8B (4096 + 1024 + 1024 over K = 4096), gate/up (14336 + 14336), and a ragged triple
(1000 + 24 + 40 over K = 1024 + 256), at M = 1, 3, 8, 16 (the weight stream: one kernel, the
parts as its outputs) and 40 (split after one y): a `FusedLinear`'s parts

1. equal `mx.split` of the one-output layer's y bit for bit where the kernel writes parts (the
   same schedule and sums, only the stores differ), and
2. are within the format's tolerance (`REL_TOL`) of the float64 reference of their columns,
   with no NaN left.

A table is printed last; results.json goes to --out. Exit 1 if anything fails.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import date
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import marlin_dsl as md  # noqa: E402
from marlin_dsl.checks.kernel_check import REL_TOL  # noqa: E402
from marlin_dsl.models.fuse import FusedLinear, LinearSlice  # noqa: E402
from marlin_dsl.nn import MarlinLinear  # noqa: E402

FORMATS = ("fp4", "int4", "uint4_zp", "nf4", "fp4_2of4")
GROUPS = {"qkv": (4096, (4096, 1024, 1024)), "gate_up": (4096, (14336, 14336)),
          "ragged": (1280, (1000, 24, 40))}
MS = (1, 3, 8, 16, 40)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", nargs="+", default=list(FORMATS))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not os.environ.get("MARLIN_DSL_POISON"):
        print("note: MARLIN_DSL_POISON is not set: unwritten outputs would not show as NaN")
    rng = np.random.default_rng(2026)
    rows, failed = [], 0
    for fname in args.formats:
        fmt = md.builtin_format(fname)
        for group, (k, widths) in GROUPS.items():
            w = rng.standard_normal((k, sum(widths))).astype(np.float32)
            packed = md.pack(fmt, w)
            starts = np.cumsum((0,) + widths)
            for act, dtype in (("f16", mx.float16), ("bf16", mx.bfloat16)):
                layer = MarlinLinear.from_packed(packed, backend="cuda")
                fused = FusedLinear(MarlinLinear.from_packed(packed, backend="cuda"), widths)
                parts = [LinearSlice(fused, i) for i in range(len(widths))]
                for m in MS:
                    x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(dtype)
                    got = [p(x) for p in parts]
                    whole = mx.split(layer(x), list(starts[1:-1]), axis=-1)
                    mx.eval(got, whole)
                    xs = np.array(x.astype(mx.float32)).astype(np.float64)
                    ref = md.reference_matmul(xs, packed)
                    same = all(np.array_equal(np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32)),
                                              equal_nan=False) for a, b in zip(got, whole))
                    errs, nans = [], 0
                    for i, part in enumerate(got):
                        pv = np.array(part.astype(mx.float32)).astype(np.float64)
                        nans += int(np.isnan(pv).sum())
                        want = ref[:, starts[i]:starts[i + 1]]
                        errs.append(float(np.linalg.norm(np.nan_to_num(pv) - want) / np.linalg.norm(want)))
                    ok = same and nans == 0 and max(errs) <= REL_TOL[act]
                    failed += not ok
                    rows.append({"format": fname, "group": group, "activation": act, "m": m, "k": k,
                                 "widths": list(widths), "bit_identical_to_split": same, "nan": nans,
                                 "max_rel_error": max(errs), "ok": ok})
                    print(f"{'ok  ' if ok else 'FAIL'} {fname:<9} {group:<8} {act:<5} M={m:<3} "
                          f"same-as-split={same} nan={nans} rel={max(errs):.2e}", flush=True)
    print(f"\n{len(rows) - failed}/{len(rows)} fused-parts checks passed")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        doc = {"device": mx.device_info() if hasattr(mx, "device_info") else str(mx.default_device()),
               "mlx": mx.__version__, "date": date.today().isoformat(),
               "poisoned": bool(os.environ.get("MARLIN_DSL_POISON")), "rows": rows}
        (args.out / "fused_parts_gpu.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
