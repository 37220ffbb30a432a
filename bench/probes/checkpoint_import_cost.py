"""Issue 36: what reading a checkpoint costs on the host (the load-time re-layout,
docs/DECISIONS.md): `CheckpointFormat.read` (checkpoint tensors -> the kernel format's codes and
parameters) and `pack_codes` (-> the linear layout the targets' layouts start from), on one
Llama-3-8B MLP weight (4096 x 14336), per format; median of 3.

    python bench/probes/checkpoint_import_cost.py [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from marlin_dsl.formats.checkpoint import awq, bnb, gguf_format, gptq  # noqa: E402
from marlin_dsl.formats.packing import pack_codes  # noqa: E402
from marlin_dsl.formats.quantize import quantize  # noqa: E402
from marlin_dsl.formats.tensors import QuantizedWeights  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--n", type=int, default=14336)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for cf, order in ((gguf_format("Q4_K"), False), (gguf_format("Q6_K"), False), (gguf_format("Q4_0"), False),
                      (gptq(4, 128, 1), True), (awq(4, 128), False), (bnb("nf4"), False)):
        fmt = cf.format
        small = 2 * fmt.k_multiple
        q = quantize(fmt, rng.standard_normal((small, a.n)) * 0.02)
        params = {x.name: np.tile(q.parameter(x.name), (a.k // small, 1)) for x in fmt.scaling.arrays()}
        codes = rng.integers(0, 1 << fmt.element.bits, size=(a.k, a.n), dtype=np.uint8)
        perm = rng.permutation(a.k) if order else None
        tensors = cf.write(QuantizedWeights.from_arrays(fmt, codes, params), perm)
        read, pack = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            imported = cf.read(tensors, (a.k, a.n))
            t1 = time.perf_counter()
            pack_codes(imported.weights)
            t2 = time.perf_counter()
            read.append(t1 - t0)
            pack.append(t2 - t1)
        row = {"format": cf.name, "k": a.k, "n": a.n, "read_s": statistics.median(read),
               "pack_s": statistics.median(pack), "act_order": order}
        rows.append(row)
        print(f"{cf.name:22s} read {row['read_s'] * 1e3:7.0f} ms  pack {row['pack_s'] * 1e3:7.0f} ms", flush=True)
    if a.out:
        a.out.write_text(json.dumps({"date": str(date.today()), "machine": platform.processor() or platform.machine(),
                                     "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
