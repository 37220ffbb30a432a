"""Issue 35 on the GPU: the epilogue kernels (marlin_dsl/epilogue.py) through the layer path,
checked and timed.

1. Checks: `models.fused_block.epilogue_call` on MarlinLinear layers (backend cuda, outputs
   NaN-poisoned: MARLIN_DSL_POISON=1) for fp4, uint4_zp, nf4 and fp4_2of4, f16 and bf16, M = 1,
   3, 16, 33, 64, the epilogues silu, bias + gelu_tanh + residual, residual, bias; N tails
   where the epilogue allows them. Each against the float64 composition under the carried error
   model (checks/epilogue_check.py); each launch must be the fused kernel
   (`TargetRuntime.layer_epilogue` not None).
2. Layer times (MLX wall clock per call, 4 weight copies rotated past the L2, medians of 5 runs
   of 200 calls), Llama-3-8B's MLP at M = 1, 16, 32, f16 and bf16:
   - gate/up: the fused epilogue (one launch, I columns out) against today's path (the fused
     layer writing its two parts, then mlx-lm's compiled swiglu) and against mx.matmul fp16
     plus swiglu;
   - down: the residual epilogue against the layer plus an add.

    MARLIN_DSL_POISON=1 python bench/probes/epilogue_gpu.py --out DIR
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
import mlx.nn as nn
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import marlin_dsl as md  # noqa: E402
from marlin_dsl.checks.epilogue_check import compare_epilogue  # noqa: E402
from marlin_dsl.checks.error_model import kernel_weights  # noqa: E402
from marlin_dsl.formats.evaluate import dequantize  # noqa: E402
from marlin_dsl.ir.numerics import round_to_activation  # noqa: E402
from marlin_dsl.models.fuse import FusedLinear  # noqa: E402
from marlin_dsl.models.fused_block import epilogue_call  # noqa: E402
from marlin_dsl.nn import MarlinLinear  # noqa: E402
from marlin_dsl.targets.cuda.runtime import RUNTIME  # noqa: E402

DTYPES = {"f16": mx.float16, "bf16": mx.bfloat16}
EPILOGUES = [("silu",), ("gelu_tanh", "residual"), ("residual",), ()]  # the layer's bias adds "bias"


def check(fmt_name: str, act: str, steps: tuple[str, ...], bias: bool, m: int, k: int, n: int,
          rng: np.random.Generator, keep: dict | None = None) -> dict:
    fmt = md.builtin_format(fmt_name)
    w = rng.standard_normal((k, n)) * 0.05
    packed = md.pack(fmt, w)
    b = rng.standard_normal(n) * 0.5 if bias else None
    layer = MarlinLinear.from_packed(packed, None if b is None else mx.array(b.astype(np.float32)), backend="cuda")
    dtype = DTYPES[act]
    x = round_to_activation(rng.standard_normal((m, k)), act).astype(np.float64)
    n_out = n // 2 if any(s in ("silu", "gelu_tanh") for s in steps) else n
    full = (("bias",) if bias else ()) + steps
    fused = RUNTIME.layer_epilogue(fmt, act, m, k, n, full) is not None
    wd = dequantize(packed)
    scale = float(np.sqrt(np.mean(np.square(x @ wd))))
    r = round_to_activation(rng.standard_normal((m, n_out)) * scale, act).astype(np.float64) if "residual" in steps else None
    extras = () if r is None else (mx.array(r.astype(np.float32)).astype(dtype),)
    y = epilogue_call(layer, steps, mx.array(x.astype(np.float32)).astype(dtype), *extras)
    y = np.array(y.astype(mx.float32)).astype(np.float64)
    bias_read = None if b is None else round_to_activation(b, act).astype(np.float64)
    res = compare_epilogue(y, full, x, wd, act, kernel_weights(packed, act), bias_read, r)
    if keep is not None and not res.ok and not keep:  # the first failure's arrays, to look at
        keep.update(y=y, product=x @ wd, residual=np.zeros(0) if r is None else r)
    return {"format": fmt_name, "act": act, "steps": list(full), "m": m, "k": k, "n": n, "fused_kernel": fused,
            "ok": bool(res.ok and fused), "rel": res.rel_error, "tol": res.tolerance, "untouched": res.untouched,
            "summary": res.summary()}


def timed(fn, calls: int = 200, runs: int = 5) -> float:
    """Median us per call of `fn(i)` over `runs` runs of `calls` calls (evaluated at the end)."""
    mx.eval(fn(0))
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        ys = [fn(i) for i in range(calls)]
        mx.eval(ys)
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(out)


def layer_times(act: str, ms: list[int]) -> list[dict]:
    from mlx_lm.models.activations import swiglu

    dtype = DTYPES[act]
    hidden, inter = 4096, 14336
    fmt = md.builtin_format("fp4")
    copies, rows = 4, []
    gate_up = []

    def packed_layer(k: int, n: int) -> tuple[MarlinLinear, mx.array]:
        source = nn.Linear(k, n, bias=False)  # packed on the device (mlx_pack)
        source.weight = (mx.random.normal((n, k)) * 0.02).astype(dtype)
        return MarlinLinear.from_linear(source, fmt, backend="cuda"), source.weight

    for c in range(copies):
        layer, w = packed_layer(hidden, 2 * inter)
        plain = FusedLinear(layer, (inter, inter))
        interleaved = FusedLinear(MarlinLinear.from_packed(layer.to_packed(), backend="cuda"), (inter, inter))
        interleaved.interleave_gate_up()
        gate_up.append((plain, interleaved, w))
    down = [packed_layer(inter, hidden)[0] for _ in range(copies)]
    for m in ms:
        x = mx.random.normal((m, hidden)).astype(dtype)
        h = mx.random.normal((m, inter)).astype(dtype)
        r = mx.random.normal((m, hidden)).astype(dtype)
        mx.eval(x, h, r)

        def parts(i):
            g, u = gate_up[i % copies][0].compute(x)
            return swiglu(g, u)

        t = {"act": act, "m": m,
             "gate_up_epilogue_us": timed(lambda i: epilogue_call(gate_up[i % copies][1].layer, ("silu",), x)),
             "gate_up_parts_swiglu_us": timed(parts),
             "gate_up_fp16_matmul_swiglu_us": timed(lambda i: swiglu(*mx.split(x @ gate_up[i % copies][2].T, 2, axis=-1))),
             "down_residual_epilogue_us": timed(lambda i: epilogue_call(down[i % copies], ("residual",), h, r)),
             "down_plus_add_us": timed(lambda i: down[i % copies](h) + r)}
        rows.append(t)
        print(f"{act} M={m:3d}: gate/up epilogue {t['gate_up_epilogue_us']:7.1f} us, parts+swiglu "
              f"{t['gate_up_parts_swiglu_us']:7.1f}, fp16 matmul+swiglu {t['gate_up_fp16_matmul_swiglu_us']:7.1f} | "
              f"down+residual epilogue {t['down_residual_epilogue_us']:7.1f}, down + add {t['down_plus_add_us']:7.1f}",
              flush=True)
    return rows


def repeat_case(times: int, rng: np.random.Generator, out_dir: Path | None) -> list[dict]:
    """fp4_2of4, bf16, M = 16, N = 520 (run 1's one failure: one element off by 1e28) `times`
    times with the residual epilogue and with the same kernel without one (bias only); the
    first failure's arrays to out_dir/repeat_failure.npz."""
    out, keep = [], {}
    for steps, bias in ((("residual",), False), ((), True)):
        for _ in range(times):
            out.append(check("fp4_2of4", "bf16", steps, bias, 16, 1024, 520, rng, keep))
    if keep and out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        np.savez(out_dir / "repeat_failure.npz", **keep)
    return out


def kernel_launches(calls: int = 3) -> None:
    """Each fp4 gate/up and down kernel of `layer_times` (f16, M = 1 and 16) launched `calls`
    times, evaluated one by one: run under `ncu --csv --metrics gpu__time_duration.sum` for
    the kernels' device times."""
    from mlx_lm.models.activations import swiglu

    fmt = md.builtin_format("fp4")
    hidden, inter = 4096, 14336
    source = nn.Linear(hidden, 2 * inter, bias=False)
    source.weight = (mx.random.normal((2 * inter, hidden)) * 0.02).astype(mx.float16)
    plain = FusedLinear(MarlinLinear.from_linear(source, fmt, backend="cuda"), (inter, inter))
    inter_l = FusedLinear(MarlinLinear.from_linear(source, fmt, backend="cuda"), (inter, inter))
    inter_l.interleave_gate_up()
    for m in (1, 16):
        x = mx.random.normal((m, hidden)).astype(mx.float16)
        mx.eval(x)
        for _ in range(calls):
            mx.eval(epilogue_call(inter_l.layer, ("silu",), x))
            mx.eval(swiglu(*plain.compute(x)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-times", action="store_true")
    parser.add_argument("--no-checks", action="store_true")
    parser.add_argument("--repeat", type=int, default=0, help="repeat run 1's failing case this many times")
    parser.add_argument("--ncu-launches", action="store_true", help="only `kernel_launches` (under ncu)")
    parser.add_argument("--formats", nargs="+", default=["fp4", "uint4_zp", "nf4", "fp4_2of4"])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 3, 16, 33, 64])
    args = parser.parse_args()
    if args.ncu_launches:
        kernel_launches()
        return 0
    rng = np.random.default_rng(35)
    checks = repeat_case(args.repeat, rng, args.out) if args.repeat else []
    for fmt_name in () if args.no_checks else args.formats:
        for act in ("f16", "bf16"):
            for steps in EPILOGUES:
                for m in args.rows:
                    gated = bool(steps) and steps[0] in ("silu", "gelu_tanh")
                    bias = not steps or steps[0] == "gelu_tanh"
                    n = 512 if gated else 520
                    checks.append(check(fmt_name, act, steps, bias, m, 1024, n, rng))
    bad = [c for c in checks if not c["ok"]]
    print(f"checks: {len(checks) - len(bad)}/{len(checks)} pass", flush=True)
    if args.repeat:
        for steps in (["residual"], ["bias"]):
            got = [c for c in checks[:2 * args.repeat] if c["steps"] == steps]
            print(f"repeated fp4_2of4 bf16 M=16 N=520 {'+'.join(steps)}: "
                  f"{sum(not c['ok'] for c in got)}/{len(got)} fail", flush=True)
    for c in bad[:20]:
        print("FAIL", c, flush=True)
    times = [] if args.no_times else layer_times("f16", [1, 16, 32]) + layer_times("bf16", [1, 16, 32])
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        doc = {"device": mx.device_info() if hasattr(mx, "device_info") else str(mx.default_device()),
               "mlx": mx.__version__, "date": date.today().isoformat(), "checks": checks, "times": times}
        (args.out / "epilogue_gpu.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
