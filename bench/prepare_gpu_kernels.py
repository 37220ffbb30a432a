"""Compile and print every built-in GEMM for CUDA here, for `bench/gpu_correctness.py --kernels`.

The GPU machine has MLX and numpy but maybe not the compiler's own dependencies (lark,
networkx), so the kernels are lowered, optimised and printed on this machine and shipped as
text: one JSON file per kernel (a `CudaSource`: header, body, parameter names and types,
grid, attrs) plus `<name>.cu` (the complete source, for reading) and `manifest.json`.
With nvcc on PATH every kernel is also compiled here for sm_80 and sm_90 (ptxas included)
before it ships, unless `--no-nvcc`.

    python bench/prepare_gpu_kernels.py --out .gpu_kernels        # 7 formats x 3 pipelines x f16/bf16
    python bench/prepare_gpu_kernels.py --out .gpu_kernels --formats int4 nf4 --activations f16

On the GPU machine (the folder must travel: carry it, or keep it untracked but not ignored):

    PYTHONPATH=/tmp/site:$PWD python3 bench/gpu_correctness.py --kernels .gpu_kernels --out $OUT
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import marlin_dsl as md  # noqa: E402
from marlin_dsl import CUDA, DoubleBuffered, FusedDequant, Gemm, Schedule, StripedKParallel  # noqa: E402
from marlin_dsl.targets.cuda.printer import print_cuda  # noqa: E402
from marlin_dsl.targets.cuda.nvcc import find_nvcc, nvcc_check
from marlin_dsl.targets.cuda.launch import gemm_inout_inputs  # noqa: E402
from marlin_dsl.compiler import compile_gemm  # noqa: E402

#: The pipelines the correctness run covers (the striped one as the Metal tests use it).
PIPELINES = {"double_buffered": DoubleBuffered, "fused_dequant": FusedDequant,
             "striped": lambda: StripedKParallel(parallel=2, groups=132),
             "weight_stream": None, "weight_stream_m16": None, "weight_stream_m16_long_k": None,
             "weight_stream_m64": None,
             "multistage_small": None, "multistage_large": None}
#: (M, K, N) each weight-stream kernel is scheduled for (`marlin_dsl.targets.cuda.tuning.tuned_schedule`)
STREAM_M = {"weight_stream": (1, None, None), "weight_stream_m16": (16, None, None),
            "weight_stream_m16_long_k": (16, 14336, 4096), "weight_stream_m64": (64, None, None),
            "multistage_small": (256, 4096, 4096),
            "multistage_large": (2048, 4096, 4096)}


def gpu_schedule(fmt, pipeline: str) -> Schedule:
    """The schedule a correctness kernel uses: seed 002's 64x64x32 tiles, or for the
    weight-stream pipeline the schedule chosen for M = 1 or 16 rows. A ScheduleError means the
    pipeline does not take the format (4:8 of pairs has no weight-stream layout)."""
    if pipeline in STREAM_M:
        m, k, n = STREAM_M[pipeline]
        return md.tuned_schedule(fmt, m, None, k, n)
    return Schedule("gpu", pipeline=PIPELINES[pipeline]())
MANIFEST_VERSION = 1


def kernel_name(fmt: str, pipeline: str, activation: str) -> str:
    return f"gemm_{fmt}_{pipeline}_{activation}"


def prepare(out: Path, formats: list[str], pipelines: list[str], activations: list[str],
            archs: list[str], check: bool, jobs: int) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    entries, sources = [], []
    t0 = time.perf_counter()
    for fmt_name in formats:
        fmt = md.builtin_format(fmt_name)
        for pl in pipelines:
            for act in activations:
                name = kernel_name(fmt_name, pl, act)
                try:
                    sched = gpu_schedule(fmt, pl)
                except md.ScheduleError:
                    continue
                gemm = Gemm(name, fmt, sched, activation=act)
                kernel = compile_gemm(gemm, CUDA).kernel
                src = print_cuda(kernel, inout_inputs=gemm_inout_inputs(kernel))
                (out / f"{name}.json").write_text(json.dumps(src.to_json()))
                (out / f"{name}.cu").write_text(src.full_source())
                sources.append(src)
                entries.append({"name": name, "file": f"{name}.json", "format": fmt_name,
                                "group_size": fmt.scale.group_size, "pipeline": pl, "activation": act,
                                "threads": src.threads, "shared_bytes": src.shared_bytes,
                                "tile": list(src.attrs.get("tile", ())), "digest": src.digest})
    compile_s = time.perf_counter() - t0
    nvcc = {"checked": False}
    if check and find_nvcc() is not None:
        t1 = time.perf_counter()
        results = nvcc_check(sources, archs=archs, jobs=jobs)
        bad = [r for r in results if not r.ok]
        nvcc = {"checked": True, "archs": archs, "seconds": round(time.perf_counter() - t1, 2),
                "failures": [r.summary() for r in bad]}
        if bad:
            for r in bad:
                print(r.log, file=sys.stderr)
            raise SystemExit(f"nvcc rejected {len(bad)} batch(es); nothing to ship")
    manifest = {"version": MANIFEST_VERSION, "generator": "bench/prepare_gpu_kernels.py",
                "marlin_dsl": md.__version__, "mlx_assumed": "0.32.4", "kernels": entries,
                "compile_seconds": round(compile_s, 2), "nvcc": nvcc}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for manifest.json and the kernels")
    ap.add_argument("--formats", nargs="*", default=list(md.BUILTIN_FORMATS))
    ap.add_argument("--pipelines", nargs="*", default=list(PIPELINES), choices=list(PIPELINES))
    ap.add_argument("--activations", nargs="*", default=["f16", "bf16"], choices=["f16", "bf16"])
    ap.add_argument("--archs", nargs="*", default=["sm_80", "sm_90"])
    ap.add_argument("--no-nvcc", action="store_true", help="skip the nvcc compile check")
    ap.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1))
    args = ap.parse_args(argv)
    m = prepare(args.out, args.formats, args.pipelines, args.activations, args.archs,
                not args.no_nvcc, args.jobs)
    size = sum(p.stat().st_size for p in args.out.iterdir())
    print(f"{len(m['kernels'])} kernels in {args.out} ({size / 1e6:.1f} MB); lowering+passes+printing "
          f"{m['compile_seconds']} s; nvcc: {m['nvcc']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
