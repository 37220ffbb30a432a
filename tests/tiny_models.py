"""A tiny mlx-lm llama (random weights, built from a config) and a tiny tokenizer written as a
model directory, as a user's source model looks: nothing is downloaded."""
from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

CONFIG = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "intermediate_size": 512,
          "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 384,
          "rope_theta": 10000.0, "tie_word_embeddings": False, "head_dim": 64}
LINEARS = 2 * 7 + 1  # q, k, v, o, gate, up, down per block, and the lm_head
WORDS = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(CONFIG["vocab_size"] - 3)]


def tiny_llama(seed: int = 0, dtype: mx.Dtype = mx.float32) -> nn.Module:
    from mlx_lm.models import llama

    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(CONFIG))
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


#: A tiny mlx-lm Qwen2: q/k/v projections with biases (q 256, k and v 128 output features),
#: o_proj, the MLP and the lm_head without.
QWEN2_CONFIG = {"model_type": "qwen2", "hidden_size": 256, "num_hidden_layers": 2, "intermediate_size": 512,
                "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "vocab_size": 384,
                "rope_theta": 1000000.0, "tie_word_embeddings": False, "max_position_embeddings": 512}


def tiny_qwen2(seed: int = 0, dtype: mx.Dtype = mx.float32) -> nn.Module:
    """mlx-lm's Qwen2 from QWEN2_CONFIG, random weights; the biases random too (nn.Linear
    draws them like the weights), so that a bias lost or misplaced changes the logits."""
    from mlx_lm.models import qwen2

    mx.random.seed(seed)
    model = qwen2.Model(qwen2.ModelArgs.from_dict(QWEN2_CONFIG))
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def write_tokenizer(directory: Path) -> None:
    """A word-level tokenizer over WORDS (tokenizer.json, tokenizer_config.json), as
    transformers writes one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(str(directory))


def write_source(directory: Path, model: nn.Module | None = None, dtype: mx.Dtype = mx.float16,
                 tokenizer: bool = True) -> Path:
    """An mlx-lm model directory (weights, config.json, tokenizer) of `model` (default: a
    fresh tiny llama in `dtype`)."""
    from mlx_lm.utils import save_config
    from mlx_lm.utils import save_model as save_mlx_lm

    save_mlx_lm(directory, model if model is not None else tiny_llama(dtype=dtype))
    save_config(dict(CONFIG), directory / "config.json")
    if tokenizer:
        write_tokenizer(directory)
    else:
        (directory / "tokenizer_config.json").write_text(json.dumps({}) + "\n")
    return directory


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` by relative path, with its bytes."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}
