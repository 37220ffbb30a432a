"""Converted models on disk: a model directory as mlx-lm writes one (safetensors shards and
config.json), whose config carries a `marlin_dsl` section naming the format of every
converted layer, and a small `marlin_dsl_model.py` through which mlx-lm's own loader builds
the model with marlin-dsl's layers (config "model_file"; mlx-lm runs it only when asked to
trust the directory's code).

Packed arrays are written in each format's *linear* layout (what `marlin_dsl.pack` writes and
`validate` checks), whatever layout the layers hold in memory, so one directory loads on any
target; loading (models/loading.py) validates every array once and converts it to the
target's layout.

    "marlin_dsl": {
      "version": "0.1.0",
      "formats": ["format fp4 {\\n  element float(...)\\n ...}\\n", ...],   # textual form
      "layers": {"model.layers.0.mlp.down_proj": {"format": 0, "bias": false,
                                                   "dtype": "float32"}, ...},
      "fused": {"model.layers.0.mlp": [["gate_proj", "up_proj"]], ...},
      "fused_blocks": ["model.layers.0.mlp", ...]      # optional (models/fused_block.py)
    }

"input_order": true marks a layer with an act-order input permutation (GPTQ's g_idx,
`MarlinLinear.from_checkpoint`), saved as its `input_order` parameter.
"dtype" (optional) is the layer's `source_dtype`: what the layer it replaced computed in. A
fused group (models/fuse.py) is one layer, listed at `<parent>.<part>__<part>.layer`.
"fused_blocks" lists the MLPs whose epilogues run in the kernels (models/fused_block.py); their
gate/up weights are written side by side like any fused group and interleaved again on load.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from ..errors import MarlinDSLError
from ..formats import Format
from ..formats.text import format_to_text, formats_from_text
from ..layers.arguments import dtype_name
from ..nn import MarlinLinear
from .destination import new_directory
from .fuse import FusedLinear, fused_name
from .fused_block import fused_mlps
from .shards import INDEX

SECTION = "marlin_dsl"
CONFIG = "config.json"
#: The file mlx-lm runs (with trust_remote_code) to build the model: config "model_file".
MODEL_FILE = "marlin_dsl_model.py"
MODEL_FILE_TEXT = '''"""Written by marlin-dsl. mlx-lm builds this converted model through it (config.json's
"model_file"; mlx-lm runs it only with trust_remote_code / --trust-remote-code): its own model
class for the config's model_type, with marlin-dsl's layers where config["marlin_dsl"] lists
them. Needs marlin-dsl installed (pip install "marlin-dsl[mlx-lm]")."""
from marlin_dsl.models.mlx_lm_model import Model, ModelArgs  # noqa: F401
'''
#: Shards are cut at this many bytes, as mlx-lm does.
MAX_SHARD_BYTES = 5 << 30


def marlin_section(model: nn.Module) -> dict[str, Any]:
    """The config section that describes the model's MarlinLinear layers."""
    from .._version import __version__

    texts: list[str] = []
    layers = {}
    fused: dict[str, list[list[str]]] = {}
    for path, module in model.named_modules():
        if isinstance(module, MarlinLinear):
            text = format_to_text(module.format)
            if text not in texts:
                texts.append(text)
            entry: dict[str, Any] = {"format": texts.index(text), "bias": "bias" in module}
            if module.source_dtype is not None:
                entry["dtype"] = dtype_name(module.source_dtype)
            if "input_order" in module:
                entry["input_order"] = True
            layers[path] = entry
        elif isinstance(module, FusedLinear):
            parent, _, name = path.rpartition(".")
            fused.setdefault(parent, []).append(name.split("__"))
    blocks = fused_mlps(model)
    return {"version": __version__, "formats": texts, "layers": dict(sorted(layers.items())),
            "fused": dict(sorted(fused.items())), **({"fused_blocks": blocks} if blocks else {})}


def portable_weights(model: nn.Module) -> dict[str, mx.array]:
    """Every parameter by its dotted name, MarlinLinear weights in the linear layout (lazy)."""
    weights = dict(tree_flatten(model.parameters()))
    for path, module in model.named_modules():
        if isinstance(module, MarlinLinear):
            for name, array in module.linear_arrays().items():
                weights[f"{path}.{name}" if path else name] = array
    for path, module in model.named_modules():  # interleaved gate/up pairs: side by side again
        order = module.portable_order() if isinstance(module, FusedLinear) else None
        if order is not None:
            index = mx.array(order.astype(np.uint32))
            prefix = f"{path}.layer." if path else "layer."
            for name in [*module.layer._weight_names, "bias"]:
                if prefix + name in weights:
                    weights[prefix + name] = mx.take(weights[prefix + name], index, axis=-1)
    return weights


def config_from_model(model: nn.Module) -> dict[str, Any]:
    """The config an mlx-lm model was built from: its `args` (a dataclass) as a dict, with
    `model_type`; {} for a model without `args`."""
    args = getattr(model, "args", None)
    if args is None:
        return {}
    config = dataclasses.asdict(args) if dataclasses.is_dataclass(args) else dict(vars(args))
    model_type = config.get("model_type") or getattr(model, "model_type", None)
    if model_type:
        config["model_type"] = model_type
    return config


