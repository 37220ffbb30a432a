"""Packed weights on the device in a named physical layout, converted with MLX ops.

"linear" is the format's own layout (what `marlin_dsl.pack` writes, what files hold and what
`validate` checks); a target may read another one, chosen at pack time (today the
weight-stream layout `lane_stream`, layouts/weight_stream.py, made from the lane tables of the
target that reads it: `Target.weight_layouts`). Layers convert once, when
weights arrive (construction, `from_*`, load), and convert back only to save or to hand the
weight out (`to_packed`).
"""
from __future__ import annotations

from typing import Mapping

import mlx.core as mx

from ..errors import ShapeError
from ..formats import Format
from ..layouts.weight_stream import LAYOUT_NAME as LANE_STREAM
from ..targets.base import reader_of
from .dispatch import LINEAR
from .weight_stream_mx import linear_arrays_mx, stream_arrays_mx, stream_shapes

Arrays = dict[str, mx.array]


def layout_shapes(fmt: Format, shape: tuple[int, int], layout: str) -> dict[str, tuple[int, ...]]:
    """The shape of every array of a [K, N] weight of `fmt` held in `layout`."""
    k, n = shape
    linear = {spec.name: tuple(spec.shape) for spec in fmt.buffers(k, n)}
    if layout == LINEAR:
        return linear
    if layout == LANE_STREAM:
        return linear | stream_shapes(fmt, reader_of(LANE_STREAM), k, n)
    raise ShapeError(f"layout: unknown weight layout {layout!r} (known: {LINEAR!r}, {LANE_STREAM!r})")


def to_layout(fmt: Format, shape: tuple[int, int], arrays: Mapping[str, mx.array], layout: str) -> Arrays:
    """Linear-layout arrays -> `layout` (lazy MLX ops; arrays that do not change are shared)."""
    if layout == LINEAR:
        return dict(arrays)
    if layout == LANE_STREAM:
        return stream_arrays_mx(fmt, reader_of(LANE_STREAM), shape, arrays)
    raise ShapeError(f"layout: unknown weight layout {layout!r}")


def to_linear(fmt: Format, shape: tuple[int, int], arrays: Mapping[str, mx.array], layout: str) -> Arrays:
    """`layout` arrays -> the linear layout: `to_layout`'s exact inverse."""
    if layout == LINEAR:
        return dict(arrays)
    if layout == LANE_STREAM:
        return linear_arrays_mx(fmt, reader_of(LANE_STREAM), shape, arrays)
    raise ShapeError(f"layout: unknown weight layout {layout!r}")


def which_layout(fmt: Format, shape: tuple[int, int], arrays: Mapping[str, mx.array],
                 candidates: tuple[str, ...]) -> str | None:
    """The first candidate layout whose array shapes `arrays` have, or None."""
    for layout in candidates:
        want = layout_shapes(fmt, shape, layout)
        if sorted(want) == sorted(arrays) and all(
                isinstance(arrays[name], mx.array) and tuple(arrays[name].shape) == s
                for name, s in want.items()):
            return layout
    return None


__all__ = ["LANE_STREAM", "LINEAR", "layout_shapes", "to_layout", "to_linear", "which_layout"]
