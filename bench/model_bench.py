"""A whole mlx-lm model with marlin-dsl layers against the same model in fp16 and with mlx-lm's
own 4-bit layers: decode tokens/s, prefill time and conversion time.

Run on the GPU machine with MLX's CUDA backend and mlx-lm (see /work/shared/GPU.md). The model
is mlx-lm's own `llama` code built from a Llama-3-8B-shaped config (hidden 4096, intermediate
14336, 32 query / 8 KV heads, vocabulary 128256) with random fp16 weights; nothing is
downloaded. Every variant starts from the same fp16 weights:

- fp16: as built;
- mlx_4bit_g64: `nn.quantize(model, 64, 4)` on the transformer blocks' linear layers;
- fp4, uint4_zp, nf4, fp4_2of4: `marlin_dsl.models.convert` on the same layers (q/k/v and
  gate/up fused, the default); fp4-unfused: each linear layer on its own.

The embedding and lm_head stay fp16 in every variant (the same bytes for all). Decode:
`mlx_lm.generate.generate_step` from a 32-token prompt, after a warm-up generation; the rate
is over tokens 2..N (the first includes the prefill). Prefill: the time to the first token of
`generate_step` for a 512- and a 2048-token prompt. All variants are built and warmed up
first, then measured in turns, `--repeats` rounds; the medians are reported. Batched decode
(`--batch 16 32`): mlx-lm's continuous batching (`mlx_lm.generate.BatchGenerator`, what
`mlx_lm.server` serves with) generating `--batch-tokens` tokens for each of B 32-token prompts
at once; the rate is its own generated tokens per second of generation time (prompt processing
excluded), all B streams together. Graph build:
the Python time of one decode step's forward (building the graph, not evaluating it), which
`generate_step` overlaps with the device's work of the step before. Host work: one step's build
plus encode (`mx.async_eval`), and its graph's primitives counted by name (`mx.export_to_dot`).

    python bench/model_bench.py --layers 32 --out bench/results/model_h100_DATE
"""
from __future__ import annotations

import argparse
import collections
import io
import json
import platform
import re
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

VARIANTS = ("fp16", "mlx_4bit_g64", "fp4", "uint4_zp", "nf4", "fp4_2of4", "fp4-noblocks", "fp4-unfused")


def llama_args(layers: int, small: bool = False):
    """Llama-3-8B's dimensions (or, with `small`, a tiny model to try the script on a CPU)."""
    from mlx_lm.models import llama

    if small:
        return llama.ModelArgs(model_type="llama", hidden_size=256, num_hidden_layers=layers,
                               intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                               rms_norm_eps=1e-5, vocab_size=1024, tie_word_embeddings=False, head_dim=64)
    return llama.ModelArgs(model_type="llama", hidden_size=4096, num_hidden_layers=layers,
                           intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                           rms_norm_eps=1e-5, vocab_size=128256, rope_theta=500000.0,
                           tie_word_embeddings=False, head_dim=128)


def block_linear(path: str, module: nn.Module) -> bool:
    """The transformer blocks' linear layers (not the lm_head)."""
    return isinstance(module, nn.Linear) and ".layers." in f".{path}"


#: the dtype of the model's weights and activations (--dtype)
DTYPE = mx.float16


def build(args, weights: dict | None):
    """A model skeleton (lazy random init, never evaluated) holding the shared weights (DTYPE)."""
    from mlx_lm.models import llama

    model = llama.Model(args)
    if weights is None:
        model.set_dtype(DTYPE)
        mx.eval(model.parameters())
    else:
        model.update(tree_unflatten(list(weights.items())))
    return model


def convert_variant(model: nn.Module, variant: str) -> float:
    """Convert the block linears in place; returns seconds (evaluated)."""
    t0 = time.perf_counter()
    if variant == "mlx_4bit_g64":
        nn.quantize(model, group_size=64, bits=4, class_predicate=block_linear)
        mx.eval(model.parameters())
    elif variant != "fp16":
        from marlin_dsl.models import convert

        # "fp4-unfused": q/k/v and gate/up separately; "fp4-noblocks": fused groups, but no
        # epilogues in the kernels (models/fused_block.py: silu * up and the residual in MLX ops)
        name, _, option = variant.partition("-")
        convert(model, lambda path, module: name if block_linear(path, module) else None,
                **({"fuse": (), "blocks": False} if option == "unfused" else
                   {"blocks": False} if option == "noblocks" else {}))
        mx.eval(model.parameters())
    return time.perf_counter() - t0


def decode_once(model: nn.Module, prompt: mx.array, tokens: int) -> float:
    """Seconds per token of one `generate_step` generation (tokens 2..N)."""
    from mlx_lm.generate import generate_step

    stamps = []
    for _ in zip(range(tokens), generate_step(prompt, model, max_tokens=tokens)):
        stamps.append(time.perf_counter())
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


