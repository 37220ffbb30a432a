"""Issue 33: block patterns that skip, on an NVIDIA GPU: the weight stream over each block's
stored vectors (`WeightStream(skip_empty=True)` on `fp4_blockpattern`, the layers' schedules:
`tuning.skip_schedule`) against dense fp4's tuned decode kernel on the same weights, in one run, under Nsight Compute as
bench/probes/decode_sweep.py times (every kernel replayed on a flushed L2, clocks left alone,
each subject bracketed by a marker kernel), with a 128-bit copy of dense fp4's bytes.

Sparsity of the weights (the benchmark names it; normal values elsewhere):
- `clustered50` / `clustered75`: aligned runs of 64 K positions x 32 columns (one block's
  K vector: pruned channel groups) zero with probability 0.5 / 0.75;
- `blocks8_50`: seed 003's 8 K x 32 column blocks zero with probability 0.5 (the pattern's
  own granularity, finer than a stored vector: little to skip);
- `random50`: every weight zero with probability 0.5 (nothing to skip: the skipping kernel
  must not be slower than dense).

Before timing, every kernel is checked on the GPU against the float64 reference (fresh
weights of each sparsity, outputs poisoned with NaN, the error model's checks) on the first
shape with an N tail, at its M and at M = 3; only kernels that pass are timed.

    # here (no GPU): lower, print and check in the interpreter (small shapes)
    python bench/block_skip_gpu.py --dry-run --out .skip_kernels
    # on the GPU machine (MLX CUDA, CuPy, ncu; ../shared/GPU.md)
    PYTHONPATH=/tmp/site:$PWD python3 bench/block_skip_gpu.py --kernels .skip_kernels --out $OUT

Writes block_skip.json (rows: K, N, M, sparsity, subject, kernel, time_ns, dram_read_bytes,
stored fraction; device, commit, kernel digests) and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench", ROOT / "bench" / "probes"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402

SPARSITIES = ("clustered50", "clustered75", "blocks8_50", "random50")
SHAPES = "4096x4096,4096x14336,14336x4096"
TAIL_N = 40
#: ncu metrics beside time and bytes: occupancy, registers, the long-scoreboard stall (loads)
EXTRA_METRICS = ("sm__warps_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread",
                 "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio")


def sparse_weights(kind: str, k: int, n: int, rng: np.random.Generator) -> np.ndarray:
    from marlin_dsl.checks.format_check import clustered_mask

    w = rng.standard_normal((k, n))
    if kind == "clustered50":
        w[clustered_mask(k, n, rng, 64, 32, keep=0.5)] = 0.0
    elif kind == "clustered75":
        w[clustered_mask(k, n, rng, 64, 32, keep=0.25)] = 0.0
    elif kind == "blocks8_50":
        w[clustered_mask(k, n, rng, 8, 32, keep=0.5)] = 0.0
    elif kind == "random50":
        w[rng.random((k, n)) < 0.5] = 0.0
    else:
        raise SystemExit(f"unknown sparsity {kind!r} (known: {', '.join(SPARSITIES)})")
    return w


def kernels_for(ms: list[int], shapes: list[tuple[int, int]]) -> list[dict]:
    """Dense fp4's tuned kernel per (M, shape) and the layers' skipping kernel
    (`tuning.skip_schedule`) per (M, shape), one entry per distinct schedule."""
    from marlin_dsl import CUDA, Gemm, builtin_format
    from marlin_dsl.targets.cuda.tuning import skip_schedule, tuned_schedule

    out = []
    fp4, blocks = builtin_format("fp4"), builtin_format("fp4_blockpattern")
    for m in ms:
        for k, n in shapes:
            s = tuned_schedule(fp4, m, CUDA, k, n)  # its k_warps depend on the shape
            name = f"fp4_tuned_m{m}_k{k}_n{n}"
            out.append({"name": name, "format": "fp4", "m": m, "gemm": Gemm(name, fp4, s, "f16"), "shapes": [[k, n]]})
        served: dict[str, dict] = {}
        for k, n in shapes:
            s = skip_schedule(blocks, m, CUDA, k)
            name = f"{s.name}_d{s.pipeline.depth}_m{m}"
            entry = served.setdefault(name, {"name": name, "format": "fp4_blockpattern", "m": m,
                                             "gemm": Gemm(name, blocks, s, "f16"), "shapes": []})
            entry["shapes"].append([k, n])
        out += served.values()
    return out


def dry_run(args) -> int:
    """Lower and print every kernel, check it in the IR interpreter on small clustered
    weights, write manifest.json and one CudaSource JSON per kernel."""
    from marlin_dsl import CUDA, pack
    from marlin_dsl.checks.kernel_check import check_output, run_kernel
    from marlin_dsl.compiler import compile_gemm
    from marlin_dsl.kernel_args import gemm_buffers, read_output
    from marlin_dsl.targets.cuda.launch import gemm_inout_inputs
    from marlin_dsl.targets.cuda.printer import print_cuda

    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    entries = []
    for c in kernels_for(ints(args.ms), parse_shapes(args.shapes)):
        kernel = compile_gemm(c["gemm"], CUDA).kernel
        m, n, k = c["m"], 72, 1024
        packed = pack(c["gemm"].format, sparse_weights("clustered50", k, n, rng))
        buffers, scalars = gemm_buffers(kernel, packed, rng.standard_normal((m, k)))
        y = read_output(run_kernel(kernel, buffers, scalars), m, n).astype(np.float64)
        res = check_output(c["gemm"], y, buffers["x"].astype(np.float64).reshape(m, k), packed)
        print(f"{c['name']:36} interpreter rel {res.rel_error:.2e} (tol {res.tolerance:.2e}) "
              f"{'PASS' if res.ok else 'FAIL'}")
        if not res.ok:
            return 1
        source = print_cuda(kernel, inout_inputs=gemm_inout_inputs(kernel))
        (args.out / f"{c['name']}.json").write_text(json.dumps(source.to_json()))
        entries.append({k_: v for k_, v in c.items() if k_ != "gemm"} | {"file": f"{c['name']}.json"})
    (args.out / "manifest.json").write_text(json.dumps({"kernels": entries}, indent=1))
    print(f"{len(entries)} kernels -> {args.out}")
    return 0


def load(args) -> list[dict]:
    from marlin_dsl.targets.cuda.source import CudaSource

    entries = json.loads((args.kernels / "manifest.json").read_text())["kernels"]
    for c in entries:
        c["source"] = CudaSource.from_json(json.loads((args.kernels / c["file"]).read_text()))
    return entries


def check_on_gpu(cands: list[dict], args) -> list[dict]:
    """Every kernel on every sparsity, the first shape with an N tail, at its M and M = 3."""
    import mlx.core as mx

    from marlin_dsl import builtin_format, pack
    from marlin_dsl.checks.error_model import kernel_weights
    from marlin_dsl.checks.gpu_output import check_gpu_output, record
    from marlin_dsl.formats.evaluate import dequantize
    from marlin_dsl.targets.cuda.launch import build_cuda_kernel

    rng = np.random.default_rng(args.seed)
    k, n = parse_shapes(args.shapes)[0]
    n += TAIL_N
    rows = []
    for c in cands:
        c["launcher"], c["ok"] = build_cuda_kernel(c["source"]), True
    for kind in args.sparsities.split(","):
        w = sparse_weights(kind, k, n, rng)
        for fmt_name in sorted({c["format"] for c in cands}):
            packed = pack(builtin_format(fmt_name), w)
            w64, wk = dequantize(packed), kernel_weights(packed, "f16")
            mine = [c for c in cands if c["format"] == fmt_name]
            weights = mine[0]["launcher"].weights(packed)  # one physical layout per format here
            for c in mine:
                for m in sorted({c["m"], 3}):
                    x = rng.standard_normal((m, k)).astype(np.float16)
                    y = np.array(c["launcher"](weights, mx.array(x), poison=True).astype(mx.float32), np.float64)
                    chk = check_gpu_output(y, x.astype(np.float64), packed, "f16", w64, wk)
                    ok = chk.ok and not np.isnan(y).any()
                    c["ok"] &= ok
                    rows.append({"kernel": c["name"], "sparsity": kind, "M": m, "K": k, "N": n, "ok": ok, **record(chk)})
                    if not ok:
                        print(f"FAIL {c['name']} {kind} M={m}: rel {chk.rel_error:.3e}")
    return rows


def subjects(cands: list[dict], args) -> list[tuple[dict, object]]:
    """[(label, launch)]: per shape, sparsity and M: the copy, dense fp4 tuned, the skipping kernels."""
    import mlx.core as mx

    from marlin_dsl import CUDA, builtin_format, pack
    from marlin_dsl.layouts.block_skip import stored_fraction
    from marlin_dsl.targets.cuda.launch import build_cuda_kernel
    from decode_sweep import copy_baseline

    rng = np.random.default_rng(args.seed + 1)
    launchers = {c["name"]: c.get("launcher") or build_cuda_kernel(c["source"]) for c in cands}
    out = []
    for k, n in parse_shapes(args.shapes):
        copy = copy_baseline(k, n)
        for kind in args.sparsities.split(","):
            w = sparse_weights(kind, k, n, rng)
            packs = {f: pack(builtin_format(f), w) for f in sorted({c["format"] for c in cands})}
            stored = stored_fraction(packs["fp4_blockpattern"].format, CUDA, packs["fp4_blockpattern"]) \
                if "fp4_blockpattern" in packs else None
            weights = {}
            for c in cands:
                weights.setdefault(c["format"], launchers[c["name"]].weights(packs[c["format"]]))
            mx.eval(*[a for wt in weights.values() for a in wt.arrays.values()])
            for m in ints(args.ms):
                x = mx.array(rng.standard_normal((m, k)).astype(np.float16))
                mx.eval(x)
                base = {"K": k, "N": n, "M": m, "sparsity": kind, "stored": stored}
                if kind == args.sparsities.split(",")[0]:
                    out.append(({**base, "sparsity": None, "subject": "copy"}, copy))
                for c in cands:
                    if c["m"] != m or not c.get("ok", True) or [k, n] not in c["shapes"]:
                        continue
                    label = {**base, "subject": c["format"], "kernel": c["name"]}
                    out.append((label, lambda g=launchers[c["name"]], wt=weights[c["format"]], x=x: g(wt, x, poison=False)))
    return out


def drive(cands: list[dict], args) -> None:
    """Under ncu: the subjects, each between two marker kernels (decode_sweep.drive_subjects)."""
    from decode_sweep import drive_subjects

    drive_subjects(subjects(cands, args), args.out / "labels.json")


def time_with_ncu(args) -> list[dict]:
    from ncu_profile import parse

    if shutil.which("ncu") is None:
        raise SystemExit("ncu (Nsight Compute) is not on PATH")
    cmd = ["ncu", "--csv", "--page", "raw", "--clock-control", "none", "--cache-control", "all",
           "--metrics", ",".join(["gpu__time_duration.sum", "dram__bytes_read.sum", *EXTRA_METRICS]),
           "--log-file", str(args.out / "ncu.csv"), sys.executable, __file__, "--drive", "--out", str(args.out),
           "--kernels", str(args.kernels), "--shapes", args.shapes, "--ms", args.ms,
           "--sparsities", args.sparsities, "--seed", str(args.seed), "--passed", str(args.out / "passed.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    print(proc.stdout[-1500:], proc.stderr[-1500:])
    if proc.returncode:
        raise SystemExit(proc.returncode)
    return parse((args.out / "ncu.csv").read_text(), json.loads((args.out / "labels.json").read_text()),
                 extra=list(EXTRA_METRICS))


def predicted_mb(rows: list[dict]) -> dict[tuple[str, int, int, float], float]:
    """The cost model's device bytes (MB) of each timed (kernel, K, N, stored) row: the
    weight-side storage per weight as the kernel reads it (`kernel_storage`: a skipping
    kernel's `stored` share of the stream, its vec_k) x K x N, plus the activations once."""
    from marlin_dsl import CUDA
    from marlin_dsl.compiler import compile_gemm
    from marlin_dsl.cost.model import kernel_storage

    timed = [r for r in rows if r["subject"] != "copy"]
    ms = sorted({r["M"] for r in timed})
    shapes = sorted({(r["K"], r["N"]) for r in timed})
    gemms = {c["name"]: c["gemm"] for c in kernels_for(ms, shapes)}
    kernels: dict[str, object] = {}
    out = {}
    for r in timed:
        name, stored = r["kernel"], (r["stored"] if r["subject"] == "fp4_blockpattern" else 1.0)
        if name not in gemms:
            continue
        if name not in kernels:
            kernels[name] = compile_gemm(gemms[name], CUDA).kernel
        weight_side = sum(v for b, v in kernel_storage(kernels[name], gemms[name].format, stored).items() if b != "x")
        out[name, r["K"], r["N"], stored] = (weight_side * r["K"] * r["N"] + r["M"] * r["K"] * 2) / 1e6
    return out


def table(rows: list[dict], predicted: dict | None = None) -> str:
    """Per shape, M and sparsity: dense fp4 and the best skipping kernel; with `predicted`
    (`predicted_mb`), each one's cost-model MB beside the DRAM MB ncu measured."""
    lines = [f"{'K x N':12} {'M':>3} {'sparsity':12} {'stored':>6} {'dense us':>8} {'skip us':>8} "
             f"{'best skip':22} {'dense/skip':>10} {'copy us':>8}"
             + (f" {'dense MB pred/dram':>18} {'skip MB pred/dram':>17}" if predicted is not None else "")]
    copy = {(r["K"], r["N"], r["M"]): r["time_ns"] for r in rows if r["subject"] == "copy"}
    keys = sorted({(r["K"], r["N"], r["M"], r["sparsity"]) for r in rows if r["subject"] != "copy"})
    for k, n, m, kind in keys:
        mine = [r for r in rows if (r["K"], r["N"], r["M"], r.get("sparsity")) == (k, n, m, kind)]
        dense = next((r for r in mine if r["subject"] == "fp4"), None)
        skips = [r for r in mine if r["subject"] == "fp4_blockpattern"]
        if dense is None or not skips:
            continue
        best = min(skips, key=lambda r: r["time_ns"])
        line = (f"{f'{k}x{n}':12} {m:3d} {kind:12} {best['stored']:6.3f} {dense['time_ns'] / 1e3:8.1f} "
                f"{best['time_ns'] / 1e3:8.1f} {best['kernel']:22} {dense['time_ns'] / best['time_ns']:10.2f} "
                f"{copy.get((k, n, m), float('nan')) / 1e3:8.1f}")
        if predicted is not None:
            nan = float("nan")
            pd, ps = predicted.get((dense["kernel"], k, n, 1.0), nan), predicted.get((best["kernel"], k, n, best["stored"]), nan)
            dd, ds = dense["dram_read_bytes"] / 1e6, best["dram_read_bytes"] / 1e6
            line += f" {f'{pd:.2f}/{dd:.2f}':>18} {f'{ps:.2f}/{ds:.2f}':>17}"
        lines.append(line)
    return "\n".join(lines)


def every_kernel(rows: list[dict]) -> str:
    """Every timed kernel per shape, M and sparsity, fastest first, with ncu's occupancy,
    registers and long-scoreboard stalls a issue (what a slower kernel waits on)."""
    occ, regs, lsb = EXTRA_METRICS
    lines = [f"{'K x N':12} {'M':>3} {'sparsity':12} {'kernel':34} {'us':>6} {'DRAM MB':>8} {'occ %':>6} {'regs':>5} {'lsb/issue':>9}"]
    for r in sorted((r for r in rows if r["subject"] != "copy"),
                    key=lambda r: (r["K"], r["N"], r["M"], r["sparsity"] or "", r["time_ns"])):
        shape = f"{r['K']}x{r['N']}"
        lines.append(f"{shape:12} {r['M']:3d} {r['sparsity']:12} {r['kernel']:34} "
                     f"{r['time_ns'] / 1e3:6.1f} {r['dram_read_bytes'] / 1e6:8.2f} {r.get(occ, float('nan')):6.1f} "
                     f"{r.get(regs, float('nan')):5.0f} {r.get(lsb, float('nan')):9.2f}")
    return "\n".join(lines)


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def parse_shapes(text: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",") if s]  # type: ignore[misc]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--kernels", type=Path)
    ap.add_argument("--drive", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--passed", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--ms", default="1,16")
    ap.add_argument("--sparsities", default=",".join(SPARSITIES))
    ap.add_argument("--seed", type=int, default=33)
    ap.add_argument("--check-only", action="store_true", help="the GPU checks only (for compute-sanitizer)")
    args = ap.parse_args(argv)
    if args.dry_run:
        return dry_run(args)
    if args.kernels is None:
        ap.error("--kernels DIR (a dry run's output) is needed on the GPU")
    args.out.mkdir(parents=True, exist_ok=True)
    cands = load(args)
    if args.drive:
        passed = set(json.loads(args.passed.read_text()))
        drive([c for c in cands if c["name"] in passed], args)
        return 0
    checks = check_on_gpu(cands, args)
    passed = [c["name"] for c in cands if c["ok"]]
    args.passed = args.out / "passed.json"
    args.passed.write_text(json.dumps(passed))
    print(f"GPU checks: {sum(r['ok'] for r in checks)}/{len(checks)} passed")
    if args.check_only:
        (args.out / "checks.json").write_text(json.dumps(checks, indent=1))
        return 0 if all(r["ok"] for r in checks) else 1
    rows = time_with_ncu(args)
    from decode_sweep import device_name, git_commit

    (args.out / "block_skip.json").write_text(json.dumps({
        "device": device_name(), "commit": git_commit(ROOT), "checks": checks, "rows": rows,
        "digests": {c["name"]: c["source"].digest for c in cands}}, indent=1))
    print(every_kernel(rows))
    print(table(rows, predicted_mb(rows)))
    return 0 if all(r["ok"] for r in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
