"""Convert the linear layers of any `mlx.nn` model to `MarlinLinear`, in place, like
`mlx.nn.quantize` does for MLX's own quantised layers.

The format of each layer comes from a *choice*: one format for all (a built-in name or a
`Format`), rules by layer path (`{"mlp": "fp4_2of4", "*": "fp4"}`: the first pattern that
matches a path or one of its dotted parts wins; `None` leaves the layer as it is), or a
function `(path, module) -> format or None`. `"exact"` loads an `nn.QuantizedLinear` in the
format of its own MLX mode, bit for bit (`layers.interop`); a named format re-quantises it
from its dequantised weight.

Every layer is packed on the device (`mlx_pack.pack_mx`) and put in the backend's layout in
turn, and evaluated before the next, so memory holds one source layer at a time beside the
converted model.
"""
from __future__ import annotations

import fnmatch
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence, TextIO, Union

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from ..errors import MarlinDSLError, ShapeError
from ..formats import Format
from ..formats.builtin import BUILTIN_FORMATS, GroupSize, builtin_format
from ..nn import Backend, MarlinLinear
from .fuse import DEFAULT_GROUPS, FusedLinear

#: Loads an nn.QuantizedLinear in its own MLX format (layers.interop), without re-quantising.
EXACT = "exact"

Choice = Union[str, Format, None]
Chooser = Callable[[str, nn.Module], Choice]
FormatChoice = Union[Choice, Mapping[str, Choice], Chooser]


@dataclass
class Conversion:
    """What `convert` did: the format of every converted layer by its path (parts of a fused
    group under their own paths), the layers left as they were and why, the fused groups
    ({parent path: [parts]}), and the time taken."""

    formats: dict[str, Format]
    skipped: dict[str, str]  # path -> why a linear layer was left as it is
    seconds: float
    fused: dict[str, list[tuple[str, ...]]] = field(default_factory=dict)


def _matches(pattern: str, path: str) -> bool:
    """A rule matches the whole path or any run of its dotted parts ("mlp", "layers.0")."""
    if fnmatch.fnmatchcase(path, pattern):
        return True
    parts = path.split(".")
    return any(fnmatch.fnmatchcase(".".join(parts[i:j]), pattern)
               for i in range(len(parts)) for j in range(i + 1, len(parts) + 1))


def chooser(choice: FormatChoice, group_size: GroupSize | None = None) -> Chooser:
    """A function (path, module) -> format name / Format / None from any accepted choice."""
    if callable(choice) and not isinstance(choice, Format):
        return choice  # type: ignore[return-value]
    if isinstance(choice, Mapping):
        rules = list(choice.items())

        def by_rule(path: str, _: nn.Module) -> Choice:
            for pattern, value in rules:
                if _matches(pattern, path):
                    return value
            return None

        return by_rule
    return lambda _path, _module: choice  # type: ignore[return-value]


def _resolve(value: Choice, group_size: GroupSize | None, path: str) -> Format | str | None:
    if value is None or value == EXACT or isinstance(value, Format):
        return value
    if isinstance(value, str) and value in BUILTIN_FORMATS:
        return builtin_format(value, group_size)
    raise MarlinDSLError(f"format for layer {path!r}: expected a built-in format name "
                         f"{sorted(BUILTIN_FORMATS)}, {EXACT!r}, a marlin_dsl Format or None, "
                         f"got {value!r}")


def _dims(module: nn.Module) -> tuple[int, int]:
    """(K input features, N output features) of a Linear or QuantizedLinear."""
    n, cols = module["weight"].shape
    return (cols * 32 // module.bits if isinstance(module, nn.QuantizedLinear) else cols), n


def _convert_one(path: str, module: nn.Module, fmt: Format | str, backend: Backend) -> MarlinLinear:
    if fmt == EXACT:
        if not isinstance(module, nn.QuantizedLinear):
            raise MarlinDSLError(f"format for layer {path!r}: {EXACT!r} loads an "
                                 f"nn.QuantizedLinear as it is; {type(module).__name__} is not one")
        return MarlinLinear.from_quantized_linear(module, backend=backend)
    if isinstance(module, nn.QuantizedLinear):  # re-quantise the weight MLX stores
        weight = mx.dequantize(module["weight"], module["scales"], module.get("biases"),
                               module.group_size, module.bits, module.mode)
        source = nn.Linear(1, 1, bias=False)
        source.weight = weight
        if "bias" in module:
            source.bias = module["bias"]
        module = source
    assert isinstance(fmt, Format)
    return MarlinLinear.from_linear(module, fmt, backend=backend)


def convert(model: nn.Module, format: FormatChoice = "fp4", *, group_size: GroupSize | None = None,
            backend: Backend = "auto", progress: TextIO | None = None,
            fuse: Sequence[Sequence[str]] = DEFAULT_GROUPS) -> Conversion:
    """Replace the model's nn.Linear / nn.QuantizedLinear leaves by MarlinLinear in place.

    A layer is converted when its choice is a format (see the module docstring). A layer
    whose shape the chosen format cannot hold (K not a multiple of its granule or group) is
    skipped with the reason when the format came from a default for all layers, and is an
    error when a rule or function chose it for that layer. Sibling layers named in one of the
    `fuse` groups (default: q/k/v and gate/up projections) that get the same format and read
    inputs of the same size become one fused layer (models/fuse.py); `fuse=()` turns that off.
    `progress` (e.g. sys.stderr) receives a progress line per layer.
    """
    choose = chooser(format, group_size)
    one_for_all = isinstance(format, (str, Format))
    layers = [(path, m) for path, m in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module)
              if isinstance(m, (nn.Linear, nn.QuantizedLinear))]
    start = time.perf_counter()
    formats: dict[str, Format] = {}
    skipped: dict[str, str] = {}
    resolved = {path: _resolve(choose(path, module), group_size, path) for path, module in layers}
    groups = _fusion_groups(dict(layers), resolved, [tuple(g) for g in fuse])
    in_group = {f"{parent}.{part}" if parent else part: (parent, parts)
                for parent, parts in groups for part in parts}
    fused: dict[str, list[tuple[str, ...]]] = {}
    for i, (path, module) in enumerate(layers):
        if path in in_group:
            parent, parts = in_group[path]
            if path.endswith("." + parts[0]) or path == parts[0]:  # the group's first part does it
                group = _fuse_group(model, parent, parts, resolved[path], backend)  # type: ignore[arg-type]
                fused.setdefault(parent, []).append(parts)
                for part in parts:
                    formats[f"{parent}.{part}" if parent else part] = group.layer.format
            if progress is not None:
                _progress(progress, i + 1, len(layers), path, time.perf_counter() - start)
            continue
        fmt = resolved[path]
        if fmt is None:
            skipped[path] = "no format chosen"
            continue
        if isinstance(fmt, Format):
            try:
                fmt.check_shape(*_dims(module), f"layer {path!r}")
            except ShapeError as err:
                if not one_for_all:
                    raise
                skipped[path] = str(err)
                continue
        new = _convert_one(path, module, fmt, backend)
        mx.eval(new.parameters())  # one layer at a time: bounded memory, honest progress
        formats[path] = new.format
        # Swap it in now, so the source layer's weights can be freed before the next layer.
        model.update_modules(tree_unflatten([(path, new)]))
        if progress is not None:
            _progress(progress, i + 1, len(layers), path, time.perf_counter() - start)
    if progress is not None and layers:
        progress.write("\n")
    return Conversion(formats, skipped, time.perf_counter() - start, fused)


