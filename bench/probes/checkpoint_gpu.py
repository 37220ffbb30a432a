"""Issue 36 on the GPU: checkpoint formats (GGUF, GPTQ, AWQ, bitsandbytes; formats/checkpoint/)
loaded with `MarlinLinear.from_checkpoint` on MLX's CUDA backend, checked and timed.

1. Checks (`--check`): every catalogue format, written from random weights by its derived
   writer and read back, through the layer at M = 1, 3, 16, 33, 65, 256 (f16 and bf16) on
   two shapes, outputs NaN-poisoned (MARLIN_DSL_POISON=1), against x @ W in float64 under the
   error model (`check_gpu_output`; act-order: x's columns permuted).
2. Times (`--time`): M = 1 on Llama-3-8B's three shapes (4096^2, 4096 x 14336, 14336 x 4096),
   f16, MLX wall clock per call, 4 weight copies rotated past the L2; variants in alternating
   rounds (`--rounds`, median and spread): our fp4 (g128), GGUF Q4_K / Q6_K / Q4_0 / Q8_0,
   GPTQ g128 (and act-order), AWQ g128, bitsandbytes NF4; fp16 mx.matmul and MLX 4-bit
   (`nn.QuantizedLinear`, g64) as baselines.

    MARLIN_DSL_POISON=1 python bench/probes/checkpoint_gpu.py --check --time --out DIR
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

from marlin_dsl.checks.gpu_output import check_gpu_output, record  # noqa: E402
from marlin_dsl.formats.builtin import builtin_format  # noqa: E402
from marlin_dsl.formats.checkpoint import awq, bnb, gguf_format, gptq  # noqa: E402
from marlin_dsl.formats.packing import pack_codes  # noqa: E402
from marlin_dsl.formats.tensors import PackedWeights, QuantizedWeights  # noqa: E402
from marlin_dsl.formats.quantize import quantize  # noqa: E402
from marlin_dsl.ir.numerics import round_to_activation  # noqa: E402
from marlin_dsl.nn import MarlinLinear  # noqa: E402

DTYPES = {"f16": mx.float16, "bf16": mx.bfloat16}
BACKEND = "cuda"  # --backend mlx: a dry run of the script on a machine without a GPU
CASES = {
    **{f"gguf_{t.lower()}": (lambda t=t: gguf_format(t), False)
       for t in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")},
    "gptq_g128": (lambda: gptq(4, 128, 1), False), "gptq_g128_act": (lambda: gptq(4, 128, 1), True),
    "gptq8_g128": (lambda: gptq(8, 128, 1), False), "gptq_v2_g32": (lambda: gptq(4, 32, 2), True),
    "awq_g128": (lambda: awq(4, 128), False), "bnb_nf4": (lambda: bnb("nf4"), False),
    "bnb_fp4": (lambda: bnb("fp4"), False), "bnb_nf4_dq": (lambda: bnb("nf4", 64, True), False),
}


def dynamic_map() -> np.ndarray:
    """bitsandbytes' signed dynamic map (the nested absmax table), from the test oracle."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from published_oracles import bnb_dynamic_map

    return bnb_dynamic_map()


def build(case: str, k: int, n: int, rng: np.random.Generator, dtype=mx.float16):
    """(layer, the kernel-format weights, the input order or None) from random weights."""
    make, act_order = CASES[case]
    cf = make()
    w = rng.standard_normal((k, n)) * 0.02
    order = rng.permutation(k) if act_order else None
    q = quantize(cf.format, w if order is None else w[order])
    nested = dynamic_map() if case.endswith("_dq") else None
    tensors = cf.write(q, order, nested_table=nested)
    layer = MarlinLinear.from_checkpoint(tensors, cf, (k, n), name=case, backend=BACKEND)
    if nested is not None:  # double quantisation changed the scales: the layer's own weight
        q = cf.read(tensors, (k, n)).weights
    return layer, q, order


