"""Correctness of the printed CUDA GEMM kernels on an NVIDIA GPU through MLX's CUDA backend.

Runs ON the GPU machine (MLX with its CUDA backend, numpy; see /work/shared/GPU.md):

    PYTHONPATH=/tmp/site:$PWD python3 bench/gpu_correctness.py --kernels .gpu_kernels --out $OUT

`--kernels DIR` loads the kernels that `bench/prepare_gpu_kernels.py` lowered and printed on a
machine with the whole compiler (manifest.json + one JSON per kernel), so this script needs
only numpy, mlx and marlin_dsl's numpy-only parts (formats, packing, the reference, the CUDA
printer's data classes). Without `--kernels` it compiles the kernels itself, which needs
marlin_dsl's compiler dependencies (networkx; lark is not needed for built-in formats): it
says so and stops if they are missing.

For every kernel (built-in format x pipeline x activation) and every shape
(M in 1, 7, 16, 64) x ((K, N) in (4096, 4096), (4096, 14336)) plus the tail M=3, N=4136,
K=4096: random weights (`marlin_dsl.checks.format_check.sample_weights`) are packed with `marlin_dsl.pack`,
activations are standard normal rounded to the activation type, outputs are poisoned with NaN
(MLX's `init_value`), and y is compared with `marlin_dsl.reference_matmul` (float64) by
the error model's checks (`marlin_dsl.checks.error_model.compare`, as `check_kernel`: the
relative Frobenius error within 1.5x of what the roundings predict, no bias, no element off by
> 5% rms; each row records tolerance, bias, bias_range, max_error). Any
output element left NaN fails; the striped pipeline must also leave its arrival counters zero.
A table is printed last; `--out` gets results.json and correctness.log. Exit status 1 when any
check fails (or a kernel does not compile), 2 when the environment is unusable.

`--time N` also times each kernel (median of N launches after a warm-up, no poisoning) with
`mx.fast.cuda_kernel` on the same shapes.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

SHAPES_KN = ((4096, 4096), (4096, 14336), (14336, 4096))
MS = (1, 7, 16, 64)
#: (M, N, K): the large M on every shape, and tails in M, N and K.
EXTRA = tuple((m, n, k) for k, n in SHAPES_KN for m in (256, 2048)) + \
    ((3, 4096 + 40, 4096), (65, 4096 + 24, 4096 + 128), (300, 4096 + 8, 4096 + 128))
#: the old outer bound, shown in the summary table only (the checks are the error model's)
REL_TOL = {"f16": 2e-3, "bf16": 1.6e-2}


class Log:
    def __init__(self, path: Path | None) -> None:
        self.lines: list[str] = []
        self.path = path

    def __call__(self, *parts) -> None:
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        self.lines.append(line)
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(line + "\n")


def problem_shapes(quick: bool) -> list[tuple[int, int, int]]:
    """(M, N, K) of every check."""
    if quick:
        return [(7, 4096, 4096), (3, 4096 + 40, 4096)]
    return [(m, n, k) for k, n in SHAPES_KN for m in MS] + list(EXTRA)


def load_kernels(args, log: Log) -> list[dict]:
    """[{name, format, group_size, pipeline, activation, source}] from --kernels or compiled here."""
    from marlin_dsl.targets.cuda.printer import CudaSource

    entries = []
    if args.kernels:
        root = Path(args.kernels)
        manifest = json.loads((root / "manifest.json").read_text())
        for e in manifest["kernels"]:
            if args.formats and e["format"] not in args.formats:
                continue
            if args.pipelines and e["pipeline"] not in args.pipelines:
                continue
            if args.activations and e["activation"] not in args.activations:
                continue
            src = CudaSource.from_json(json.loads((root / e["file"]).read_text()))
            entries.append({**e, "source": src})
        log(f"loaded {len(entries)} kernels from {root} (prepared by {manifest.get('generator')}, "
            f"marlin_dsl {manifest.get('marlin_dsl')})")
        return entries
    try:
        import networkx  # noqa: F401

        from marlin_dsl.compiler import compile_gemm  # noqa: F401
    except ImportError as exc:
        log(f"cannot compile kernels here: {exc}. marlin_dsl's compiler needs networkx (and lark for "
            "textual formats). Prepare them where the compiler runs:\n"
            "    python bench/prepare_gpu_kernels.py --out .gpu_kernels\n"
            "and pass --kernels .gpu_kernels here.")
        raise SystemExit(2)
    sys.path.insert(0, str(ROOT / "bench"))
    from prepare_gpu_kernels import PIPELINES, gpu_schedule, kernel_name  # noqa: E402

    import marlin_dsl as md
    from marlin_dsl import CUDA, Gemm, Schedule
    from marlin_dsl.targets.cuda.printer import print_cuda
    from marlin_dsl.targets.cuda.launch import gemm_inout_inputs
    from marlin_dsl.compiler import compile_gemm as _compile

    for fmt_name in args.formats or list(md.BUILTIN_FORMATS):
        fmt = md.builtin_format(fmt_name)
        for pl in args.pipelines or list(PIPELINES):
            for act in args.activations or ["f16", "bf16"]:
                name = kernel_name(fmt_name, pl, act)
                try:
                    sched = gpu_schedule(fmt, pl)
                except md.ScheduleError:
                    continue  # e.g. block-pattern formats have no weight-stream layout
                kernel = _compile(Gemm(name, fmt, sched, activation=act), CUDA).kernel
                src = print_cuda(kernel, inout_inputs=gemm_inout_inputs(kernel))
                entries.append({"name": name, "format": fmt_name, "group_size": fmt.scale.group_size,
                                "pipeline": pl, "activation": act, "source": src})
    log(f"compiled {len(entries)} kernels here")
    return entries


def time_kernel(mx, gemm, weights, x, repeats: int) -> float:
    """Median seconds of one launch (no poisoning), after one warm-up."""
    mx.eval(gemm(weights, x, poison=False))
    mx.synchronize()
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        mx.eval(gemm(weights, x, poison=False))
        mx.synchronize()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="folder for results.json and correctness.log")
    ap.add_argument("--kernels", type=Path, default=None, help="folder written by prepare_gpu_kernels.py")
    ap.add_argument("--formats", nargs="*", default=None)
    ap.add_argument("--pipelines", nargs="*", default=None)
    ap.add_argument("--activations", nargs="*", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="two shapes only (M=7 and the tail)")
    ap.add_argument("--shapes", default=None, metavar="MxNxK,...", help="only these problem shapes")
    ap.add_argument("--time", type=int, default=0, metavar="N", help="also time each kernel (N launches)")
    ap.add_argument("--verbose-kernel", action="store_true", help="MLX prints each generated source")
    args = ap.parse_args(argv)

    log_path = None
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        log_path = args.out / "correctness.log"
        log_path.write_text("")
    log = Log(log_path)
    started = time.time()

    try:
        import mlx.core as mx
    except ImportError as exc:
        log(f"mlx is not importable ({exc}): install MLX with its CUDA backend (see /work/shared/GPU.md)")
        return 2
    if not (hasattr(mx, "cuda") and mx.cuda.is_available()):
        log(f"MLX {mx.__version__} has no CUDA backend here (mx.cuda.is_available() is false)")
        return 2
    import marlin_dsl as md
    from marlin_dsl.targets.cuda.launch import build_cuda_kernel
    from marlin_dsl.formats import dequantize
    from marlin_dsl.ir.numerics import round_to_activation
    from marlin_dsl.checks.format_check import sample_weights
    from marlin_dsl.checks.error_model import compare, kernel_weights
    from marlin_dsl.checks.gpu_output import record
    from marlin_dsl.benchmarks.provenance import git_commit, source_digest

    try:
        info = mx.device_info()
    except Exception:  # noqa: BLE001
        info = {}
    env = {"mlx": mx.__version__, "device": str(mx.default_device()), "device_info": {k: str(v) for k, v in info.items()},
           "python": platform.python_version(), "numpy": np.__version__, "host": platform.node(),
           "commit": git_commit(ROOT),
           "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    log(f"environment: {json.dumps(env)}")

    entries = load_kernels(args, log)
    if not entries:
        log("no kernels selected")
        return 2
    shapes = problem_shapes(args.quick) if args.shapes is None else \
        [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rng = np.random.default_rng(args.seed)
    results = []
    failures = 0

    by_format: dict[str, list[dict]] = {}
    for e in entries:
        by_format.setdefault(e["format"], []).append(e)
        e["gemm"] = build_cuda_kernel(e["source"])

    for fmt_name, group in by_format.items():
        gs = group[0]["group_size"]
        fmt = md.builtin_format(fmt_name, gs)
        for k, n in sorted({(k, n) for _, n, k in shapes}):
            t0 = time.perf_counter()
            w = sample_weights(fmt, k, n, rng)
            packed = md.pack(fmt, w)
            dense = dequantize(packed)  # float64 [K, N]
            weights = {}  # one upload per format and (K, N), shared by its kernels
            decoded: dict[str, np.ndarray] = {}  # activation -> kernel_weights(packed, act)
            prep_s = time.perf_counter() - t0
            for m in [m for m, n2, k2 in shapes if (k2, n2) == (k, n)]:
                x = rng.standard_normal((m, k))
                for act in sorted({e["activation"] for e in group}):
                    xa = round_to_activation(x, act).astype(np.float32)
                    ref = xa.astype(np.float64) @ dense
                    x_mx = mx.array(xa).astype(mx.float16 if act == "f16" else mx.bfloat16)
                    for e in [e for e in group if e["activation"] == act]:
                        gemm = e["gemm"]
                        row = {"kernel": e["name"], "format": fmt_name, "pipeline": e["pipeline"],
                               "activation": act, "M": m, "N": n, "K": k,
                               "digest": source_digest(e["source"])}
                        try:
                            layout = gemm.source.attrs.get("weight_layout")  # the target's layout
                            if layout not in weights:
                                weights[layout] = gemm.weights(packed)
                            state = {name: mx.array(np.zeros(size, np.uint32))
                                     for name, size in gemm.sizes(m, n, k).items()
                                     if name in gemm.source.inout_inputs}
                            t = time.perf_counter()
                            y = gemm(weights[layout], x_mx, state=state, verbose=args.verbose_kernel)
                            mx.eval(y)
                            row["first_call_s"] = round(time.perf_counter() - t, 4)
                            yv = np.array(y.astype(mx.float32)).astype(np.float64)
                            if act not in decoded:  # the weight as the kernels decode it
                                decoded[act] = kernel_weights(packed, act)
                            check = compare(yv, ref, xa.astype(np.float64), dense, act, decoded[act])
                            counters_ok = all(not np.array(a).any() for a in state.values())
                            row.update(record(check), counters_left_zero=counters_ok,
                                       ok=check.ok and counters_ok)
                        except Exception as exc:  # noqa: BLE001  (NVRTC errors, launch failures)
                            row.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:4000],
                                       traceback=traceback.format_exc()[-4000:])
                        if args.time and row["ok"]:
                            try:
                                row["median_s"] = time_kernel(mx, gemm, weights[layout], x_mx, args.time)
                            except Exception as exc:  # noqa: BLE001
                                row.update(ok=False, error=f"timing: {type(exc).__name__}: {exc}"[:4000],
                                           traceback=traceback.format_exc()[-4000:])
                        failures += not row["ok"]
                        results.append(row)
                        status = "ok  " if row["ok"] else "FAIL"
                        detail = (f"rel={row['rel_error']:.2e} nan={row['untouched']}" if "rel_error" in row else "")
                        if not row.get("counters_left_zero", True):
                            detail += " counters not left zero"
                        if "error" in row:
                            detail += " " + (row["error"].splitlines() or [""])[0][:200]
                        if "median_s" in row:
                            detail += f" {row['median_s'] * 1e6:.1f} us"
                        log(f"{status} {e['name']:<42} M={m:<3} N={n:<6} K={k:<5} {detail}")
            log(f"  [{fmt_name} K={k} N={n}: weights prepared in {prep_s:.1f} s]")

    # ----- summary table -----------------------------------------------------------------------
    log("")
    log(f"{'kernel':<42} {'checks':>6} {'failed':>6} {'max rel err':>11} {'tol':>8}"
        + (f" {'median us (M=16,N=14336)':>24}" if args.time else ""))
    for e in entries:
        rows = [r for r in results if r["kernel"] == e["name"]]
        bad = [r for r in rows if not r["ok"]]
        errs = [r["rel_error"] for r in rows if "rel_error" in r]
        line = (f"{e['name']:<42} {len(rows):>6} {len(bad):>6} "
                f"{(max(errs) if errs else float('nan')):>11.2e} {REL_TOL[e['activation']]:>8.1e}")
        if args.time:
            t = [r.get("median_s") for r in rows if r["M"] == 16 and r["N"] == 14336 and "median_s" in r]
            line += f" {(t[0] * 1e6 if t else float('nan')):>24.1f}"
        log(line)
    total = len(results)
    log(f"\n{total - failures}/{total} checks passed, {failures} failed "
        f"({time.time() - started:.0f} s, {env['device']} {env['device_info'].get('device_name', '')})")
    if args.out is not None:
        (args.out / "results.json").write_text(json.dumps(
            {"environment": env, "commit": env["commit"], "shapes": shapes,
             "tolerance": "marlin_dsl.checks.error_model (per check: tolerance, bias_range)",
             "digests": {e["name"]: source_digest(e["source"]) for e in entries}, "results": results,
             "passed": total - failures, "failed": failures}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
