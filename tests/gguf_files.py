"""Tiny llama GGUF files written with the gguf package's own writer (nothing downloaded), the
way llama.cpp's converter lays a Hugging Face llama out: q and k rows permuted for its
interleaved RoPE, and Q4_K_M's mix of types (Q6_K for the output, attn_v and ffn_down of the
first layer, Q4_K elsewhere, F32 norms)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from mlx.utils import tree_flatten

from marlin_dsl.formats.checkpoint import gguf_format
from marlin_dsl.formats.quantize import quantize
from marlin_dsl.models.imports import GGUF_BLOCK_NAMES, GGUF_TOP_NAMES

from tiny_models import CONFIG, tiny_llama


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute: HF's rotate-half rows to the
    interleaved pairs of its RoPE."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_cpp_unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def q4_k_m_type(name: str) -> str:
    """The GGUF type of a 2-D tensor in this tiny Q4_K_M."""
    if name == "output.weight" or name in ("blk.0.attn_v.weight", "blk.0.ffn_down.weight"):
        return "Q6_K"
    return "Q4_K"


def hf_to_gguf_names() -> dict[str, str]:
    out = {f"{v}.weight": f"{k}.weight" for k, v in GGUF_TOP_NAMES.items()}
    for i in range(CONFIG["num_hidden_layers"]):
        out.update({f"model.layers.{i}.{v}.weight": f"blk.{i}.{k}.weight" for k, v in GGUF_BLOCK_NAMES.items()})
    return out


def write_tiny_gguf(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """A tiny llama as a Q4_K_M .gguf file; returns the HF float weights it was made from."""
    import gguf

    model = tiny_llama(seed)
    hf = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    names = hf_to_gguf_names()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(CONFIG["num_hidden_layers"])
    writer.add_context_length(512)
    writer.add_embedding_length(CONFIG["hidden_size"])
    writer.add_feed_forward_length(CONFIG["intermediate_size"])
    writer.add_head_count(CONFIG["num_attention_heads"])
    writer.add_head_count_kv(CONFIG["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(CONFIG["rms_norm_eps"])
    writer.add_rope_freq_base(CONFIG["rope_theta"])
    for hf_name, w in sorted(hf.items()):
        name = names[hf_name]
        if w.ndim == 1:
            writer.add_tensor(name, w.astype(np.float32))
            continue
        if ".attn_q." in name:
            w = llama_cpp_permute(w, CONFIG["num_attention_heads"])
        elif ".attn_k." in name:
            w = llama_cpp_permute(w, CONFIG["num_key_value_heads"])
        type_name = q4_k_m_type(name)
        cf = gguf_format(type_name)
        records = cf.write(quantize(cf.format, w.T.astype(np.float64)))["weight"]
        writer.add_tensor(name, records, raw_dtype=getattr(gguf.GGMLQuantizationType, type_name))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return hf
