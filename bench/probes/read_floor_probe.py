"""How fast can anything read the decode's bytes? The bound behind issue 15's M = 1 target.

The M = 1 target is "fp4 >= 80% of copy bandwidth", with copy bandwidth = (bytes read + bytes
written) / time of a 128-bit copy of the fp4 weight's bytes. This probe times, on the GPU and
under Nsight Compute with a cold L2 (as `decode_sweep.py` times the kernels), three CuPy kernels
over exactly the bytes fp4 reads at M = 1 on each issue shape (the packed weight and its group-128
f16 scales):

- `copy`: the reference of the target (grid-stride 128-bit loads and stores);
- `read`: the same loads with no stores (each block XORs what it read into one word): what a
  kernel that does nothing but read the weight takes;
- `read_1wave`: the same reads from exactly one wave of blocks (132 SMs x 4 blocks of 512
  threads), each streaming a contiguous range with 4 loads in flight per thread.

`read` bounds every decode kernel from below, so `read`'s bandwidth over the copy's is the
highest "percent of copy bandwidth" any M = 1 kernel can reach on that shape.

    ncu --cache-control all --clock-control none --metrics gpu__time_duration.sum \\
        -k regex:'mdsl_probe' python3 bench/probes/read_floor_probe.py            # on the GPU machine
    python3 bench/probes/read_floor_probe.py --report NCU_OUTPUT.txt                # the table (anywhere)
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

#: (K, N) of the issue's shapes; fp4 g128: K*N/2 bytes of codes + K/128*N*2 bytes of scales
SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096))

_SOURCE = r"""
extern "C" __global__ void mdsl_probe_copy(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}
extern "C" __global__ void mdsl_probe_read(const uint4* __restrict__ src, unsigned* __restrict__ out, size_t n) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint4 v = src[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) out[blockIdx.x] = acc;  // never true for the data used: keeps the loads
}
extern "C" __global__ void mdsl_probe_read_1wave(const uint4* __restrict__ src, unsigned* __restrict__ out, size_t n) {
  const size_t per = (n + gridDim.x - 1) / gridDim.x;  // a contiguous range per block
  const size_t lo = blockIdx.x * per, hi = lo + per < n ? lo + per : n;
  unsigned acc = 0;
  for (size_t i = lo + threadIdx.x; i < hi; i += 4 * (size_t)blockDim.x) {
    uint4 v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = i + j * blockDim.x < hi ? src[i + j * blockDim.x] : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int j = 0; j < 4; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  if (acc == 0x9e3779b9u) out[blockIdx.x] = acc;
}
"""


def fp4_bytes(k: int, n: int) -> int:
    return k * n // 2 + (k // 128) * n * 2


def run() -> int:
    import cupy as cp

    mod = cp.RawModule(code=_SOURCE)
    copy, read, wave = (mod.get_function(f"mdsl_probe_{n}") for n in ("copy", "read", "read_1wave"))
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    out = cp.zeros(4096, dtype=cp.uint32)
    for k, n in SHAPES:
        words = fp4_bytes(k, n) // 16
        src = cp.random.randint(1, 2**31, size=words * 4, dtype=cp.uint32)  # never all zeros
        dst = cp.empty_like(src)
        size = cp.uint64(words)
        for _ in range(2):  # ncu times each launch; the report takes the second of each
            copy((sms * 8,), (512,), (src, dst, size))
            read((sms * 8,), (512,), (src, out, size))
            wave((sms * 4,), (512,), (src, out, size))
        cp.cuda.Device().synchronize()
        assert bool((dst == src).all()), "the copy probe copied wrongly"
        print(f"K={k} N={n} bytes={fp4_bytes(k, n)}", flush=True)
    return 0


def report(path: Path) -> int:
    """The table from ncu's text output: per shape the second launch of each probe."""
    text = path.read_text()
    times: dict[str, list[float]] = {}
    blocks = re.split(r"\n\s*(mdsl_probe_\w+)", "\n" + text)
    for name, body in zip(blocks[1::2], blocks[2::2]):
        m = re.search(r"gpu__time_duration\.sum\s+(\w+)\s+([\d.,]+)", body)
        if m:
            scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}[m.group(1)]
            times.setdefault(name.replace("mdsl_probe_", ""), []).append(float(m.group(2).replace(",", "")) * scale)
    print("| K x N | fp4 bytes (MB) | copy us | read us | one-wave read us | read BW / copy BW |")
    print("|---|---:|---:|---:|---:|---:|")
    for i, (k, n) in enumerate(SHAPES):
        b = fp4_bytes(k, n)
        c, r, w = (times[x][2 * i + 1] for x in ("copy", "read", "read_1wave"))
        copy_bw = 2 * b / c
        # the faster of the two reads against the copy
        print(f"| {k} x {n} | {b / 1e6:.1f} | {c:.1f} | {r:.1f} | {w:.1f} | {b / min(r, w) / copy_bw:.0%} |")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--report", type=Path, help="print the table from an ncu text output")
    a = ap.parse_args()
    return report(a.report) if a.report else run()


if __name__ == "__main__":
    sys.exit(main())
