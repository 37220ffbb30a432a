"""Issue 6 on the GPU: run-time 2:4 activation sparsity kernels through MLX's CUDA backend.

  python3 bench/probes/activation_gpu.py check [--small]   correctness (sparsify bit-exact vs the numpy
                                                    reference incl. padding words and column
                                                    counts; sparse GEMM vs float64; MVUE mean
                                                    over 10,000 seeds; FFN grads cuda vs mlx)
  python3 bench/probes/activation_gpu.py bench [--out DIR] forward+backward of the sparse FFN vs dense,
                                                    and the kernels alone

Everything is printed; `--out` also writes JSON. Results: bench/results/activation/.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import mlx.core as mx
import numpy as np

from marlin_dsl.activation import kernels
from marlin_dsl.activation.ffn import dense_ffn, sparse_ffn
from marlin_dsl.layouts.sparse_activation import ActivationLayout
from marlin_dsl.formats.activation_reference import operand_shape, sparsify_reference
from marlin_dsl.formats.activation_spec import SparsifySpec
from marlin_dsl.ir.numerics import round_to_activation

MX = {"f16": mx.float16, "bf16": mx.bfloat16}
PATTERN = 12345  # init_value of a second launch: a word the kernel missed would show it


def to_np(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a)


def device_name() -> str:
    try:
        return str(mx.device_info().get("device_name", "cuda"))
    except Exception:  # noqa: BLE001 - informational only
        return "cuda"


def check_sparsify(spec: SparsifySpec, shape: tuple[int, int], seed: int, rng) -> str:
    x = rng.standard_normal(shape).astype(np.float32)
    x[rng.random(shape) < 0.25] = 0.0
    xh = np.asarray(round_to_activation(x, spec.dtype), np.float32)
    xm = mx.array(xh).astype(MX[spec.dtype])
    outs = [kernels.sparsify(xm, spec, seed, "cuda", init_value=iv) for iv in (0, PATTERN)]
    mx.eval(*[a for s in outs for a in (s.values, s.metadata) + ((s.col_zeros,) if spec.stats else ())])
    s0, s1 = outs
    v0, m0 = np.array(s0.values), np.array(s0.metadata)
    if not (np.array_equal(v0, np.array(s1.values)) and np.array_equal(m0, np.array(s1.metadata))):
        return "unwritten words (results depend on the output's initial contents)"
    ref = sparsify_reference(x, spec, seed)
    lay: ActivationLayout = s0.layout.layout
    want_v, want_m = lay.encode(ref, spec.dtype)
    if not np.array_equal(v0, want_v):
        return f"values differ in {(v0 != want_v).sum()} of {v0.size} words"
    if not np.array_equal(m0, want_m):
        return f"metadata differ in {(m0 != want_m).sum()} of {m0.size} words"
    dense, nib = lay.decode(v0, m0, spec.dtype)
    if not np.array_equal(dense, ref.dense):
        return "decoded operand differs"
    if spec.stats:
        for s in outs:
            if not np.array_equal(np.array(s.col_zeros), ref.col_zeros):
                return "column zero counts differ"
    dm = s0.dense_operand()  # the MLX-ops decoder the FFN uses
    if not np.array_equal(to_np(dm), ref.dense):
        return "decode_mx differs"
    return ""


def check_gemm(dtype: str, shape: tuple[int, int], n: int, axis: int, rng) -> tuple[str, float]:
    spec = SparsifySpec("top2", axis, dtype)
    x = rng.standard_normal(shape).astype(np.float32)
    s = kernels.sparsify(mx.array(x).astype(MX[dtype]), spec, 0, "cuda")
    p, length = operand_shape(shape, axis)
    b = rng.standard_normal((length, n)).astype(np.float32)
    bh = np.asarray(round_to_activation(b, dtype), np.float64)
    y = kernels.sparse_matmul(s, mx.array(bh.astype(np.float32)).astype(MX[dtype]), init_value=float("nan"))
    got = to_np(y).astype(np.float64)
    want = sparsify_reference(x, spec).dense.astype(np.float64) @ bh
    err = float(np.abs(got - want).max() / np.abs(want).max())
    tol = 2e-3 if dtype == "f16" else 1.6e-2
    return ("" if np.isfinite(got).all() and err < tol else f"rel err {err:.2e} >= {tol}"), err


def mvue_unbiased(draws: int = 10_000) -> dict:
    rng = np.random.default_rng(6)
    x = rng.standard_normal((8, 32)).astype(np.float32)
    spec = SparsifySpec("mvue", 1, "f16")
    xh = np.asarray(round_to_activation(x, "f16"), np.float64)
    xm = mx.array(xh.astype(np.float32)).astype(mx.float16)
    total = np.zeros_like(xh)
    total_sq = np.zeros_like(xh)
    t0 = time.perf_counter()
    for seed in range(draws):
        d = to_np(kernels.sparsify(xm, spec, seed, "cuda").dense_operand()).astype(np.float64)
        total += d
        total_sq += d * d
    mean = total / draws
    var = np.maximum(total_sq / draws - mean * mean, 0) * draws / (draws - 1)
    se = np.sqrt(var / draws)
    z = np.where(se > 0, np.abs(mean - xh) / np.where(se > 0, se, 1), 0)
    exact = np.all(mean[se == 0] == xh[se == 0])
    return {"draws": draws, "elements": int(xh.size), "max_z": float(z.max()),
            "within_3se": int((z <= 3).sum()), "zero_variance_exact": bool(exact),
            "seconds": time.perf_counter() - t0}


def ffn_grads(method: str, dtype=mx.float16) -> dict:
    """The FFN's forward and gradients on the CUDA kernels vs the same layer on MLX ops."""
    rng = np.random.default_rng(3)
    t, dims, hidden = 200, 64, 192
    x = mx.array(rng.standard_normal((t, dims)).astype(np.float32)).astype(dtype)
    w1 = mx.array(rng.standard_normal((hidden, dims)).astype(np.float32) / 8).astype(dtype)
    w2 = mx.array(rng.standard_normal((dims, hidden)).astype(np.float32) / 8).astype(dtype)
    b1 = mx.array(rng.standard_normal(hidden).astype(np.float32) / 8).astype(dtype)
    b2 = mx.array(rng.standard_normal(dims).astype(np.float32) / 8).astype(dtype)
    dy = mx.array(rng.standard_normal((t, dims)).astype(np.float32)).astype(dtype)
    out = {}
    res = {}
    for backend in ("cuda", "mlx"):
        def f(x_, w1_, b1_, w2_, b2_):
            return sparse_ffn(x_, w1_, b1_, w2_, b2_, method=method, seed=11, dw2="split",
                              split_fraction=0.5, backend=backend)
        y, grads = mx.vjp(f, [x, w1, b1, w2, b2], [dy])
        res[backend] = [to_np(a).astype(np.float64) for a in (y[0], *grads)]
    for name, a, b in zip(("y", "dx", "dw1", "db1", "dw2", "db2"), res["cuda"], res["mlx"]):
        out[name] = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
    return out


