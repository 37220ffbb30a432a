"""mlx-lm decoder blocks whose work around the GEMMs runs in the kernels' epilogues
(marlin_dsl/epilogue.py): fewer MLX primitives, and so less host work, per token.

For a block `convert` has fused (gate/up one `FusedLinear`, down_proj a `MarlinLinear`):
- the MLP computes act(gate) * up in the gate/up kernel's epilogue (the fused weight's columns
  interleaved in runs of 8, `FusedLinear.interleave_gate_up`), so the layer writes I columns,
  not 2I, and no split, activation or product follows;
- the pre-norm block (h = x + attn(norm(x)); out = h + mlp(norm(h))) passes h to the MLP, whose
  down projection adds it in its epilogue: no add follows.

Which mlx-lm classes qualify is data (`FUSIBLE_MLPS`, `FUSIBLE_BLOCKS`): their code was read
(mlx-lm 0.32) and the replacement computes the same function. A qualifying module becomes an
instance of a subclass of its own class that overrides `__call__` only, so its children,
parameters and every other attribute stay as they were (saving, loading and mlx-lm's code
that reads them are unaffected). Anything else stays as it is. Where a launch's kernel does not
apply epilogues (many rows on Hopper: the warpgroup pipeline and the dequantize route; a gate
in Metal's multistage pipeline) the layer runs the plain kernel and the same steps in MLX ops
(`layers/epilogue_dispatch.py`).
"""
from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..errors import ShapeError
from ..layers.epilogue_dispatch import applies_at_decode, check_extras, compose, epilogue_dispatch_for
from ..nn import MarlinLinear
from .fuse import FusedLinear, LinearSlice

#: (module, class) of an mlx-lm MLP -> the gate's activation, for MLPs that compute
#: down_proj(act(gate_proj(x)) * up_proj(x)).
FUSIBLE_MLPS: dict[tuple[str, str], str] = {
    ("mlx_lm.models.llama", "MLP"): "silu",
    ("mlx_lm.models.qwen2", "MLP"): "silu",
    ("mlx_lm.models.qwen3", "MLP"): "silu",
    ("mlx_lm.models.gemma2", "MLP"): "gelu_tanh",
}
#: mlx-lm blocks whose __call__(x, mask, cache) is h = x + self_attn(input_layernorm(x), mask,
#: cache); return h + mlp(post_attention_layernorm(h)).
FUSIBLE_BLOCKS: frozenset[tuple[str, str]] = frozenset({
    ("mlx_lm.models.llama", "TransformerBlock"),
    ("mlx_lm.models.qwen2", "TransformerBlock"),
    ("mlx_lm.models.qwen3", "TransformerBlock"),
})


def epilogue_call(layer: MarlinLinear, steps: tuple[str, ...], x: mx.array, *extras: mx.array) -> mx.array:
    """E(x @ W (+ the layer's bias)) with E of `steps` (without "bias": the layer's own bias is
    added as the epilogue's first step). One kernel launch where the kernel for x's rows applies
    epilogues; else the layer's call and the steps in MLX ops. The per-call path is a closure
    kept on the layer (dropped when its weights or bias change, as the layer's own)."""
    call = layer._epilogue_calls.get(steps)
    if call is None:
        call = layer._epilogue_calls[steps] = _epilogue_closure(layer, steps)
    return call(x, extras)


def _epilogue_closure(layer: MarlinLinear, steps: tuple[str, ...]):
    """(x, extras) -> y for `epilogue_call`. Per activation shape and dtype it keeps the launch,
    the residual's shape and dtype and the bias in the kernel's dtype, so that a call is a
    dictionary lookup, a test of the residual and one launch (decode is bound by host time)."""
    layer.prepare()
    if layer._skip is not None:  # block skipping: the layer's own path, then the steps in MLX ops
        return lambda x, extras: compose(steps, layer(x), extras)
    bias = layer.get("bias")
    full = ("bias", *steps) if bias is not None else steps
    dispatch = epilogue_dispatch_for(layer.format, layer.input_dims, layer.output_dims, layer._backend, full)
    n, n_out = dispatch.n, dispatch.n_out
    weights = tuple(layer[name] for name in dispatch.names)
    casts = layer._casts  # the source layer's promotion (`MarlinLinear.source_dtype`)
    residual = "residual" in steps
    table: dict[tuple, tuple] = {}

    def entry(x: mx.array) -> tuple:
        launch = dispatch.launch(x)  # checks x
        dtype = mx.float16 if x.dtype == mx.float32 else x.dtype
        found = table[(x.shape, x.dtype)] = (launch, (*x.shape[:-1], n_out), dtype,
                                             () if bias is None else (bias.astype(dtype),))
        return found

    def call(x: mx.array, extras: tuple) -> mx.array:
        if casts:
            to = casts.get(getattr(x, "dtype", None))
            if to is not None:
                x = x.astype(to)
        try:
            launch, r_shape, dtype, biases = table[(x.shape, x.dtype)]
        except (KeyError, AttributeError, TypeError):  # first call with this shape, or bad x
            launch, r_shape, dtype, biases = entry(x)
        if residual:
            r = extras[0] if len(extras) == 1 else None
            if r is None or getattr(r, "shape", None) != r_shape or r.dtype != dtype:
                extras = tuple(check_extras(steps, x, n, n_out, extras, dtype))
        elif extras:
            check_extras(steps, x, n, n_out, extras, dtype)  # raises: this epilogue takes none
        return launch(x, weights, (*biases, *extras))

    return call


