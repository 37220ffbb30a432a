"""Quantised checkpoints of the ecosystem as marlin-dsl models, bit for bit: a `.gguf` file
(llama.cpp; read with the `gguf` package) and a Hugging Face-style model directory whose
config carries a GPTQ or AWQ `quantization_config`. The model is mlx-lm's own class for the
config, every quantised linear a `MarlinLinear.from_checkpoint` in the tensor's checkpoint
format (formats/checkpoint/), everything else loaded as it is; `save_model` then writes a
directory that `models.load` and mlx-lm load.

GGUF: metadata becomes an mlx-lm llama config. llama.cpp stores q and k projections with
rows permuted for its interleaved RoPE, so the config asks mlx-lm for that RoPE
(`rope_traditional: true`) instead of permuting rows back. Float tensors (F32, F16, BF16) load as
floats; a quantised token embedding is dequantised (mlx-lm's embedding is a float table).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from ..errors import MarlinDSLError, ShapeError
from ..formats.checkpoint import CheckpointFormat, Packed, awq, gguf_format, gptq
from ..formats.reference import dequantize
from ..nn import Backend, MarlinLinear
from .mlx_lm_env import require_mlx_lm

#: GGUF tensor names (blk.N.<name>) -> mlx-lm llama's module paths (model.layers.N.<path>).
GGUF_BLOCK_NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
                    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
GGUF_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
FLOAT_TYPES = ("F32", "F16", "BF16")


def gguf_path_name(name: str) -> str:
    """A GGUF tensor name's mlx-lm parameter name ("blk.3.ffn_up.weight" ->
    "model.layers.3.mlp.up_proj.weight"); a MarlinDSLError for a name it does not know."""
    base, _, leaf = name.rpartition(".")
    parts = base.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in GGUF_BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{GGUF_BLOCK_NAMES[parts[2]]}.{leaf}"
    if base in GGUF_TOP_NAMES:
        return f"{GGUF_TOP_NAMES[base]}.{leaf}"
    raise MarlinDSLError(f"{name}: a GGUF tensor marlin-dsl does not map to mlx-lm's llama")


def gguf_config(fields: Mapping[str, Any], vocab_size: int, tied: bool) -> dict[str, Any]:
    """An mlx-lm llama config from GGUF metadata (key -> value)."""
    arch = fields.get("general.architecture")
    if arch != "llama":
        raise MarlinDSLError(f"general.architecture: {arch!r}; marlin-dsl reads llama-family GGUF files")

    def need(key: str) -> Any:
        if f"llama.{key}" not in fields:
            raise MarlinDSLError(f"llama.{key}: missing from the GGUF metadata")
        return fields[f"llama.{key}"]

    heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    return {"model_type": "llama", "hidden_size": hidden, "num_hidden_layers": int(need("block_count")),
            "intermediate_size": int(need("feed_forward_length")), "num_attention_heads": heads,
            "num_key_value_heads": int(fields.get("llama.attention.head_count_kv", heads)),
            "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")), "vocab_size": int(vocab_size),
            "rope_theta": float(fields.get("llama.rope.freq_base", 10000.0)), "rope_traditional": True,
            "head_dim": int(fields.get("llama.attention.key_length", hidden // heads)),
            "max_position_embeddings": int(fields.get("llama.context_length", 2048)),
            "tie_word_embeddings": tied}


def _field_value(field: Any) -> Any:
    """A GGUFReader field's value (a scalar or a string; arrays are not needed here)."""
    import gguf

    kind = field.types[0] if field.types else None
    if kind == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    if kind == gguf.GGUFValueType.ARRAY:
        return len(field.data)
    return field.parts[field.data[0]][0].item()


def read_gguf(path: str | Path, backend: Backend = "auto") -> tuple[nn.Module, dict[str, Any]]:
    """(model, config) of a llama-family .gguf file: MarlinLinear layers for quantised linear
    tensors, in their GGUF type's checkpoint format, bit for bit."""
    try:
        import gguf
    except ImportError:
        raise MarlinDSLError("reading .gguf files needs the gguf package: pip install gguf") from None
    require_mlx_lm("marlin_dsl.models.read_gguf")
    reader = gguf.GGUFReader(str(path))
    fields = {name: _field_value(f) for name, f in reader.fields.items() if not name.startswith("tokenizer.")}
    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise MarlinDSLError(f"{path}: token_embd.weight: missing (not a llama GGUF file?)")
    vocab = int(tensors["token_embd.weight"].shape[1])
    config = gguf_config(fields, vocab, tied="output.weight" not in tensors)
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    floats, layers = {}, []
    for name, t in tensors.items():
        target = gguf_path_name(name)
        type_name = t.tensor_type.name
        k, n = (int(d) for d in t.shape[:2]) if len(t.shape) > 1 else (int(t.shape[0]), 1)
        if type_name in FLOAT_TYPES:
            data = np.asarray(t.data)
            floats[target] = mx.array(data.astype(np.float32) if data.dtype != np.float32 else data).reshape(
                (n, k) if len(t.shape) > 1 else (k,))
            continue
        cf = gguf_format(type_name)
        tensors_of = {"weight": np.asarray(t.data)}
        if name == "token_embd.weight":  # a float table in mlx-lm
            w = dequantize(cf.read(tensors_of, (k, n), f"{name}:").weights)
            floats[target] = mx.array(w.T.astype(np.float32))
            continue
        module_path = target.rpartition(".")[0]
        layers.append((module_path, MarlinLinear.from_checkpoint(tensors_of, cf, (k, n), name=name + ":",
                                                                 backend=backend)))
    _install(model, layers, floats, str(path))
    return model, config


