"""Loading a converted model directory (models/checkpoint.py writes them): the model's own
architecture built fresh, MarlinLinear placeholders where the config's marlin_dsl section
lists layers, the weights loaded, and every layer validated once and put in its backend's
layout.

Errors are marlin-dsl's own types and name the directory or file and, for a packed array
that fails validation, the shard, the layer and the array
("model.safetensors: model.layers.0.self_attn.o_proj.scales[1, 7] is not finite: nan").
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from ..errors import MarlinDSLError
from ..formats import Format
from ..nn import Backend, MarlinLinear
from .checkpoint import CONFIG, SECTION, read_section
from .fused_block import fuse_blocks
from .fuse import FusedLinear, fused_name, install
from .mlx_lm_env import require_mlx_lm
from .shards import shard_files, tensor_files

#: How the validators name an array: "scales[1, 7] ..." or "weights['scales']: ...".
_ARRAY = re.compile(r"^(?:weights\['(\w+)'\]|(\w+)(?=\[))")


def model_directory(path: str | Path, argument: str = "path") -> tuple[Path, dict[str, Any]]:
    """(the directory, its config.json) or MarlinDSLError naming what is missing."""
    directory = Path(path)
    if not directory.is_dir():
        raise MarlinDSLError(f"{argument}: {directory} is not a directory"
                             + ("" if directory.exists() else " (it does not exist)"))
    config_path = directory / CONFIG
    if not config_path.is_file():
        raise MarlinDSLError(f"{argument}: {directory} is not a model directory (no {CONFIG})")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise MarlinDSLError(f"{config_path}:{err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(config, dict):
        raise MarlinDSLError(f"{config_path}: expected a JSON object")
    return directory, config


def _dims(module: object, path: str) -> tuple[int, int]:
    """(K, N) of a linear layer of a freshly built model, or MarlinDSLError."""
    if not isinstance(module, (nn.Linear, nn.QuantizedLinear)):
        raise MarlinDSLError(f"marlin_dsl: the model has no linear layer at {path!r} "
                             f"(found {type(module).__name__})")
    n, cols = module["weight"].shape
    return (cols * 32 // module.bits if isinstance(module, nn.QuantizedLinear) else cols), n


def _placeholder(fmt: Format, k: int, n: int, entry: dict, backend: Backend) -> MarlinLinear:
    layer = MarlinLinear.placeholder(fmt, k, n, bias=bool(entry.get("bias")), backend=backend)
    layer.source_dtype = entry.get("dtype")
    if entry.get("input_order"):  # an act-order layer (MarlinLinear.from_checkpoint)
        layer.input_order = mx.zeros((k,), dtype=mx.uint32)
        layer.freeze()
    return layer


def install_placeholders(model: nn.Module, formats: list[Format], layers: dict[str, dict],
                         fused: dict[str, list] | None = None, backend: Backend = "auto") -> nn.Module:
    """Replace each listed layer (an nn.Linear or nn.QuantizedLinear of the freshly built
    model, which gives the shape) by an empty MarlinLinear of its format, and each fused group
    by an empty FusedLinear with its slices, to be filled by `load_weights`. Unknown paths are
    an error."""
    modules = dict(tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module))
    done = set()
    for parent_path, groups in (fused or {}).items():
        parent = _lookup(model, parent_path)
        for parts in groups:
            parts = tuple(parts)
            paths = [f"{parent_path}.{p}" if parent_path else p for p in parts]
            dims = [_dims(modules.get(p), p) for p in paths]
            path = f"{parent_path}.{fused_name(parts)}.layer" if parent_path else f"{fused_name(parts)}.layer"
            entry = layers[path]
            layer = _placeholder(formats[entry["format"]], dims[0][0], sum(n for _, n in dims), entry, backend)
            install(parent, parts, FusedLinear(layer, tuple(n for _, n in dims)))
            done.add(path)
    replaced = []
    for path, entry in layers.items():
        if path in done:
            continue
        k, n = _dims(modules.get(path), path)
        replaced.append((path, _placeholder(formats[entry["format"]], k, n, entry, backend)))
    model.update_modules(tree_unflatten(replaced))
    return model


def _lookup(model: nn.Module, path: str) -> nn.Module:
    module = model
    for part in path.split(".") if path else []:
        module = module[int(part)] if isinstance(module, list) else module.get(part)
        if module is None:
            raise MarlinDSLError(f"marlin_dsl.fused: the model has no module at {path!r}")
    return module


def prepare_layers(model: nn.Module, shard_of: dict[str, str] | None = None) -> nn.Module:
    """Validate every MarlinLinear's arrays once and put them in its backend's layout; an
    error names the layer, the array and (given `shard_of`, tensor -> file) the shard."""
    for path, module in model.named_modules():
        if not isinstance(module, MarlinLinear):
            continue
        try:
            module.prepare()
        except MarlinDSLError as err:
            raise _layer_error(err, path, module, shard_of or {}) from None
    return model


def _layer_error(err: MarlinDSLError, path: str, layer: MarlinLinear, shard_of: dict[str, str]) -> MarlinDSLError:
    message = err.message
    match = _ARRAY.match(message)
    array = match and (match.group(1) or match.group(2))
    if array in layer.weight_arrays:
        rest = message[match.end():]  # type: ignore[union-attr]
        tensor = f"{path}.{array}"
        where = f"{shard_of[tensor]}: " if tensor in shard_of else ""
        return type(err)(f"{where}{tensor}{rest}", err.location)
    files = sorted({shard_of[f"{path}.{a}"] for a in layer.weight_arrays if f"{path}.{a}" in shard_of})
    return type(err)(f"{', '.join(files) + ': ' if files else ''}layer {path!r}: {message}", err.location)


def load_into(model: nn.Module, path: str | Path, backend: Backend = "auto") -> nn.Module:
    """Load a converted directory into a freshly built model of the same architecture (any
    mlx.nn model): placeholders for the listed layers, all weights (strict), then one
    validation and layout conversion per layer (`prepare`)."""
    directory, config = model_directory(path)
    formats, layers, fused = read_section(config, str(directory / CONFIG))
    install_placeholders(model, formats, layers, fused, backend)
    shard_of = tensor_files(directory)
    weights: dict[str, mx.array] = {}
    for shard in shard_files(directory):
        weights.update(mx.load(str(shard)))
    try:
        model.load_weights(list(weights.items()), strict=True)
    except MarlinDSLError:
        raise
    except ValueError as err:
        raise MarlinDSLError(f"{directory}: its weights do not fit the model: {err}") from None
    prepare_layers(model, shard_of)
    if config[SECTION].get("fused_blocks"):
        fuse_blocks(model)
    return model


def mlx_lm_classes(config: dict[str, Any], backend: Backend = "auto") -> Callable[[dict], tuple]:
    """A `get_model_classes` for `mlx_lm.utils.load_model` that builds the model with
    MarlinLinear placeholders where the config's marlin_dsl section lists them."""
    from mlx_lm.utils import _get_classes  # mlx-lm's default; there is no public name

    formats, layers, fused = read_section(config, CONFIG)

    def get_classes(config: dict) -> tuple:
        model_class, args_class = _get_classes(config)

        def build(args):
            return install_placeholders(model_class(args), formats, layers, fused, backend)

        return build, args_class

    return get_classes