def graph_build_time(model: nn.Module, prompt: mx.array, steps: int = 32) -> float:
    """Seconds of Python (building one decode step's graph, not evaluating it) per token: the
    host work that generate_step overlaps with the device's."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    mx.eval(model(prompt[None], cache=cache))
    token = prompt[-1:][None]
    total = 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        logits = model(token, cache=cache)
        total += time.perf_counter() - t0
        token = mx.argmax(logits[:, -1, :], axis=-1)[:, None]
        mx.eval(token)
    return total / steps


def step_parts(model, prompt: mx.array, steps: int) -> dict[str, float]:
    """Median ms of build / encode / wait over `steps` decode steps, one at a time."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    mx.eval(model(prompt[None], cache=cache))
    token = prompt[-1:][None]
    parts = collections.defaultdict(list)
    for _ in range(steps):
        t0 = time.perf_counter()
        logits = model(token, cache=cache)
        token = mx.argmax(logits[:, -1, :], axis=-1)[:, None]
        t1 = time.perf_counter()
        mx.async_eval(token)
        t2 = time.perf_counter()
        mx.eval(token)
        t3 = time.perf_counter()
        parts["build"].append(t1 - t0)
        parts["encode"].append(t2 - t1)
        parts["wait"].append(t3 - t2)
    return {k: statistics.median(v) * 1e3 for k, v in parts.items()}


