"""`marlin-dsl bench`: our GEMM kernels against MLX's own and against the bandwidth floor, on a GPU.

One run measures, for every (K, N) and M (y[M, N] = x[M, K] @ W[K, N], x and y float16):

* our kernels, one per requested built-in format x pipeline: lowered with `compile_gemm(..,
  CUDA)`, printed with `print_cuda` and launched through `build_cuda_kernel` (MLX's
  `mx.fast.cuda_kernel`); on an Apple GPU the same Gemm compiled for Metal and launched through
  its generated launcher (`emit.write_metal_kernel`);
* `mx.quantized_matmul`, 4-bit affine, group 64, `transpose=True` (the form MLX's
  `QuantizedLinear` calls), weights from `mx.quantize` of the same random weight;
* float16 `mx.matmul` of the same weight;
* the floor: (packed weight bytes + x bytes + y bytes) / device-to-device copy bandwidth, the
  bandwidth measured once per run.

Timing (`DEFINITIONS` says the same in bench.json):

* kernel time: the median over `repeats` batches of (wall time of one `mx.eval` +
  `mx.synchronize` over a batch of launches queued beforehand) / launches. A batch has 50
  launches, fewer (at least 3) when one launch takes so long that 50 would exceed ~50 ms. The
  launches rotate over copies of the weights (at least 4, and enough that the copies together
  exceed 128 MiB, over twice the H100's 50 MB L2), so a launch does not find its weights in
  L2 (4 copies of a 4-bit 4096 x 4096 weight, 34 MB, would still fit). The first launch at
  each M (JIT compilation on a kernel's first use) and one warm-up batch are not timed.
  MLX records independent launches into one CUDA graph (up to 20 nodes) whose nodes may run
  concurrently (in one comparison on an H100 our kernels at M = 1 and 16 then measured up to
  1.9x faster); the run
  sets MLX_MAX_OPS_PER_BUFFER=1 (unless the environment sets it; MLX reads it once, at its
  first GPU evaluation in the process) so that every launch is its own graph and the launches
  run one after another on the stream. That costs MLX 10-20 us of host time per launch:
  `launch_floor_us` in the environment is the same measurement of a one-element negation, and
  a kernel time under 1.5x that floor is marked host-bound (an upper bound on the GPU time).
* end-to-end time: the median of single calls, each followed by `mx.eval` (so it includes
  Python, MLX graph building, CUDA graph launch and the wait), through the public call path
  (`CudaGemm.__call__` with `poison=False` for ours).

Each (kernel, M) is also checked once: the first end-to-end output against x @ W in float32
(W dequantised from the kernel's own weights), relative Frobenius error <= 2e-3.

Needs only numpy, MLX and marlin_dsl with its compiler dependencies (networkx; lark only for
textual formats), so it runs on the GPU machine from the carried wheels. matplotlib is
optional: without it the run writes bench.json only and `bench/plot_bench.py` makes the PNG
elsewhere.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Protocol, Sequence

import numpy as np

from .errors import EnvironmentUnavailable, MarlinDSLError, ScheduleError

DEFAULT_SHAPES: tuple[tuple[int, int], ...] = ((4096, 4096), (4096, 14336), (14336, 4096))
DEFAULT_MS: tuple[int, ...] = (1, 16, 64, 256, 2048)
#: Every pipeline the bench can build (the striped one with one group per H100 SM, as
#: bench/prepare_gpu_kernels.py builds it for the correctness run).
PIPELINES: tuple[str, ...] = ("double_buffered", "fused_dequant", "striped", "weight_stream")
#: The default selection: every pipeline. The default run (7 formats x 3 pipelines x 3 shapes
#: x 5 Ms) took 3.3 min on an H100 (2026-11-22), of which ~70 s were MLX compiling its own
#: quantized_matmul kernels and ~45 s NVRTC compiling ours.
DEFAULT_PIPELINES: tuple[str, ...] = PIPELINES
QUICK_SHAPES: tuple[tuple[int, int], ...] = ((4096, 4096),)
QUICK_MS: tuple[int, ...] = (1, 16)
QUICK_FORMATS: tuple[str, ...] = ("fp4", "fp4_2of4")
DEFAULT_REPEATS = 5

#: Launches per timed batch, and the fewest when a launch is slow.
BATCH_LAUNCHES = 50
MIN_BATCH_LAUNCHES = 3
#: A batch is cut to about this long (seconds), never below MIN_BATCH_LAUNCHES launches.
BATCH_TARGET_S = 0.05
#: Weight copies rotate over at least this many bytes (the H100's L2 holds 50 MB).
ROTATE_BYTES = 128 << 20
MIN_COPIES, MAX_COPIES = 4, 64
#: The copy-bandwidth measurement: a chain of negations of a 1 GiB float32 array.
COPY_BYTES = 1 << 30
COPY_CHAIN = 8
COPY_SAMPLES = 5
#: Bytes per activation element (x and y are float16).
ACT_BYTES = 2
REL_TOL = 2e-3  # kernel_check.REL_TOL for f16
#: A kernel time below this many per-launch floors (environment.launch_floor_us) is marked
#: host-bound: launches could not be issued faster, so it is an upper bound on the GPU time.
HOST_BOUND_FACTOR = 1.5

QMM = "mx.quantized_matmul"
FP16 = "mx.matmul"
QMM_FORMAT = "mlx_affine4_g64"
FP16_FORMAT = "fp16"
KIND_ORDER = {"fp16": 0, "mlx_q4": 1, "marlin": 2}

DEFINITIONS = {
    "kernel_us": (
        "median over `repeats` batches of (wall time of one mx.eval + mx.synchronize over a batch of "
        "launches queued beforehand) / launches in the batch; launches per batch: `launches` (50, fewer "
        "when one launch is slow), rotating over `copies` copies of the weights so that weights are not "
        "served from L2; with MLX_MAX_OPS_PER_BUFFER=1 every launch is its own CUDA graph, so the "
        "launches run one after another (this includes the gap between launches, see "
        "environment.launch_floor_us)"),
    "e2e_us": ("median of single calls each followed by mx.eval (Python + MLX graph building + "
               "launch + wait), through the public call path (ours: CudaGemm.__call__, poison=False)"),
    "floor_us": ("(weight_bytes + x_bytes + y_bytes) / copy bandwidth: the time to move the bytes that "
                 "must move at the measured device-to-device copy bandwidth"),
    "weight_bytes": ("the packed weight as launched: every array the kernel reads (codes, scales, zero "
                     "points, sparsity metadata); for mx.quantized_matmul w + scales + biases; for fp16 K*N*2"),
    "pct_floor_bw": "100 * floor_us / kernel_us: the achieved share of the copy bandwidth",
    "vs_qmm": "kernel_us of mx.quantized_matmul at the same K, N, M / this kernel_us (> 1: faster than it)",
    "vs_fp16": "kernel_us of float16 mx.matmul at the same K, N, M / this kernel_us (> 1: faster than it)",
    "rel_error": ("||y - x @ W|| / ||x @ W|| (Frobenius) of the first end-to-end output, W dequantised "
                  "from the kernel's own weights, float32 reference; ok when <= 2e-3"),
    "copy_bandwidth": ("(bytes read + bytes written) / time of a chain of negations of a 1 GiB float32 "
                       "array (each step reads and writes 1 GiB), median of several chains"),
    "launch_floor_us": "kernel_us measured the same way for a one-element negation: the per-launch overhead",
    "host_bound": (f"kernel_us < {HOST_BOUND_FACTOR:g} * launch_floor_us: MLX could not issue the launches "
                   "faster, so kernel_us is an upper bound on the GPU time (table: '*')"),
    "queue_us": "Python time to queue one launch (building the lazy MLX array; not in kernel_us, in e2e_us)",
    "first_launch_ms": "the first launch at this M evaluated alone (JIT compilation when it is the kernel's first)",
    "measure_s": "wall time of the whole measurement of this row",
    "e2e_prepared_us": ("like e2e_us, but each call is the launch that kernel_us times, its inputs made "
                        "beforehand (ours: dims array and zeroed counters already on the device); "
                        "e2e_us - e2e_prepared_us is what the public call path adds"),
    "compile_s": "per kernel: lowering + passes + printing (the NVRTC compilation happens at the first launch)",
}


# ----- results ---------------------------------------------------------------------------------

@dataclass
class Measurement:
    """What a subject's `measure(m)` returns."""

    kernel_s: float
    e2e_s: float
    launches: int = BATCH_LAUNCHES
    copies: int = 1
    rel_error: float | None = None
    kernel_samples_s: list[float] = field(default_factory=list)
    e2e_samples_s: list[float] = field(default_factory=list)
    #: Python time to queue one launch (building the lazy MLX array, no evaluation).
    queue_s: float | None = None
    #: The first launch at this M, evaluated alone (includes JIT compilation on first use).
    first_launch_s: float | None = None
    #: Like e2e_s, but calling the launch the kernel time uses (inputs prepared beforehand).
    e2e_prepared_s: float | None = None


