"""Sibling linear layers that read the same input, run as one kernel launch.

In a transformer block q_proj, k_proj and v_proj read the same x, and so do gate_proj and
up_proj. Converted separately they are 5 launches per block; fused, 2. At decode (one token)
a launch costs about as much host time as its kernel takes on the device, so fewer launches
is what makes a converted model decode faster (bench/README.md, model benchmark).

A fused group becomes one `FusedLinear` (a MarlinLinear of the parts' output features side by
side, N = sum of theirs, stored once at `<parent>.<part>__<part>...`) and each part becomes a
`LinearSlice` without parameters. The model's own code still calls `self.q_proj(x)`, ...: the
first part called with an x computes the whole product, splits it into the parts' columns
(one `mx.split`) and keeps them until every part has taken its own, then lets them go; a
part called with another x computes again, so a model that does not feed the parts the same
input stays correct, only slower.

Quantisation is per output column, so fusing changes no packed value: every column of the
fused weight is what the part's own conversion would have made.
"""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from ..errors import MarlinDSLError
from ..nn import MarlinLinear

#: Groups fused by default (mlx-lm's names for the attention inputs and the gated MLP).
DEFAULT_GROUPS: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def fused_name(parts: tuple[str, ...]) -> str:
    return "__".join(parts)


class FusedLinear(nn.Module):
    """Several linear layers of one input as one MarlinLinear (`layer`); `part(x, i)` is part
    i's output. The part sizes are the output features of each part, in order."""

    def __init__(self, layer: MarlinLinear, sizes: tuple[int, ...]) -> None:
        super().__init__()
        if sum(sizes) != layer.output_dims:
            raise MarlinDSLError(f"FusedLinear: parts of {list(sizes)} output features do not add up "
                                 f"to the layer's {layer.output_dims}")
        self.layer = layer
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        object.__setattr__(self, "_bounds", tuple((a, a + s) for a, s in zip(starts, sizes)))
        # Where the output splits: one mx.split (one graph node with every part as an output)
        # costs less host time per call than a slice per part.
        object.__setattr__(self, "_splits", starts[1:])
        object.__setattr__(self, "_memo", None)  # [x, the parts' outputs, parts taken]

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in self._bounds)

    def part(self, x: mx.array, index: int) -> mx.array:
        memo = self._memo
        if memo is None or memo[0] is not x or index in memo[2]:
            memo = [x, mx.split(self.layer(x), self._splits, axis=-1), set()]
            object.__setattr__(self, "_memo", memo)
        memo[2].add(index)
        if len(memo[2]) == len(self._bounds):  # every part has its output: let x and y go
            object.__setattr__(self, "_memo", None)
        return memo[1][index]

    def __call__(self, x: mx.array) -> mx.array:
        return self.layer(x)


class LinearSlice(nn.Module):
    """What a fused part becomes: its columns of the FusedLinear's output. Holds no
    parameters (the fused layer is not a child here; it lives once, at its own path)."""

    def __init__(self, fused: FusedLinear, index: int) -> None:
        super().__init__()
        object.__setattr__(self, "_fused", fused)
        object.__setattr__(self, "_index", index)

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
        return self._fused.part(x, self._index)

    def _extra_repr(self) -> str:
        a, b = self._fused._bounds[self._index]
        return f"columns {a}..{b - 1} of a fused {self._fused.layer.format.name} layer"


def install(parent: nn.Module, parts: tuple[str, ...], fused: FusedLinear) -> None:
    """Put `fused` into `parent` at its fused name and the parts' slices in their places."""
    parent[fused_name(parts)] = fused
    for i, name in enumerate(parts):
        parent[name] = LinearSlice(fused, i)


__all__ = ["DEFAULT_GROUPS", "FusedLinear", "LinearSlice", "fused_name", "install"]
