"""Sibling linear layers that read the same input, run as one kernel launch.

In a transformer block q_proj, k_proj and v_proj read the same x, and so do gate_proj and
up_proj. Converted separately they are 5 launches per block; fused, 2. At decode (one token)
a launch costs about as much host time as its kernel takes on the device, so fewer launches
is what makes a converted model decode faster (bench/README.md, model benchmark).

A fused group becomes one `FusedLinear` (a MarlinLinear of the parts' output features side by
side, N = sum of theirs, stored once at `<parent>.<part>__<part>...`) and each part becomes a
`LinearSlice` without parameters. The model's own code still calls `self.q_proj(x)`, ...: the
first part called with an x computes the whole product as the parts' columns (at decode,
the weight stream's rows, the kernel writes each part as its own output, `Gemm.outputs`, on
CUDA and Metal; else one `mx.split` of y) and keeps them until every part has taken its
own, then lets them go; a part called with another x computes again, so a model that does
not feed the parts the same input stays correct, only slower.

Quantisation is per output column, so fusing changes no packed value: every column of the
fused weight is what the part's own conversion would have made.
"""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..epilogue import gate_interleave
from ..errors import MarlinDSLError, ShapeError
from ..formats import BlockPatternSparsity, PackedWeights
from ..layers.epilogue_dispatch import deinterleave
from ..machine.outputs import GATE_ROWS
from ..nn import MarlinLinear

#: Groups fused by default (mlx-lm's names for the attention inputs and the gated MLP).
DEFAULT_GROUPS: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def fused_name(parts: tuple[str, ...]) -> str:
    return "__".join(parts)


class FusedLinear(nn.Module):
    """Several linear layers of one input as one MarlinLinear (`layer`); its `LinearSlice`s
    return the parts' outputs. The part sizes are the output features of each part, in order."""

    def __init__(self, layer: MarlinLinear, sizes: tuple[int, ...]) -> None:
        super().__init__()
        if sum(sizes) != layer.output_dims:
            raise MarlinDSLError(f"FusedLinear: parts of {list(sizes)} output features do not add up "
                                 f"to the layer's {layer.output_dims}")
        self.layer = layer
        layer.split_outputs(tuple(sizes))  # the parts straight out of the kernel where it can
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        object.__setattr__(self, "_bounds", tuple((a, a + s) for a, s in zip(starts, sizes)))
        # [x, the parts' outputs, how many parts have still to take theirs]. A part's call
        # runs 5 times per transformer block and a decode step is bound by host time
        # (bench/probes/decode_host_probe.py), so it does the least it can: an identity test and a
        # countdown, in the part's own frame.
        object.__setattr__(self, "_memo", [None, None, 0])

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in self._bounds)

    @property
    def interleaved(self) -> bool:
        """Whether the layer holds a gate/up pair with its columns interleaved in runs of 8
        (`interleave_gate_up`), as a gated epilogue reads them."""
        return getattr(self, "_interleaved", False)

    def interleave_gate_up(self, now: bool = True) -> None:
        """Hold a (gate, up) pair's fused weight with its columns alternating in runs of 8
        (`epilogue.gate_interleave`): what a kernel with a gated epilogue reads. Quantisation is
        per column, so no value changes, and the parts' outputs stay what they were
        (de-interleaved by `compute`). Weights loaded into the layer later (in the portable,
        side-by-side order that `checkpoint.portable_weights` writes) are interleaved again
        before their first use (`ensure_layout`). ShapeError where the parts differ in size or
        are not whole runs, or the format's arrays do not all hold the N columns on their last
        axis (block patterns). `now` False: at the first call (weights still to be loaded)."""
        sizes = self.sizes
        if len(sizes) != 2 or sizes[0] != sizes[1] or sizes[0] % GATE_ROWS:
            raise ShapeError(f"FusedLinear: a gate/up pair needs two parts of the same multiple of "
                             f"{GATE_ROWS} columns, got {list(sizes)}")
        if isinstance(self.layer.format.sparsity, BlockPatternSparsity):
            raise ShapeError(f"FusedLinear ({self.layer.format.name}): its block patterns span several "
                             "columns; columns cannot be reordered one by one")
        object.__setattr__(self, "_wants_interleave", True)
        if now:
            self.ensure_layout()

    def ensure_layout(self) -> None:
        """Interleave the layer's columns where that was asked and its arrays are side by side
        (never interleaved, or replaced since: `MarlinLinear` marks replaced arrays stale)."""
        if not getattr(self, "_wants_interleave", False):
            return
        if self.interleaved and not self.layer._stale:
            return
        self["layer"] = permuted_columns(self.layer, gate_interleave(self.sizes[0]))
        object.__setattr__(self, "_interleaved", True)
        memo = self._memo
        memo[0] = memo[1] = None

    def portable_order(self) -> np.ndarray | None:
        """The column order that puts the held layer's columns back side by side (the parts in
        turn), or None where they already are."""
        return np.argsort(gate_interleave(self.sizes[0])) if self.interleaved else None

    def compute(self, x: mx.array) -> list[mx.array]:
        """Every part's output for x, remembered for the parts until each has taken its own
        (`LinearSlice.__call__`): one launch whose kernel writes the parts where it can (the
        decode: a split costs about as much host time as the launch), else one launch and
        one `mx.split` (MarlinLinear.split_outputs)."""
        if getattr(self, "_wants_interleave", False):  # one y, its gate and up runs taken apart
            self.ensure_layout()
            outs = list(deinterleave(self["layer"](x)))
        else:  # the layer's per-call closure directly: MarlinLinear.call_parts is only its wrapper.
            outs = self["layer"]._parts_call(x)
        memo = self._memo
        memo[0], memo[1], memo[2] = x, outs, len(self._bounds)
        return outs

    def __call__(self, x: mx.array) -> mx.array:
        return self.layer(x)


