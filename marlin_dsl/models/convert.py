"""Convert the linear layers of any `mlx.nn` model to `MarlinLinear`, in place, like
`mlx.nn.quantize` does for MLX's own quantised layers.

The format of each layer comes from a *choice* (models/rules.py): one format for all (a
built-in name or a `Format`), rules by layer path (`{"mlp": "fp4_2of4", "*": "fp4"}`: the
first pattern that matches the path or a run of its whole dotted parts wins; `None` leaves
the layer as it is; a pattern that matches no linear layer is an error), or a function
`(path, module) -> format or None`. `"exact"` loads an `nn.QuantizedLinear` in the format of
its own MLX mode, bit for bit (`layers.interop`); a named format re-quantises it from its
dequantised weight.

Every layer is packed on the device (`mlx_pack.pack_mx`) and put in the backend's layout in
turn, and evaluated before the next, so memory holds one source layer at a time beside the
converted model. A converted layer returns the dtype its source returned (`source_dtype`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence, TextIO

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from ..errors import MarlinDSLError, ShapeError
from ..formats import Format
from ..formats.builtin import GroupSize
from ..layers.arguments import promoted
from ..layers.source_errors import SourcePart
from ..nn import Backend, MarlinLinear
from .fuse import DEFAULT_GROUPS, FusedLinear
from .fused_block import fuse_blocks
from .progress import Progress
from .rules import EXACT, FormatChoice, Resolver, by_default, check_rules_match, chooser

#: Why a layer whose choice was None is left as it is.
NOT_CHOSEN = "no format chosen"


@dataclass(repr=False)
class Conversion:
    """What `convert` did: the format of every converted layer by its path (parts of a fused
    group under their own paths), the layers left as they were and why, the fused groups
    ({parent path: [parts]}), and the time taken."""

    formats: dict[str, Format]
    skipped: dict[str, str]  # path -> why a linear layer was left as it is
    seconds: float
    fused: dict[str, list[tuple[str, ...]]] = field(default_factory=dict)
    #: MLPs whose activation (and block residual) run in the kernels' epilogues
    fused_blocks: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Converted layers by format name."""
        counts: dict[str, int] = {}
        for fmt in self.formats.values():
            counts[fmt.name] = counts.get(fmt.name, 0) + 1
        return dict(sorted(counts.items()))

    @property
    def unconverted(self) -> dict[str, str]:
        """Layers left as they were although a format was chosen for them (the format cannot
        hold their shape), with the reason."""
        return {path: why for path, why in self.skipped.items() if why != NOT_CHOSEN}

    def summary(self) -> str:
        """'15 layers: 8 x fp4, 6 x fp4_2of4; 1 left as it was; 2 fused groups; 1.2 s'."""
        by_format = ", ".join(f"{count} x {name}" for name, count in self.counts().items()) or "none"
        groups = sum(len(g) for g in self.fused.values())
        return (f"{len(self.formats)} layers converted: {by_format}; {len(self.skipped)} left as they were"
                f"{f' ({len(self.unconverted)} because of their shape)' if self.unconverted else ''}; "
                f"{groups} fused groups; {self.seconds:.1f} s")

    def __repr__(self) -> str:  # the dataclass's would print every Format of every layer
        return f"Conversion({self.summary()})"