def _module(model: nn.Module, path: str) -> nn.Module:
    module = model
    for part in path.split("."):
        module = module[int(part)] if isinstance(module, list) else module[part]
    return module


def _fusion_groups(layers: dict[str, nn.Module], resolved: dict[str, object],
                   groups: list[tuple[str, ...]]) -> list[tuple[str, tuple[str, ...]]]:
    """(parent path, parts) of every group whose parts all exist under one parent, get the
    same format (or are all loaded exactly, from identical MLX modes), share K, and whose
    outputs side by side the format can hold."""
    found = []
    for path in layers:
        parent, _, name = path.rpartition(".")
        for parts in groups:
            paths = [f"{parent}.{p}" if parent else p for p in parts]
            if name != parts[0] or not all(p in layers for p in paths):
                continue
            fmts = [resolved[p] for p in paths]
            mods = [layers[p] for p in paths]
            if fmts[0] is None or any(f != fmts[0] for f in fmts) or len({_dims(m)[0] for m in mods}) != 1:
                continue
            if fmts[0] == EXACT:
                configs = {(type(m), getattr(m, "mode", None), getattr(m, "bits", None),
                            getattr(m, "group_size", None), m["scales"].dtype if "scales" in m else None)
                           for m in mods}
                if len(configs) != 1 or next(iter(configs))[0] is not nn.QuantizedLinear:
                    continue
            else:
                try:
                    fmts[0].check_shape(_dims(mods[0])[0], sum(_dims(m)[1] for m in mods))  # type: ignore[union-attr]
                except ShapeError:
                    continue
            found.append((parent, parts))
    return found


def _fuse_group(model: nn.Module, parent_path: str, parts: tuple[str, ...], fmt: Format | str,
                backend: Backend) -> "FusedLinear":
    """Convert one group's layers as one (their outputs side by side) and install it."""
    from ..formats import PackedWeights
    from ..layers.interop import packed_from_quantized
    from .fuse import install

    parent = _module(model, parent_path) if parent_path else model
    modules = [parent[p] for p in parts]
    sizes = tuple(_dims(m)[1] for m in modules)
    biases = [m.get("bias") for m in modules]
    bias = None
    if any(b is not None for b in biases):
        dtype = next(b.dtype for b in biases if b is not None)
        bias = mx.concatenate([b if b is not None else mx.zeros((n,), dtype) for b, n in zip(biases, sizes)])
    if fmt == EXACT:
        packed = [packed_from_quantized(m) for m in modules]
        arrays = {name: mx.concatenate([p.arrays[name] for p in packed], axis=1) for name in packed[0].arrays}
        joined = PackedWeights(packed[0].format, (packed[0].shape[0], sum(sizes)), arrays)
        layer = MarlinLinear.from_packed(joined, bias, backend=backend)
    else:
        weights = [_float_weight(m) for m in modules]
        source = nn.Linear(1, 1, bias=False)
        source.weight = mx.concatenate(weights, axis=0)
        if bias is not None:
            source.bias = bias
        assert isinstance(fmt, Format)
        layer = MarlinLinear.from_linear(source, fmt, backend=backend)
    mx.eval(layer.parameters())
    group = FusedLinear(layer, sizes)
    install(parent, parts, group)
    return group


def _float_weight(module: nn.Module) -> mx.array:
    if isinstance(module, nn.QuantizedLinear):
        return mx.dequantize(module["weight"], module["scales"], module.get("biases"),
                             module.group_size, module.bits, module.mode)
    return module["weight"]


def _progress(out: TextIO, done: int, total: int, path: str, seconds: float) -> None:
    width = 30
    filled = width * done // total
    bar = "#" * filled + "." * (width - filled)
    out.write(f"\r[{bar}] {done}/{total} {seconds:6.1f}s {path[-40:]:<40}")
    out.flush()


__all__ = ["EXACT", "Conversion", "chooser", "convert"]