def run_check(small: bool) -> int:
    rng = np.random.default_rng(2026)
    failures = 0
    shapes = [(1, 5), (3, 64), (65, 130), (37, 4099)] if small else \
        [(1, 5), (3, 64), (65, 130), (37, 4099), (2048, 4096), (4097, 1000), (1000, 4097)]
    n_checks = 0
    for dtype in ("f16", "bf16"):
        for method in ("top2", "mvue", "soft_threshold"):
            for axis in (0, 1):
                for relu2, stats in ((False, False), (True, True)):
                    spec = SparsifySpec(method, axis, dtype, relu2=relu2, stats=stats)
                    for shape in shapes:
                        msg = check_sparsify(spec, shape, 7 + n_checks, rng)
                        n_checks += 1
                        if msg:
                            failures += 1
                            print(f"FAIL sparsify {spec.name} {shape}: {msg}")
    print(f"sparsify: {n_checks - failures}/{n_checks} bit-exact (values, metadata, padding, counts)")
    gemm_shapes = [((3, 40), 9, 1), ((65, 70), 130, 1), ((45, 33), 20, 0), ((130, 1000), 257, 1)]
    if not small:
        gemm_shapes += [((2048, 4096), 4096, 1), ((4099, 1024), 520, 0)]
    errs = []
    for dtype in ("f16", "bf16"):
        for shape, n, axis in gemm_shapes:
            msg, err = check_gemm(dtype, shape, n, axis, rng)
            errs.append(err)
            if msg:
                failures += 1
                print(f"FAIL sparse GEMM {dtype} {shape} n={n} axis={axis}: {msg}")
    print(f"sparse GEMM: {len(errs) - sum(1 for e in errs if e >= 1.6e-2)}/{len(errs)} within tolerance, "
          f"max rel err {max(errs):.2e}")
    if not small:
        mv = mvue_unbiased()
        print(f"MVUE on the GPU: {mv}")
        failures += int(mv["within_3se"] != mv["elements"] or not mv["zero_variance_exact"])
        for method in ("top2", "mvue", "soft_threshold"):
            g = ffn_grads(method)
            print(f"FFN {method} cuda vs mlx backends, max-abs rel err: {g}")
            failures += int(max(g.values()) > 2e-2)
    print(f"device: {device_name()}; failures: {failures}")
    return 1 if failures else 0


# ----- timing ----------------------------------------------------------------------------------

