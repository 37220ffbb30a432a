"""Packing speed of every built-in format on a large float weight.

Requirement: `marlin_dsl.pack(builtin_format(name), w)` of a 4096 x 14336 float32 weight
([K, N], the shape of a Llama-3-8B MLP projection) takes under 2 s for every built-in
format on a 2-core, CI-sized machine. This script shows it; it is not a timed test.

The weight is float32 random normal (seeded). For `fp4_blockpattern` the weight also has
clustered zeros, the structure that format exists for: whole 8 x 32 blocks (the format's
block_k x block_n) are zeroed with probability `--zero-blocks`, and whole input channels
(rows along K) with probability `--zero-channels`. The other formats get the plain weight.

For each format: one warm-up call, then `--repeats` timed calls of `pack`; best and median
are reported. `unpack(packed)` (which validates first) and `dequantize(unpack(packed))`
(float64 [K, N]) are timed the same way. The peak of memory that numpy allocates during
one `pack` call is measured separately with tracemalloc (outside the timed runs).

    python bench/pack_speed.py                        # 4096 x 14336, 5 repeats
    python bench/pack_speed.py --k 512 --n 1024 --repeats 3 --out /tmp/small.json
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Callable

import numpy as np

import marlin_dsl
from marlin_dsl import BUILTIN_FORMATS, builtin_format, dequantize, pack, unpack

LIMIT_S = 2.0
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "pack_speed.json"


def make_weight(k: int, n: int, seed: int) -> np.ndarray:
    """Float32 [K, N] standard normal weight."""
    return np.random.default_rng(seed).standard_normal((k, n), dtype=np.float32)


def make_clustered(w: np.ndarray, seed: int, block_k: int, block_n: int,
                   zero_blocks: float, zero_channels: float) -> np.ndarray:
    """A copy of w with whole block_k x block_n blocks and whole K rows set to zero."""
    k, n = w.shape
    rng = np.random.default_rng(seed + 1)
    kb, nb = k // block_k, -(-n // block_n)
    dead_blocks = rng.random((kb, nb)) < zero_blocks
    mask = np.repeat(np.repeat(dead_blocks, block_k, axis=0), block_n, axis=1)[:k, :n]
    mask |= (rng.random(k) < zero_channels)[:, None]
    out = w.copy()
    out[mask] = 0.0
    return out


def time_calls(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(best, median) seconds of `repeats` calls after one warm-up call."""
    result = fn()  # warm-up
    del result
    times = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
        del result
    return min(times), statistics.median(times)


def peak_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes traced (numpy reports its buffers to tracemalloc) during one call."""
    gc.collect()
    tracemalloc.start()
    try:
        result = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del result
    return peak


def machine_info() -> dict[str, object]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        cpu = platform.processor() or "unknown"
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),
        "usable_cores": usable,
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "marlin_dsl": marlin_dsl.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=4096, help="rows (input features), default 4096")
    parser.add_argument("--n", type=int, default=14336, help="columns (outputs), default 14336")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per measurement")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--zero-blocks", type=float, default=0.5,
                        help="fp4_blockpattern: probability that an 8x32 block is all zero")
    parser.add_argument("--zero-channels", type=float, default=0.1,
                        help="fp4_blockpattern: probability that an input channel (K row) is zero")
    parser.add_argument("--formats", nargs="*", default=list(BUILTIN_FORMATS),
                        help="formats to run (default: all built-in)")
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc pass")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON file ({DEFAULT_OUT})")
    args = parser.parse_args(argv)

    dense = make_weight(args.k, args.n, args.seed)
    rows = []
    header = (f"{'format':<18}{'pack best':>10}{'median':>9}{'unpack':>9}{'dequant':>9}"
              f"{'packed MB':>11}{'peak MB':>9}  <{LIMIT_S:g} s")
    print(f"K={args.k} N={args.n}, {args.repeats} repeats after 1 warm-up, float32 input")
    print(header)
    print("-" * len(header))
    for name in args.formats:
        fmt = builtin_format(name)
        w = dense
        weight_note = "random normal"
        sp = fmt.sparsity
        if isinstance(sp, marlin_dsl.BlockPatternSparsity):
            w = make_clustered(dense, args.seed, sp.block_k, sp.block_n,
                               args.zero_blocks, args.zero_channels)
            weight_note = (f"random normal with clustered zeros: {args.zero_blocks:.0%} of "
                           f"{sp.block_k}x{sp.block_n} blocks and {args.zero_channels:.0%} of "
                           f"input channels zeroed")
        pack_best, pack_med = time_calls(lambda: pack(fmt, w), args.repeats)
        packed = pack(fmt, w)
        unpack_best, unpack_med = time_calls(lambda: unpack(packed), args.repeats)
        logical = unpack(packed)
        deq_best, deq_med = time_calls(lambda: dequantize(logical), args.repeats)
        del logical
        peak = None if args.no_memory else peak_bytes(lambda: pack(fmt, w))
        row = {
            "format": name,
            "describe": fmt.describe(),
            "weight": weight_note,
            "pack_best_s": pack_best,
            "pack_median_s": pack_med,
            "unpack_best_s": unpack_best,
            "unpack_median_s": unpack_med,
            "dequantize_best_s": deq_best,
            "dequantize_median_s": deq_med,
            "packed_bytes": packed.nbytes,
            "pack_peak_traced_bytes": peak,
            "passes": pack_med < LIMIT_S,
        }
        if "patterns" in packed.arrays:
            row["empty_pattern_bits"] = float(
                1.0 - np.unpackbits(packed["patterns"][..., None], axis=-1).mean())
        rows.append(row)
        del packed
        peak_text = "-" if peak is None else f"{peak / 2**20:.0f}"
        print(f"{name:<18}{pack_best:>10.3f}{pack_med:>9.3f}{unpack_med:>9.3f}{deq_med:>9.3f}"
              f"{row['packed_bytes'] / 2**20:>11.1f}{peak_text:>9}  "
              f"{'pass' if row['passes'] else 'FAIL'}")

    try:
        import resource
        max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    except ImportError:
        max_rss = None
    result = {
        "benchmark": "pack_speed",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "shape": {"k": args.k, "n": args.n},
        "input_dtype": "float32",
        "seed": args.seed,
        "repeats": args.repeats,
        "warmup": 1,
        "limit_s": LIMIT_S,
        "pass_criterion": "median pack time < limit_s",
        "unpack_note": "unpack(packed) includes validate()",
        "dequantize_note": "dequantize(unpack(packed)), float64 [K, N]",
        "process_max_rss_bytes": max_rss,
        "results": rows,
        "all_pass": all(r["passes"] for r in rows),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nall formats under {LIMIT_S:g} s: {result['all_pass']}; "
          f"process max RSS {max_rss / 2**30:.2f} GiB; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
