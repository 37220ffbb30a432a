"""Issue 15: a sweep of weight-stream schedules for decode (M = 1 and 16) on an NVIDIA GPU, in one run.

For every format, M and weight shape [K, N], the candidates are the tuned schedule
(`targets/cuda/tuning.py`) and the grid k_warps x depth x warps_n x n_tiles (tile_n = 16 warps_n n_tiles) x unroll
x vectors (K vectors per step: tile_k = vectors x the layout's chunk; tile_m 8 for M <= 8, else 16)
x stages (`--stages`: the weight words through a shared ring filled by cp.async; 0 = registers)
x x_ahead (`--x-ahead`: the activations' B fragments loaded a step ahead; `--tile-m` fixes tile_m)
x x_shuffle (`--x-shuffle`: 2:4 activation loads shared by 2 or 4 lanes through warp shuffles),
and with `--probe` text-mutated copies (l1na: weight loads that skip L1; xpf1/xpf2: activations
prefetched 1/2 steps ahead; the candidates and the kernels folder: decode_sweep_kernels.py). Per candidate, on the GPU through MLX's CUDA backend:

1. correctness: fresh random weights (`sample_weights`, packed) and activations (rounded to
   f16) per shape, outputs poisoned with NaN, y against the float64 `reference_matmul` with the
   error model's checks (`checks/gpu_output.py`: norm, bias, worst element); every timed
   shape plus an N tail (N + 40) and M = 3; a NaN left anywhere fails;
2. time: Nsight Compute (`--timer ncu`, the default: the script runs itself under ncu with every
   kernel replayed on a flushed L2, clocks left alone; each launch bracketed by a marker kernel,
   as bench/ncu_profile.py) or wall clock through MLX (`--timer wall`: median of batches,
   rotating weight copies; host-bound for 10-20 us kernels, an upper bound), with the baselines
   in the same run: a 128-bit grid-stride copy (CuPy) of the same bytes (4-bit codes plus
   group-128 f16 scales), and MLX's 4-bit `quantized_matmul`.

Only candidates that pass (1) are timed. A short table is printed last (per shape, M and format:
the tuned and the best schedule, their time, % of copy bandwidth; per shape and format the best
M = 16 / M = 1 ratio); `--out` gets decode_sweep.json (every row) and the kernels.

    # here (no GPU): build, print and nvcc-compile every kernel, check each in the IR interpreter
    python bench/probes/decode_sweep.py --dry-run --out .sweep_kernels
    # on the GPU machine (MLX CUDA, CuPy, ncu; see ../shared/GPU.md), the kernels built here:
    PYTHONPATH=/tmp/site:$PWD python3 bench/probes/decode_sweep.py --kernels .sweep_kernels --out $OUT

`--kernels DIR` loads the kernels a dry run wrote (the GPU machine then needs only numpy, MLX,
CuPy and marlin_dsl's numpy parts); without it the kernels are compiled in the run.

The default grid (fp4; k_warps 4, 8, 16; depth 1, 2; tile_n 16; unroll 1, 2; vectors 1, 2:
48 kernels, the tuned ones among them, 144 timed problems) is sized for one 10-minute device call;
`--formats int4,uint4_zp`, `--warps-n 1,2` are further runs of the same size or twice it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, ROOT / "bench", ROOT / "bench" / "probes"):  # bench/: ncu_profile
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402

from decode_sweep_kernels import (build, candidates, ints, load_kernels, parse_shapes,  # noqa: E402
                                  probe_variants, public, write_kernels)

MARKER = "mdsl_marker"
TAIL_N = 40  # the correctness-only N tail


def weight_bytes(k: int, n: int) -> int:
    """Bytes of a 4-bit [K, N] weight with group-128 f16 scales: what the copy baseline moves."""
    return k * n // 2 + (k // 128) * n * 2


# ----- dry run (no GPU) ------------------------------------------------------------------------------

def dry_run(args) -> int:
    """Build and print every kernel, nvcc-compile them for sm_90, check each in the IR
    interpreter at a small shape; SASS loop counts where cuobjdump is on PATH."""
    from marlin_dsl.checks.kernel_check import check_kernel
    from marlin_dsl.targets.cuda.nvcc import find_nvcc, nvcc_check

    cands = candidates(args)
    build(cands)
    if args.probe:
        cands += probe_variants(cands, args.probe.split(","))
    write_kernels(cands, args.out / "kernels")
    failed = 0
    if find_nvcc() is None:
        print("nvcc not found: kernels printed, not compiled")
        compiled = None
    else:
        results = nvcc_check([c["source"] for c in cands], archs=["sm_90"], jobs=args.jobs, batches=1)
        compiled = all(r.ok for r in results)
        if not compiled:
            print("\n".join(r.log for r in results if not r.ok)[-4000:])
            failed += 1
    sass = sass_counts(cands) if args.sass and shutil.which("cuobjdump") else {}
    rng = np.random.default_rng(args.seed)
    for c in cands:
        if args.interpret:
            # K = 1.5 k_warps vectors: half the warps run two steps (the unrolled loop), half one
            k = c["schedule"].tile_k * (c["k_warps"] + max(1, c["k_warps"] // 2))
            res = check_kernel(c["gemm"], c["kernel"], (3 if c["m"] > 1 else 1, 40, k), rng)
            c["interpreter_rel_error"], c["interpreter_ok"] = res.rel_error, bool(res.ok)
            failed += not res.ok
        c["sass_per_step"] = sass.get(c["name"])
    print(f"{'kernel':32} {'threads':>7} {'interp. rel err':>15} {'SASS/step':>9}")
    for c in cands:
        err = c.get("interpreter_rel_error")
        print(f"{c['name']:32} {c['source'].threads:7d} {'-' if err is None else f'{err:.2e}':>15} "
              f"{c['sass_per_step'] or '-':>9}")
    summary = {"date": time.strftime("%Y-%m-%d"), "mode": "dry-run", "nvcc_ok": compiled,
               "kernels": [public(c) for c in cands]}
    (args.out / "dry_run.json").write_text(json.dumps(summary, indent=1))
    print(f"{len(cands)} kernels in {args.out / 'kernels'}, nvcc {'ok' if compiled else compiled}, "
          f"{failed} failures")
    return 1 if failed else 0


def sass_counts(cands: list[dict]) -> dict[str, float]:
    """K-loop SASS instructions per step (bench/probes/sass_count.py)."""
    from marlin_dsl import CUDA, builtin_format
    from marlin_dsl.layouts.weight_stream import stream_layout
    from sass_count import count, steps_per_loop

    out = {}
    for c in cands:
        r = count(c["source"], 1)
        steps = steps_per_loop(r["ops"], c["schedule"], stream_layout(builtin_format(c["format"]), CUDA))
        out[c["name"]] = round(r["loop_instructions"] / steps, 1)
    return out


# ----- on the GPU --------------------------------------------------------------------------------------

def check_on_gpu(cands: list[dict], args) -> None:
    """Correctness of every candidate on every timed shape and a tail: c["checks"], c["ok"]."""
    import mlx.core as mx

    from marlin_dsl import builtin_format, pack, reference_matmul
    from marlin_dsl.checks.error_model import kernel_weights
    from marlin_dsl.checks.format_check import sample_weights
    from marlin_dsl.checks.gpu_output import check_gpu_output
    from marlin_dsl.formats.evaluate import dequantize

    rng = np.random.default_rng(args.seed)
    shapes = sorted(set(parse_shapes(args.shapes)))
    shapes.append((shapes[0][0], shapes[0][1] + TAIL_N))
    for c in cands:
        c["launcher"] = launcher_for(c)
        c["checks"], c["ok"] = [], True
    for fmt_name in sorted({c["format"] for c in cands}):
        fmt = builtin_format(fmt_name)
        mine = [c for c in cands if c["format"] == fmt_name]
        for k, n in shapes:
            packed = pack(fmt, sample_weights(fmt, k, n, rng))  # fresh weights per shape
            weights = mine[0]["launcher"].weights(packed)  # one physical layout serves them all
            xs = {m: rng.standard_normal((m, k)).astype(np.float16) for m in sorted({c["m"] for c in mine} | {3})}
            refs = {m: reference_matmul(x.astype(np.float64), packed) for m, x in xs.items()}  # fresh activations
            # the float64 weight and its kernel decode once per weight, not per kernel and M:
            # recomputed per check they made 38 kernels' checks outlast an 8-minute device call
            # (bench/results/issue33_h200_2026-11-28/README.md)
            w64, w_kernel = dequantize(packed), kernel_weights(packed, "f16")
            for c in mine:
                for m in sorted({c["m"], 3}):
                    y = np.array(c["launcher"](weights, mx.array(xs[m]), poison=True).astype(mx.float32), np.float64)
                    ref = refs[m]
                    nan = int(np.isnan(y).sum())
                    rel = float(np.linalg.norm(np.nan_to_num(y) - ref) / max(np.linalg.norm(ref), 1e-300))
                    # the error model's checks (issue 17), as warpgroup_gpu.py and gpu_correctness.py
                    ok = nan == 0 and check_gpu_output(y, xs[m].astype(np.float64), packed, "f16",
                                                       w64, w_kernel).ok
                    c["checks"].append({"M": m, "K": k, "N": n, "rel_error": rel, "nan": nan, "ok": ok})
                    c["ok"] &= ok
                    if not ok:
                        print(f"FAIL {c['name']} M={m} K={k} N={n}: rel {rel:.3e}, {nan} NaN")


def rotating(gemm, copies: list, x):
    """launch(): one call of `gemm` on the next weight copy (outputs not poisoned)."""
    turn = [0]

    def launch():
        turn[0] += 1
        return gemm(copies[turn[0] % len(copies)], x, poison=False)
    return launch


def launcher_for(c: dict):
    """The candidate's kernel bound to MLX's `mx.fast.cuda_kernel` (a `CudaGemm`)."""
    from marlin_dsl.targets.cuda.launch import build_cuda_kernel

    return build_cuda_kernel(c["source"])


def copy_baseline(k: int, n: int):
    """launch(): a 128-bit grid-stride copy (CuPy) of a 4-bit [K, N] weight's bytes."""
    import cupy as cp
    import mlx.core as mx

    kernel = cp.RawKernel(r"""
extern "C" __global__ void mdsl_copy(const uint4* __restrict__ src, uint4* __restrict__ dst, unsigned n) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}""", "mdsl_copy")
    words = weight_bytes(k, n) // 16 * 4  # whole 16-byte units
    src, dst = cp.ones(words, dtype=cp.uint32), cp.empty(words, dtype=cp.uint32)

    def launch():
        kernel((132 * 8,), (256,), (src, dst, np.uint32(words // 4)))
        return mx.array(0)  # CuPy launched it: nothing for MLX to evaluate
    return launch


def subjects(cands: list[dict], args) -> list[tuple[dict, object]]:
    """[(label, launch)]: per timed problem the baselines and every candidate that passed."""
    import mlx.core as mx

    from marlin_dsl import builtin_format, pack
    from marlin_dsl.checks.format_check import sample_weights

    rng = np.random.default_rng(args.seed + 1)
    out = []
    for k, n in parse_shapes(args.shapes):
        copy = copy_baseline(k, n)
        wt = mx.array(rng.standard_normal((n, k)).astype(np.float16))
        q = mx.quantize(wt, group_size=64, bits=4)
        mx.eval(*q)
        launchers = {c["name"]: c.get("launcher") or launcher_for(c) for c in cands}
        copies = {}  # per format: one set of weight copies in the (shared) physical layout
        for fmt_name in sorted({c["format"] for c in cands}):
            fmt = builtin_format(fmt_name)
            first = launchers[next(c["name"] for c in cands if c["format"] == fmt_name)]
            copies[fmt_name] = first.weight_copies(pack(fmt, sample_weights(fmt, k, n, rng)), args.copies)
        for m in ints(args.ms):
            x = mx.array(rng.standard_normal((m, k)).astype(np.float16))
            mx.eval(x)
            base = {"K": k, "N": n, "M": m}
            out.append(({**base, "subject": "copy"}, copy))
            if "mlx_q4" in args.baselines:
                out.append(({**base, "subject": "mlx_q4"},
                            lambda x=x, q=q: mx.quantized_matmul(x, *q, transpose=True, group_size=64, bits=4)))
            for c in cands:
                if c["m"] != m or not c.get("ok", True):
                    continue
                label = {**base, "subject": c["format"], "kernel": c["name"], "tuned": [k, n] in c["tuned_for"]}
                out.append((label, rotating(launchers[c["name"]], copies[c["format"]], x)))
    return out


def marker_launch():
    """launch(): a tiny CuPy kernel named MARKER, then a device sync: brackets one subject in
    the ncu log (bench/ncu_profile.py's `parse` splits the rows at these)."""
    import cupy as cp

    marker = cp.RawKernel(r'extern "C" __global__ void mdsl_marker(int* p) { if (p) p[0] = 1; }', MARKER)

    def launch() -> None:
        marker((1,), (32,), (0,))
        cp.cuda.runtime.deviceSynchronize()
    return launch


def drive(cands: list[dict], args) -> None:
    """Under ncu: every subject of `subjects` (drive_subjects)."""
    drive_subjects(subjects(cands, args), Path(args.labels))


def drive_subjects(pairs, labels_path: Path) -> None:
    """Under ncu: each (label, launch) warmed, then launched once between two marker kernels;
    the labels, in order, to `labels_path` (ncu_profile.parse pairs them with the segments)."""
    import mlx.core as mx

    marker = marker_launch()
    labels = []
    for label, launch in pairs:
        for _ in range(2):
            mx.eval(launch())
        mx.synchronize()
        marker()
        mx.eval(launch())
        mx.synchronize()
        marker()
        labels.append(label)
    labels_path.write_text(json.dumps(labels))


def ncu_command(args) -> list[str]:
    """ncu profiling this script in --drive mode: the passing kernels and the baselines,
    every kernel on a flushed L2, clocks left alone."""
    return ["ncu", "--csv", "--page", "raw", "--clock-control", "none", "--cache-control", "all",
            "--metrics", ",".join(["gpu__time_duration.sum", "dram__bytes_read.sum", *filter(None, args.metrics.split(","))]),
            "--log-file", str(args.out / "ncu.csv"),
            sys.executable, __file__, "--drive", "--out", str(args.out), "--kernels", str(args.kernels),
            "--labels", args.labels, "--shapes", args.shapes, "--ms", args.ms, "--formats", args.formats,
            "--baselines", args.baselines, "--passed", str(args.out / "passed.json"), "--copies", "1",
            "--seed", str(args.seed)]


def time_with_ncu(args) -> list[dict]:
    from ncu_profile import parse

    if shutil.which("ncu") is None:
        print("ncu (Nsight Compute) is not on PATH: add it, or time with --timer wall")
        raise SystemExit(2)
    proc = subprocess.run(ncu_command(args), capture_output=True, text=True, env=dict(os.environ))
    print(proc.stdout[-2000:], proc.stderr[-2000:])
    if proc.returncode:
        raise SystemExit(proc.returncode)
    return parse((args.out / "ncu.csv").read_text(), json.loads(Path(args.labels).read_text()),
                 extra=[m for m in args.metrics.split(",") if m])


def time_with_wall(cands: list[dict], args) -> list[dict]:
    """Median over repeats of (a batch of launches in one eval) / batch, weight copies rotating."""
    import mlx.core as mx

    rows = []
    for label, launch in subjects(cands, args):
        mx.eval(launch())
        per = []
        for _ in range(args.repeats):
            mx.synchronize()
            t0 = time.perf_counter()
            mx.eval(*[launch() for _ in range(args.batch)])
            mx.synchronize()
            per.append((time.perf_counter() - t0) / args.batch)
        rows.append({**label, "time_ns": statistics.median(per) * 1e9, "dram_read_bytes": None})
    return rows


def summarize(rows: list[dict], cands: list[dict], args) -> None:
    copy_ns = {(r["K"], r["N"], r["M"]): r["time_ns"] for r in rows if r["subject"] == "copy"}
    for r in rows:
        ref = copy_ns.get((r["K"], r["N"], r["M"]))
        r["copy_ns"] = ref
        # read bandwidth as a share of the copy's (bytes read + written) / its time
        if ref and r["time_ns"]:
            copy_bw = 2 * weight_bytes(r["K"], r["N"]) / ref
            read = r.get("dram_read_bytes") or weight_bytes(r["K"], r["N"])
            r["pct_of_copy_bw"] = round(100 * read / r["time_ns"] / copy_bw, 1)
    print(f"\n{'K x N':12} {'M':>3} {'format':9} {'tuned us':>8} {'best us':>8} {'best kernel':32} "
          f"{'copy us':>7} {'best % copy BW':>14} {'mlx_q4 us':>9}")
    best: dict[tuple, dict] = {}
    for (k, n, m) in sorted(copy_ns, key=lambda t: (t[0], t[1], t[2])):
        q4 = next((r["time_ns"] for r in rows if (r["K"], r["N"], r["M"], r["subject"]) == (k, n, m, "mlx_q4")), None)
        for fmt in args.formats.split(","):
            ours = [r for r in rows if (r["K"], r["N"], r["M"], r["subject"]) == (k, n, m, fmt) and r["time_ns"]]
            if not ours:
                continue
            b = min(ours, key=lambda r: r["time_ns"])
            tuned = next((r for r in ours if r.get("tuned")), None)
            best[(k, n, m, fmt)] = b
            print(f"{f'{k}x{n}':12} {m:3d} {fmt:9} {tuned['time_ns'] / 1e3 if tuned else float('nan'):8.1f} "
                  f"{b['time_ns'] / 1e3:8.1f} {b['kernel']:32} {copy_ns[(k, n, m)] / 1e3:7.1f} "
                  f"{b.get('pct_of_copy_bw', float('nan')):14} {q4 / 1e3 if q4 else float('nan'):9.1f}")
    ms = sorted(ints(args.ms))
    if len(ms) > 1:
        print("\nbest M = %d / best M = %d:" % (ms[-1], ms[0]))
        for (k, n, m, fmt), b in sorted(best.items()):
            if m == ms[0] and (k, n, ms[-1], fmt) in best:
                print(f"  {k}x{n} {fmt}: {best[(k, n, ms[-1], fmt)]['time_ns'] / b['time_ns']:.2f}")
    failed = [c["name"] for c in cands if not c.get("ok", True)]
    (args.out / "decode_sweep.json").write_text(json.dumps(
        {"date": time.strftime("%Y-%m-%d"), "timer": args.timer, "device": device_name(),
         "commit": git_commit(ROOT), "digests": {c["name"]: source_digest(c["source"]) for c in cands if "source" in c},
         "failed": failed, "kernels": [public(c) for c in cands], "rows": rows}, indent=1))
    print(f"\n{len(cands) - len(failed)}/{len(cands)} kernels correct; results in {args.out / 'decode_sweep.json'}")


def git_commit(root: Path) -> str:
    from marlin_dsl.benchmarks.provenance import git_commit as commit

    return commit(root)


def source_digest(source: object) -> str:
    from marlin_dsl.benchmarks.provenance import source_digest as digest

    return digest(source)


def device_name() -> str:
    from marlin_dsl.benchmarks.provenance import gpu_name

    return gpu_name()


# ----- command line ------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry-run", action="store_true", help="no GPU: build, print, nvcc, interpreter checks")
    ap.add_argument("--kernels", type=Path, help="kernels a dry run wrote (manifest.json)")
    ap.add_argument("--formats", default="fp4", help="e.g. fp4,int4,uint4_zp (3x the run)")
    ap.add_argument("--ms", default="1,16")
    ap.add_argument("--tile-m", type=int, default=0, help="the grid's tile_m (default 8 for M <= 8, else 16)")
    ap.add_argument("--shapes", default="4096x4096,4096x14336,14336x4096", help="KxN,...")
    ap.add_argument("--k-warps", default="4,8,16")
    ap.add_argument("--depth", default="1,2")
    ap.add_argument("--warps-n", default="1", help="tile_n = 16 x warps_n (1,2: twice the run)")
    ap.add_argument("--n-tiles", default="1", help="16-row N tiles per warp (tile_n = 16 x warps_n x n_tiles)")
    ap.add_argument("--unroll", default="1,2")
    ap.add_argument("--vectors", default="1,2", help="K vectors per step (tile_k = vectors x the layout's chunk)")
    ap.add_argument("--stages", default="0", help="shared ring slots per warp for the weights (0: registers)")
    ap.add_argument("--x-ahead", default="0", help="0,1: B fragments loaded a step ahead (WeightStream.x_ahead)")
    ap.add_argument("--x-shuffle", default="0", help="0,2,4: activation loads shared by lanes (WeightStream.x_shuffle; 2:4)")
    ap.add_argument("--probe", default="", help="dry run: also text-mutated variants (l1na)")
    ap.add_argument("--metrics", default="", help="more ncu metrics, comma-separated (kept per row)")
    ap.add_argument("--timer", default="ncu", choices=("ncu", "wall"))
    ap.add_argument("--baselines", default="copy,mlx_q4")
    ap.add_argument("--copies", type=int, default=4, help="weight copies rotated (wall timer)")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2, help="nvcc processes (dry run)")
    ap.add_argument("--no-interpret", dest="interpret", action="store_false", help="dry run: skip the interpreter")
    ap.add_argument("--no-sass", dest="sass", action="store_false", help="dry run: skip SASS counts")
    ap.add_argument("--drive", action="store_true", help=argparse.SUPPRESS)  # the process ncu profiles
    ap.add_argument("--labels", default="/tmp/decode_sweep_labels.json", help=argparse.SUPPRESS)
    ap.add_argument("--passed", type=Path, help="skip the GPU checks: time the kernels an earlier run's passed.json lists")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        return dry_run(args)
    if args.drive:
        cands = load_kernels(args.kernels, args)
        passed = set(json.loads(args.passed.read_text())) if args.passed else None
        drive([c for c in cands if passed is None or c["name"] in passed], args)
        return 0
    if args.kernels:
        cands = load_kernels(args.kernels, args)
    else:
        cands = candidates(args)
        build(cands)
        args.kernels = args.out / "kernels"
        write_kernels(cands, args.kernels)
    if args.passed:  # an earlier run's GPU checks (its passed.json): time only what passed there
        passed = set(json.loads(args.passed.read_text()))
        for c in cands:
            c["ok"] = c["name"] in passed
        print(f"{len(cands)} kernels; {len(passed)} passed the GPU checks of {args.passed}")
    else:
        print(f"{len(cands)} kernels; checking them on the GPU")
        check_on_gpu(cands, args)
    (args.out / "passed.json").write_text(json.dumps([c["name"] for c in cands if c["ok"]]))
    rows = time_with_ncu(args) if args.timer == "ncu" else time_with_wall(cands, args)
    summarize(rows, cands, args)
    return 0 if all(c["ok"] for c in cands) else 1


if __name__ == "__main__":
    raise SystemExit(main())