def _fused_mlp_call(self: Any, x: mx.array, residual: mx.array | None = None) -> mx.array:
    """down_proj(act(gate) * up) (+ residual), the activation in the gate/up kernel's epilogue
    and the residual in the down projection's."""
    group: FusedLinear = self._marlin_group
    group.ensure_layout()  # weights loaded since (side by side): interleaved again, once
    h = epilogue_call(group.layer, (self._marlin_gate,), x)
    if residual is None:
        return self.down_proj(h)
    return epilogue_call(self.down_proj, ("residual",), h, residual)


def _fused_block_call(self: Any, x: mx.array, mask: mx.array | None = None, cache: Any = None) -> mx.array:
    """The pre-norm block with the MLP's residual added in its down projection's epilogue."""
    h = x + self.self_attn(self.input_layernorm(x), mask, cache)
    return self.mlp(self.post_attention_layernorm(h), residual=h)


def _subclass(cls: type, call: Any) -> type:
    """`cls` with `call` as its __call__ (one subclass per class, so instances compare alike)."""
    made = _SUBCLASSES.get(cls)
    if made is None:
        made = _SUBCLASSES[cls] = type(f"Fused{cls.__name__}", (cls,), {"__call__": call, "_marlin_fused": True,
                                                                       "__module__": __name__})
    return made


_SUBCLASSES: dict[type, type] = {}


def _key(module: nn.Module) -> tuple[str, str]:
    cls = type(module)
    if getattr(cls, "_marlin_fused", False):
        cls = cls.__mro__[1]
    return cls.__module__, cls.__name__


def fuse_mlp(mlp: nn.Module, interleave_now: bool = True) -> bool:
    """Make an mlx-lm MLP (`FUSIBLE_MLPS`) with a fused gate/up `FusedLinear` and a MarlinLinear
    down_proj compute its activation in the gate/up kernel; False (and nothing changed) where
    it does not qualify (also where its layers' backend has no kernel that applies epilogues:
    MLX ops). `interleave_now` False: the gate/up columns are interleaved on the first
    call (a model built to be filled by load_weights)."""
    if getattr(type(mlp), "_marlin_fused", False):
        return True
    gate = FUSIBLE_MLPS.get(_key(mlp))
    group = mlp.get("gate_proj__up_proj")
    down = mlp.get("down_proj")
    if (gate is None or not isinstance(group, FusedLinear) or not isinstance(mlp.get("gate_proj"), LinearSlice)
            or not isinstance(down, MarlinLinear)):
        return False
    # Where no kernel applies the epilogue (MLX ops, a format without the stream layout), the
    # interleave would only add a reshape per call: leave the MLP as it is.
    layer = group.layer
    if not all(applies_at_decode(m.format, m.input_dims, m.output_dims, m._backend) for m in (layer, down)):
        return False
    try:
        group.interleave_gate_up(now=interleave_now)
    except ShapeError:
        return False
    object.__setattr__(mlp, "_marlin_group", group)
    object.__setattr__(mlp, "_marlin_gate", gate)
    mlp.__class__ = _subclass(type(mlp), _fused_mlp_call)
    return True


def fused_mlps(model: nn.Module) -> list[str]:
    """The paths of the model's MLPs whose epilogues run in the kernels."""
    return sorted(path for path, m in model.named_modules() if getattr(type(m), "_marlin_fused", False)
                  and hasattr(m, "_marlin_group"))


def fuse_blocks(model: nn.Module, interleave_now: bool = True) -> list[str]:
    """Fuse every qualifying MLP and pre-norm block of `model` (see the module docstring), in
    place; returns the paths of the fused MLPs. Idempotent. `interleave_now` as `fuse_mlp`."""
    fused = []
    for path, module in model.named_modules():
        if _key(module) in FUSIBLE_MLPS and fuse_mlp(module, interleave_now):
            fused.append(path)
    for path, module in model.named_modules():
        mlp = module.get("mlp") if isinstance(module, nn.Module) else None
        if _key(module) in FUSIBLE_BLOCKS and mlp is not None and getattr(type(mlp), "_marlin_fused", False) \
                and not getattr(type(module), "_marlin_fused", False):
            module.__class__ = _subclass(type(module), _fused_block_call)
    return sorted(fused)


__all__ = ["FUSIBLE_BLOCKS", "FUSIBLE_MLPS", "epilogue_call", "fuse_blocks", "fuse_mlp", "fused_mlps"]