class Subject(Protocol):
    """One kernel at one (K, N), weights prepared: `measure(m)` times it at M = m."""

    kind: str  # "marlin", "mlx_q4" or "fp16"
    format: str
    pipeline: str
    weight_bytes: int

    def measure(self, m: int) -> Measurement: ...


class Runner(Protocol):
    """Where subjects come from: the MLX runner on a GPU, a fake one in tests."""

    def environment(self) -> dict: ...

    def copy_bandwidth(self) -> dict: ...

    def baselines(self, k: int, n: int) -> list[Subject]: ...

    def marlin(self, fmt: str, pipeline: str, k: int, n: int) -> Subject: ...

    def end_shape(self) -> None: ...


def kernel_label(kind: str, fmt: str, pipeline: str) -> str:
    if kind == "mlx_q4":
        return QMM
    if kind == "fp16":
        return FP16
    return f"{fmt}/{pipeline}"


def floor_bytes(weight_bytes: int, m: int, k: int, n: int) -> int:
    """Bytes a GEMM must move at least: the weights once, x [M, K] and y [M, N] in float16."""
    return int(weight_bytes) + m * k * ACT_BYTES + m * n * ACT_BYTES


def floor_us(nbytes: int, bandwidth_bytes_per_s: float) -> float:
    return nbytes / bandwidth_bytes_per_s * 1e6


def copies_for(weight_bytes: int) -> int:
    """How many weight copies the launches rotate over."""
    return max(MIN_COPIES, min(MAX_COPIES, math.ceil(ROTATE_BYTES / max(int(weight_bytes), 1))))


def finish_rows(rows: list[dict], bandwidth: float) -> None:
    """Fill in floor_bytes, floor_us, pct_floor_bw, vs_qmm and vs_fp16 (in place)."""
    base = {(r["kind"], r["K"], r["N"], r["M"]): r.get("kernel_us") for r in rows}
    for r in rows:
        fb = floor_bytes(r["weight_bytes"], r["M"], r["K"], r["N"])
        r["floor_bytes"] = fb
        r["floor_us"] = floor_us(fb, bandwidth)
        t = r.get("kernel_us")
        r["pct_floor_bw"] = 100.0 * r["floor_us"] / t if t else None
        for key, kind in (("vs_qmm", "mlx_q4"), ("vs_fp16", "fp16")):
            ref = base.get((kind, r["K"], r["N"], r["M"]))
            r[key] = ref / t if ref and t else None