def save_model(model: nn.Module, path: str | Path, config: dict[str, Any] | None = None, *,
               source_dir: str | Path | None = None, overwrite: bool = False) -> Path:
    """Write `model` as a model directory: safetensors shards (and their index), config.json
    (`config` plus the marlin_dsl section) and, from `source_dir`, every other file of the
    source model (tokenizer, generation config, ...). Returns the directory.

    `config` defaults to the model's own: an mlx-lm model carries the ModelArgs it was built
    from (`model.args`); for another model the config holds the marlin_dsl section only (load
    it with `load_into`). When the config names a `model_type`, the directory also gets the
    model file through which `mlx_lm.load(path, trust_remote_code=True)` builds it.

    The directory is written beside `path` and renamed into place when complete: an error
    leaves `path` as it was. A non-empty `path` is an error unless `overwrite` (and then it
    must be a model directory: it has a config.json)."""
    config = dict(config_from_model(model) if config is None else config)
    with new_directory(path, overwrite) as tmp:
        _write(model, tmp, config, None if source_dir is None else Path(source_dir))
    return Path(path)


def _write(model: nn.Module, out: Path, config: dict[str, Any], source_dir: Path | None) -> None:
    weights = portable_weights(model)
    shards, size = [{}], 0
    for name in sorted(weights):
        nbytes = weights[name].nbytes
        if shards[-1] and size + nbytes > MAX_SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = weights[name]
        size += nbytes
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    weight_map = {}
    for shard_name, shard in zip(names, shards):
        mx.save_safetensors(str(out / shard_name), shard, metadata={"format": "mlx"})
        weight_map.update(dict.fromkeys(shard, shard_name))
    (out / INDEX).write_text(json.dumps(
        {"metadata": {"total_size": sum(w.nbytes for w in weights.values())},
         "weight_map": dict(sorted(weight_map.items()))}, indent=2) + "\n")
    section = marlin_section(model)
    quantization = config.get("quantization")
    if isinstance(quantization, dict):  # mlx-lm's per-layer entries must not name our layers
        ours = set(section["layers"]) | {f"{parent}.{part}" if parent else part
                                         for parent, groups in section["fused"].items()
                                         for parts in groups for part in parts}
        config["quantization"] = {k: v for k, v in quantization.items() if k not in ours}
        config["quantization_config"] = config["quantization"]
    config.pop("model_file", None)  # a loaded converted model's config names ours: written anew
    if config.get("model_type"):
        (out / MODEL_FILE).write_text(MODEL_FILE_TEXT)
        config["model_file"] = MODEL_FILE
    config[SECTION] = section  # replaces a loaded converted model's own
    try:
        text = json.dumps(dict(sorted(config.items())), indent=2) + "\n"
    except TypeError as err:
        raise MarlinDSLError(f"config: cannot be written as JSON ({err})") from None
    (out / CONFIG).write_text(text)
    if source_dir is not None:
        _copy_other_files(source_dir, out)


def _copy_other_files(src: Path, dst: Path) -> None:
    """Tokenizer, generation config, chat template...: everything but weights and config."""
    for item in src.iterdir():
        name = item.name
        if (item.is_file() and name not in (CONFIG, MODEL_FILE) and not name.endswith(".safetensors")
                and not name.endswith(".safetensors.index.json")):
            shutil.copy2(item, dst / name)


def read_section(config: dict[str, Any], where: str) -> tuple[list[Format], dict[str, dict], dict[str, list]]:
    """(formats, layers, fused groups) of a config's marlin_dsl section, or MarlinDSLError
    naming `where`."""
    section = config.get(SECTION)
    if not isinstance(section, dict) or "formats" not in section or "layers" not in section:
        raise MarlinDSLError(f"{where}: no {SECTION!r} section with 'formats' and 'layers': "
                             "not a model converted by marlin-dsl")
    formats = [formats_from_text(text, f"{where}:{SECTION}.formats[{i}]")[0]
               for i, text in enumerate(section["formats"])]
    layers = section["layers"]
    for path, entry in layers.items():
        index = entry.get("format") if isinstance(entry, dict) else None
        if not isinstance(index, int) or not 0 <= index < len(formats):
            raise MarlinDSLError(f"{where}: {SECTION}.layers[{path!r}].format must be an index "
                                 f"into the {len(formats)} formats, got {index!r}")
    fused = section.get("fused", {})
    for parent, groups in fused.items():
        for parts in groups:
            path = f"{parent}.{fused_name(tuple(parts))}.layer" if parent else f"{fused_name(tuple(parts))}.layer"
            if path not in layers:
                raise MarlinDSLError(f"{where}: {SECTION}.fused[{parent!r}] lists {parts}, but "
                                     f"layers has no {path!r}")
    return formats, layers, fused


__all__ = ["CONFIG", "MODEL_FILE", "SECTION", "config_from_model", "marlin_section", "portable_weights",
           "read_section", "save_model"]
