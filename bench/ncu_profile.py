"""Kernel times and bounds from Nsight Compute, the same way for MLX's kernels and ours.

`marlin-dsl bench` times launches through MLX, where host overhead per launch can hide the
device time of a 10-50 us kernel. This script measures the device side only: it runs itself
under `ncu` (every kernel replayed with caches flushed, clocks left alone), so a weight matrix
always comes from DRAM, as it would in a model, and reports per subject and shape:
gpu__time_duration, DRAM bytes read, DRAM throughput (% of peak), achieved occupancy, issue
activity and registers per thread: the profile the note's explanations come from.

Subjects: MLX's `quantized_matmul` (4-bit affine, group 64), fp16 `mx.matmul`, and our
weight-stream kernels (formats x schedules from `marlin_dsl.benchmarks.STREAM_SCHEDULES` or
--schedules). Each subject's launch is bracketed by a marker kernel (CuPy) so the ncu rows are
attributed without relying on kernel names.

    PYTHONPATH=/tmp/site:$PWD python3 bench/ncu_profile.py --out $OUT [--shapes ...] [--ms ...]
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

METRICS = {
    "gpu__time_duration.sum": "time_ns",
    "dram__bytes_read.sum": "dram_read_bytes",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_pct",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue_pct",
    "launch__registers_per_thread": "registers",
}
#: With --detail: what bounds a compute-heavy kernel (tensor pipe, shared-memory conflicts,
#: the main stall reasons as % of active warp cycles).
DETAIL_METRICS = {
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor_pct",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": "smem_ld_conflicts",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum": "smem_ld_wavefronts",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": "stall_barrier",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": "stall_long_sb",
    "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio": "stall_short_sb",
    "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio": "stall_math",
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": "stall_wait",
    "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio": "stall_mio",
    "smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio": "stall_not_selected",
    "smsp__inst_executed.sum": "instructions",
}
MARKER = "mdsl_marker"


def subjects(args):
    """[(label dict, launch callable)] for every shape, M and subject."""
    import mlx.core as mx

    from marlin_dsl import builtin_format, pack
    from marlin_dsl.targets.cuda.launch import build_cuda_kernel
    from marlin_dsl.compiler import compile_gemm
    from marlin_dsl.targets.cuda.tuning import multistage_schedule, tuned_schedule
    from marlin_dsl.schedule import Gemm, Multistage, Schedule, WeightStream
    from marlin_dsl.machine import CUDA

    import cupy as cp

    copy_raw = cp.RawKernel(r"""