class LinearSlice(nn.Module):
    """What a fused part becomes: its columns of the FusedLinear's output. Holds no
    parameters (the fused layer is not a child here; it lives once, at its own path)."""

    def __init__(self, fused: FusedLinear, index: int) -> None:
        super().__init__()
        object.__setattr__(self, "_fused", fused)
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_memo", fused._memo)  # one lookup less per call

    @property
    def format(self):
        """The fused layer's format."""
        return self._fused.layer.format

    @property
    def input_dims(self) -> int:
        return self._fused.layer.input_dims

    @property
    def output_dims(self) -> int:
        return self._fused.sizes[self._index]

    def __call__(self, x: mx.array) -> mx.array:
        # x is the memo's input (the same array object: the same product), or compute. Once
        # as many parts as there are have taken theirs, the memo lets x and the outputs go (a
        # prefill's are large). A part taken twice for one x gets the same output again.
        memo = self._memo
        outs = memo[1] if memo[0] is x else self._fused.compute(x)
        memo[2] -= 1
        if memo[2] <= 0:
            memo[0] = memo[1] = None
        return outs[self._index]

    def _extra_repr(self) -> str:
        a, b = self._fused._bounds[self._index]
        return f"columns {a}..{b - 1} of a fused {self._fused.layer.format.name} layer"


def permuted_columns(layer: MarlinLinear, order: np.ndarray) -> MarlinLinear:
    """A new layer whose column i is `layer`'s column order[i] (the linear layout's arrays and
    the bias taken in that order; the same format, backend and source dtype)."""
    n = layer.output_dims
    index = mx.array(order.astype(np.uint32))
    arrays = {}
    for name, a in layer.linear_arrays().items():
        if a.ndim != 2 or a.shape[-1] != n:
            raise ShapeError(f"layer ({layer.format.name}): array {name!r} of shape {list(a.shape)} does "
                             f"not hold the {n} columns on its last axis")
        arrays[name] = mx.contiguous(mx.take(a, index, axis=1))  # row-major (the gather gives column-major)
    bias = layer.get("bias")
    new = MarlinLinear.from_packed(PackedWeights(layer.format, (layer.input_dims, n), arrays),
                                   None if bias is None else mx.contiguous(mx.take(bias, index)), backend=layer.backend)
    new.source_dtype = layer.source_dtype
    mx.eval(new.parameters())
    return new


def install(parent: nn.Module, parts: tuple[str, ...], fused: FusedLinear) -> None:
    """Put `fused` into `parent` at its fused name and the parts' slices in their places."""
    parent[fused_name(parts)] = fused
    for i, name in enumerate(parts):
        parent[name] = LinearSlice(fused, i)


__all__ = ["DEFAULT_GROUPS", "FusedLinear", "LinearSlice", "fused_name", "install", "permuted_columns"]
