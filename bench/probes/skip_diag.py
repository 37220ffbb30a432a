"""Issue 33: why the skipping weight stream is slower than dense where nothing is skipped.

Writes a kernels folder for bench/block_skip_gpu.py (`--kernels`) holding, per M (1, 16), for
14336 x 4096 and 4096 x 14336:
- `fp4_tuned_*`: dense fp4's tuned kernel (the reference);
- `dense_tk64_*`: dense fp4 with the skipping kernel's schedule (one 64-K vector a step, its
  k_warps and depth): what the schedule alone costs;
- `skip_*`: the skipping kernel as shipped (`WeightStream(skip_empty=True)`);
- `diag_kvarith_*`: the skipping kernel with each stored vector's K computed as
  `ks - vec_start[block]` instead of read from `vec_k`: exact only where a block stores every
  vector (random 50%: time it on `--sparsities random50`), and there it says what the
  dependent `vec_k` reads cost.
A diagnostic: the `diag_*` kernels are not products and are never shipped.

    python bench/probes/skip_diag.py --variants run8 --out .skipdiag   # here: lower, print, check
    PYTHONPATH=/tmp/site:$PWD python3 bench/block_skip_gpu.py --kernels .skipdiag \
        --shapes 14336x4096 --sparsities random50 --out $OUT     # on the GPU
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402

#: (kind, M served, tile_m, k_warps, depth, unroll); kind: dense_tk64 (dense fp4 on the
#: skipping kernel's schedule), skip (as shipped), diag_kvarith (no vec_k reads: random 50% only).
#: Run 8 (2026-11-29) timed the first set; run 9 the unrolled ones (on the vector-major
#: stored order of the time).
RUN8 = tuple((kind, m, tm, kw, d, 1) for m, tm, kw, d in ((1, 8, 16, 2), (1, 8, 16, 4), (1, 8, 32, 2),
                                                        (16, 16, 8, 2), (16, 16, 16, 2))
             for kind in ("dense_tk64", "skip", "diag_kvarith"))
RUN9 = (("skip", 1, 8, 16, 2, 2), ("skip", 1, 8, 16, 1, 2), ("skip", 1, 8, 8, 2, 2), ("skip", 1, 8, 16, 4, 4),
        ("dense_tk64", 1, 8, 16, 2, 2),
        ("skip", 16, 16, 16, 1, 1), ("skip", 16, 16, 16, 1, 2), ("skip", 16, 16, 8, 2, 2), ("skip", 16, 16, 16, 2, 2),
        ("dense_tk64", 16, 16, 8, 2, 2))
#: run 10: run 9's set on the tile-major stored order (layouts/block_skip.py), and unroll 4
RUN10 = RUN9 + (("skip", 1, 8, 16, 1, 4), ("skip", 16, 16, 16, 1, 4))
VARIANTS = {"run8": RUN8, "run9": RUN9, "run10": RUN10}
SHAPES = ((14336, 4096), (4096, 14336))


def kv_arithmetic(enabled: bool):
    """Patch WeightStreamSkipLowering so that a stored vector's K is ks - vec_start[block]
    (no vec_k read); returns the undo."""
    from marlin_dsl.lowering import weight_stream_skip as wss

    cls = wss.WeightStreamSkipLowering
    saved = (cls.step_range, cls.fetch)
    if not enabled:
        return lambda: None

    def step_range(self, wk, wn):
        first, end = saved[0](self, wk, wn)
        self.diag_start = self.op2("sub", first, wk, hint="vs")
        return first, end

    def fetch(self, ks, clamp=True, previous=None):
        if clamp:
            ks = self.op2("min", ks, self.last_step, hint="kc")
        kv = self.op2("sub", ks, self.diag_start, hint="kv")
        out = self.fetch_words([ks])
        if self.prefetch_params:
            out += self.fetch_params(kv)
        return out + [kv, kv]

    cls.step_range, cls.fetch = step_range, fetch

    def undo():
        cls.step_range, cls.fetch = saved
    return undo


def candidates(variants: tuple) -> list[dict]:
    from marlin_dsl import CUDA, Gemm, Schedule, WeightStream, builtin_format
    from marlin_dsl.targets.cuda.tuning import tuned_schedule

    fp4, blocks = builtin_format("fp4"), builtin_format("fp4_blockpattern")
    out = []
    for m in sorted({v[1] for v in variants}):
        for k, n in SHAPES:
            name = f"fp4_tuned_m{m}_k{k}_n{n}"
            out.append({"name": name, "format": "fp4", "m": m, "shapes": [[k, n]], "diag": False,
                        "gemm": Gemm(name, fp4, tuned_schedule(fp4, m, CUDA, k, n), "f16")})
    for kind, m, tile_m, k_warps, depth, unroll in variants:
        name = f"{kind}_tm{tile_m}_kw{k_warps}_d{depth}" + (f"_u{unroll}" if unroll > 1 else "") + f"_m{m}"
        fmt, skip = (fp4, False) if kind == "dense_tk64" else (blocks, True)
        s = Schedule(name, tile_m=tile_m, tile_n=16, tile_k=64, warps_m=1, warps_n=1,
                     pipeline=WeightStream(k_warps=k_warps, depth=depth, unroll=unroll, skip_empty=skip))
        out.append({"name": name, "format": fmt.name, "m": m, "shapes": [list(kn) for kn in SHAPES],
                    "diag": kind == "diag_kvarith",
                    "gemm": Gemm(name, fmt, s, "f16")})
    return out


def main(argv: list[str] | None = None) -> int:
    from marlin_dsl import CUDA, pack
    from marlin_dsl.checks.kernel_check import check_output, run_kernel
    from marlin_dsl.compiler import compile_gemm
    from marlin_dsl.kernel_args import gemm_buffers, read_output
    from marlin_dsl.targets.cuda.launch import gemm_inout_inputs
    from marlin_dsl.targets.cuda.printer import print_cuda
    from block_skip_gpu import sparse_weights

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=33)
    ap.add_argument("--variants", choices=sorted(VARIANTS), default="run10")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    entries = []
    for c in candidates(VARIANTS[args.variants]):
        undo = kv_arithmetic(c["diag"])
        try:
            kernel = compile_gemm(c["gemm"], CUDA).kernel
        finally:
            undo()
        m, n, k = c["m"], 72, 1024
        packed = pack(c["gemm"].format, sparse_weights("random50", k, n, rng))
        buffers, scalars = gemm_buffers(kernel, packed, rng.standard_normal((m, k)))
        y = read_output(run_kernel(kernel, buffers, scalars), m, n).astype(np.float64)
        res = check_output(c["gemm"], y, buffers["x"].astype(np.float64).reshape(m, k), packed)
        print(f"{c['name']:36} interpreter (random 50%) rel {res.rel_error:.2e} {'PASS' if res.ok else 'FAIL'}")
        if not res.ok:
            return 1
        source = print_cuda(kernel, inout_inputs=gemm_inout_inputs(kernel))
        (args.out / f"{c['name']}.json").write_text(json.dumps(source.to_json()))
        entries.append({key: v for key, v in c.items() if key not in ("gemm", "diag")} | {"file": f"{c['name']}.json"})
    (args.out / "manifest.json").write_text(json.dumps({"kernels": entries}, indent=1))
    print(f"{len(entries)} kernels -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
