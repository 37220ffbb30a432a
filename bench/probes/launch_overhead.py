"""Host cost of one `mx.fast.cuda_kernel` launch against the size of the kernel's source text.

MLX builds the full kernel source (its header + ours) as a string on every call and hashes
it when the graph is evaluated (mlx/backend/cuda/custom_kernel.cpp), so a launch's host cost
grows with the text. This times a trivial kernel (y[i] = x[i]) whose header is padded with a
comment to 1, 8, 32 and 128 KB: "call" is the Python call (graph building), "batched" the
wall time per launch of 2000 launches evaluated together (the device work is negligible),
next to `mx.quantized_matmul` and `mx.add` on tiny inputs. Run on the GPU machine.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx

BODY = "uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; if (i < 256) y[i] = x[i];"


def timed(fn, calls: int = 2000, repeats: int = 5) -> tuple[float, float]:
    mx.eval(fn())
    build, total = [], []
    for _ in range(repeats):
        mx.synchronize()
        t0 = time.perf_counter()
        outs = [fn() for _ in range(calls)]
        t1 = time.perf_counter()
        mx.eval(outs)
        mx.synchronize()
        t2 = time.perf_counter()
        build.append((t1 - t0) / calls * 1e6)
        total.append((t2 - t0) / calls * 1e6)
    return statistics.median(build), statistics.median(total)


def main() -> int:
    x = mx.random.normal((256,)).astype(mx.float16)
    rows = []
    for kb in (1, 8, 32, 128):
        header = "// " + "p" * (kb * 1024 - 4) + "\n"
        kernel = mx.fast.cuda_kernel(name=f"copy_{kb}kb", input_names=["x"], output_names=["y"],
                                     source=BODY, header=header)
        call, batched = timed(lambda: kernel(inputs=[x], output_shapes=[(256,)], output_dtypes=[mx.float16],
                                             grid=(256, 1, 1), threadgroup=(256, 1, 1))[0])
        rows.append({"what": f"cuda_kernel, {kb} KB source", "call_us": call, "batched_us": batched})
    w = mx.random.normal((256, 256)).astype(mx.float16)
    q, s, b = mx.quantize(w, group_size=64, bits=4)
    x2 = mx.random.normal((1, 256)).astype(mx.float16)
    call, batched = timed(lambda: mx.quantized_matmul(x2, q, s, b, transpose=True, group_size=64, bits=4))
    rows.append({"what": "mx.quantized_matmul 256x256, M=1", "call_us": call, "batched_us": batched})
    call, batched = timed(lambda: x + x)
    rows.append({"what": "mx.add of 256 elements", "call_us": call, "batched_us": batched})
    for r in rows:
        print(f"{r['what']:<36} call {r['call_us']:6.2f} us   batched {r['batched_us']:6.2f} us/launch")
    if len(sys.argv) > 1:
        out = Path(sys.argv[1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "launch_overhead.json").write_text(json.dumps(
            {"device": {k: str(v) for k, v in mx.device_info().items()}, "mlx": mx.__version__,
             "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