def random_weights(case: str, k: int, n: int, rng: np.random.Generator):
    """Random codes, and the parameters of a small quantised weight tiled along K (the checks
    cover reading checkpoints; timing needs only the kernel format's arrays)."""
    make, act_order = CASES[case]
    fmt = make().format
    small = 2 * fmt.k_multiple
    q = quantize(fmt, rng.standard_normal((small, n)) * 0.02)
    params = {a.name: np.tile(q.parameter(a.name), (k // small, 1)) if a.per_group else q.parameter(a.name)
              for a in fmt.scaling.arrays()}
    codes = rng.integers(0, 1 << fmt.element.bits, size=(k, n), dtype=np.uint8)
    return QuantizedWeights.from_arrays(fmt, codes, params), (rng.permutation(k) if act_order else None)


def clone(packed, order: np.ndarray | None) -> MarlinLinear:
    arrays = {name: mx.array(a) for name, a in packed.arrays.items()}
    layer = MarlinLinear.from_packed(PackedWeights(packed.format, packed.shape, arrays), backend=BACKEND)
    if order is not None:
        layer.input_order = mx.array(order.astype(np.uint32))
        layer.freeze()
    return layer


def checks(ms: list[int], shapes: list[tuple[int, int]], acts: list[str]) -> list[dict]:
    rng = np.random.default_rng(36)
    rows = []
    for case in CASES:
        for k, n in shapes:
            layer, q, order = build(case, k, n, rng)
            packed = pack_codes(q)
            for act in acts:
                for m in ms:
                    x = round_to_activation(rng.standard_normal((m, k)), act).astype(np.float64)
                    y = layer(mx.array(x.astype(np.float32)).astype(DTYPES[act]))
                    y = np.array(y.astype(mx.float32)).astype(np.float64)
                    res = check_gpu_output(y, x if order is None else x[:, order], packed, act)
                    rows.append({"case": case, "format": q.format.name, "act": act, "m": m, "k": k, "n": n,
                                 "ok": bool(res.ok), **record(res)})
                    if not res.ok:
                        print(f"FAIL {case} {act} M={m} {k}x{n}: {res.failures()}", flush=True)
        done = [r for r in rows if r["case"] == case]
        print(f"{case:14s} {sum(r['ok'] for r in done)}/{len(done)} ok, worst rel "
              f"{max(r['rel_error'] for r in done):.2e}", flush=True)
    return rows


def times(rounds: int, calls: int, variants: list[str], shapes: list[tuple[int, int]]) -> list[dict]:
    rng = np.random.default_rng(1)
    rows = []
    for k, n in shapes:
        layers: dict[str, list] = {}
        for v in variants:
            copies = []
            for _ in range(4):
                if v == "fp16":
                    w = (mx.random.normal((n, k)) * 0.02).astype(mx.float16)
                    copies.append(lambda x, w=w: x @ w.T)
                elif v == "mlx_4bit":
                    lin = nn.Linear(k, n, bias=False)
                    lin.weight = (mx.random.normal((n, k)) * 0.02).astype(mx.float16)
                    copies.append(nn.QuantizedLinear.from_linear(lin, group_size=64, bits=4))
                elif v == "fp4":
                    lin = nn.Linear(k, n, bias=False)
                    lin.weight = (mx.random.normal((n, k)) * 0.02).astype(mx.float16)
                    copies.append(MarlinLinear.from_linear(lin, builtin_format("fp4"), backend=BACKEND))
                elif not copies:  # random codes and parameters (quantising 58M weights takes minutes)
                    q, order = random_weights(v, k, n, rng)
                    packed = pack_codes(q)
                    copies.append(clone(packed, order))
                else:  # the same weight again at other addresses
                    copies.append(clone(packed, order))
            layers[v] = copies
        x = mx.random.normal((1, k)).astype(mx.float16)
        mx.eval(x)
        per: dict[str, list[float]] = {v: [] for v in variants}
        for v in variants:  # warm up (compile, layouts)
            mx.eval([layers[v][i](x) for i in range(4)])
        for _ in range(rounds):
            for v in variants:
                fns = layers[v]
                t0 = time.perf_counter()
                mx.eval([fns[i % 4](x) for i in range(calls)])
                per[v].append((time.perf_counter() - t0) / calls * 1e6)
        base = statistics.median(per["fp4"])
        for v in variants:
            med = statistics.median(per[v])
            rows.append({"k": k, "n": n, "variant": v, "median_us": med, "min_us": min(per[v]), "max_us": max(per[v]),
                         "vs_fp4": med / base, "rounds": rounds, "calls": calls})
            print(f"{k:5d}x{n:5d} {v:14s} {med:8.1f} us ({min(per[v]):.1f}-{max(per[v]):.1f}) "
                  f"{med / base:5.2f}x fp4", flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--check", action="store_true")
    p.add_argument("--time", action="store_true")
    p.add_argument("--quick", action="store_true", help="checks at M = 1, 33, 65, f16, one shape (memcheck)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--shapes", default="4096x4096,4096x14336,14336x4096")
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--backend", default="cuda")
    p.add_argument("--ms", default="", help="checks at these M (with --acts) instead of the full set")
    p.add_argument("--acts", default="f16")
    p.add_argument("--tag", default="", help="suffix of the result file")
    a = p.parse_args()
    global BACKEND
    BACKEND = a.backend
    a.out.mkdir(parents=True, exist_ok=True)
    result: dict = {"date": str(date.today()), "device": mx.device_info().get("device_name", "?")
                    if hasattr(mx, "device_info") else "?"}
    ok = True
    if a.check:
        if a.quick:
            rows = checks([1, 33, 65], [(512, 264)], ["f16"])
        elif a.ms:
            rows = checks([int(m) for m in a.ms.split(",")], [(512, 264), (4096, 1032)], a.acts.split(","))
        else:
            rows = checks([1, 3, 16, 33, 65, 256], [(512, 264), (4096, 1032)], ["f16", "bf16"])
        result["checks"] = rows
        ok = all(r["ok"] for r in rows)
        print(f"checks: {sum(r['ok'] for r in rows)}/{len(rows)} ok")
    if a.time:
        shapes = [tuple(int(d) for d in s.split("x")) for s in a.shapes.split(",")]
        result["times"] = times(a.rounds, a.calls, ["fp16", "mlx_4bit", "fp4", "gguf_q4_k", "gguf_q6_k", "gguf_q4_0",
                                                    "gguf_q8_0", "gptq_g128", "gptq_g128_act", "awq_g128", "bnb_nf4"], shapes)
    name = "checkpoint_gpu" + ("_quick" if a.quick else "") + a.tag + ".json"
    (a.out / name).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