def timed(fn, reps: int = 5, inner: int = 3) -> float:
    """Median seconds per call (each sample evaluates `inner` calls)."""
    mx.eval(fn())
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            mx.eval(fn())
        mx.synchronize()
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def run_bench(out_dir: str | None, tokens: list[int], hiddens: list[int], dims: int) -> None:
    rng = np.random.default_rng(0)
    rows = []
    for hidden in hiddens:
        w1 = mx.array(rng.standard_normal((hidden, dims)).astype(np.float32) / np.sqrt(dims)).astype(mx.float16)
        w2 = mx.array(rng.standard_normal((dims, hidden)).astype(np.float32) / np.sqrt(hidden)).astype(mx.float16)
        b1 = mx.array(-0.5 * np.ones(hidden, np.float32)).astype(mx.float16)  # ~70-90% zeros after ReLU
        for t in tokens:
            x = mx.array(rng.standard_normal((t, dims)).astype(np.float32)).astype(mx.float16)
            dy = mx.array(rng.standard_normal((t, dims)).astype(np.float32) / 64).astype(mx.float16)
            mx.eval(x, dy, w1, w2, b1)
            row = {"tokens": t, "dims": dims, "hidden": hidden}

            def dense_fwd():
                return dense_ffn(x, w1, b1, w2, None)

            def dense_fb():
                return mx.vjp(lambda *a: dense_ffn(*a, None), [x, w1, b1, w2], [dy])[1]

            row["dense_fwd_ms"] = 1e3 * timed(dense_fwd)
            row["dense_fwd_bwd_ms"] = 1e3 * timed(dense_fb)
            for method in ("top2", "mvue"):
                for dw2 in ("split", "dense"):
                    def sp_fwd():
                        return sparse_ffn(x, w1, b1, w2, None, method=method, seed=1, dw2=dw2, backend="cuda")

                    def sp_fb():
                        return mx.vjp(lambda *a: sparse_ffn(*a, None, method=method, seed=1, dw2=dw2, backend="cuda"),
                                      [x, w1, b1, w2], [dy])[1]
                    if dw2 == "split":
                        row[f"{method}_fwd_ms"] = 1e3 * timed(sp_fwd)
                    row[f"{method}_{dw2}_fwd_bwd_ms"] = 1e3 * timed(sp_fb)
            # the kernels alone: fused ReLU^2+stats+2:4 vs ReLU^2 in MLX; sparse GEMM vs dense GEMM
            h = mx.matmul(x, w1.T) + b1
            mx.eval(h)
            spec = SparsifySpec("top2", 1, "f16", relu2=True, stats=True)
            s = kernels.sparsify(h, spec, 0, "cuda")
            mx.eval(s.values)
            row["sparsify_fused_ms"] = 1e3 * timed(lambda: kernels.sparsify(h, spec, 0, "cuda").values)
            row["relu2_mlx_ms"] = 1e3 * timed(lambda: mx.square(mx.maximum(h, 0)))
            w2t = mx.contiguous(w2.T)
            a_dense = mx.square(mx.maximum(h, 0))
            mx.eval(w2t, a_dense)
            row["sparse_gemm_ms"] = 1e3 * timed(lambda: kernels.sparse_matmul(s, w2t))
            row["dense_gemm_ms"] = 1e3 * timed(lambda: mx.matmul(a_dense, w2t))
            zeros = float(np.array(s.col_zeros).sum()) / (t * hidden)
            row["activation_zero_fraction"] = zeros
            rows.append(row)
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
    print("\n| T | hidden | dense fwd+bwd | top2 split | top2 dense-dW2 | mvue split | sparse GEMM | dense GEMM | fused sparsify |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['tokens']} | {r['hidden']} | {r['dense_fwd_bwd_ms']:.2f} | {r['top2_split_fwd_bwd_ms']:.2f} | "
              f"{r['top2_dense_fwd_bwd_ms']:.2f} | {r['mvue_split_fwd_bwd_ms']:.2f} | {r['sparse_gemm_ms']:.3f} | "
              f"{r['dense_gemm_ms']:.3f} | {r['sparsify_fused_ms']:.3f} |")
    if out_dir:
        path = Path(out_dir) / f"sparse_ffn_bench_{date.today().isoformat()}.json"
        path.write_text(json.dumps({"device": device_name(), "date": date.today().isoformat(),
                                    "mlx": mx.__version__, "python": platform.python_version(),
                                    "rows": rows}, indent=1))
        print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("check", "bench"))
    ap.add_argument("--small", action="store_true", help="check: small shapes only (for compute-sanitizer)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--tokens", default="2048,4096,8192,16384")
    ap.add_argument("--hidden", default="4096,14336")
    ap.add_argument("--dims", type=int, default=4096)
    args = ap.parse_args(argv)
    if args.mode == "check":
        return run_check(args.small)
    run_bench(args.out, [int(v) for v in args.tokens.split(",")], [int(v) for v in args.hidden.split(",")], args.dims)
    return 0


if __name__ == "__main__":
    sys.exit(main())
