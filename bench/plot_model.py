"""Plot a model_bench.json (bench/model_bench.py): decode tokens/s and prefill time per
variant, with mlx-lm 4-bit as the reference line.

    python bench/plot_model.py bench/results/issue12_h100_2026-11-24/model_bench_D_all_variants.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path: str) -> int:
    doc = json.loads(Path(path).read_text())
    rows = doc["rows"]
    names = [r["variant"] for r in rows]
    prefills = sorted(int(k.split("_")[1]) for k in rows[0] if k.startswith("prefill_") and k.endswith("_ms"))
    fig, axes = plt.subplots(1, 1 + len(prefills), figsize=(4.5 * (1 + len(prefills)), 4))
    ref = {r["variant"]: r for r in rows}.get("mlx_4bit_g64")
    panels = [("decode_tokens_per_s", "decode tokens/s (higher is better)")] + \
             [(f"prefill_{n}_ms", f"prefill {n} tokens, ms (lower is better)") for n in prefills]
    for ax, (key, title) in zip(axes, panels):
        values = [r[key] for r in rows]
        colors = ["#888888" if n in ("fp16", "mlx_4bit_g64") else "#1f77b4" for n in names]
        ax.bar(names, values, color=colors)
        if ref is not None:
            ax.axhline(ref[key], color="#d62728", linestyle="--", linewidth=1, label="mlx-lm 4-bit")
            ax.legend(loc="lower right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", rotation=45, labelsize=8)
    device = doc.get("device_name") or "GPU"
    fig.suptitle(f"mlx-lm llama, Llama-3-8B shape, {doc['layers']} layers: {device}, MLX {doc['mlx']}, "
                 f"{doc['date']}, commit {doc['commit']}", fontsize=10)
    fig.tight_layout()
    out = Path(path).with_suffix(".png")
    fig.savefig(out, dpi=110)
    print(out)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_bench_json", help="a model_bench.json; the plot is written beside it (.png)")
    sys.exit(main(parser.parse_args().model_bench_json))
