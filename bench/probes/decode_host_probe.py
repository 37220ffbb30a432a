"""Where one decode step of a whole mlx-lm model spends its time, per variant.

`model_bench.py` showed the converted model decoding slower than mlx-lm's 4-bit layers although
each of our M = 1 kernels is faster than MLX's: the step is bound by host work. This probe splits
one step (one token, KV cache) into its parts, measured one after another on a quiet device:

- build: the Python forward (graph building, nothing evaluated);
- encode: `mx.async_eval` of the logits (MLX's host work that turns the graph into device work;
  returns before the device finishes);
- wait: the rest until the logits are ready (device work that the encode did not cover);
- graph: the primitives of the step's graph, counted by name (`mx.export_to_dot`);
- profile: the Python frames of the build (cProfile, most time first);
- decode: `mlx_lm.generate.generate_step`'s pipelined rate (build of step t+1 overlaps the
  device's step t), for reference.

Run on the GPU machine with MLX's CUDA backend and mlx-lm (see /work/shared/GPU.md):

    python bench/probes/decode_host_probe.py --layers 8 --out bench/results/<dir>
"""
from __future__ import annotations

import argparse
import cProfile
import collections
import gc
import io
import json
import pstats
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: model_bench
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import model_bench  # noqa: E402  (the model, its variants and the decode timing are shared)


class GCClock:
    """Time spent in Python's garbage collector, by generation, while enabled."""

    def __init__(self) -> None:
        self.seconds = collections.Counter()
        self.count = collections.Counter()
        self._t0 = 0.0
        gc.callbacks.append(self._hook)

    def _hook(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._t0
            self.count[info["generation"]] += 1

    def reset(self) -> None:
        self.seconds.clear()
        self.count.clear()


def token_times(model, prompt: mx.array, tokens: int, clock: GCClock) -> dict:
    """Per-token intervals of one `generate_step` run (tokens 2..N) and the GC time in it."""
    from mlx_lm.generate import generate_step

    stamps = []
    clock.reset()
    for _ in zip(range(tokens), generate_step(prompt, model, max_tokens=tokens)):
        stamps.append(time.perf_counter())
    dts = sorted(b - a for a, b in zip(stamps, stamps[1:]))
    return {"mean_ms": (stamps[-1] - stamps[0]) / (len(stamps) - 1) * 1e3,
            "median_ms": statistics.median(dts) * 1e3, "p90_ms": dts[int(0.9 * len(dts))] * 1e3,
            "max_ms": dts[-1] * 1e3, "gc_ms": {g: v * 1e3 for g, v in clock.seconds.items()},
            "gc_count": dict(clock.count)}


def build_profile(model, prompt: mx.array, steps: int = 16, top: int = 25) -> str:
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    mx.eval(model(prompt[None], cache=cache))
    token = prompt[-1:][None]
    prof = cProfile.Profile()
    for _ in range(steps):
        prof.enable()
        logits = model(token, cache=cache)
        prof.disable()
        token = mx.argmax(logits[:, -1, :], axis=-1)[:, None]
        mx.eval(token)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--variants", nargs="+", default=["fp16", "mlx_4bit_g64", "fp4", "fp4-unfused"])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=0,
                        help="after the per-variant parts: rounds of per-token decode timings, variants in turn")
    parser.add_argument("--tag", default="", help="a label for this process's settings (e.g. the launch path)")
    parser.add_argument("--small", action="store_true", help="a tiny model, to try the script")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    margs = model_bench.llama_args(args.layers, args.small)
    base = dict(tree_flatten(model_bench.build(margs, None).parameters()))
    prompt = mx.random.randint(0, margs.vocab_size, (32,))
    rows, models = [], {}
    for variant in args.variants:
        model = model_bench.build(margs, base)
        model_bench.convert_variant(model, variant)
        model_bench.decode_once(model, prompt, 8)  # compiles every kernel of a decode step
        if args.rounds:
            models[variant] = model
        row = {"variant": variant, **model_bench.step_parts(model, prompt, args.steps)}
        row["decode_ms"] = statistics.median(model_bench.decode_once(model, prompt, args.decode_tokens)
                                             for _ in range(3)) * 1e3
        row["graph"] = model_bench.graph_counts(model, prompt)
        row["graph_nodes"] = sum(row["graph"].values())
        row["profile"] = build_profile(model, prompt)
        rows.append(row)
        print(f"{args.tag} {variant:>13}: build {row['build']:.2f} encode {row['encode']:.2f} "
              f"wait {row['wait']:.2f} | pipelined decode {row['decode_ms']:.2f} ms/token | "
              f"{row['graph_nodes']} primitives: "
              + ", ".join(f"{k} {v}" for k, v in list(row["graph"].items())[:8]), flush=True)
        del model
    clock = GCClock()
    rounds = []
    for r in range(args.rounds):
        for variant, model in models.items():
            got = {"round": r + 1, "variant": variant, **token_times(model, prompt, args.decode_tokens, clock)}
            rounds.append(got)
            print(f"{args.tag} round {r + 1} {variant:>13}: mean {got['mean_ms']:.2f} median {got['median_ms']:.2f} "
                  f"p90 {got['p90_ms']:.2f} max {got['max_ms']:.2f} ms/token, gc "
                  + ", ".join(f"gen{g} {got['gc_count'][g]}x {ms:.1f} ms" for g, ms in sorted(got["gc_ms"].items())),
                  flush=True)
    for row in rows:
        print(f"\n==== {args.tag} {row['variant']}: build profile\n" + row["profile"][:3500])
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        doc = {"device": mx.device_info() if hasattr(mx, "device_info") else str(mx.default_device()),
               "mlx": mx.__version__, "date": date.today().isoformat(), "layers": args.layers,
               "tag": args.tag, "rows": rows, "rounds": rounds}
        name = f"decode_host_probe{'_' + args.tag if args.tag else ''}.json"
        (args.out / name).write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
