"""The issue rate of the tensor-core instructions the sparse activation GEMM can use, on the GPU:
back-to-back `mma.sync` m16n8k16 (dense) and `mma.sp` m16n8k32 (2:4 sparse A), f16 inputs, f32
accumulators, from registers only (no memory in the loop), so the result is the instruction's
ceiling, not a kernel's. Each warp keeps 16 independent accumulators in flight.

    python3 bench/probes/mma_rate_probe.py [--out FILE]      # needs CuPy (the GPU machine has it)

Reported in dense-equivalent TFLOP/s (an m16n8k32 sparse MMA counts 2 * 16 * 8 * 32): where the
sparse MMA's rate is no more than the dense one's, 2:4 activations cannot speed up a GEMM on
this instruction, whatever the kernel around it.
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import date

SOURCE = r"""
extern "C" __global__ void rate(float* out, int iters, int sparse) {
  unsigned a0 = 0x3c003c00u ^ threadIdx.x, a1 = a0 + 1, a2 = a0 + 2, a3 = a0 + 3;
  unsigned b0 = 0x3c003c00u, b1 = b0 + 5, b2 = b0 + 6, b3 = b0 + 7;
  unsigned meta = 0x44444444u;  // every group keeps positions (0, 1): valid ordered metadata
  float acc[16][4];
  for (int i = 0; i < 16; ++i) for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
  if (sparse) {
    for (int it = 0; it < iters; ++it) {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        asm volatile(
            "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9,%10,%11}, {%0,%1,%2,%3}, %12, 0x0;\n"
            : "+f"(acc[i][0]), "+f"(acc[i][1]), "+f"(acc[i][2]), "+f"(acc[i][3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(b2), "r"(b3), "r"(meta));
      }
    }
  } else {
    for (int it = 0; it < iters; ++it) {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(acc[i][0]), "+f"(acc[i][1]), "+f"(acc[i][2]), "+f"(acc[i][3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
      }
    }
  }
  float s = 0.0f;
  for (int i = 0; i < 16; ++i) for (int j = 0; j < 4; ++j) s += acc[i][j];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
"""


def main(argv: list[str] | None = None) -> int:
    import cupy as cp

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=4096)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    kernel = cp.RawKernel(SOURCE, "rate", options=("-arch=sm_90",))
    props = cp.cuda.runtime.getDeviceProperties(0)
    sms = props["multiProcessorCount"]
    rows = []
    for sparse in (0, 1):
        for warps in (4, 8, 16):
            blocks, threads = sms * 4, 32 * warps
            out = cp.zeros(blocks * threads, cp.float32)
            args = (out, cp.int32(a.iters), cp.int32(sparse))
            kernel((blocks,), (threads,), args)
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            for _ in range(5):
                kernel((blocks,), (threads,), args)
            stop.record()
            stop.synchronize()
            seconds = cp.cuda.get_elapsed_time(start, stop) / 1e3 / 5
            k = 32 if sparse else 16
            flops = blocks * warps * a.iters * 16 * 2 * 16 * 8 * k
            rows.append({"instruction": "mma.sp m16n8k32" if sparse else "mma.sync m16n8k16",
                         "warps_per_block": warps, "blocks": blocks,
                         "dense_equivalent_tflops": flops / seconds / 1e12})
            print(f"{rows[-1]['instruction']:18s} {warps:2d} warps x {blocks} blocks: "
                  f"{rows[-1]['dense_equivalent_tflops']:.0f} dense-equivalent TFLOP/s", flush=True)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": name, "date": date.today().isoformat(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