def read_hf_quantized(path: str | Path, backend: Backend = "auto") -> tuple[nn.Module, dict[str, Any]]:
    """(model, config) of a model directory with a GPTQ or AWQ quantization_config."""
    require_mlx_lm("marlin_dsl.models.read_hf_quantized")
    directory = Path(path)
    config = json.loads((directory / "config.json").read_text())
    qc = dict(config.pop("quantization_config", None) or {})
    cf = checkpoint_format_of(qc, directory / "config.json")
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    weights: dict[str, mx.array] = {}
    for file in sorted(directory.glob("*.safetensors")):
        weights.update(mx.load(str(file)))
    quantised = sorted({name.rpartition(".")[0] for name in weights if name.endswith(".qweight")})
    layers = []
    for module_path in quantised:
        tensors = {}
        for t in cf.names:
            key = f"{module_path}.{t}"
            if key in weights:
                tensors[t] = np.array(weights.pop(key))
        missing = [t for t in cf.names if t not in tensors]
        if missing and qc.get("desc_act") and "g_idx" in missing:
            raise ShapeError(f"{module_path}.g_idx: missing, and quantization_config has desc_act: true "
                             f"(the rows' groups are unknown without it)")
        if missing == ["g_idx"]:  # no act-order: the groups are k // G, the map says that
            tensors["g_idx"] = _trivial_g_idx(tensors, cf)
        bias = weights.pop(f"{module_path}.bias", None)
        k, n = _hf_shape(tensors, cf, f"{module_path}.")
        layers.append((module_path, MarlinLinear.from_checkpoint(tensors, cf, (k, n), bias, name=module_path,
                                                                 backend=backend)))
    _install(model, layers, weights, str(directory))
    return model, config


def checkpoint_format_of(qc: Mapping[str, Any], where: object) -> CheckpointFormat:
    """The checkpoint format a quantization_config describes (GPTQ or AWQ)."""
    method = str(qc.get("quant_method", "")).lower()
    bits, group = int(qc.get("bits", qc.get("w_bit", 4))), int(qc.get("group_size", qc.get("q_group_size", 128)))
    if method == "gptq":
        version = 2 if str(qc.get("checkpoint_format", "gptq")).lower() == "gptq_v2" else 1
        return gptq(bits, group, version)
    if method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise MarlinDSLError(f"{where}: quantization_config.version {version!r}: marlin-dsl reads AWQ's GEMM layout")
        return awq(bits, group)
    raise MarlinDSLError(f"{where}: quantization_config.quant_method {method!r}; marlin-dsl reads 'gptq' and 'awq' "
                         f"model directories (and .gguf files)")


def _trivial_g_idx(tensors: dict[str, np.ndarray], cf: CheckpointFormat) -> np.ndarray:
    k, _ = _hf_shape(tensors, cf, "")
    g = cf.format.group_size_for(k)
    return (np.arange(k) // g).astype(np.int32)


def _hf_shape(tensors: dict[str, np.ndarray], cf: CheckpointFormat, prefix: str) -> tuple[int, int]:
    """(K, N) from the codes tensor, as its `Words` declaration packs them (GPTQ's qweight
    [K*bits/32, N] along K, AWQ's [K, N*bits/32] along N)."""
    codes = next(e for e in cf.tensors if isinstance(e, Packed) and e.into == "codes")
    q = tensors.get(codes.tensor)
    if q is None or np.ndim(q) != 2:
        raise ShapeError(f"{prefix}{codes.tensor}: missing or not a matrix")
    rows, cols = (int(d) for d in (q.shape[::-1] if codes.words.transposed else q.shape))
    per = codes.words.per_word
    return (rows * per, cols) if codes.words.axis == "K" else (rows, cols * per)


def _install(model: nn.Module, layers: list[tuple[str, MarlinLinear]], floats: Mapping[str, mx.array],
             source: str) -> None:
    model.update_modules(tree_unflatten(layers))
    expected = {name for name, _ in tree_flatten(model.parameters())}
    unknown = sorted(set(floats) - expected)
    if unknown:
        raise MarlinDSLError(f"{source}: tensor {unknown[0]!r} has no place in mlx-lm's "
                             f"{type(model).__module__.rpartition('.')[2]} model")
    model.load_weights(list(floats.items()), strict=False)
    given = set(floats) | {f"{p}.{n}" for p, layer in layers for n, _ in tree_flatten(layer.parameters())}
    missing = sorted(expected - given)
    if missing:
        raise MarlinDSLError(f"{source}: no tensor for {missing[0]!r}")
    mx.eval(model.parameters())


__all__ = ["checkpoint_format_of", "gguf_config", "gguf_path_name", "read_gguf", "read_hf_quantized"]