def sort_rows(rows: list[dict], shapes: Sequence[tuple[int, int]] = ()) -> list[dict]:
    order = {tuple(s): i for i, s in enumerate(shapes)}
    return sorted(rows, key=lambda r: (order.get((r["K"], r["N"]), len(order)), r["K"], r["N"],
                                       -1 if r.get("M") is None else r["M"],
                                       KIND_ORDER.get(r["kind"], 9), r["format"], r["pipeline"]))


def _us(v: float | None) -> str:
    if v is None or not math.isfinite(v):
        return "-"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x" if v < 100 else f"{v:.0f}x"


TABLE_HEADERS = ["format", "pipeline", "K", "N", "M", "kernel us", "e2e us", "floor us",
                 "% floor bw", "vs mx.qmm", "vs fp16", "check"]


def table_rows(rows: Iterable[dict]) -> list[list[str]]:
    out = []
    for r in rows:
        if r.get("error"):
            check = "ERROR"
        elif r.get("rel_error") is None:
            check = "-"
        else:
            check = f"{'ok' if r['ok'] else 'FAIL'} {r['rel_error']:.0e}"
        pct = r.get("pct_floor_bw")
        out.append([r["format"], r["pipeline"], str(r["K"]), str(r["N"]), "-" if r.get("M") is None else str(r["M"]),
                    _us(r.get("kernel_us")) + ("*" if r.get("host_bound") else ""), _us(r.get("e2e_us")), _us(r.get("floor_us")),
                    "-" if pct is None else f"{pct:.1f}", _ratio(r.get("vs_qmm")),
                    _ratio(r.get("vs_fp16")), check])
    return out


def format_table(rows: Iterable[dict]) -> str:
    body = table_rows(rows)
    headers = TABLE_HEADERS
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]
    right = {2, 3, 4, 5, 6, 7, 8, 9, 10}

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *map(line, body)])


# ----- the run ---------------------------------------------------------------------------------

class Log:
    """Prints each line and appends it to `path` (when given)."""

    def __init__(self, path: Path | None = None, stream=None) -> None:
        self.path = path
        self.stream = stream
        self.lines: list[str] = []
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")

    def __call__(self, *parts) -> None:
        line = " ".join(str(p) for p in parts)
        print(line, file=self.stream or sys.stdout, flush=True)
        self.lines.append(line)
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(line + "\n")


def _row(subject: Subject, k: int, n: int, m: int) -> dict:
    return {"kernel": kernel_label(subject.kind, subject.format, subject.pipeline), "kind": subject.kind,
            "format": subject.format, "pipeline": subject.pipeline, "K": k, "N": n, "M": m,
            "weight_bytes": int(subject.weight_bytes)}