extern "C" __global__ void mdsl_copy(const uint4* __restrict__ src, uint4* __restrict__ dst, unsigned n) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}""", "mdsl_copy")

    def copy_kernel(src):
        dst = cp.empty_like(src)
        n = src.size // 4
        copy_raw((132 * 8,), (256,), (src, dst, np.uint32(n)))
        return mx.array(0)  # nothing to evaluate on MLX's side: CuPy launched it

    rng = np.random.default_rng(0)
    out = []
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        w = rng.standard_normal((k, n)).astype(np.float32)
        wt = mx.array(np.ascontiguousarray(w.T).astype(np.float16))
        q = mx.quantize(wt, group_size=64, bits=4)
        w16 = mx.array(w.astype(np.float16))
        copy_src = cp.ones(((k * n // 8 + (k // 128) * n // 2) // 4) * 4, dtype=cp.uint32)  # 16-byte units
        mx.eval(*q, w16)
        ours = []
        for fmt_name in args.formats.split(","):
            fmt = builtin_format(fmt_name)
            packed = pack(fmt, w)
            for m in [int(v) for v in args.ms.split(",")]:
                scheds = [tuned_schedule(fmt, m, None, k, n)] + [
                    Schedule("extra", tile_m=tm, tile_n=tn, tile_k=tuned_schedule(fmt, m).tile_k, warps_m=1,
                             warps_n=wn, pipeline=WeightStream(k_warps=kw, depth=d))
                    for tm, tn, wn, kw, d in (tuple(int(v) for v in e.split(":")) for e in args.extra.split(",") if e)
                    if tm >= min(m, 16)] + [
                    Schedule("extra_ms", tile_m=tm, tile_n=tn, tile_k=multistage_schedule(fmt, 2048).tile_k, warps_m=wm,
                             warps_n=wn, pipeline=Multistage(stages=st))
                    for tm, tn, wm, wn, st in (tuple(int(v) for v in e.split(":")) for e in args.multistage.split(",") if e)]
                for sched in scheds:
                    gemm = build_cuda_kernel(compile_gemm(Gemm(f"ncu_{fmt_name}", fmt, sched), CUDA).kernel)
                    ours.append((fmt_name, m, sched, gemm, gemm.weights(packed)))
        for m in [int(v) for v in args.ms.split(",")]:
            x = mx.array(rng.standard_normal((m, k)).astype(np.float16))
            mx.eval(x)
            base = {"K": k, "N": n, "M": m}
            out.append(({**base, "subject": "mlx_q4"},
                        lambda x=x, q=q: mx.quantized_matmul(x, *q, transpose=True, group_size=64, bits=4)))
            out.append(({**base, "subject": "fp16"}, lambda x=x, w16=w16: mx.matmul(x, w16)))
            # The copy floor: a 128-bit grid-stride copy kernel (CuPy) of the bytes of a 4-bit
            # weight with its group-128 f16 scales: the "copy bandwidth" (read + write).
            out.append(({**base, "subject": "copy"}, lambda c=copy_src: copy_kernel(c)))
            for fmt_name, mm, sched, gemm, weights in ours:
                if mm == m:
                    p = sched.pipeline
                    if p.kind == "multistage":
                        label = f"{sched.tile_m}x{sched.tile_n}x{sched.tile_k} {sched.warps_m}x{sched.warps_n} s{p.stages}"
                    else:
                        label = f"{sched.tile_m}x{sched.tile_n}x{sched.tile_k} w{sched.warps_n} k{p.k_warps} d{p.depth}"
                    out.append(({**base, "subject": f"ws {fmt_name}", "schedule": label},
                                lambda x=x, g=gemm, wt_=weights: g(wt_, x, poison=False)))
    return out


def drive(args) -> None:
    import cupy as cp
    import mlx.core as mx

    marker = cp.RawKernel(r'extern "C" __global__ void mdsl_marker(int* p) { if (p) p[0] = 1; }', MARKER)
    labels = []
    for label, launch in subjects(args):
        for _ in range(2):  # compile and warm outside the bracket
            mx.eval(launch())
        mx.synchronize()
        marker((1,), (32,), (0,))  # opens the bracket
        cp.cuda.runtime.deviceSynchronize()
        mx.eval(launch())
        mx.synchronize()
        marker((1,), (32,), (0,))  # closes it
        cp.cuda.runtime.deviceSynchronize()
        labels.append(label)
    Path(args.labels).write_text(json.dumps(labels))


def parse(csv_text: str, labels: list[dict], extra: list[str] = ()) -> list[dict]:
    """Rows per subject (between marker kernels): METRICS summed or maxed over the subject's
    kernels, and each `extra` metric as the value of its longest kernel."""
    rows = list(csv.DictReader(io.StringIO(csv_text[csv_text.index('"ID"'):])))
    rows = [r for r in rows if r.get("Kernel Name")]
    segments: list[list[dict]] = []
    inside = False
    for r in rows:
        if r["Kernel Name"].startswith(MARKER):
            inside = not inside
            if inside:
                segments.append([])
        elif inside:
            segments[-1].append(r)
    results = []
    for label, seg in zip(labels, segments):
        res = dict(label)
        res["kernels"] = [r["Kernel Name"][:60] for r in seg]
        for metric, key in METRICS.items():
            vals = [float(str(r.get(metric, "nan")).replace(",", "") or "nan") for r in seg]
            res[key] = sum(vals) if key in ("time_ns", "dram_read_bytes") else (max(vals) if vals else None)
        if seg and extra:
            longest = max(seg, key=lambda r: float(str(r.get("gpu__time_duration.sum", "0")).replace(",", "") or 0))
            for metric in extra:
                res[metric] = float(str(longest.get(metric, "nan")).replace(",", "") or "nan")
        results.append(res)
    return results


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", nargs="?", default="profile", choices=("profile", "drive"))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--labels", default="/tmp/ncu_labels.json")
    ap.add_argument("--shapes", default="4096x4096,4096x14336,14336x4096")
    ap.add_argument("--ms", default="1,16,64")
    ap.add_argument("--formats", default="fp4")
    ap.add_argument("--extra", default="", help="more schedules tile_m:tile_n:warps_n:k_warps:depth,...")
    ap.add_argument("--detail", action="store_true", help="also tensor-pipe, shared-memory and stall metrics")
    ap.add_argument("--multistage", default="", help="multistage schedules tile_m:tile_n:warps_m:warps_n:stages,...")
    args = ap.parse_args()
    if args.mode == "drive":
        drive(args)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "ncu.csv"
    if args.detail:
        METRICS.update(DETAIL_METRICS)
    metrics = list(METRICS)
    cmd = ["ncu", "--csv", "--page", "raw", "--clock-control", "none", "--cache-control", "all",
           "--metrics", ",".join(metrics), "--log-file", str(log),
           sys.executable, __file__, "drive", "--labels", args.labels, "--shapes", args.shapes,
           "--ms", args.ms, "--formats", args.formats, "--extra", args.extra,
           "--multistage", args.multistage]
    started = time.time()
    proc = subprocess.run(cmd, env=dict(os.environ), capture_output=True, text=True)
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    if proc.returncode:
        return proc.returncode
    results = parse(log.read_text(), json.loads(Path(args.labels).read_text()))
    copy_gbs = {}
    for r in results:
        if r["subject"] == "copy" and r["time_ns"]:  # bytes read + written
            copy_gbs[(r["K"], r["N"])] = 2 * 4 * (r["K"] * r["N"] // 8 + (r["K"] // 128) * r["N"] // 2) / r["time_ns"]
    for r in results:
        gbs = r["dram_read_bytes"] / r["time_ns"] if r["time_ns"] else 0.0
        ref = copy_gbs.get((r["K"], r["N"]))
        r["pct_of_copy_bw"] = round(100 * gbs / ref, 1) if ref else None
        print(f"{r['K']}x{r['N']} M={r['M']:<5} {r['subject']:12} {r.get('schedule', ''):26} "
              f"{r['time_ns'] / 1e3:8.1f} us  {gbs:7.0f} GB/s ({r['pct_of_copy_bw']}% of copy)  dram {r['dram_pct'] or 0:5.1f}%  "
              f"occ {r['occupancy_pct'] or 0:5.1f}%  issue {r['issue_pct'] or 0:5.1f}%  regs {r['registers']}"
              + ("".join(f"  {key} {r.get(key)}" for key in DETAIL_METRICS.values()) if args.detail else ""))
    (args.out / "ncu_profile.json").write_text(json.dumps(
        {"date": time.strftime("%Y-%m-%d"), "tool": "ncu --clock-control none --cache-control all",
         "rows": results}, indent=2))
    print(f"done in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
