"""One kernel, two launch paths: `mx.fast.cuda_kernel` (MLX compiles the text; the default,
handed as #include lines: targets/cuda/launch_text.py) against `mx.fast.precompiled_cuda_kernel`
(NVRTC here, MLX loads the cubin: targets/cuda/launch_precompiled.py). Host cost per call and
device time, in one process.

For each format and weight shape K x N at M rows, the layer kernel (`cuda_gemm` with the tuned
schedule, compact text) is bound both ways, plus a third probe row, "precompiled_nobytes": the
precompiled launch handing MLX a 1-byte `compiled_source` once the module is loaded (MLX 0.32.4
looks its module cache up by name first, so the bytes are ignored then): what copying the cubin
into every call costs. Not a supported path: only a measurement. Checks: the outputs of all
paths are bit-identical and every element is written (outputs NaN-poisoned).

Timing, in turns (round r times every path once; medians over rounds), on weight copies that
together exceed the 50 MB L2 (so a big shape's weights come from DRAM, as in a model):
- call_us: the Python call alone (graph building: the host cost of one launch);
- batched_us: wall time per launch of `--calls` launches evaluated together: the host cost at
  a small shape (the device work is negligible), the device time at a big one (where launches
  queue faster than the GPU runs them; `device_bound` says when batched > 1.5 x call);
- sync_us: one call, evaluated and synchronised (latency).
`mx.quantized_matmul` (4-bit, g64) on the same shape is a built-in reference row.

    python bench/probes/launch_path_bench.py --out bench/results/<dir>/launch_path.json     # on the GPU
    python bench/probes/launch_path_bench.py --dry-run                                       # no GPU: compile, show
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from marlin_dsl.errors import EnvironmentUnavailable, MarlinDSLError  # noqa: E402
from marlin_dsl.formats.builtin import builtin_format  # noqa: E402
from marlin_dsl.formats.pack_weights import pack  # noqa: E402
from marlin_dsl.targets.cuda.launch import mlx_kernel  # noqa: E402
from marlin_dsl.targets.cuda.launch_precompiled import precompiled_kernel  # noqa: E402
from marlin_dsl.targets.cuda.launch_text import mlx_strings  # noqa: E402
from marlin_dsl.targets.cuda.runtime import cuda_gemm, cuda_schedule  # noqa: E402

L2_BYTES = 50 << 20
PATHS = ("cuda_kernel", "precompiled", "precompiled_nobytes")
EXIT_ENVIRONMENT = 4


def parse_shape(text: str) -> tuple[int, int]:
    k, _, n = text.lower().partition("x")
    return int(k), int(n)


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip()
    except OSError:
        return ""


def plan(fmt_name: str, k: int, n: int, m: int, arch: str | None) -> dict:
    """The kernel of one case bound both ways (compiling the precompiled one through NVRTC):
    everything but the launches. `arch` None: the GPU's (kernel_arch)."""
    fmt = builtin_format(fmt_name)
    gemm = cuda_gemm(fmt, "f16", cuda_schedule(fmt, m, k, n))
    src = gemm.source.compact()
    scalars = {"M": m, "N": n, "K": k}
    grid, threadgroup = src.launch_dims(scalars)
    pre = precompiled_kernel(src, gemm.name, arch)
    header, body = mlx_strings(gemm.name, src.header, src.body)
    return {"format": fmt_name, "k": k, "n": n, "m": m, "gemm": gemm, "source": src, "kernel": gemm.name,
            "schedule": gemm.source.attrs.get("schedule"), "grid": grid, "threadgroup": threadgroup,
            "shared_memory": pre.shared_memory, "arch": pre.arch, "precompiled": pre,
            "cubin_bytes": len(pre.compiled), "cuda_kernel_chars": len(header) + len(body),
            "inputs": list(src.input_names), "outputs": list(src.output_names)}


def show(p: dict) -> str:
    return (f"{p['format']:>8} {p['k']}x{p['n']} M={p['m']}: {p['kernel']} ({p['schedule']})\n"
            f"    grid {p['grid']} threads, threadgroup {p['threadgroup']}, dynamic shared {p['shared_memory']} B\n"
            f"    inputs {p['inputs']} -> outputs {p['outputs']}\n"
            f"    cuda_kernel: {p['cuda_kernel_chars']} chars of #include lines per call; "
            f"precompiled: {p['cubin_bytes']} B cubin for {p['arch']} per call")


