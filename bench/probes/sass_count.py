"""Static SASS instruction counts of printed CUDA kernels (no GPU needed).

Compiles each kernel with nvcc for sm_90 (`marlin_dsl.targets.cuda.nvcc`), disassembles the
cubin with `cuobjdump -sass` (needs `nvdisasm` beside it or on PATH; the CUDA toolkit has both)
and counts the instructions of the kernel's main loop: the longest backward branch's body, which
for the weight-stream and multistage kernels is the K loop. Reported per loop iteration, per K
step (a weight-stream loop unrolled, by its `unroll` or by ptxas, runs several steps per
iteration: counted from its MMAs) and per weight a lane decodes, by opcode: the "instructions
per weight" the issue-15 notes quote.

    python bench/probes/sass_count.py --formats fp4,int4 --ms 1,16 [--k 4096 --n 14336] [--unroll 1] [--show]
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[0-9T]+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def sass_of(cubin: str) -> str:
    tool = shutil.which("cuobjdump")
    if tool is None:
        raise SystemExit("cuobjdump not found (CUDA toolkit bin, or put it and nvdisasm on PATH)")
    return subprocess.run([tool, "-sass", cubin], capture_output=True, text=True, check=True).stdout


def parse(sass: str) -> list[tuple[int, str, str]]:
    """[(address, opcode, operands)] in program order."""
    return [(int(m.group(1), 16), m.group(3), m.group(4)) for m in _INSTR.finditer(sass)]


def main_loop(instrs: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """The body of the longest loop: from a backward branch's target to the branch."""
    best: list[tuple[int, str, str]] = []
    for i, (addr, op, args) in enumerate(instrs):
        if op == "BRA":
            m = re.search(r"0x([0-9a-f]+)", args)
            if m and int(m.group(1), 16) < addr:
                target = int(m.group(1), 16)
                body = [x for x in instrs[: i + 1] if x[0] >= target]
                if len(body) > len(best):
                    best = body
    return best


def count(src, weights_per_iteration: int) -> dict:
    """Opcode counts of the kernel's main loop (and the loop itself, as text lines)."""
    from marlin_dsl.targets.cuda.nvcc import nvcc_check

    res = nvcc_check([src], archs=["sm_90"])[0]
    if not res.ok:
        raise SystemExit(res.log)
    loop = main_loop(parse(sass_of(res.output)))
    ops = collections.Counter(op.split(".")[0] for _, op, _ in loop)
    n = sum(ops.values())
    return {"loop_instructions": n, "per_weight": n / weights_per_iteration, "ops": dict(ops.most_common()),
            "loop": [f"{addr:#06x}  {op} {args.strip()}" for addr, op, args in loop]}


def steps_per_loop(ops: dict, schedule, layout) -> int:
    """K steps one pass of the loop runs: its MMAs over one step's (layout.tiles K tiles x N
    tiles x M tiles of a warp); ptxas unrolls some loops by itself, the pipeline's `unroll`
    others. 1 where the loop has no MMA (not a weight-stream loop)."""
    mm, mn = 16, 8  # CUDA's mma.sync m16n8k16 / mma.sp m16n8k32: A 16 N rows, B 8 M columns
    per_step = layout.tiles * (schedule.tile_n // schedule.warps_n // mm) * (schedule.tile_m // mn)
    return max(1, ops.get("HMMA", 0) // per_step)


def main() -> int:
    from marlin_dsl import builtin_format
    from marlin_dsl.compiler import compile_gemm
    from marlin_dsl.schedule import Gemm
    from marlin_dsl.machine import CUDA
    from marlin_dsl.targets import emit
    from marlin_dsl.targets.cuda.tuning import tuned_schedule
    from marlin_dsl.layouts.weight_stream import stream_layout

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="fp4,int4,uint4_zp,nf4,fp4_2of4")
    ap.add_argument("--ms", default="1,16")
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--n", type=int, default=14336)
    ap.add_argument("--act", default="f16")
    ap.add_argument("--unroll", type=int, default=None, help="override the weight stream's unroll")
    ap.add_argument("--show", action="store_true", help="print the loop's SASS of the first kernel")
    args = ap.parse_args()
    print(f"{'format':10} {'M':>4} {'schedule':22} {'loop instr':>10} {'steps':>5} {'per step':>8} "
          f"{'per weight':>10}  top opcodes")
    for name in args.formats.split(","):
        fmt = builtin_format(name)
        for m in (int(v) for v in args.ms.split(",")):
            s = tuned_schedule(fmt, m, CUDA, args.k, args.n)
            if args.unroll is not None and hasattr(s.pipeline, "unroll"):
                s = dataclasses.replace(s, pipeline=dataclasses.replace(s.pipeline, unroll=args.unroll))
            src = emit(compile_gemm(Gemm(f"sass_{name}_{m}", fmt, s, activation=args.act), CUDA).kernel, CUDA)
            lay = stream_layout(fmt, CUDA)
            # weights one lane decodes per K step: one vector per N tile of the warp
            per_lane = lay.chunk * 16 // 32 * (s.tile_n // s.warps_n // 16)
            r = count(src, per_lane)
            steps = steps_per_loop(r["ops"], s, lay) if s.pipeline.kind == "weight_stream" else 1
            r["per_weight"] /= steps
            top = " ".join(f"{k}:{v}" for k, v in list(r["ops"].items())[:8])
            print(f"{name:10} {m:4d} {s.name:22} {r['loop_instructions']:10d} {steps:5d} "
                  f"{r['loop_instructions'] / steps:8.1f} {r['per_weight']:10.2f}  {top}")
            if args.show:  # the first kernel's loop only
                print("\n".join(r["loop"]))
                args.show = False
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
