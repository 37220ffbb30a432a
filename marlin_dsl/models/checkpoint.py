"""Converted models on disk: a model directory as mlx-lm writes one (safetensors shards and
config.json), whose config carries a `marlin_dsl` section naming the format of every
converted layer, and the loaders that rebuild such a model.

Packed arrays are written in each format's *linear* layout (what `marlin_dsl.pack` writes and
`validate` checks), whatever layout the layers hold in memory, so one directory loads on any
target; loading validates every array once and converts it to the target's layout.

    "marlin_dsl": {
      "version": "0.1.0",
      "formats": ["format fp4 {\\n  element float(...)\\n ...}\\n", ...],   # textual form
      "layers": {"model.layers.0.mlp.down_proj": {"format": 0, "bias": false}, ...},
      "fused": {"model.layers.0.mlp": [["gate_proj", "up_proj"]], ...}
    }

A fused group (models/fuse.py) is one layer, listed at `<parent>.<part>__<part>.layer`.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from ..errors import MarlinDSLError
from ..formats import Format
from ..formats.text import format_to_text, formats_from_text
from ..nn import Backend, MarlinLinear, prepare
from .fuse import FusedLinear, fused_name, install

if TYPE_CHECKING:
    from .convert import Conversion

SECTION = "marlin_dsl"
CONFIG = "config.json"
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
            layers[path] = {"format": texts.index(text), "bias": "bias" in module}
        elif isinstance(module, FusedLinear):
            parent, _, name = path.rpartition(".")
            fused.setdefault(parent, []).append(name.split("__"))
    return {"version": __version__, "formats": texts, "layers": dict(sorted(layers.items())),
            "fused": dict(sorted(fused.items()))}


def portable_weights(model: nn.Module) -> dict[str, mx.array]:
    """Every parameter by its dotted name, MarlinLinear weights in the linear layout (lazy)."""
    weights = dict(tree_flatten(model.parameters()))
    for path, module in model.named_modules():
        if isinstance(module, MarlinLinear):
            for name, array in module.linear_arrays().items():
                weights[f"{path}.{name}" if path else name] = array
    return weights


def save_model(model: nn.Module, path: str | Path, config: dict[str, Any] | None = None, *,
               source_dir: str | Path | None = None) -> Path:
    """Write `model` as a model directory: safetensors shards (and their index), config.json
    (`config` plus the marlin_dsl section) and, from `source_dir`, every other file of the
    source model (tokenizer, generation config, ...). Returns the directory."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
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
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum(w.nbytes for w in weights.values())},
         "weight_map": dict(sorted(weight_map.items()))}, indent=2) + "\n")
    section = marlin_section(model)
    config = dict(config or {})
    quantization = config.get("quantization")
    if isinstance(quantization, dict):  # mlx-lm's per-layer entries must not name our layers
        config["quantization"] = {k: v for k, v in quantization.items() if k not in section["layers"]}
        config["quantization_config"] = config["quantization"]
    config[SECTION] = section
    (out / CONFIG).write_text(json.dumps(dict(sorted(config.items())), indent=2) + "\n")
    if source_dir is not None:
        _copy_other_files(Path(source_dir), out)
    return out


def _copy_other_files(src: Path, dst: Path) -> None:
    """Tokenizer, generation config, chat template...: everything but weights and config."""
    for item in src.iterdir():
        name = item.name
        if (item.is_file() and name != CONFIG and not name.endswith(".safetensors")
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


def _dims(module: object, path: str) -> tuple[int, int]:
    """(K, N) of a linear layer of a freshly built model, or MarlinDSLError."""
    if not isinstance(module, (nn.Linear, nn.QuantizedLinear)):
        raise MarlinDSLError(f"{SECTION}: the model has no linear layer at {path!r} "
                             f"(found {type(module).__name__})")
    n, cols = module["weight"].shape
    return (cols * 32 // module.bits if isinstance(module, nn.QuantizedLinear) else cols), n


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
            layer = MarlinLinear.placeholder(formats[entry["format"]], dims[0][0], sum(n for _, n in dims),
                                             bias=bool(entry.get("bias")), backend=backend)
            install(parent, parts, FusedLinear(layer, tuple(n for _, n in dims)))
            done.add(path)
    replaced = []
    for path, entry in layers.items():
        if path in done:
            continue
        k, n = _dims(modules.get(path), path)
        replaced.append((path, MarlinLinear.placeholder(formats[entry["format"]], k, n,
                                                        bias=bool(entry.get("bias")), backend=backend)))
    model.update_modules(tree_unflatten(replaced))
    return model


def _lookup(model: nn.Module, path: str) -> nn.Module:
    module = model
    for part in path.split(".") if path else []:
        module = module[int(part)] if isinstance(module, list) else module.get(part)
        if module is None:
            raise MarlinDSLError(f"{SECTION}.fused: the model has no module at {path!r}")
    return module


def load_into(model: nn.Module, path: str | Path, backend: Backend = "auto") -> nn.Module:
    """Load a converted directory into a freshly built model of the same architecture (any
    mlx.nn model): placeholders for the listed layers, all weights (strict), then one
    validation and layout conversion per layer (`prepare`)."""
    directory = Path(path)
    config = json.loads((directory / CONFIG).read_text())
    formats, layers, fused = read_section(config, str(directory / CONFIG))
    install_placeholders(model, formats, layers, fused, backend)
    weights: dict[str, mx.array] = {}
    for shard in sorted(directory.glob("model*.safetensors")):
        weights.update(mx.load(str(shard)))
    model.load_weights(list(weights.items()), strict=True)
    return prepare(model)


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
    Needs mlx-lm (`pip install "marlin-dsl[mlx-lm]"`)."""
    from mlx_lm.utils import load_config, load_model

    directory = Path(path)
    classes = mlx_lm_classes(load_config(directory), backend)
    model, config = load_model(directory, lazy=True, get_model_classes=classes)
    prepare(model)
    if not lazy:
        mx.eval(model.parameters())
    return model, config


def convert_directory(src: str | Path, dst: str | Path, format: Any = "fp4", *,
                      group_size: Any = None, backend: Backend = "auto",
                      progress: Any = None) -> "Conversion":
    """Convert an mlx-lm model directory (fp16/bf16/f32, or quantised by MLX) into `dst`:
    load it with mlx-lm (lazily), `convert` its linear layers, `save_model` with the source's
    other files. Returns the Conversion (formats per layer, skipped layers, seconds)."""
    from mlx_lm.utils import load_model

    from .convert import convert

    source = Path(src)
    if not (source / CONFIG).exists():
        raise MarlinDSLError(f"src: {source} is not a model directory (no {CONFIG})")
    if Path(dst).resolve() == source.resolve():
        raise MarlinDSLError("dst: must differ from src (the source's weights are read lazily)")
    model, config = load_model(source, lazy=True)
    conversion = convert(model, format, group_size=group_size, backend=backend, progress=progress)
    save_model(model, dst, config, source_dir=source)
    return conversion


__all__ = ["SECTION", "convert_directory", "install_placeholders", "load", "load_into", "marlin_section",
           "mlx_lm_classes", "portable_weights", "read_section", "save_model"]
