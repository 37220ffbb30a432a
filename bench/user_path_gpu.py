"""The README's model quick start on a GPU, as a user runs it: an mlx-lm model directory (a
Llama-shaped model with random f16 weights and a word-level tokenizer, built here: nothing is
downloaded) -> `marlin-dsl convert` -> `marlin-dsl generate` and `mlx_lm.generate
--trust-remote-code` -> the converted model's logits against the same layers run by MLX ops.

Checks, each recorded in the result file:
- every command exits 0, and the two generators print the same greedy text;
- a converted directory loads through `marlin_dsl.models.load` and through mlx-lm's own `load`;
- logits of a 64-token prefill and of 8 decode steps, on the GPU kernels, against the same
  converted layers computed by MLX ops (`backend="mlx"`: dequantise, then `mx.matmul`), as a
  relative Frobenius error (f16 activations: ~1e-3 is rounding).

    python bench/user_path_gpu.py --out DIR     # on a machine with MLX's CUDA (or Metal) backend
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CONFIG = {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 2, "intermediate_size": 5632,
          "num_attention_heads": 16, "num_key_value_heads": 4, "rms_norm_eps": 1e-5, "vocab_size": 4096,
          "rope_theta": 500000.0, "tie_word_embeddings": False, "head_dim": 128}
WORDS = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(CONFIG["vocab_size"] - 3)]
PROMPT = "w1 w7 w42 w3 w99 w512"


def write_source(directory: Path) -> Path:
    """An mlx-lm model directory: f16 random weights, config.json and a word-level tokenizer."""
    from mlx_lm.models import llama
    from mlx_lm.utils import save_config, save_model
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(CONFIG))
    model.set_dtype(mx.float16)
    mx.eval(model.parameters())
    save_model(directory, model)
    save_config(dict(CONFIG), directory / "config.json")
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(str(directory))
    return directory


def run(args: list[str]) -> dict:
    t0 = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, timeout=900)
    return {"command": " ".join(args[2:]), "returncode": done.returncode, "seconds": time.perf_counter() - t0,
            "stdout": done.stdout[-2000:], "stderr": done.stderr[-2000:]}


def rel(a: mx.array, b: mx.array) -> float:
    a, b = a.astype(mx.float32), b.astype(mx.float32)
    return float((mx.linalg.norm(a - b) / mx.linalg.norm(b)).item())


def logits_errors(dst: Path) -> dict:
    """Prefill (64 tokens) and 8 greedy decode steps: GPU kernels against MLX ops."""
    from mlx_lm.models.cache import make_prompt_cache

    from marlin_dsl.models import load

    ours, _ = load(dst)                  # the device's kernels
    ops, _ = load(dst, backend="mlx")    # the same packed layers by MLX ops
    prompt = mx.random.randint(3, CONFIG["vocab_size"], (1, 64))
    c1, c2 = make_prompt_cache(ours), make_prompt_cache(ops)
    a, b = ours(prompt, cache=c1), ops(prompt, cache=c2)
    errors = {"prefill_64": rel(a, b)}
    token = mx.argmax(b[:, -1, :], axis=-1)[:, None]
    steps = []
    for _ in range(8):
        a, b = ours(token, cache=c1), ops(token, cache=c2)
        steps.append(rel(a, b))
        token = mx.argmax(b[:, -1, :], axis=-1)[:, None]
    errors["decode_steps"] = steps
    errors["decode_max"] = max(steps)
    return errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--commit", default=None)
    args = parser.parse_args()
    py = [sys.executable, "-m"]
    doc = {"device": mx.device_info() if hasattr(mx, "device_info") else str(mx.default_device()),
           "mlx": mx.__version__, "date": date.today().isoformat(), "python": platform.python_version(),
           "commit": args.commit, "config": CONFIG, "commands": [], "variants": {}}
    with tempfile.TemporaryDirectory() as tmp:
        src = write_source(Path(tmp) / "SRC")
        for name, formats in (("fp4", ["--format", "fp4"]),
                              ("mlp_fp4_2of4", ["--format", "mlp=fp4_2of4", "--format", "fp4", "--skip", "lm_head"])):
            dst = Path(tmp) / f"DST_{name}"
            steps = [run(py + ["marlin_dsl", "convert", str(src), str(dst), *formats]),
                     run(py + ["marlin_dsl", "generate", str(dst), "--prompt", PROMPT, "--max-tokens", "12"]),
                     run(py + ["mlx_lm.generate", "--model", str(dst), "--trust-remote-code", "--prompt", PROMPT,
                               "--max-tokens", "12"])]
            doc["commands"] += steps
            ok = all(s["returncode"] == 0 for s in steps)
            ours_text = steps[1]["stdout"].strip()
            theirs = steps[2]["stdout"]  # mlx_lm.generate frames the text with ===== lines and stats
            mlx_lm_text = theirs.split("==========")[1].strip() if theirs.count("==========") >= 2 else theirs
            variant = {"commands_ok": ok, "marlin_dsl_generate": ours_text, "mlx_lm_generate": mlx_lm_text,
                       "same_text": ours_text == mlx_lm_text}
            if ok:
                variant.update(logits_errors(dst))
            doc["variants"][name] = variant
            print(f"{name}: commands {'ok' if ok else 'FAILED'}, same text {variant['same_text']}, "
                  f"prefill rel.err {variant.get('prefill_64', float('nan')):.2e}, "
                  f"decode max {variant.get('decode_max', float('nan')):.2e}", flush=True)
    passed = all(v["commands_ok"] and v["same_text"] and v["prefill_64"] < 1e-2 and v["decode_max"] < 1e-2
                 for v in doc["variants"].values())
    doc["passed"] = passed
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "user_path_gpu.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print("PASS" if passed else "FAIL")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