def _summary(p: dict) -> dict:
    return {key: p[key] for key in ("format", "k", "n", "m", "kernel", "schedule", "grid", "threadgroup",
                                    "shared_memory", "arch", "cubin_bytes", "cuda_kernel_chars", "inputs",
                                    "outputs")}


def run_case(p: dict, mx, calls: int, repeats: int) -> list[dict]:
    """Time every path of one case, in turns; check that they agree."""
    gemm, src, m, k, n = p["gemm"], p["source"], p["m"], p["k"], p["n"]
    rng = np.random.default_rng(0)
    packed = pack(builtin_format(p["format"]), rng.standard_normal((k, n)).astype(np.float32))
    one = gemm.weights(packed)
    wbytes = sum(a.nbytes for a in one.arrays.values())
    host = {name: np.array(a) for name, a in one.arrays.items()}  # copies without re-packing
    copies = [one] + [type(one)({name: mx.array(a) for name, a in host.items()}, one.shape, one.format_name)
                      for _ in range(max(0, min(16, -(-2 * L2_BYTES // wbytes)) - 1))]
    mx.eval(*[a for c in copies for a in c.arrays.values()])
    x = mx.array(rng.standard_normal((m, k)).astype(np.float16))
    dims = mx.array(src.dims({"M": m, "N": n, "K": k}))
    inputs = [[x if nm == "x" else dims if nm == "dims" else c.arrays[nm] for nm in src.input_names] for c in copies]
    mx.eval(x, dims)
    shapes, dtypes = [(m, n)], [mx.float16]
    kernels = {"cuda_kernel": mlx_kernel(src, gemm.name, "cuda_kernel"), "precompiled": p["precompiled"]}

    def launcher(path: str):
        if path == "precompiled_nobytes":
            pre = p["precompiled"]
            launch = mx.fast.precompiled_cuda_kernel

            def call(i: int, init=None):
                return launch(name=pre.name, compiled_source=b"\0", inputs=inputs[i % len(inputs)],
                              output_shapes=shapes, output_dtypes=dtypes, scalars=[], grid=p["grid"],
                              threadgroup=p["threadgroup"], shared_memory=pre.shared_memory, init_value=init,
                              ensure_row_contiguous=True)[0]
            return call
        kern = kernels[path]

        def call(i: int, init=None):
            return kern(inputs=inputs[i % len(inputs)], output_shapes=shapes, output_dtypes=dtypes,
                        grid=p["grid"], threadgroup=p["threadgroup"], init_value=init)[0]
        return call

    ys = {}
    for path in PATHS:  # first launches (the nobytes probe after the module is loaded), poisoned outputs
        y = launcher(path)(0, float("nan"))
        mx.eval(y)
        ys[path] = np.array(y)
    same = {path: bool(np.array_equal(ys[path].view(np.uint16), ys["cuda_kernel"].view(np.uint16))) for path in PATHS}
    written = {path: bool(np.isfinite(ys[path]).all()) for path in PATHS}
    samples: dict[str, dict[str, list[float]]] = {path: {"call": [], "batched": [], "sync": []} for path in PATHS}
    fns = {path: launcher(path) for path in PATHS}
    for _ in range(repeats):
        for path in PATHS:
            fn = fns[path]
            mx.synchronize()
            t0 = time.perf_counter()
            outs = [fn(i) for i in range(calls)]
            t1 = time.perf_counter()
            mx.eval(outs)
            mx.synchronize()
            t2 = time.perf_counter()
            samples[path]["call"].append((t1 - t0) / calls * 1e6)
            samples[path]["batched"].append((t2 - t0) / calls * 1e6)
            sync = []
            for i in range(20):
                t0 = time.perf_counter()
                mx.eval(fn(i))
                mx.synchronize()
                sync.append((time.perf_counter() - t0) * 1e6)
            samples[path]["sync"].append(statistics.median(sync))
    rows = []
    for path in PATHS:
        med = {key: statistics.median(v) for key, v in samples[path].items()}
        rows.append({**_summary(p), "path": path, "weight_copies": len(copies), "call_us": med["call"],
                     "batched_us": med["batched"], "sync_us": med["sync"],
                     "device_bound": med["batched"] > 1.5 * med["call"],
                     "same_as_cuda_kernel": same[path], "all_written": written[path],
                     "samples_us": samples[path]})
    return rows


def builtin_row(mx, m: int, k: int, n: int, calls: int, repeats: int) -> dict:
    rng = np.random.default_rng(1)
    q, s, b = mx.quantize(mx.array(rng.standard_normal((n, k)).astype(np.float16)), group_size=64, bits=4)
    x = mx.array(rng.standard_normal((m, k)).astype(np.float16))
    mx.eval(q, s, b, x)
    call_t, batch_t = [], []
    for _ in range(repeats):
        mx.synchronize()
        t0 = time.perf_counter()
        outs = [mx.quantized_matmul(x, q, s, b, transpose=True, group_size=64, bits=4) for _ in range(calls)]
        t1 = time.perf_counter()
        mx.eval(outs)
        mx.synchronize()
        call_t.append((t1 - t0) / calls * 1e6)
        batch_t.append((time.perf_counter() - t0) / calls * 1e6)
    return {"format": "mx.quantized_matmul", "k": k, "n": n, "m": m, "path": "builtin",
            "call_us": statistics.median(call_t), "batched_us": statistics.median(batch_t)}


def table(rows: list[dict]) -> str:
    out = [f"{'format':>19} {'K x N':>11} {'M':>3} {'path':>20} {'call us':>8} {'batched us':>10} "
           f"{'sync us':>8} {'bytes/call':>10}  checks"]
    for r in rows:
        per_call = r.get("cubin_bytes") if r["path"].startswith("precompiled") else r.get("cuda_kernel_chars")
        if r["path"] == "precompiled_nobytes":
            per_call = 1
        checks = "" if "same_as_cuda_kernel" not in r else (
            ("same" if r["same_as_cuda_kernel"] else "DIFFERENT") + (", all written" if r["all_written"] else ", UNWRITTEN")
            + (", device-bound" if r["device_bound"] else ""))
        sync = f"{r['sync_us']:8.1f}" if "sync_us" in r else f"{'-':>8}"
        out.append(f"{r['format']:>19} {r['k']:>5}x{r['n']:<5} {r['m']:>3} {r['path']:>20} {r['call_us']:8.2f} "
                   f"{r['batched_us']:10.2f} {sync} {per_call or '-':>10}  {checks}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", nargs="+", default=["fp4"])
    parser.add_argument("--shapes", nargs="+", type=parse_shape, default=[(256, 256), (4096, 14336)],
                        metavar="KxN")
    parser.add_argument("--m", type=int, nargs="+", default=[1])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU: compile every case through NVRTC and print what would be launched")
    parser.add_argument("--arch", default="sm_90", help="the architecture of a --dry-run (default sm_90, H100)")
    args = parser.parse_args(argv)
    cases = [(f, k, n, m) for f in args.formats for k, n in args.shapes for m in args.m]
    doc: dict = {"date": date.today().isoformat(), "commit": commit(), "calls": args.calls, "repeats": args.repeats}
    try:
        if args.dry_run:
            plans = [plan(f, k, n, m, args.arch) for f, k, n, m in cases]
            for p in plans:
                print(show(p))
            print(f"dry run: {len(plans)} cases compiled through NVRTC for {args.arch}; nothing launched")
            doc.update(dry_run=True, arch=args.arch, cases=[_summary(p) for p in plans])
            failures = 0
        else:
            import mlx.core as mx

            if not mx.cuda.is_available():
                print("launch_path_bench: needs MLX's CUDA backend and an NVIDIA GPU (--dry-run works without)",
                      file=sys.stderr)
                return EXIT_ENVIRONMENT
            mx.set_default_device(mx.gpu)
            rows: list[dict] = []
            for f, k, n, m in cases:
                p = plan(f, k, n, m, None)
                print(show(p), flush=True)
                rows += run_case(p, mx, args.calls, args.repeats)
                rows.append(builtin_row(mx, m, k, n, args.calls, args.repeats))
                print(table(rows[-len(PATHS) - 1:]), flush=True)
            print("\n" + table(rows))
            failures = sum(not (r["same_as_cuda_kernel"] and r["all_written"]) for r in rows if "all_written" in r)
            doc.update(dry_run=False, mlx=mx.__version__, device={k: str(v) for k, v in mx.device_info().items()},
                       rows=rows)
            print("ALL PASS" if failures == 0 else f"FAILURES: {failures}")
    except MarlinDSLError as e:
        print(f"launch_path_bench: {e}", file=sys.stderr)
        return EXIT_ENVIRONMENT if isinstance(e, EnvironmentUnavailable) else 1
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        print(f"wrote {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
