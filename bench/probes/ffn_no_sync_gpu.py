"""Issue 15 on the GPU: the sparse FFN's training step makes no host sync (split dW2 by rank).

  python3 bench/probes/ffn_no_sync_gpu.py [--out DIR] [--no-bench] [--backends cuda,mlx]

Checks, for the "cuda" (kernels) and "mlx" (MLX ops) backends and every method:
- tripwire: the step's graph (forward + VJP, dw2="split") is built with every Python-level host
  read of an MLX array (item, tolist, bool/int/float, __array__, mx.eval, np.array of one)
  raising; nothing may trip;
- compile: the same step under `mx.compile` (any evaluation while tracing raises) equals the
  eager step (max |diff| / max |ref| <= 1e-3; bit_exact reported);
- backends: cuda's step equals mlx's (rel. max error <= 2e-2: the same device selection and
  sparsify, different GEMM accumulation order).
Then (unless --no-bench) times fwd+bwd at T = 8192, hidden 14336, dims 4096: dense layer,
sparse top2 with dw2 split (eager and compiled) and dw2 dense; reports the speed-up over dense.
Prints PASS/FAIL lines and a table; --out writes ffn_no_sync.json; exit 1 on any FAIL.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Iterator

import mlx.core as mx
import numpy as np

from marlin_dsl.activation.ffn import dense_ffn, sparse_ffn

METHODS = ("top2", "mvue", "soft_threshold")


class HostRead(AssertionError):
    pass


@contextlib.contextmanager
def tripwire() -> Iterator[list[str]]:
    trips: list[str] = []
    saved: list[tuple[object, str, object]] = []

    def trap(what: str) -> Callable[..., object]:
        def raise_(*_a: object, **_k: object) -> object:
            trips.append(what)
            raise HostRead(what)
        return raise_

    def patch(obj: object, name: str, value: object) -> None:
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    try:
        for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__array__"):
            patch(mx.array, name, trap(f"mx.array.{name}"))
        patch(mx, "eval", trap("mx.eval"))
        for name in ("array", "asarray", "flatnonzero"):
            def guarded(*a: object, _real: Callable = getattr(np, name), _n: str = name, **k: object) -> object:
                if any(isinstance(v, mx.array) for v in (*a, *k.values())):
                    trap(f"np.{_n}(mx.array)")()
                return _real(*a, **k)
            patch(np, name, guarded)
        yield trips
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


def to_np(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32)).astype(np.float64)


def inputs(t: int, dims: int, hidden: int, seed: int = 3) -> list[mx.array]:
    rng = np.random.default_rng(seed)
    shift = np.where(rng.random(hidden) < 0.5, -1.5, 0.0)
    arrs = [rng.standard_normal((t, dims)), rng.standard_normal((hidden, dims)) / np.sqrt(dims),
            rng.standard_normal(hidden) * 0.5 + shift, rng.standard_normal((dims, hidden)) / np.sqrt(hidden),
            rng.standard_normal(dims) * 0.1, rng.standard_normal((t, dims))]
    return [mx.array(a.astype(np.float32)).astype(mx.float16) for a in arrs]


def step(method: str, backend: str, dw2: str = "split", fraction: float = 0.5) -> Callable[..., list]:
    def run(x, w1, b1, w2, b2, dy):  # noqa: ANN001, ANN202
        f = lambda *p: sparse_ffn(*p, method=method, seed=11, dw2=dw2, split_fraction=fraction, backend=backend)  # noqa: E731
        (y,), grads = mx.vjp(f, [x, w1, b1, w2, b2], [dy])
        return [y, *grads]
    return run


def rel_max(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def check(results: dict, backends: tuple[str, ...]) -> int:
    fails = 0
    names = ("y", "dx", "dw1", "db1", "dw2", "db2")
    for t, hidden in ((65, 192), (200, 190)):
        args = inputs(t, 64, hidden)
        per_backend = {}
        for backend in backends:
            for method in METHODS:
                key = f"{backend}/{method}/T{t}/H{hidden}"
                rec: dict = {}
                try:
                    eager = step(method, backend)(*args)
                    mx.eval(*eager)
                    with tripwire() as trips:
                        step(method, backend)(*args)
                    rec["trips"] = list(trips)
                    try:
                        comp = mx.compile(step(method, backend))(*args)
                        mx.eval(*comp)
                        errs = {n: rel_max(to_np(c), to_np(e)) for n, c, e in zip(names, comp, eager)}
                        rec["compile_rel_err"] = errs
                        rec["compile_bit_exact"] = all(np.array_equal(to_np(c), to_np(e)) for c, e in zip(comp, eager))
                        rec["compile_ok"] = max(errs.values()) <= 1e-3
                    except Exception as e:  # noqa: BLE001
                        rec["compile_ok"] = False
                        rec["compile_error"] = f"{type(e).__name__}: {e}"
                    per_backend[(backend, method)] = [to_np(a) for a in eager]
                    ok = not trips and rec["compile_ok"]
                except Exception:  # noqa: BLE001
                    rec["error"] = traceback.format_exc(limit=3)
                    ok = False
                rec["pass"] = ok
                fails += not ok
                results[key] = rec
                print(f"{'PASS' if ok else 'FAIL'} {key}: trips={rec.get('trips')} compile_ok={rec.get('compile_ok')} "
                      f"bit_exact={rec.get('compile_bit_exact')} {rec.get('compile_error', '')}{rec.get('error', '')}", flush=True)
        for method in METHODS if set(backends) == {"cuda", "mlx"} else ():
            key = f"cuda_vs_mlx/{method}/T{t}/H{hidden}"
            if ("cuda", method) not in per_backend or ("mlx", method) not in per_backend:
                results[key] = {"pass": False}
                fails += 1
                print(f"FAIL {key}: a backend did not run")
                continue
            errs = {n: rel_max(c, m) for n, c, m in zip(names, per_backend[("cuda", method)], per_backend[("mlx", method)])}
            ok = max(errs.values()) <= 2e-2
            fails += not ok
            results[key] = {"rel_err": errs, "pass": ok}
            print(f"{'PASS' if ok else 'FAIL'} {key}: " + " ".join(f"{n}={v:.1e}" for n, v in errs.items()), flush=True)
    return fails


def timed(fn: Callable[[], list], reps: int = 10) -> float:
    for _ in range(2):
        mx.eval(*fn())
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        mx.eval(*fn())
        samples.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(samples)


def bench(results: dict) -> None:
    t, dims, hidden = 8192, 4096, 14336
    x, w1, b1, w2, b2, dy = inputs(t, dims, hidden, seed=5)
    mx.eval(x, w1, b1, w2, b2, dy)
    rows = {}

    def dense() -> list:
        return mx.vjp(lambda *p: dense_ffn(*p), [x, w1, b1, w2, b2], [dy])[1]
    rows["dense"] = timed(dense)
    for dw2, fraction in (("split", 0.95), ("split", 0.5), ("dense", 0.95)):
        fn = step("top2", "cuda", dw2, fraction)
        rows[f"top2 dw2={dw2} fraction={fraction}"] = timed(lambda: fn(x, w1, b1, w2, b2, dy))
    fn_c = mx.compile(step("top2", "cuda", "split", 0.95))
    try:
        rows["top2 dw2=split fraction=0.95 compiled"] = timed(lambda: fn_c(x, w1, b1, w2, b2, dy))
    except Exception as e:  # noqa: BLE001
        rows["top2 dw2=split fraction=0.95 compiled"] = float("nan")
        results["bench_compile_error"] = f"{type(e).__name__}: {e}"
    results["bench"] = {"T": t, "dims": dims, "hidden": hidden, "ms": rows}
    print(f"\nfwd+bwd at T={t}, dims={dims}, hidden={hidden} (ms, median of 10; speed-up = dense / this)")
    print("| variant | ms | speed-up |\n|---|---|---|")
    for name, ms in rows.items():
        print(f"| {name} | {ms:.2f} | {rows['dense'] / ms:.2f}x |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--backends", default="cuda,mlx", help="comma-separated (mlx alone: a CPU dry run)")
    args = ap.parse_args(argv)
    results: dict = {"device": str(mx.default_device()), "mlx": mx.__version__}
    fails = check(results, tuple(args.backends.split(",")))
    if not args.no_bench:
        try:
            bench(results)
        except Exception:  # noqa: BLE001
            results["bench_error"] = traceback.format_exc(limit=3)
            print("FAIL bench:", results["bench_error"])
            fails += 1
    print(f"\n{'ALL PASS' if not fails else f'{fails} FAIL'}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "ffn_no_sync.json").write_text(json.dumps(results, indent=1, default=str))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
