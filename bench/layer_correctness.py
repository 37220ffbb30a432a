"""The layer path on the GPU (issue 12): what `MarlinLinear` does on MLX's CUDA backend, checked
against independent oracles.

Runs on the GPU machine (MLX with CUDA; /work/shared/GPU.md):

    MARLIN_DSL_POISON=1 python bench/layer_correctness.py --out $OUT

1. Device packing: `mlx_pack.pack_mx` on the GPU equals `marlin_dsl.pack` (numpy, float64)
   bit for bit, for every built-in format and f16/bf16 weights.
2. Device layout: the CUDA weight layout made with MLX ops on the GPU equals the numpy one
   (`stream_arrays`), and converts back exactly.
3. Layers: `MarlinLinear` (built-ins via `from_linear`, MLX's modes via
   `from_quantized_linear`) at M = 1, 3, 16, 65, 512 on 4096 x 4096 and tail shapes, against
   the float64 reference of its own packed weight (relative Frobenius error, `REL_TOL`),
   outputs poisoned with NaN (MARLIN_DSL_POISON=1). MLX's modes are also compared with
   `mx.quantized_matmul` of the original layer.
4. `mx.compile` of a function calling the layer gives the same output.
A table is printed last; results.json goes to --out. Exit 1 if anything fails.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import marlin_dsl as md  # noqa: E402
from marlin_dsl.checks.kernel_check import REL_TOL  # noqa: E402
from marlin_dsl.layers.weights import to_layout, to_linear  # noqa: E402
from marlin_dsl.layouts.weight_stream import stream_arrays  # noqa: E402
from marlin_dsl.layers.mlx_ops import packed_to_mx, packed_to_numpy  # noqa: E402
from marlin_dsl.layers.mlx_pack import pack_mx  # noqa: E402
from marlin_dsl.nn import MarlinLinear  # noqa: E402

SHAPES = ((4096, 4096), (4096 + 128, 4096 + 40), (14336, 1024 + 8))
MS = (1, 3, 16, 65, 512)
MLX_MODES = (("affine", 4, 64), ("affine", 8, 32), ("affine", 2, 128), ("affine", 3, 64),
             ("mxfp4", 4, 32), ("nvfp4", 4, 16), ("mxfp8", 8, 32))
results: list[dict] = []


def record(kind: str, name: str, ok: bool, **info) -> None:
    results.append({"check": kind, "name": name, "ok": bool(ok), **info})
    detail = " ".join(f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}" for k, v in info.items())
    print(f"{'ok  ' if ok else 'FAIL'} {kind:<8} {name:<34} {detail}", flush=True)


def rel_error(y: mx.array, ref: np.ndarray) -> tuple[float, int]:
    yv = np.array(y.astype(mx.float32)).astype(np.float64)
    nan = int(np.isnan(yv).sum())
    finite = np.where(np.isnan(yv), 0.0, yv)
    return float(np.linalg.norm(finite - ref) / max(np.linalg.norm(ref), 1e-300)), nan


def check_packing(rng: np.random.Generator) -> None:
    for name in md.BUILTIN_FORMATS:
        fmt = md.builtin_format(name)
        for dtype in (mx.float16, mx.bfloat16):
            w = mx.array(rng.standard_normal((4096, 1024 + 8)) * 0.02).astype(dtype)
            t0 = time.perf_counter()
            packed = pack_mx(fmt, w)
            mx.eval(packed.arrays)
            seconds = time.perf_counter() - t0
            want = md.pack(fmt, np.array(w.astype(mx.float32)))
            got = packed_to_numpy(packed.arrays)
            same = all(np.array_equal(got[k], want[k]) for k in want.arrays)
            record("pack", f"{name} {dtype}", same, seconds=seconds)


def check_layout(rng: np.random.Generator) -> None:
    for name in ("fp4", "uint4_zp", "nf4", "fp4_2of4", "int4_2of4"):
        fmt = md.builtin_format(name)
        k, n = 4096 + 128, 1024 + 40
        packed = md.pack(fmt, rng.standard_normal((k, n)))
        device = to_layout(fmt, (k, n), packed_to_mx(packed.arrays, fmt), "lane_stream")
        want = stream_arrays(fmt, md.CUDA, packed)
        same = all(np.array_equal(np.array(device[a]), want[a]) for a in want)
        back = packed_to_numpy(to_linear(fmt, (k, n), device, "lane_stream"))
        round_trip = all(np.array_equal(back[a], packed[a]) for a in packed.arrays)
        record("layout", name, same and round_trip, round_trip=round_trip)


def check_layers(rng: np.random.Generator, ms: tuple[int, ...], formats: list[str]) -> None:
    for name in formats:
        for k, n in SHAPES:
            linear = nn.Linear(k, n, bias=True)
            linear.set_dtype(mx.float16)
            layer = MarlinLinear.from_linear(linear, name)
            dense = md.dequantize(layer.to_packed())
            bias = np.array(linear.bias.astype(mx.float32)).astype(np.float64)
            for m in ms:
                for dtype, act in ((mx.float16, "f16"), (mx.bfloat16, "bf16")):
                    x = mx.array(rng.standard_normal((m, k))).astype(dtype)
                    ref = np.array(x.astype(mx.float32)).astype(np.float64) @ dense + bias
                    try:
                        rel, nan = rel_error(layer(x), ref)
                        record("layer", f"{name} {k}x{n} M={m} {act}", nan == 0 and rel <= REL_TOL[act],
                               rel=rel, nan=nan, layout=layer.layout)
                    except Exception as exc:  # noqa: BLE001
                        record("layer", f"{name} {k}x{n} M={m} {act}", False, error=repr(exc)[:300],
                               tb=traceback.format_exc()[-2000:])


def check_mlx_modes(rng: np.random.Generator, ms: tuple[int, ...], modes: list[str] | None) -> None:
    for mode, bits, group in MLX_MODES:
        if modes and mode not in modes and f"{mode}{bits}" not in modes:
            continue
        for k, n in SHAPES[:2]:
            linear = nn.Linear(k, n, bias=False)
            linear.set_dtype(mx.float16)
            ql = nn.QuantizedLinear.from_linear(linear, group_size=group, bits=bits, mode=mode)
            layer = MarlinLinear.from_quantized_linear(ql)
            w = mx.dequantize(ql["weight"], ql["scales"], ql.get("biases"), group, bits, mode).T
            w64 = np.array(w.astype(mx.float32)).astype(np.float64)
            for m in ms:
                x = mx.array(rng.standard_normal((m, k))).astype(mx.float16)
                ref = np.array(x.astype(mx.float32)).astype(np.float64) @ w64
                try:
                    rel, nan = rel_error(layer(x), ref)
                    rel_mlx, _ = rel_error(ql(x), ref)
                    ok = nan == 0 and rel <= REL_TOL["f16"]
                    record("mlx", f"{mode}{bits} g{group} {k}x{n} M={m}", ok, rel=rel, mlx_rel=rel_mlx,
                           format=layer.format.name, layout=layer.layout)
                except Exception as exc:  # noqa: BLE001
                    record("mlx", f"{mode}{bits} g{group} {k}x{n} M={m}", False, error=repr(exc)[:300],
                           tb=traceback.format_exc()[-2000:])


def check_compile(rng: np.random.Generator) -> None:
    for name in ("fp4", "fp4_2of4"):
        layer = MarlinLinear(4096, 4096, format=name)
        layer.set_dtype(mx.float16)
        compiled = mx.compile(lambda v: layer(v) * 2.0)
        for m in (1, 16, 512):
            x = mx.array(rng.standard_normal((m, 4096))).astype(mx.float16)
            same = np.array_equal(np.array(compiled(x)), np.array(layer(x) * 2.0))
            record("compile", f"{name} M={m}", same)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="M = 1 and 65 only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checks", nargs="+", default=["pack", "layout", "layers", "mlx", "compile"],
                        choices=["pack", "layout", "layers", "mlx", "compile"])
    parser.add_argument("--formats", nargs="+", default=None, help="built-in formats for 'layers'")
    parser.add_argument("--modes", nargs="+", default=None, help="MLX modes for 'mlx' (affine4, mxfp8, ...)")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    ms = (1, 65) if args.quick else MS
    t0 = time.time()
    checks = {"pack": lambda: check_packing(rng), "layout": lambda: check_layout(rng),
              "layers": lambda: check_layers(rng, ms, args.formats or list(md.BUILTIN_FORMATS)),
              "mlx": lambda: check_mlx_modes(rng, ms, args.modes), "compile": lambda: check_compile(rng)}
    for name in args.checks:
        checks[name]()
    failed = [r for r in results if not r["ok"]]
    print(f"\n{len(results) - len(failed)}/{len(results)} checks passed in {time.time() - t0:.0f} s "
          f"on {mx.device_info().get('device_name', mx.default_device())}, MLX {mx.__version__}")
    for kind in dict.fromkeys(r["check"] for r in results):
        rows = [r for r in results if r["check"] == kind]
        print(f"  {kind:<8} {sum(r['ok'] for r in rows)}/{len(rows)}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "layer_correctness.json").write_text(json.dumps(
            {"device": {k: str(v) for k, v in mx.device_info().items()}, "mlx": mx.__version__,
             "results": results}, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
