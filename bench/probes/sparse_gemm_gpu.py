"""Issue 15: the staged sparse activation GEMM (`lowering/sparse_gemm_staged.py`) on the GPU,
and where the time of the sparse FFN goes. Runs through MLX's CUDA backend, staged as in
bench/README.md ("GPU correctness").

  python3 bench/probes/sparse_gemm_gpu.py check [--tiles ...]   every block size against float64 (NaN-
                                                          poisoned C, odd shapes, f16 and bf16)
  python3 bench/probes/sparse_gemm_gpu.py time  [--tiles ...]   the GEMMs of the FFN at T x hidden x dims
                                                          per block size, against mx.matmul
  python3 bench/probes/sparse_gemm_gpu.py ffn                    the FFN's forward + backward, dense and
                                                          sparse, and each of the sparse one's parts
  python3 bench/probes/sparse_gemm_gpu.py profile [--tiles ...]  two launches a block at the forward's
                                                          shape, to run under ncu

`--tiles` names blocks as tile_m x tile_n x warps_m x warps_n x stages [x k_tiles]
(e.g. 128x256x2x4x4, 128x128x2x2x3x2);
the default sweeps a few around the tuned ones. `--out FILE` writes the rows as JSON (device,
date and MLX version included).
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

from marlin_dsl.activation import ffn as ffn_module
from marlin_dsl.activation import kernels, ops
from marlin_dsl.activation.ffn import FFNConfig, dense_ffn, ffn_backward, ffn_forward, sparse_ffn
from marlin_dsl.formats.activation_spec import SparsifySpec
from marlin_dsl.lowering.sparse_gemm_staged import LARGE, SMALL, SparseGemmTiles, choose_tiles

MX = {"f16": mx.float16, "bf16": mx.bfloat16}
RTOL = {"f16": 2e-3, "bf16": 1.6e-2}
SWEEP = [SMALL, LARGE, SparseGemmTiles(128, 128, 2, 2, 4), SparseGemmTiles(128, 256, 2, 4, 4),
         SparseGemmTiles(256, 128, 4, 2, 4)]


def parse_tiles(text: str | None) -> list[SparseGemmTiles]:
    if not text:
        return SWEEP
    return [SparseGemmTiles(*(int(v) for v in t.split("x"))) for t in text.split(",")]


def device_name() -> str:
    try:
        return str(mx.device_info().get("device_name", "cuda"))
    except Exception:  # noqa: BLE001 - informational only
        return "cuda"


def timed(fn, reps: int = 7, inner: int = 5) -> float:
    """Median seconds per call (each sample evaluates `inner` calls back to back)."""
    mx.eval(fn())
    samples = []
    for _ in range(reps):
        mx.synchronize()
        t0 = time.perf_counter()
        for _ in range(inner):
            mx.eval(fn())
        mx.synchronize()
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def activations(rng, shape: tuple[int, int], dtype: str) -> mx.array:
    """ReLU^2 inputs with a third of them negative-biased (so groups have zeros and ties)."""
    x = rng.standard_normal(shape).astype(np.float32) - 0.3
    x[rng.random(shape) < 0.1] = 0.0
    return mx.array(x).astype(MX[dtype])


def run_check(tiles: list[SparseGemmTiles], small: bool = False) -> list[dict]:
    rng = np.random.default_rng(5)
    rows, failed = [], 0
    shapes = [(1, 37, 9), (3, 64, 130), (65, 130, 130), (150, 96, 300), (300, 1000, 520), (1029, 2080, 777)]
    if small:  # under compute-sanitizer
        shapes = shapes[:4]
    for dtype in ("f16", "bf16"):
        for axis in (1, 0):
            # axis 1 as the FFN's forward: the kernel also writes dense S and its kept mask,
            # checked against the physical layout's own decoder
            spec = SparsifySpec("top2" if axis else "mvue", axis, dtype, relu2=axis == 1, stats=axis == 1,
                                dense=axis == 1)
            for p, length, n in shapes:
                x = activations(rng, (p, length) if axis == 1 else (length, p), dtype)
                b = mx.array(rng.standard_normal((length, n)).astype(np.float32)).astype(MX[dtype])
                s = kernels.sparsify(x, spec, 3, "cuda")
                if spec.dense:
                    decoded, kept = s.layout.decode_mx(s.values, s.metadata)
                    same = bool(mx.array_equal(decoded, s.dense).item()) and bool(mx.array_equal(kept, s.mask).item())
                    failed += not same
                    rows.append({"dtype": dtype, "axis": axis, "shape": [p, length], "what": "dense S and mask",
                                 "ok": same})
                    print(f"{'PASS' if same else 'FAIL'} {dtype} P={p} L={length}: the kernel's dense S and "
                          f"kept mask equal the layout's decode", flush=True)
                dense = np.array(s.dense_operand().astype(mx.float32), np.float64)
                want = dense @ np.array(b.astype(mx.float32), np.float64)
                for t in tiles:
                    y = np.array(kernels.sparse_matmul(s, b, init_value=float("nan"), tiles=t).astype(mx.float32))
                    finite = bool(np.isfinite(y).all())
                    err = float(np.abs(y - want).max() / max(np.abs(want).max(), 1e-30)) if finite else float("inf")
                    ok = finite and err < RTOL[dtype] and y.shape == want.shape
                    failed += not ok
                    rows.append({"dtype": dtype, "axis": axis, "shape": [p, length, n], "tiles": t.name,
                                 "warps": [t.warps_m, t.warps_n], "finite": finite, "rel_err": err, "ok": ok})
                    print(f"{'PASS' if ok else 'FAIL'} {dtype} axis={axis} P={p} L={length} N={n} "
                          f"{t.name}: rel err {err:.2e}", flush=True)
    print(f"\n{len(rows) - failed}/{len(rows)} passed")
    return rows


def run_time(tiles: list[SparseGemmTiles], tokens: int, hidden: int, dims: int, dtype: str) -> list[dict]:
    """The FFN's two sparse GEMMs: forward S [T, hidden] @ W2^T, and dW2's S' [F_s, T] @ dY."""
    rng = np.random.default_rng(0)
    rows = []
    f_s = ops.sparse_column_count(hidden, 0.95)
    # B as the FFN passes it: W2^T, a transposed view of the weight (the kernel reads W2 where it
    # is), and dY, row-major (MLX transposes it for the kernel).
    cases = [("forward y = S W2^T", SparsifySpec("top2", 1, dtype, relu2=True, stats=True), (tokens, hidden), dims, True),
             ("dW2 (S^T dY), 95% of columns", SparsifySpec("mvue", 0, dtype), (tokens, f_s), dims, False)]
    for what, spec, shape, n, transposed in cases:
        x = activations(rng, shape, dtype)
        s = kernels.sparsify(x, spec, 1, "cuda")
        p, length = s.operand_shape
        stored = (n, length) if transposed else (length, n)
        b = mx.array(rng.standard_normal(stored).astype(np.float32) / 64).astype(MX[dtype])
        b = b.T if transposed else b
        a_dense = s.dense_operand()
        mx.eval(s.values, s.metadata, b, a_dense)
        dense_ms = 1e3 * timed(lambda: mx.matmul(a_dense, b))
        flops = 2.0 * p * length * n
        print(f"\n{what}: P={p} L={length} N={n} ({dtype}, B {'a transposed view' if transposed else 'row-major'}); "
              f"dense mx.matmul {dense_ms:.3f} ms ({flops / dense_ms / 1e9:.0f} TFLOP/s); "
              f"choose_tiles: {choose_tiles(p, n).name}", flush=True)
        for t in tiles:
            ms = 1e3 * timed(lambda: kernels.sparse_matmul(s, b, tiles=t))
            row = {"case": what, "P": p, "L": length, "N": n, "dtype": dtype, "tiles": t.name,
                   "warps": [t.warps_m, t.warps_n], "sparse_ms": ms, "dense_ms": dense_ms,
                   "b_transposed_view": transposed, "dense_over_sparse": dense_ms / ms,
                   "dense_equiv_tflops": flops / ms / 1e9}
            rows.append(row)
            print(f"  {t.name}: {ms:.3f} ms = {dense_ms / ms:.2f}x dense, "
                  f"{flops / ms / 1e9:.0f} dense-equivalent TFLOP/s", flush=True)
    return rows


