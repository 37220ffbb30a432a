"""Host cost of the pieces of a converted model's layer call, one piece at a time.

`decode_host_probe.py` showed a decode step of a converted model bound by host work (the graph
build and MLX's encode of it). This times, at a small shape where the device work is negligible
(K = 256, parts of 256 output features, M = 1, f16), `calls` repeats of each piece built into
one graph: "build" is the Python time per call (graph building), "encode" the `mx.async_eval`
time per call (MLX turning the nodes into device work), "total" the wall time per call until
all are evaluated. Pieces: mlx-lm's 4-bit `QuantizedLinear` (one, and three as q/k/v),
`MarlinLinear` fp4 (one), the fused q/k/v parts (`LinearSlice` x 3 of one `FusedLinear`), the
bound kernel called as the layer calls it (keywords) and positionally, `mx.split`, and the
layer's per-call closure.

    python bench/probes/call_cost_probe.py --out bench/results/<dir>
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from marlin_dsl.models import convert  # noqa: E402
from marlin_dsl.nn import MarlinLinear  # noqa: E402


def timed(fn, calls: int, repeats: int = 5) -> dict[str, float]:
    mx.eval(fn())
    parts: dict[str, list[float]] = {"build": [], "encode": [], "total": []}
    for _ in range(repeats):
        mx.synchronize()
        t0 = time.perf_counter()
        outs = [fn() for _ in range(calls)]
        t1 = time.perf_counter()
        mx.async_eval(outs)
        t2 = time.perf_counter()
        mx.eval(outs)
        mx.synchronize()
        t3 = time.perf_counter()
        for key, dt in (("build", t1 - t0), ("encode", t2 - t1), ("total", t3 - t0)):
            parts[key].append(dt / calls * 1e6)
    return {key: statistics.median(v) for key, v in parts.items()}


class _Attention(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", type=int, default=256)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    d = args.dims
    x = mx.random.normal((1, 1, d)).astype(mx.float16)
    lin = nn.Linear(d, d, bias=False)
    lin.set_dtype(mx.float16)
    qlin = nn.QuantizedLinear.from_linear(lin, group_size=64, bits=4)
    attn = _Attention(d)
    attn.set_dtype(mx.float16)
    qattn = _Attention(d)
    qattn.update(attn.parameters())
    nn.quantize(qattn, group_size=64, bits=4)
    for layer in (attn.q_proj, attn.k_proj, attn.v_proj):
        del layer["bias"]
    convert(attn, "fp4")  # q/k/v fused by default
    marlin = MarlinLinear.from_linear(lin, "fp4")
    mx.eval(qlin.parameters(), qattn.parameters(), attn.parameters(), marlin.parameters(), x)
    marlin(x)
    launch = marlin._dispatch.launch(x)
    weights = [marlin[n] for n in marlin._dispatch.names]
    k, dims, shapes, dtypes = launch.kernel, launch.dims, launch.shapes, launch.dtypes
    grid, tg = launch.grid, launch.threadgroup
    y3 = mx.random.normal((1, 1, 3 * d)).astype(mx.float16)
    mx.eval(y3)
    cases = {
        "QuantizedLinear": lambda: qlin(x),
        "QuantizedLinear x3 (q, k, v)": lambda: [qattn.q_proj(x), qattn.k_proj(x), qattn.v_proj(x)],
        "MarlinLinear fp4": lambda: marlin(x),
        "fused q, k, v parts (LinearSlice x3)": lambda: [attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)],
        "layer closure (_call)": lambda: marlin._call(x),
        "bound kernel, keywords": lambda: k(inputs=[x, *weights, dims], output_shapes=shapes,
                                            output_dtypes=dtypes, grid=grid, threadgroup=tg,
                                            init_value=None)[0],
        "bound kernel, no init_value": lambda: k(inputs=[x, *weights, dims], output_shapes=shapes,
                                                 output_dtypes=dtypes, grid=grid, threadgroup=tg)[0],
        "mx.split in 3": lambda: mx.split(y3, [d, 2 * d], axis=-1),
        "mx.add": lambda: x + x,
    }
    rows = []
    for name, fn in cases.items():
        row = {"what": name, **timed(fn, args.calls)}
        rows.append(row)
        print(f"{name:<40} build {row['build']:6.2f}  encode {row['encode']:6.2f}  "
              f"total {row['total']:6.2f} us/call", flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        doc = {"device": mx.device_info() if hasattr(mx, "device_info") else str(mx.default_device()),
               "mlx": mx.__version__, "date": date.today().isoformat(), "dims": d, "rows": rows}
        (args.out / "call_cost_probe.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