def graph_counts(model, prompt: mx.array) -> dict[str, int]:
    """Primitives of one decode step's graph by name (evaluated arrays are leaves)."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    mx.eval(model(prompt[None], cache=cache))
    logits = model(prompt[-1:][None], cache=cache)
    token = mx.argmax(logits[:, -1, :], axis=-1)
    buf = io.StringIO()
    mx.export_to_dot(buf, token)
    counts = collections.Counter(re.findall(r'label ="([^"]+)"', buf.getvalue()))
    mx.eval(token)
    return dict(counts.most_common())


def batched_decode_once(model: nn.Module, batch: int, tokens: int, vocab: int) -> dict:
    """Continuous batching as mlx-lm serves: B fresh 32-token prompts, `tokens` each, greedy,
    no stop tokens. Returns generated tokens per second (all streams, generation time only)
    and the prompt tokens per second of its prefill."""
    from mlx_lm.generate import BatchGenerator

    prompts = mx.random.randint(0, vocab, (batch, 32)).tolist()
    gen = BatchGenerator(model, max_tokens=tokens, completion_batch_size=batch, prefill_batch_size=batch)
    try:
        gen.insert(prompts, [tokens] * batch)
        with gen.stats() as stats:
            while gen.next_generated():
                pass
    finally:
        gen.close()
    return {"tokens_per_s": stats.generation_tps, "prompt_tokens_per_s": stats.prompt_tps,
            "generated": stats.generation_tokens}


def prefill_once(model: nn.Module, length: int, vocab: int) -> float:
    """Seconds to the first token of `generate_step` for a fresh random prompt."""
    from mlx_lm.generate import generate_step

    prompt = mx.random.randint(0, vocab, (length,))
    mx.eval(prompt)
    t0 = time.perf_counter()
    token, _ = next(generate_step(prompt, model, max_tokens=1))
    mx.eval(token)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--prefill", type=int, nargs="*", default=[512, 2048])
    parser.add_argument("--batch", type=int, nargs="*", default=[],
                        help="batch sizes of a batched (continuous batching) decode, e.g. 16 32")
    parser.add_argument("--batch-tokens", type=int, default=64, help="tokens per stream of a batched decode")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--commit", default=None, help="the commit measured (default: git's HEAD)")
    parser.add_argument("--small", action="store_true", help="a tiny model, to try the script")
    parser.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16",
                        help="the model's dtype (the \"fp16\" variant is the unquantised model in it)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    global DTYPE
    DTYPE = getattr(mx, args.dtype)
    margs = llama_args(args.layers, args.small)
    t0 = time.perf_counter()
    base = dict(tree_flatten(build(margs, None).parameters()))
    print(f"fp16 model: {args.layers} layers, {sum(a.nbytes for a in base.values()) / 1e9:.1f} GB, "
          f"built in {time.perf_counter() - t0:.1f} s", flush=True)
    # Every variant is converted and warmed up first and then measured in turns (round r
    # measures every variant once): the host's speed drifts over minutes, and a decode that is
    # bound by host time would otherwise compare runs taken under different conditions.
    models, rows = {}, {}
    prompt = mx.random.randint(0, margs.vocab_size, (32,))
    for variant in args.variants:
        model = build(margs, base)
        seconds = convert_variant(model, variant)
        size = sum(a.nbytes for _, a in tree_flatten(model.parameters()))
        t0 = time.perf_counter()
        decode_once(model, prompt, 8)  # compiles every kernel a decode step launches
        for length in args.prefill:
            prefill_once(model, length, margs.vocab_size)
        for b in args.batch:
            batched_decode_once(model, b, 4, margs.vocab_size)
        models[variant] = model
        rows[variant] = {"variant": variant, "convert_s": seconds, "weight_gb": size / 1e9,
                         "warmup_s": time.perf_counter() - t0, "decode": [],
                         **{f"prefill_{n}": [] for n in args.prefill}, **{f"batch_{b}": [] for b in args.batch}}
        print(f"{variant:>13}: converted in {seconds:6.1f} s, {size / 1e9:5.2f} GB, "
              f"warm-up {rows[variant]['warmup_s']:5.1f} s", flush=True)
    for r in range(args.repeats):
        for variant, model in models.items():
            rows[variant]["decode"].append(decode_once(model, prompt, args.decode_tokens))
            for length in args.prefill:
                rows[variant][f"prefill_{length}"].append(prefill_once(model, length, margs.vocab_size))
            for b in args.batch:
                rows[variant][f"batch_{b}"].append(batched_decode_once(model, b, args.batch_tokens, margs.vocab_size))
        print(f"round {r + 1}: " + ", ".join(f"{v} {rows[v]['decode'][-1] * 1e3:.2f}" for v in models)
              + " ms/token", flush=True)
    for variant, model in models.items():
        row = rows[variant]
        per_token = statistics.median(row["decode"])
        graph = graph_counts(model, prompt)
        parts = step_parts(model, prompt, 32)
        row.update({"decode_ms_per_token": per_token * 1e3, "decode_tokens_per_s": 1.0 / per_token,
                    "decode_ms_all": [t * 1e3 for t in row.pop("decode")],
                    "graph_build_ms_per_token": graph_build_time(model, prompt) * 1e3,
                    # one token's step taken apart (build, encode, wait) and its graph's primitives
                    "step_ms": parts, "host_ms_per_token": parts["build"] + parts["encode"],
                    "primitives_per_token": sum(graph.values()), "primitives": graph})
        for length in args.prefill:
            times = row.pop(f"prefill_{length}")
            row[f"prefill_{length}_ms"] = statistics.median(times) * 1e3
            row[f"prefill_{length}_ms_all"] = [t * 1e3 for t in times]
        for b in args.batch:
            runs = row.pop(f"batch_{b}")
            row[f"batch_{b}_tokens_per_s"] = statistics.median(r["tokens_per_s"] for r in runs)
            row[f"batch_{b}_all"] = runs
        print(f"{variant:>13}: decode {row['decode_ms_per_token']:6.2f} ms/token "
              f"({row['decode_tokens_per_s']:6.1f} tok/s, graph build {row['graph_build_ms_per_token']:5.2f} ms, "
              f"host {row['host_ms_per_token']:5.2f} ms, {row['primitives_per_token']} primitives), "
              + ", ".join([f"prefill {n}: {row[f'prefill_{n}_ms']:7.1f} ms" for n in args.prefill]
                          + [f"batch {b}: {row[f'batch_{b}_tokens_per_s']:7.1f} tok/s" for b in args.batch]), flush=True)
    rows = list(rows.values())
    ref = {r["variant"]: r for r in rows}.get("mlx_4bit_g64")
    if ref:
        print("\nagainst mlx-lm 4-bit (decode tokens/s ratio; prefill time ratio, < 1 is faster):")
        for r in rows:
            print(f"  {r['variant']:>13}: decode x{r['decode_tokens_per_s'] / ref['decode_tokens_per_s']:.2f}, "
                  + ", ".join([f"prefill {n} x{r[f'prefill_{n}_ms'] / ref[f'prefill_{n}_ms']:.2f}" for n in args.prefill]
                              + [f"batch {b} x{r[f'batch_{b}_tokens_per_s'] / ref[f'batch_{b}_tokens_per_s']:.2f}"
                                 for b in args.batch]))
    doc = {"device": mx.device_info() if hasattr(mx, "device_info") else str(mx.default_device()),
           "mlx": mx.__version__, "dtype": args.dtype, "date": date.today().isoformat(), "python": platform.python_version(),
           "commit": args.commit or _git_commit(), "layers": args.layers, "decode_tokens": args.decode_tokens,
           "batch_tokens": args.batch_tokens, "repeats": args.repeats,
           "rows": rows}
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "model_bench.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return 0


def _git_commit() -> str:
    from marlin_dsl.benchmarks.provenance import git_commit

    return git_commit(Path(__file__).parent)


if __name__ == "__main__":
    sys.exit(main())