def run_profile(tiles: list[SparseGemmTiles], tokens: int, hidden: int, dims: int, dtype: str) -> list[dict]:
    """Two launches per block at the forward's shape (the second is the one to profile:
    `ncu --kernel-name regex:sparse_act_gemm --launch-skip 1`)."""
    rng = np.random.default_rng(0)
    s = kernels.sparsify(activations(rng, (tokens, hidden), dtype), SparsifySpec("top2", 1, dtype, relu2=True), 1, "cuda")
    b = mx.array(rng.standard_normal((dims, hidden)).astype(np.float32) / 64).astype(MX[dtype]).T
    for t in tiles:
        for _ in range(2):
            mx.eval(kernels.sparse_matmul(s, b, tiles=t))
    return [{"tiles": t.name} for t in tiles]


def run_ffn(tokens: int, hidden: int, dims: int, dtype: str) -> list[dict]:
    """fwd + bwd of the FFN (dense, sparse top2 with dW2 split / dense), and the sparse one's parts."""
    rng = np.random.default_rng(1)
    t_ = MX[dtype]
    w1 = mx.array(rng.standard_normal((hidden, dims)).astype(np.float32) / np.sqrt(dims)).astype(t_)
    w2 = mx.array(rng.standard_normal((dims, hidden)).astype(np.float32) / np.sqrt(hidden)).astype(t_)
    b1 = mx.array(np.full(hidden, -0.5, np.float32)).astype(t_)
    x = mx.array(rng.standard_normal((tokens, dims)).astype(np.float32)).astype(t_)
    dy = mx.array(rng.standard_normal((tokens, dims)).astype(np.float32) / 64).astype(t_)
    mx.eval(w1, w2, b1, x, dy)
    out: dict[str, float] = {}

    def fb(**kw):
        return mx.vjp(lambda *a: sparse_ffn(*a, None, backend="cuda", **kw), [x, w1, b1, w2], [dy])[1]

    out["dense_fwd_bwd"] = timed(lambda: mx.vjp(lambda *a: dense_ffn(*a, None), [x, w1, b1, w2], [dy])[1], reps=5, inner=3)
    out["top2_split_fwd_bwd"] = timed(lambda: fb(method="top2", seed=1), reps=5, inner=3)
    out["top2_densedw2_fwd_bwd"] = timed(lambda: fb(method="top2", seed=1, dw2="dense"), reps=5, inner=3)
    out["dense_fwd"] = timed(lambda: dense_ffn(x, w1, b1, w2, None), reps=5, inner=3)
    out["top2_fwd"] = timed(lambda: sparse_ffn(x, w1, b1, w2, None, backend="cuda", seed=1), reps=5, inner=3)
    # The parts of the sparse step, each on the previous part's evaluated result.
    cfg = FFNConfig("top2", "split", 0.95, 1, "cuda")
    h = mx.matmul(x, w1.T) + b1
    mx.eval(h)
    out["part_h_gemm"] = timed(lambda: mx.matmul(x, w1.T) + b1)
    spec = SparsifySpec("top2", axis=1, dtype=dtype, relu2=True, stats=True)
    s = ops.sparsify(h, spec, 1, "cuda")
    mx.eval(s.values, s.metadata, s.col_zeros, s.activation)
    out["part_sparsify"] = timed(lambda: ops.sparsify(h, spec, 1, "cuda").values)
    out["part_dense_and_mask"] = timed(lambda: (s.dense_operand(), s.kept_mask()))
    w2t = w2.T
    out["part_sparse_gemm_fwd"] = timed(lambda: ops.sparse_matmul(s, w2t))
    y, cache = ffn_forward(x, w1, b1, w2, None, cfg)
    mx.eval(y, cache.h, cache.s, cache.mask, cache.col_zeros)
    out["part_forward_total"] = timed(lambda: ffn_forward(x, w1, b1, w2, None, cfg)[0])
    out["part_ds_gemm"] = timed(lambda: mx.matmul(dy, w2))
    ds = mx.matmul(dy, w2)
    mx.eval(ds)
    out["part_da_dh_elementwise"] = timed(lambda: (ds * cache.mask.astype(ds.dtype)) * (2 * mx.maximum(cache.h, 0)))
    out["part_da_dh_fused"] = timed(lambda: ffn_module._MASKED_GRADS(ds, cache.mask, cache.h))
    n_sparse = ops.sparse_column_count(hidden, 0.95)
    out["part_dw2_split"] = timed(lambda: ops.split_matmul_by_rank(cache.s, dy, cache.col_zeros, n_sparse, "mvue", 7, "cuda"))
    out["part_dw2_dense"] = timed(lambda: mx.matmul(dy.T, cache.s))
    # the split's own parts
    order = ops.most_sparse_columns(cache.col_zeros, n_sparse, tokens)
    mx.eval(order)
    out["split_order"] = timed(lambda: ops.most_sparse_columns(cache.col_zeros, n_sparse, tokens))
    gathered = mx.take(cache.s, order[:n_sparse], axis=1)
    mx.eval(gathered)
    out["split_gather_columns"] = timed(lambda: mx.take(cache.s, order[:n_sparse], axis=1))
    spec0 = SparsifySpec("mvue", axis=0, dtype=dtype)
    s0 = ops.sparsify(gathered, spec0, 7, "cuda")
    mx.eval(s0.values, s0.metadata)
    out["split_sparsify_axis0"] = timed(lambda: ops.sparsify(gathered, spec0, 7, "cuda").values)
    out["split_sparsify_columns_in_place"] = timed(
        lambda: ops.sparsify(cache.s, spec0, 7, "cuda", columns=order[:n_sparse]).values)
    out["split_sparse_gemm"] = timed(lambda: ops.sparse_matmul(s0, dy))
    rest = mx.take(cache.s, order[n_sparse:], axis=1)
    mx.eval(rest)
    out["split_dense_rest"] = timed(lambda: mx.matmul(rest.T, dy))
    parts = [ops.sparse_matmul(s0, dy), mx.matmul(rest.T, dy)]
    mx.eval(parts)
    out["split_scatter_rows"] = timed(lambda: mx.take(mx.concatenate(parts, axis=0), mx.argsort(order), axis=0))
    dh = ds * cache.mask.astype(ds.dtype) * (2 * mx.maximum(cache.h, 0))
    mx.eval(dh)
    out["part_dx_gemm"] = timed(lambda: mx.matmul(dh, w1))
    out["part_dw1_gemm"] = timed(lambda: mx.matmul(dh.T, x))
    out["part_backward_total"] = timed(lambda: tuple(vars(ffn_backward(cache, x, w1, w2, dy, cfg)).values()))
    rows = [{"what": k, "ms": 1e3 * v, "tokens": tokens, "hidden": hidden, "dims": dims, "dtype": dtype}
            for k, v in out.items()]
    print(f"\nFFN T={tokens} hidden={hidden} dims={dims} {dtype} (ms, median):")
    for r in rows:
        print(f"  {r['what']:28s} {r['ms']:8.3f}")
    print(f"  speed-up of top2 split over dense: {out['dense_fwd_bwd'] / out['top2_split_fwd_bwd']:.2f}x")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("check", "time", "ffn", "profile"))
    ap.add_argument("--tiles", default=None)
    ap.add_argument("--small", action="store_true", help="check: the 4 small shapes only (compute-sanitizer)")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=14336)
    ap.add_argument("--dims", type=int, default=4096)
    ap.add_argument("--dtype", default="f16", choices=tuple(MX))
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.mode == "check":
        rows = run_check(parse_tiles(a.tiles), a.small)
    elif a.mode == "profile":  # one launch per block at the forward's shape, for ncu
        rows = run_profile(parse_tiles(a.tiles), a.tokens, a.hidden, a.dims, a.dtype)
    elif a.mode == "time":
        rows = run_time(parse_tiles(a.tiles), a.tokens, a.hidden, a.dims, a.dtype)
    else:
        rows = run_ffn(a.tokens, a.hidden, a.dims, a.dtype)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps({"device": device_name(), "date": date.today().isoformat(),
                                           "mlx": mx.__version__, "mode": a.mode, "rows": rows}, indent=1))
    return 1 if a.mode == "check" and not all(r["ok"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
