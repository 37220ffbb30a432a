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

import json
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from ..errors import MarlinDSLError, ScheduleError
from ..formats.builtin import BUILTIN_FORMATS
from .cases import (DEFAULT_MS, DEFAULT_PIPELINES, DEFAULT_REPEATS, DEFAULT_SHAPES, DEFINITIONS, HOST_BOUND_FACTOR,
                    PIPELINES, REL_TOL, Measurement, Runner, Subject, kernel_label)
from .mlx_runner import MLXRunner
from .provenance import git_commit
from .results import finish_doc, floor_bytes, floor_us, fmt_us, format_table, plot_bench, write_json
from .timing import BATCH_LAUNCHES, BATCH_TARGET_S, MIN_BATCH_LAUNCHES, ROTATE_BYTES


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
    env.setdefault("commit", git_commit())  # ties the numbers to the code (issue 17)
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
            f"{fmt_us(row['kernel_us']):>8} us ({meas.launches} launches, {meas.copies} copies)  e2e "
            f"{fmt_us(row['e2e_us']):>8} us  floor {fmt_us(floor_us(fb, bw['bytes_per_s'])):>7} us  rel {rel}  "
            f"[queue {fmt_us(row['queue_us'])} us, first {row['first_launch_ms']} ms, {row['measure_s']:.2f} s]")

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
            finish_doc(doc, shapes, bw["bytes_per_s"], started)
            write_json(doc, out)
    finish_doc(doc, shapes, bw["bytes_per_s"], started)
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
        path = write_json(doc, out)
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