def load(path: str | Path, backend: Backend = "auto", lazy: bool = False) -> tuple[nn.Module, dict]:
    """Load a model directory written by `save_model` for an mlx-lm model: (model, config).
    Needs mlx-lm (`pip install "marlin-dsl[mlx-lm]"`); runs no code from the directory."""
    require_mlx_lm("marlin_dsl.models.load")
    from mlx_lm.utils import load_model

    directory, config = model_directory(path)
    classes = mlx_lm_classes(config, backend)
    shard_of = tensor_files(directory)
    try:
        # model_file None: our classes, not the directory's marlin_dsl_model.py (same result,
        # without executing a file of the directory).
        model, config = load_model(directory, lazy=True, get_model_classes=classes,
                                   model_config={"model_file": None})
    except MarlinDSLError:
        raise
    except (ValueError, KeyError, TypeError, FileNotFoundError, RuntimeError) as err:
        raise MarlinDSLError(f"{directory}: mlx-lm cannot build or fill the model: "
                             f"{type(err).__name__}: {err}") from None
    config.pop("model_file", None)
    prepare_layers(model, shard_of)
    if config[SECTION].get("fused_blocks"):
        fuse_blocks(model)
    if not lazy:
        mx.eval(model.parameters())
    return model, config


__all__ = ["install_placeholders", "load", "load_into", "mlx_lm_classes", "model_directory", "prepare_layers"]
