"""Errors of packing a layer's weight, told in the terms of the layer it came from.

The packer sees W as [K, N]: the source's [N, K] weight transposed, and for a fused group
(models/fuse.py) the parts' weights side by side, for an MLX-quantised source the weight
dequantised. Its messages name that array ("weights: non-finite value nan at index (7, 512)",
"weights: group 0 of column 3 needs scale ..."), which a user cannot find in any file. Here
they are rewritten to name the source tensor (`model.layers.1.mlp.up_proj.weight`) and the
index in its own shape.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

import mlx.core as mx

from ..errors import MarlinDSLError, ValueRangeError
from .arguments import first_non_finite

#: How the packer names a scale it cannot store (formats/scaling/rounding.py).
_GROUP_OF_COLUMN = re.compile(r"^weights: group (\d+) of column (\d+) ")


@dataclass
class SourcePart:
    """One source layer whose rows are (some of) the packed weight's columns: its name (the
    prefix of its tensors, e.g. `model.layers.1.mlp.up_proj`), its output features, and its
    tensors by name (`weight` [N, K], and `scales`, `biases`, `bias` where it has them)."""

    name: str
    rows: int
    tensors: dict[str, mx.array] = field(default_factory=dict)


def source_error(err: MarlinDSLError, parts: Sequence[SourcePart], group_size: int) -> MarlinDSLError:
    """`err` (raised while packing the weight made of `parts`) naming the source tensor and the
    index in its own shape where it can, else prefixed by the layer's name; the same type."""
    message = err.message
    if "non-finite value" in message:
        for part in parts:
            for tensor, array in part.tensors.items():
                if not isinstance(array, mx.array) or not mx.issubdtype(array.dtype, mx.floating):
                    continue
                bad = first_non_finite(array)
                if bad is not None:
                    return ValueRangeError(f"{part.name}.{tensor}: non-finite value {array[bad].item()} "
                                           f"at index {bad} of its shape {tuple(array.shape)}")
    match = _GROUP_OF_COLUMN.match(message)
    if match is not None:
        group, column = int(match.group(1)), int(match.group(2))
        start = 0
        for part in parts:
            if column < start + part.rows:
                row = column - start
                first = group * group_size
                where = (f"{part.name}.weight: the group of row {row}, columns {first}..{first + group_size - 1} "
                         f"(the input features of one scale)")
                return type(err)(where + " " + message[match.end():], err.location)
            start += part.rows
    name = parts[0].name if len(parts) == 1 else "+".join(p.name for p in parts)
    return type(err)(f"{name}: {message}", err.location)


__all__ = ["SourcePart", "source_error"]
