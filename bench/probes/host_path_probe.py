"""Where a layer call's host time goes, and what dequantise-then-`mx.matmul` would cost at large M.

Part 1 (host): for fp16 `nn.Linear`, MLX's 4-bit `nn.QuantizedLinear` (g64) and `MarlinLinear`
fp4 (g128), and for the pieces of our call path (the bound `mx.fast.cuda_kernel` object called
directly; a trivial one-input kernel), at K x N = 256 x 256 and 4096 x 14336, M = 1:
"queue" is the Python time of one call (graph building; `calls` calls, no evaluation),
"batched" the wall time per call of `calls` calls built and evaluated together (host-bound at
256 x 256), with and without NaN-poisoned outputs (`init_value`, a fill per call). A cProfile
of the MarlinLinear calls shows which Python frames the queue time sits in.

Part 2 (premise of a large-M path): at M = 2048, 4096 x 14336, f16: `mx.matmul` alone; a
hand-written fp4 dequantise kernel (one thread per 32-bit word of 8 codes, one 16-byte store:
the rate a generated one can at best reach) alone; the two together; and the two in 2 and 4
chunks along N (each chunk's W^T fits the 50 MB L2, so the matmul may read it from there),
joined with `mx.concatenate`. Weights rotate over copies that exceed the L2. The dequantise
kernel is checked against numpy first. Not shipped code: it decides whether a generated
dequantise pipeline is worth building.

    python bench/probes/host_path_probe.py --out bench/results/<dir>
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)

# E2M1 code c as f16 bits: sign to bit 15, the 3 magnitude bits to bits 9..11 (exponent's low
# two bits and the mantissa's top bit), times 2^14 (no table: a per-lane table index
# serialises a constant-memory read).
DQ_HEADER = ""
# words: [N, K/8] u32 (code j of a word in bits 4j..4j+3), scales: [N, K/128] f16 -> w: [N, K] f16
DQ_BODY = """
uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
uint32_t kw = dims[0] / 8, total = dims[1] * kw;
if (i >= total) return;
uint32_t n = i / kw, j = i % kw;
uint32_t word = words[i];
__half2 s2 = __half2half2(__hmul(scales[n * (dims[0] / 128) + j / 16], __float2half(16384.f)));
__align__(16) __half2 out[4];
#pragma unroll
for (int c = 0; c < 4; ++c) {
  uint32_t b = word >> (8 * c);
  uint32_t bits = ((b & 7u) << 9) | ((b & 8u) << 12) | ((b & 0x70u) << 21) | ((b & 0x80u) << 24);
  out[c] = __hmul2(*reinterpret_cast<__half2*>(&bits), s2);
}
*reinterpret_cast<uint4*>(w + (size_t)n * dims[0] + (size_t)j * 8) = *reinterpret_cast<uint4*>(out);
"""


def timed(fn, calls: int, repeats: int = 5) -> tuple[float, float]:
    """(median Python us per call, median wall us per call of `calls` built and evaluated)."""
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
        del outs
    return statistics.median(build), statistics.median(total)


def linear(k: int, n: int, w: mx.array) -> nn.Linear:
    layer = nn.Linear(k, n, bias=False)
    layer.weight = w
    return layer


def host_part(rng: np.random.Generator, calls: int) -> tuple[list[dict], str]:
    import marlin_dsl.layers.dispatch as dispatch
    from marlin_dsl.nn import MarlinLinear

    rows: list[dict] = []
    profile_text = ""
    trivial = mx.fast.cuda_kernel(name="probe_copy", input_names=["x"], output_names=["y"],
                                  source="uint32_t i = threadIdx.x; y[i] = x[i];")
    for k, n in ((256, 256), (4096, 14336)):
        copies = 1 if k == 256 else 4
        ws = [mx.array(rng.standard_normal((n, k)) * 0.02).astype(mx.float16) for _ in range(copies)]
        x = mx.array(rng.standard_normal((1, k))).astype(mx.float16)
        fp16 = [linear(k, n, w) for w in ws]
        q4 = [nn.QuantizedLinear.from_linear(linear(k, n, w), group_size=64, bits=4) for w in ws]
        ours = [MarlinLinear.from_linear(linear(k, n, w), "fp4") for w in ws]
        mx.eval([l.parameters() for l in (*fp16, *q4, *ours)])
        ours[0](x)
        launch = ours[0]._dispatch.launches[(x.shape, x.dtype)]
        weights = [ours[0][name] for name in ours[0]._dispatch.names]
        subjects = {
            "fp16 nn.Linear": lambda i: fp16[i % copies](x),
            "MLX 4-bit QuantizedLinear": lambda i: q4[i % copies](x),
            "MarlinLinear fp4": lambda i: ours[i % copies](x),
            "its kernel object, called directly": lambda i: launch.kernel(
                inputs=[x, *weights, launch.dims], output_shapes=launch.shapes, output_dtypes=launch.dtypes,
                grid=launch.grid, threadgroup=launch.threadgroup)[0],
            "trivial cuda_kernel (1 input)": lambda i: trivial(
                inputs=[x], output_shapes=[(32,)], output_dtypes=[mx.float16], grid=(32, 1, 1),
                threadgroup=(32, 1, 1))[0],
            "mx.add": lambda i: x + x,
        }
        for turn, poison in enumerate((None, float("nan"), None)):  # the third: is the first repeatable?
            dispatch._INIT_VALUE = poison
            for name, fn in subjects.items():
                if turn and name != "MarlinLinear fp4":
                    continue
                counter = iter(range(10 ** 9))
                call_us, batched_us = timed(lambda fn=fn: fn(next(counter)), calls)
                rows.append({"what": name + ("", " (poisoned)", " (again)")[turn], "K": k, "N": n,
                             "M": 1, "queue_us": call_us, "batched_us": batched_us})
                print(f"{k}x{n:<6} {rows[-1]['what']:<42} queue {call_us:7.2f} us  batched {batched_us:7.2f} us",
                      flush=True)
        dispatch._INIT_VALUE = None
        if k == 4096:
            prof = cProfile.Profile()
            prof.enable()
            outs = [ours[i % copies](x) for i in range(calls)]
            prof.disable()
            mx.eval(outs)
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
            profile_text = buf.getvalue()
            print(profile_text, flush=True)
    return rows, profile_text


def chain_part(rng: np.random.Generator, pairs: int = 8, k: int = 4096, n: int = 14336,
               repeats: int = 7) -> list[dict]:
    """Decode as a model runs it: `pairs` (K -> N, N -> K) layer pairs chained (each layer's
    input is the one before's output, so nothing runs concurrently), M = 1, every layer its own
    weight; the chain built and evaluated once per sample. us per layer, median of samples."""
    from marlin_dsl.nn import MarlinLinear

    shapes = [(k, n), (n, k)] * pairs
    ws = [mx.array(rng.standard_normal((o, i)) * 0.02).astype(mx.float16) for i, o in shapes]
    variants = {
        "fp16 nn.Linear": [linear(i, o, w) for (i, o), w in zip(shapes, ws)],
        "MLX 4-bit QuantizedLinear": [nn.QuantizedLinear.from_linear(linear(i, o, w), group_size=64, bits=4)
                                      for (i, o), w in zip(shapes, ws)],
        "MarlinLinear fp4": [MarlinLinear.from_linear(linear(i, o, w), "fp4") for (i, o), w in zip(shapes, ws)],
    }
    for layers in variants.values():
        mx.eval([l.parameters() for l in layers])
    x0 = mx.array(rng.standard_normal((1, k))).astype(mx.float16)

    def run(layers) -> mx.array:
        h = x0
        for layer in layers:
            h = layer(h) * 0.05  # keeps values in range; an op between layers, as a model has
        return h

    samples: dict[str, list[float]] = {name: [] for name in variants}
    for name, layers in variants.items():
        mx.eval(run(layers))
    for _ in range(repeats):  # in turns, so that drift hits every variant alike
        for name, layers in variants.items():
            mx.synchronize()
            t0 = time.perf_counter()
            mx.eval(run(layers))
            mx.synchronize()
            samples[name].append((time.perf_counter() - t0) / len(shapes) * 1e6)
    rows = []
    for name, got in samples.items():
        rows.append({"what": name, "M": 1, "layers": len(shapes), "shapes": f"{k}x{n} and {n}x{k}",
                     "us_per_layer": statistics.median(got), "samples": got})
        print(f"chain of {len(shapes)} layers, M=1: {name:<28} {statistics.median(got):7.2f} us per layer "
              f"(+ a multiply)", flush=True)
    return rows


def gemm_part(rng: np.random.Generator, m: int = 2048, k: int = 4096, n: int = 14336,
              copies: int = 4) -> list[dict]:
    dq = mx.fast.cuda_kernel(name="probe_fp4_dequant", input_names=["words", "scales", "dims"],
                             output_names=["w"], source=DQ_BODY, header=DQ_HEADER)

    def dequant(words: mx.array, scales: mx.array, rows: int, cols: int = k) -> mx.array:
        dims = mx.array([cols, rows], mx.uint32)
        total = rows * cols // 8
        return dq(inputs=[words, scales, dims], output_shapes=[(rows, cols)], output_dtypes=[mx.float16],
                  grid=(-(-total // 256) * 256, 1, 1), threadgroup=(256, 1, 1))[0]

    # correctness of the hand-written kernel on a small matrix
    cw = rng.integers(0, 2 ** 32, (64, 256 // 8), dtype=np.uint64).astype(np.uint32)
    cs = (rng.random((64, 256 // 128)) + 0.5).astype(np.float16)
    codes = (cw[:, :, None] >> (4 * np.arange(8, dtype=np.uint32))) & 15
    want = (E2M1[codes].reshape(64, 256) * np.repeat(cs.astype(np.float32), 128, axis=1)).astype(np.float16)
    got = np.array(dequant(mx.array(cw), mx.array(cs), 64, 256))
    assert np.array_equal(got, want), "hand-written dequantise kernel is wrong"

    words = [mx.array(rng.integers(0, 2 ** 32, (n, k // 8), dtype=np.uint64).astype(np.uint32)) for _ in range(copies)]
    scales = [mx.array((rng.random((n, k // 128)) * 0.01 + 0.005).astype(np.float16)) for _ in range(copies)]
    wf16 = [mx.array(rng.standard_normal((n, k)) * 0.02).astype(mx.float16) for _ in range(copies)]
    x = mx.array(rng.standard_normal((m, k))).astype(mx.float16)
    mx.eval(words, scales, wf16, x)

    def chunked(i: int, parts: int) -> mx.array:
        c = i % copies
        step = n // parts
        ys = [mx.matmul(x, dequant(words[c][r:r + step], scales[c][r:r + step], step).T)
              for r in range(0, n, step)]
        return ys[0] if parts == 1 else mx.concatenate(ys, axis=1)

    subjects = {
        "fp16 mx.matmul": lambda i: mx.matmul(x, wf16[i % copies].T),
        "fp4 dequantise alone": lambda i: dequant(words[i % copies], scales[i % copies], n),
        "dequantise + matmul": lambda i: chunked(i, 1),
        "dequantise + matmul, 2 N chunks": lambda i: chunked(i, 2),
        "dequantise + matmul, 4 N chunks": lambda i: chunked(i, 4),
    }
    rows = []
    for name, fn in subjects.items():
        counter = iter(range(10 ** 9))
        _, per = timed(lambda fn=fn: fn(next(counter)), 40, repeats=5)
        rows.append({"what": name, "M": m, "K": k, "N": n, "us": per})
        print(f"M={m} {k}x{n} {name:<36} {per:8.1f} us", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    from marlin_dsl.benchmarks.provenance import git_commit, gpu_name

    rng = np.random.default_rng(15)
    host_rows, profile_text = host_part(rng, args.calls)
    chain_rows = chain_part(rng)
    gemm_rows = gemm_part(rng)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_path_probe.json").write_text(json.dumps(
        {"date": time.strftime("%Y-%m-%d"), "commit": git_commit(ROOT), "device": gpu_name(),
         "mlx": mx.__version__, "host": host_rows, "chain": chain_rows,
         "large_m": gemm_rows}, indent=1) + "\n")
    (args.out / "host_path_profile.txt").write_text(profile_text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