def run_bench(formats: Sequence[str] | None = None, pipelines: Sequence[str] | None = None,
              shapes_kn: Sequence[tuple[int, int]] | None = None, ms: Sequence[int] | None = None,
              repeats: int = DEFAULT_REPEATS, out_dir: Path | str | None = None,
              log: Callable[..., None] | None = None, *, runner: Runner | None = None,
              plot: bool = True) -> dict:
    """Time every kernel at every shape; write bench.json (and bench.png with matplotlib) to
    `out_dir`; return the JSON document. `runner` defaults to `MLXRunner` (GPU only: it raises
    MarlinDSLError without MLX's CUDA or Metal backend)."""
    from .formats.builtin import BUILTIN_FORMATS

    formats = list(BUILTIN_FORMATS) if formats is None else list(formats)
    pipelines = list(DEFAULT_PIPELINES) if pipelines is None else list(pipelines)
    shapes = [tuple(int(v) for v in s) for s in (DEFAULT_SHAPES if shapes_kn is None else shapes_kn)]
    ms = list(DEFAULT_MS if ms is None else ms)
    for name in formats:
        if name not in BUILTIN_FORMATS:
            raise MarlinDSLError(f"unknown format {name!r}; built-in formats: {', '.join(BUILTIN_FORMATS)}")
    for name in pipelines:
        if name not in PIPELINES:
            raise MarlinDSLError(f"unknown pipeline {name!r}; pipelines: {', '.join(PIPELINES)}")
    if repeats < 1:
        raise MarlinDSLError(f"repeats must be at least 1, got {repeats}")
    log = log or Log()
    out = Path(out_dir) if out_dir is not None else None
    started = time.perf_counter()
    if runner is None:
        runner = MLXRunner(repeats=repeats, log=log)
    env = runner.environment()
    log(f"environment: {json.dumps(env)}")
    bw = runner.copy_bandwidth()
    log(f"device-to-device copy bandwidth: {bw['bytes_per_s'] / 1e9:.0f} GB/s (bytes read + written)")
    env["copy_bandwidth_gb_s"] = round(bw["bytes_per_s"] / 1e9, 1)
    launch_floor_s = float(env.get("launch_floor_us") or 0.0) * 1e-6
    doc = {
        "schema": "marlin-dsl bench 1",
        "environment": env,
        "copy_bandwidth": bw,
        "settings": {"formats": formats, "pipelines": pipelines, "shapes_kn": [list(s) for s in shapes],
                     "ms": ms, "repeats": repeats, "batch_launches": BATCH_LAUNCHES,
                     "min_batch_launches": MIN_BATCH_LAUNCHES, "batch_target_s": BATCH_TARGET_S,
                     "rotate_bytes": ROTATE_BYTES, "activation": "f16", "rel_tol": REL_TOL},
        "definitions": DEFINITIONS,
        "rows": [],
        "errors": [],
    }
    rows: list[dict] = doc["rows"]

    def record(label: dict, fn: Callable[[], Measurement]) -> None:
        row = dict(label)
        t_row = time.perf_counter()
        try:
            meas = fn()
        except Exception as exc:  # noqa: BLE001  (NVRTC errors, launch failures: keep going)
            row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            doc["errors"].append({k: row[k] for k in ("kernel", "K", "N", "M", "error")})
            log(f"ERROR {row['kernel']:<28} K={row['K']} N={row['N']} M={row['M']}: {row['error'][:300]}")
            rows.append(row)
            return
        row.update(kernel_us=meas.kernel_s * 1e6, e2e_us=meas.e2e_s * 1e6, launches=meas.launches,
                   copies=meas.copies, rel_error=meas.rel_error,
                   ok=meas.rel_error is not None and meas.rel_error <= REL_TOL,
                   kernel_samples_us=[round(s * 1e6, 3) for s in meas.kernel_samples_s],
                   e2e_samples_us=[round(s * 1e6, 3) for s in meas.e2e_samples_s],
                   queue_us=None if meas.queue_s is None else round(meas.queue_s * 1e6, 2),
                   first_launch_ms=None if meas.first_launch_s is None else round(meas.first_launch_s * 1e3, 2),
                   e2e_prepared_us=None if meas.e2e_prepared_s is None else round(meas.e2e_prepared_s * 1e6, 2),
                   host_bound=bool(meas.kernel_s < HOST_BOUND_FACTOR * launch_floor_s),
                   measure_s=round(time.perf_counter() - t_row, 3))
        if meas.rel_error is None:
            row["ok"] = None
        rows.append(row)
        fb = floor_bytes(row["weight_bytes"], row["M"], row["K"], row["N"])
        rel = "-" if meas.rel_error is None else f"{meas.rel_error:.1e}"
        log(f"{row['kernel']:<28} K={row['K']:<5} N={row['N']:<5} M={row['M']:<4} kernel "
            f"{_us(row['kernel_us']):>8} us ({meas.launches} launches, {meas.copies} copies)  e2e "
            f"{_us(row['e2e_us']):>8} us  floor {_us(floor_us(fb, bw['bytes_per_s'])):>7} us  rel {rel}  "
            f"[queue {_us(row['queue_us'])} us, first {row['first_launch_ms']} ms, {row['measure_s']:.2f} s]")

    for k, n in shapes:
        t_shape = time.perf_counter()
        subjects: list = []
        try:
            subjects += runner.baselines(k, n)
        except Exception as exc:  # noqa: BLE001
            doc["errors"].append({"kernel": "baselines", "K": k, "N": n, "error": f"{type(exc).__name__}: {exc}"})
            log(f"ERROR baselines K={k} N={n}: {exc}")
        for subject in subjects:
            for m in ms:
                record(_row(subject, k, n, m), lambda s=subject, m=m: s.measure(m))
        for fmt in formats:
            for pl in pipelines:
                try:
                    subject = runner.marlin(fmt, pl, k, n)
                except ScheduleError as exc:  # the pipeline does not take this format: not a failure
                    log(f"skip {kernel_label('marlin', fmt, pl)}: {exc}")
                    continue
                except Exception as exc:  # noqa: BLE001
                    label = {"kernel": kernel_label("marlin", fmt, pl), "kind": "marlin", "format": fmt,
                             "pipeline": pl, "K": k, "N": n, "M": None, "weight_bytes": 0,
                             "error": f"{type(exc).__name__}: {exc}"[:2000]}
                    doc["errors"].append({key: label[key] for key in ("kernel", "K", "N", "M", "error")})
                    rows.append(label)
                    log(f"ERROR {label['kernel']} K={k} N={n}: {label['error'][:300]}")
                    continue
                for m in ms:
                    record(_row(subject, k, n, m), lambda s=subject, m=m: s.measure(m))
                del subject
        runner.end_shape()
        doc["compile_s"] = dict(getattr(runner, "compile_s", {}))
        log(f"  [K={k} N={n}: {time.perf_counter() - t_shape:.1f} s]")
        if out is not None:  # partial results survive a run that is cut short
            _finish(doc, shapes, bw["bytes_per_s"], started)
            _write_json(doc, out)
    _finish(doc, shapes, bw["bytes_per_s"], started)
    log("")
    log(format_table(doc["rows"]))
    log("")
    log("kernel us: median per launch of back-to-back launches (weights rotated past L2); e2e us: "
        "median single call + mx.eval; floor us: (weight + x + y bytes) / copy bandwidth "
        f"({bw['bytes_per_s'] / 1e9:.0f} GB/s); % floor bw = floor / kernel; vs mx.qmm, vs fp16: "
        "their kernel us / this kernel us (> 1: faster); check: relative error vs float32 x @ W "
        f"(ok <= {REL_TOL:g}); *: under {HOST_BOUND_FACTOR:g}x the per-launch floor "
        f"({env.get('launch_floor_us')} us): launches could not be issued faster, an upper bound")
    if out is not None:
        path = _write_json(doc, out)
        log(f"wrote {path}")
        if plot:
            try:
                png = plot_bench(doc, out / "bench.png")
                log(f"wrote {png}")
            except ImportError:
                log("matplotlib is not importable here: no bench.png; make it where matplotlib is with\n"
                    f"    python bench/plot_bench.py {path}")
    failures = [r for r in doc["rows"] if r.get("error") or r.get("ok") is False]
    log(f"{len(doc['rows'])} measurements, {len(failures)} failed or errored, "
        f"{doc['elapsed_s']:.0f} s ({env.get('device_name', env.get('device', '?'))})")
    return doc


def _finish(doc: dict, shapes, bandwidth: float, started: float) -> None:
    doc["rows"][:] = sort_rows(doc["rows"], shapes)
    finish_rows([r for r in doc["rows"] if r.get("M") is not None], bandwidth)
    doc["elapsed_s"] = round(time.perf_counter() - started, 1)
    doc["failed"] = sum(1 for r in doc["rows"] if r.get("error") or r.get("ok") is False)