def _dims(module: nn.Module) -> tuple[int, int]:
    """(K input features, N output features) of a Linear or QuantizedLinear."""
    n, cols = module["weight"].shape
    return (cols * 32 // module.bits if isinstance(module, nn.QuantizedLinear) else cols), n


def _result_dtype(module: nn.Module) -> mx.Dtype | None:
    """The dtype the layer computes in (MLX's promotion of its float weight or scales and its
    bias); None where nothing promotes (E8M0/E4M3 scale codes: the activation's dtype)."""
    names = ("scales", "bias") if isinstance(module, nn.QuantizedLinear) else ("weight", "bias")
    dtypes = [a.dtype for a in (module.get(name) for name in names)
              if isinstance(a, mx.array) and mx.issubdtype(a.dtype, mx.floating)]
    return promoted(*dtypes) if dtypes else None


def _source_part(path: str, module: nn.Module) -> SourcePart:
    """The layer's own tensors, for errors that name one of them."""
    names = ("weight", "scales", "biases", "bias")
    return SourcePart(path, _dims(module)[1], {n: module[n] for n in names if n in module})


def _float_weight(module: nn.Module) -> mx.array:
    if isinstance(module, nn.QuantizedLinear):
        return mx.dequantize(module["weight"], module["scales"], module.get("biases"),
                             module.group_size, module.bits, module.mode)
    return module["weight"]


def _convert_one(path: str, module: nn.Module, fmt: Format | str, backend: Backend) -> MarlinLinear:
    if fmt == EXACT:
        if not isinstance(module, nn.QuantizedLinear):
            raise MarlinDSLError(f"format for layer {path!r}: {EXACT!r} loads an "
                                 f"nn.QuantizedLinear as it is; {type(module).__name__} is not one")
        try:
            return MarlinLinear.from_quantized_linear(module, backend=backend)
        except MarlinDSLError as err:
            raise type(err)(f"layer {path!r}: {err.message}", err.location) from None
    assert isinstance(fmt, Format)
    if not isinstance(module, nn.QuantizedLinear):
        return MarlinLinear.from_linear(module, fmt, backend=backend, name=path)
    # Re-quantise the weight MLX stores; errors name the layer's own tensors.
    source = nn.Linear(1, 1, bias=False)
    source.weight = _float_weight(module)
    if "bias" in module:
        source.bias = module["bias"]
    layer = MarlinLinear.from_linear(source, fmt, backend=backend, name=path,
                                     sources=[_source_part(path, module)])
    layer.source_dtype = _result_dtype(module)
    return layer


def convert(model: nn.Module, format: FormatChoice = "fp4", *, group_size: GroupSize | None = None,
            backend: Backend = "auto", progress: TextIO | None = None,
            fuse: Sequence[Sequence[str]] = DEFAULT_GROUPS, blocks: bool = True) -> Conversion:
    """Replace the model's nn.Linear / nn.QuantizedLinear leaves by MarlinLinear in place.

    A layer is converted when its choice is a format (see the module docstring); a rule whose
    pattern matches no linear layer is an error (`rules.UnmatchedRules`, with near matches).
    A layer whose shape the chosen format cannot hold (K not a multiple of its granule or
    group) is skipped with the reason when the format came from a default for all layers (one
    format for all, or the catch-all rule "*"; `Conversion.unconverted` lists them), and is an
    error when a rule naming it or a function chose it for that layer. Sibling layers named
    in one of the `fuse` groups (default: q/k/v and gate/up projections) that get the same
    format and read inputs of the same size become one fused layer (models/fuse.py);
    `fuse=()` turns that off. `progress` (e.g. sys.stderr) receives a bar (a terminal) or a
    line per layer (anything else). `blocks`: mlx-lm MLPs and decoder blocks that qualify run
    their activation and residual add in the kernels' epilogues (models/fused_block.py;
    `Conversion.fused_blocks` lists them). Errors name the source tensor (`<path>.weight`) and
    the index in its own shape, or the layer."""
    layers = [(path, m) for path, m in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module)
              if isinstance(m, (nn.Linear, nn.QuantizedLinear))]
    check_rules_match(format, [path for path, _ in layers])
    choose, resolve = chooser(format), Resolver(group_size)
    start = time.perf_counter()
    formats: dict[str, Format] = {}
    skipped: dict[str, str] = {}
    resolved = {path: resolve(choose(path, module), path) for path, module in layers}
    groups = _fusion_groups(dict(layers), resolved, [tuple(g) for g in fuse])
    in_group = {f"{parent}.{part}" if parent else part: (parent, parts)
                for parent, parts in groups for part in parts}
    fused: dict[str, list[tuple[str, ...]]] = {}
    steps = Progress(progress, len(layers))
    try:
        for path, module in layers:
            if path in in_group:
                parent, parts = in_group[path]
                if path.endswith("." + parts[0]) or path == parts[0]:  # the group's first part does it
                    group = _fuse_group(model, parent, parts, resolved[path], backend)  # type: ignore[arg-type]
                    fused.setdefault(parent, []).append(parts)
                    for part in parts:
                        formats[f"{parent}.{part}" if parent else part] = group.layer.format
                chosen = resolved[path]
                steps.step(path, f"{getattr(chosen, 'name', chosen)} (fused: {'+'.join(parts)})")
                continue
            fmt = resolved[path]
            if fmt is None:
                skipped[path] = NOT_CHOSEN
                steps.step(path, "left as it is")
                continue
            if isinstance(fmt, Format):
                try:
                    fmt.check_shape(*_dims(module), f"layer {path!r}")
                except ShapeError as err:
                    if not by_default(format, path):
                        raise
                    skipped[path] = why = str(err).removeprefix(f"layer {path!r}: ")
                    steps.step(path, f"left as it is: {why}")
                    continue
            new = _convert_one(path, module, fmt, backend)
            mx.eval(new.parameters())  # one layer at a time: bounded memory, honest progress
            formats[path] = new.format
            # Swap it in now, so the source layer's weights can be freed before the next layer.
            model.update_modules(tree_unflatten([(path, new)]))
            steps.step(path, new.format.name)
    finally:
        steps.close()  # an error starts on a line of its own
    blocks_fused = fuse_blocks(model) if blocks else []
    return Conversion(formats, skipped, time.perf_counter() - start, fused, blocks_fused)


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
                backend: Backend) -> FusedLinear:
    """Convert one group's layers as one (their outputs side by side) and install it."""
    from ..formats import PackedWeights
    from ..layers.interop import packed_from_quantized
    from .fuse import install

    parent = _module(model, parent_path) if parent_path else model
    modules = [parent[p] for p in parts]
    paths = [f"{parent_path}.{p}" if parent_path else p for p in parts]
    sizes = tuple(_dims(m)[1] for m in modules)
    biases = [m.get("bias") for m in modules]
    bias = None
    if any(b is not None for b in biases):
        dtype = next(b.dtype for b in biases if b is not None)
        bias = mx.concatenate([b if b is not None else mx.zeros((n,), dtype) for b, n in zip(biases, sizes)])
    dtypes = [d for d in (_result_dtype(m) for m in modules) if d is not None]
    if fmt == EXACT:
        packed = [packed_from_quantized(m) for m in modules]
        arrays = {name: mx.concatenate([p.arrays[name] for p in packed], axis=1) for name in packed[0].arrays}
        joined = PackedWeights(packed[0].format, (packed[0].shape[0], sum(sizes)), arrays)
        try:
            layer = MarlinLinear.from_packed(joined, bias, backend=backend)
        except MarlinDSLError as err:
            raise type(err)(f"layers {paths}: {err.message}", err.location) from None
    else:
        source = nn.Linear(1, 1, bias=False)
        source.weight = mx.concatenate([_float_weight(m) for m in modules], axis=0)
        if bias is not None:
            source.bias = bias
        assert isinstance(fmt, Format)
        layer = MarlinLinear.from_linear(source, fmt, backend=backend, name="+".join(paths),
                                         sources=[_source_part(p, m) for p, m in zip(paths, modules)])
    layer.source_dtype = promoted(*dtypes) if dtypes else None
    mx.eval(layer.parameters())
    group = FusedLinear(layer, sizes)
    install(parent, parts, group)
    return group


__all__ = ["EXACT", "NOT_CHOSEN", "Conversion", "convert"]