def _write_json(doc: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "bench.json"
    path.write_text(json.dumps(doc, indent=1, default=float))
    return path


# ----- the plot --------------------------------------------------------------------------------

def best_pipelines(rows: Iterable[dict]) -> dict[tuple[int, int, str], str]:
    """(K, N, format) -> the pipeline with the smallest geometric-mean kernel time over the Ms
    it has measured at all of them."""
    times: dict[tuple[int, int, str, str], dict[int, float]] = {}
    for r in rows:
        if r["kind"] == "marlin" and r.get("kernel_us"):
            times.setdefault((r["K"], r["N"], r["format"], r["pipeline"]), {})[r["M"]] = r["kernel_us"]
    best: dict[tuple[int, int, str], tuple[int, float, str]] = {}
    for (k, n, fmt, pl), by_m in times.items():
        score = (-len(by_m), sum(math.log(v) for v in by_m.values()) / len(by_m), pl)
        key = (k, n, fmt)
        if key not in best or score < best[key]:
            best[key] = score
    return {key: score[2] for key, score in best.items()}


def plot_bench(doc: dict, path: Path | str) -> Path:
    """bench.png: a panel per (K, N), kernel time (log) against M (log), a line per format (its
    best pipeline at that shape), mx.quantized_matmul and float16 mx.matmul solid, each line's
    bandwidth floor dashed in its colour. Needs matplotlib (ImportError otherwise)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullLocator

    rows = [r for r in doc["rows"] if r.get("M") is not None and r.get("kernel_us")]
    shapes = [tuple(s) for s in doc["settings"]["shapes_kn"]]
    shapes = [s for s in shapes if any((r["K"], r["N"]) == s for r in rows)] or [(0, 0)]
    best = best_pipelines(rows)
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 5), squeeze=False)
    palette = plt.get_cmap("tab10").colors
    formats = [f for f in doc["settings"]["formats"]]
    colours = {FP16: "black", QMM: "dimgray"}
    for i, f in enumerate(formats):
        colours[f] = palette[i % len(palette)]
    for ax, (k, n) in zip(axes[0], shapes):
        here = [r for r in rows if (r["K"], r["N"]) == (k, n)]
        lines: list[tuple[str, str, list[dict]]] = []
        for kind, label in (("fp16", FP16), ("mlx_q4", QMM)):
            sel = [r for r in here if r["kind"] == kind]
            if sel:
                lines.append((label, label, sel))
        for fmt in formats:
            pl = best.get((k, n, fmt))
            sel = [r for r in here if r["kind"] == "marlin" and r["format"] == fmt and r["pipeline"] == pl]
            if sel:
                lines.append((f"{fmt} ({pl})", fmt, sel))
        for label, colour_key, sel in lines:
            sel = sorted(sel, key=lambda r: r["M"])
            m = [r["M"] for r in sel]
            colour = colours.get(colour_key, "tab:blue")
            width = 2.2 if colour_key in (FP16, QMM) else 1.4
            ax.plot(m, [r["kernel_us"] for r in sel], marker="o", markersize=3, linewidth=width,
                    color=colour, label=label)
            ax.plot(m, [r["floor_us"] for r in sel], linestyle="--", linewidth=1.0, color=colour, alpha=0.6)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ms_here = sorted({r["M"] for r in here})
        ax.set_xticks(ms_here)
        ax.set_xticklabels([str(v) for v in ms_here])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_title(f"K = {k}, N = {n}")
        ax.set_xlabel("M (rows of x)")
        ax.set_ylabel("kernel time per launch (us)")
        ax.grid(True, which="both", alpha=0.25)
        handles, labels = ax.get_legend_handles_labels()
        handles.append(Line2D([], [], linestyle="--", color="gray"))
        labels.append("bandwidth floor (dashed, same colour)")
        ax.legend(handles, labels, fontsize=7, loc="upper left")
    env = doc.get("environment", {})
    fig.suptitle(f"marlin-dsl bench: {env.get('device_name', env.get('device', '?'))}, MLX "
                 f"{env.get('mlx', '?')}, {str(env.get('date', ''))[:10]}; copy bandwidth "
                 f"{env.get('copy_bandwidth_gb_s', '?')} GB/s", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


# ----- timing ----------------------------------------------------------------------------------

@dataclass
class TimedLaunches:
    per_launch_s: float
    launches: int
    samples_s: list[float]
    estimate_s: float  # one launch evaluated alone
    queue_s: float  # Python time to queue one launch
    first_s: float  # the first launch (JIT compilation on first use)


def kernel_time(mx, launch: Callable[[int], object], repeats: int, *,
                clock: Callable[[], float] = time.perf_counter,
                max_launches: int = BATCH_LAUNCHES, min_launches: int = MIN_BATCH_LAUNCHES,
                target_s: float = BATCH_TARGET_S) -> TimedLaunches:
    """Median seconds per launch of back-to-back launches: `launch(i)` queues launch number i
    (lazily, MLX array out). One launch first (compiles on first use), two timed single
    launches to size a first batch, which is a warm-up (allocator, caches) and sizes the
    `repeats` timed batches that follow."""
    counter = 0
    queue_s: list[float] = []

    def queue(count: int) -> list:
        nonlocal counter
        t = clock()
        outs = [launch(counter + i) for i in range(count)]
        queue_s.append((clock() - t) / count)
        counter += count
        return outs

    t = clock()
    mx.eval(*queue(1))
    mx.synchronize()
    first = clock() - t
    single = []
    for _ in range(2):
        outs = queue(1)
        t = clock()
        mx.eval(*outs)
        mx.synchronize()
        single.append(clock() - t)
    estimate = max(min(single), 1e-9)

    def size(per_launch: float) -> int:
        return max(min_launches, min(max_launches, int(target_s / max(per_launch, 1e-9) + 1e-6)))

    count = size(estimate)
    samples = []
    for r in range(repeats + 1):
        outs = queue(count)
        mx.synchronize()
        t = clock()
        mx.eval(*outs)
        mx.synchronize()
        elapsed = clock() - t
        del outs
        if r:
            samples.append(elapsed / count)
        else:  # the warm-up batch sizes the timed ones better than single launches do
            count = size(elapsed / count)
    return TimedLaunches(statistics.median(samples), count, samples, estimate,
                         statistics.median(queue_s[1:]), first)


def e2e_time(mx, call: Callable[[int], object], repeats: int, estimate_s: float, *,
             clock: Callable[[], float] = time.perf_counter, budget_s: float = 0.25):
    """Median seconds of single calls, each followed by mx.eval: max(3, min(2 * repeats,
    budget / estimate)) calls. Returns (median, samples, the first output)."""
    count = max(3, min(2 * repeats, int(budget_s / max(estimate_s, 1e-9))))
    samples, first = [], None
    for i in range(count):
        t = clock()
        y = call(i)
        mx.eval(y)
        samples.append(clock() - t)
        if first is None:
            first = y
    return statistics.median(samples), samples, first


# ----- MLX on the GPU --------------------------------------------------------------------------

def _machine() -> str:
    return f"{platform.system()} {platform.machine()}, Python {platform.python_version()}"


def gpu_backend(mx=None) -> str:
    """'cuda' or 'metal', or EnvironmentUnavailable saying what this machine has."""
    needs = "marlin-dsl bench needs MLX's CUDA (or Metal) GPU backend; this machine has "
    if mx is None:
        try:
            import mlx.core as mx
        except ImportError as exc:
            raise EnvironmentUnavailable(needs + f"no importable MLX ({exc}); {_machine()}. Install mlx[cuda13] "
                                 "on an NVIDIA GPU machine (bench/README.md says how)") from None
    try:
        cuda = bool(hasattr(mx, "cuda") and mx.cuda.is_available())
    except Exception:  # noqa: BLE001
        cuda = False
    if cuda:
        return "cuda"
    try:
        metal = bool(mx.metal.is_available())
    except Exception:  # noqa: BLE001
        metal = False
    if metal:
        return "metal"
    raise EnvironmentUnavailable(
        needs + f"MLX {getattr(mx, '__version__', '?')} with no GPU backend (default device "
        f"{mx.default_device()}; mx.cuda.is_available() and mx.metal.is_available() are false); "
        f"{_machine()}. Run it on the GPU machine (bench/README.md says how)")


def _device_info(mx) -> dict:
    for get in (getattr(mx, "device_info", None), getattr(getattr(mx, "metal", None), "device_info", None)):
        if get is None:
            continue
        try:
            return {k: (v if isinstance(v, (int, float, str)) else str(v)) for k, v in get().items()}
        except Exception:  # noqa: BLE001
            continue
    return {}


def _rel_error(mx, y, ref) -> float:
    d = y.astype(mx.float32).reshape(ref.shape) - ref
    num = mx.sqrt(mx.sum(d * d))
    den = mx.sqrt(mx.sum(ref * ref))
    return float((num / mx.maximum(den, 1e-30)).item())


def _host_copy(mx, a):
    """A new device array with a's contents (through host memory, so never an alias)."""
    return mx.array(np.array(a))


def _schedule(fmt, pipeline: str, m: int = 1, k: int | None = None, n: int | None = None):
    from math import lcm

    from .schedule import DoubleBuffered, FusedDequant, Schedule, StripedKParallel
    from .targets.cuda.tuning import stream_schedule

    if pipeline == "weight_stream":  # its schedule depends on M (stream_schedule's buckets)
        return stream_schedule(fmt, m, None, k, n)

    pl = {"double_buffered": DoubleBuffered, "fused_dequant": FusedDequant,
          "striped": lambda: StripedKParallel(parallel=2, groups=132)}[pipeline]()
    return Schedule("bench", tile_k=lcm(32, fmt.k_granule), pipeline=pl)


class _Subject:
    def __init__(self, runner: "MLXRunner", kind: str, fmt: str, pipeline: str, k: int, n: int,
                 weight_bytes: int, copies: int, make_launch, make_call, reference) -> None:
        self.runner, self.kind, self.format, self.pipeline = runner, kind, fmt, pipeline
        self.k, self.n, self.weight_bytes, self.copies = k, n, weight_bytes, copies
        self._make_launch, self._make_call, self._reference = make_launch, make_call, reference

    def measure(self, m: int) -> Measurement:
        mx, r = self.runner.mx, self.runner
        x = r.activations(m, self.k)
        launch = self._make_launch(x, m)
        timed = kernel_time(mx, launch, r.repeats)
        et, esamples, y = e2e_time(mx, self._make_call(x, m), r.repeats, timed.estimate_s)
        prepared, _, _ = e2e_time(mx, launch, 2, timed.estimate_s, budget_s=0.05)
        ref = self._reference(x)
        rel = _rel_error(mx, y, ref)
        del y, ref, launch
        return Measurement(timed.per_launch_s, et, timed.launches, self.copies, rel, timed.samples_s,
                           esamples, timed.queue_s, timed.first_s, prepared)


class MLXRunner:
    """Subjects on MLX's GPU device: our kernels (CUDA: `build_cuda_kernel`; Metal: the
    generated launcher) and MLX's baselines. Weight copies are uploaded per (K, N) and freed by
    `end_shape`."""

    def __init__(self, repeats: int = DEFAULT_REPEATS, log: Callable[..., None] | None = None,
                 seed: int = 0, serialize: bool = True) -> None:
        # Both are read once, at MLX's first evaluation on the GPU: set them before it.
        if serialize:
            os.environ.setdefault("MLX_MAX_OPS_PER_BUFFER", "1")
        os.environ.setdefault("MLX_ENABLE_TF32", "0")  # the float32 references stay float32
        try:
            import mlx.core as mx
        except ImportError:
            mx = None
        self.backend = gpu_backend(mx)
        self.mx = mx
        mx.set_default_device(mx.gpu)
        self.repeats = repeats
        self.log = log or (lambda *a: None)
        self.seed = seed
        self._weights: dict[tuple[int, int], np.ndarray] = {}
        self._x: dict[tuple[int, int], object] = {}
        self._gemms: dict[tuple[str, str], object] = {}
        self._packed: dict[tuple[str, int, int], dict] = {}
        self.compile_s: dict[str, float] = {}

    # ----- environment ------------------------------------------------------------------------

    def environment(self) -> dict:
        mx = self.mx
        info = _device_info(mx)
        return {
            "device_name": str(info.get("device_name", mx.default_device())),
            "device": str(mx.default_device()), "backend": self.backend, "device_info": info,
            "mlx": mx.__version__, "numpy": np.__version__, "python": platform.python_version(),
            "host": platform.node(), "platform": _machine(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "MLX_MAX_OPS_PER_BUFFER": os.environ.get("MLX_MAX_OPS_PER_BUFFER"),
            "MLX_ENABLE_TF32": os.environ.get("MLX_ENABLE_TF32"),
            "launch_floor_us": round(self.launch_floor() * 1e6, 2),
        }

    def launch_floor(self) -> float:
        mx = self.mx
        one = mx.array(np.ones(1, np.float32))
        return kernel_time(mx, lambda i: -one, max(self.repeats, 5)).per_launch_s

    def copy_bandwidth(self) -> dict:
        mx = self.mx
        a = mx.array(np.ones(COPY_BYTES // 4, np.float32))
        mx.eval(a)

        def chain():
            b = a
            for _ in range(COPY_CHAIN):
                b = -b
            return b

        mx.eval(chain())  # warm-up: allocation, first touch
        mx.synchronize()
        samples = []
        for _ in range(COPY_SAMPLES):
            b = chain()
            mx.synchronize()
            t = time.perf_counter()
            mx.eval(b)
            mx.synchronize()
            samples.append(time.perf_counter() - t)
            del b
        moved = 2 * COPY_BYTES * COPY_CHAIN
        med = statistics.median(samples)
        del a
        return {"bytes_per_s": moved / med, "array_bytes": COPY_BYTES, "chain": COPY_CHAIN,
                "bytes_per_sample": moved, "samples_s": [round(s, 6) for s in samples],
                "method": "b = -b repeated `chain` times on a 1 GiB float32 array, one eval; "
                          "(bytes read + written) / median time"}

    # ----- inputs -----------------------------------------------------------------------------

    def weight(self, k: int, n: int) -> np.ndarray:
        """The random weight of this shape, float32 [K, N], standard normal * 0.02."""
        if (k, n) not in self._weights:
            rng = np.random.default_rng([self.seed, k, n])
            self._weights[(k, n)] = (rng.standard_normal((k, n), dtype=np.float32) * 0.02)
        return self._weights[(k, n)]

    def activations(self, m: int, k: int):
        mx = self.mx
        if (m, k) not in self._x:
            rng = np.random.default_rng([self.seed, 1, m, k])
            self._x[(m, k)] = mx.array(rng.standard_normal((m, k), dtype=np.float32).astype(np.float16))
            mx.eval(self._x[(m, k)])
        return self._x[(m, k)]

    def end_shape(self) -> None:
        self._weights.clear()
        self._x.clear()
        self._packed.clear()
        try:
            self.mx.clear_cache()
        except Exception:  # noqa: BLE001
            pass

    # ----- MLX's kernels ----------------------------------------------------------------------

    def baselines(self, k: int, n: int) -> list[Subject]:
        mx = self.mx
        w = self.weight(k, n)
        w16 = mx.array(w.astype(np.float16))
        wt = mx.array(np.ascontiguousarray(w.T).astype(np.float16))  # [N, K] as QuantizedLinear holds it
        wq, scales, biases = mx.quantize(wt, group_size=64, bits=4)
        mx.eval(wq, scales, biases, w16)
        q_bytes = int(wq.nbytes + scales.nbytes + biases.nbytes)
        q_copies = [tuple(_host_copy(mx, a) for a in (wq, scales, biases)) for _ in range(copies_for(q_bytes))]
        f_copies = [_host_copy(mx, w16) for _ in range(copies_for(w16.nbytes))]
        mx.eval(*[a for c in q_copies for a in c], *f_copies)
        deq = mx.dequantize(wq, scales, biases, group_size=64, bits=4)  # [N, K]

        def q_launch(x, m):
            return lambda i: mx.quantized_matmul(x, *q_copies[i % len(q_copies)], transpose=True,
                                                 group_size=64, bits=4)

        def f_launch(x, m):
            return lambda i: mx.matmul(x, f_copies[i % len(f_copies)])

        qmm = _Subject(self, "mlx_q4", QMM_FORMAT, QMM, k, n, q_bytes, len(q_copies), q_launch, q_launch,
                       lambda x: mx.matmul(x.astype(mx.float32), deq.astype(mx.float32).T))
        fp16 = _Subject(self, "fp16", FP16_FORMAT, FP16, k, n, int(w16.nbytes), len(f_copies), f_launch,
                        f_launch, lambda x: mx.matmul(x.astype(mx.float32), w16.astype(mx.float32)))
        return [fp16, qmm]

    # ----- ours -------------------------------------------------------------------------------

    def _packed_weights(self, fmt_name: str, k: int, n: int) -> dict:
        key = (fmt_name, k, n)
        if key not in self._packed:
            from . import api
            from .formats import dequantize
            from .formats.builtin import builtin_format

            self._packed = {kk: v for kk, v in self._packed.items() if kk[0] == fmt_name}  # one format at a time
            t = time.perf_counter()
            packed = api.pack(builtin_format(fmt_name), self.weight(k, n))
            dense = self.mx.array(dequantize(packed).astype(np.float32))
            self._packed[key] = {"packed": packed, "dense": dense, "copies": {}}
            self.log(f"  [{fmt_name} K={k} N={n}: packed in {time.perf_counter() - t:.1f} s, "
                     f"{packed.nbytes / 2**20:.1f} MiB]")
        return self._packed[key]

    def _gemm(self, fmt_name: str, pipeline: str, m: int = 1, k: int | None = None, n: int | None = None):
        from .formats.builtin import builtin_format

        schedule = _schedule(builtin_format(fmt_name), pipeline, m, k, n)
        key = (fmt_name, pipeline, schedule.name)
        if key not in self._gemms:
            try:
                import networkx  # noqa: F401
            except ImportError as exc:
                raise MarlinDSLError(f"compiling the kernels needs networkx ({exc}): install marlin_dsl's "
                                     "dependencies on this machine (bench/README.md)") from None
            from .compiler import compile_gemm
            from .formats.builtin import builtin_format
            from .schedule import Gemm
            from .targets import CUDA, METAL

            t = time.perf_counter()
            fmt = builtin_format(fmt_name)
            gemm = Gemm(f"bench_{fmt_name}_{pipeline}_f16", fmt, schedule, activation="f16")
            if self.backend == "cuda":
                from .targets.cuda.launch import build_cuda_kernel

                self._gemms[key] = build_cuda_kernel(compile_gemm(gemm, CUDA).kernel)
            else:
                self._gemms[key] = _metal_launcher(compile_gemm(gemm, METAL))
            self.compile_s[f"{fmt_name}/{pipeline}/{schedule.name}"] = round(time.perf_counter() - t, 2)
        return self._gemms[key]

    def marlin(self, fmt_name: str, pipeline: str, k: int, n: int) -> Subject:
        mx = self.mx
        gemm = self._gemm(fmt_name, pipeline, 1, k, n)
        entry = self._packed_weights(fmt_name, k, n)
        packed, dense = entry["packed"], entry["dense"]
        count = copies_for(packed.nbytes)
        reference = lambda x: mx.matmul(x.astype(mx.float32), dense)  # noqa: E731
        if self.backend == "cuda":
            layout = f"cuda/{gemm.source.attrs.get('weight_layout')}"  # the target's physical layout
            if layout not in entry["copies"]:
                entry["copies"][layout] = [gemm.weights(packed) for _ in range(count)]
                mx.eval(*[a for c in entry["copies"][layout] for a in c.arrays.values()])
            copies = entry["copies"][layout]
            for_m = lambda m: self._gemm(fmt_name, pipeline, m, k, n)  # noqa: E731  (M picks the schedule)
            return _Subject(self, "marlin", fmt_name, pipeline, k, n, packed.nbytes, count,
                            lambda x, m: _cuda_launch(mx, for_m(m), copies, x, m, n, k),
                            lambda x, m: (lambda i, g=for_m(m): g(copies[i % len(copies)], x, poison=False)),
                            reference)
        if "metal" not in entry["copies"]:
            names = [nm for nm in gemm.INPUT_NAMES if nm not in ("x", "dims")]
            entry["copies"]["metal"] = [[mx.array(np.ascontiguousarray(packed.arrays[nm])) for nm in names]
                                        for _ in range(count)]
            mx.eval(*[a for c in entry["copies"]["metal"] for a in c])
        copies = entry["copies"]["metal"]
        launch = lambda x, m: (lambda i: gemm.launch(x, *copies[i % len(copies)]))  # noqa: E731
        return _Subject(self, "marlin", fmt_name, pipeline, k, n, packed.nbytes, count, launch, launch, reference)


def _cuda_launch(mx, gemm, copies, x, m: int, n: int, k: int) -> Callable[[int], object]:
    """launch(i): one launch of a CudaGemm on weight copy i, everything but the launch itself
    prepared here (dims, zeroed counters: one per launch slot of a batch; the kernel leaves
    them zero and every batch is evaluated before the next is queued)."""
    from .targets.cuda.launch import _mx_dtype

    s = gemm.source
    scalars = {"M": m, "N": n, "K": k}
    sizes = gemm.sizes(m, n, k)
    dims = mx.array(s.dims(scalars))
    grid, threadgroup = s.launch_dims(scalars)
    pool = [{nm: mx.zeros((sizes[nm],), dtype=_mx_dtype(s.elems[nm])) for nm in s.inout_inputs}
            for _ in range(BATCH_LAUNCHES)]
    mx.eval(dims, *[a for st in pool for a in st.values()])
    shapes = [(sizes[nm],) for nm in s.output_names]
    dtypes = [_mx_dtype(s.elems[nm]) for nm in s.output_names]
    y_at = s.output_names.index("y")
    kernel = gemm.kernel

    def launch(i: int):
        w, state = copies[i % len(copies)], pool[i % len(pool)]
        inputs = [x if nm == "x" else dims if nm == "dims" else state[nm] if nm in state else w.arrays[nm]
                  for nm in s.input_names]
        outs = kernel(inputs=inputs, output_shapes=shapes, output_dtypes=dtypes, grid=grid,
                      threadgroup=threadgroup, init_value=None)
        return outs[y_at].reshape(m, n)

    return launch


def _metal_launcher(compiled):
    """The generated MLX launcher module of a kernel compiled for Metal (written to a temporary
    folder). Untested here: no Apple GPU on the machines this was written on."""
    import importlib.util
    import tempfile

    from .targets.metal.ship import write_metal_kernel

    folder = Path(tempfile.mkdtemp(prefix="marlin_bench_"))
    files = write_metal_kernel(compiled, None, folder)
    spec = importlib.util.spec_from_file_location(f"marlin_bench_{compiled.gemm.name}", files["launcher"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module
