"""Packed weights on the device in a named physical layout, converted with MLX ops.

"linear" is the format's own layout (what `marlin_dsl.pack` writes, what files hold and what
`validate` checks); a target may read another one, chosen at pack time (today the
weight-stream layouts, CUDA's `lane_stream` and Metal's `metal_lane_stream`,
layouts/weight_stream.py, each made from the lane tables of the target that reads it:
`Target.weight_layouts`). Layers convert once, when
weights arrive (construction, `from_*`, load), and convert back only to save or to hand the
weight out (`to_packed`).
"""
from __future__ import annotations

from typing import Mapping

import mlx.core as mx

from ..errors import ShapeError
from ..formats import Format
from ..layouts.weight_stream import LAYOUT_NAME as LANE_STREAM
from ..machine.target import TARGETS, Target, reader_of
from .dispatch import LINEAR
from .weight_stream_mx import linear_arrays_mx, stream_arrays_mx, stream_shapes

Arrays = dict[str, mx.array]


def _stream_target(layout: str) -> Target | None:
    """The target whose weight-stream layout `layout` is (CUDA's `lane_stream`, Metal's
    `metal_lane_stream`: each made from its own lane tables), or None."""
    if any(layout in t.weight_layouts for t in TARGETS.values()):
        return reader_of(layout)
    return None


def layout_shapes(fmt: Format, shape: tuple[int, int], layout: str) -> dict[str, tuple[int, ...]]:
    """The shape of every array of a [K, N] weight of `fmt` held in `layout`."""
    k, n = shape
    linear = {spec.name: tuple(spec.shape) for spec in fmt.buffers(k, n)}
    if layout == LINEAR:
        return linear
    target = _stream_target(layout)
    if target is not None:
        return linear | stream_shapes(fmt, target, k, n)
    known = [LINEAR, *(name for t in TARGETS.values() for name in t.weight_layouts)]
    raise ShapeError(f"layout: unknown weight layout {layout!r} (known: {', '.join(map(repr, known))})")


def to_layout(fmt: Format, shape: tuple[int, int], arrays: Mapping[str, mx.array], layout: str) -> Arrays:
    """Linear-layout arrays -> `layout` (lazy MLX ops; arrays that do not change are shared)."""
    if layout == LINEAR:
        return dict(arrays)
    target = _stream_target(layout)
    if target is not None:
        return stream_arrays_mx(fmt, target, shape, arrays)
    raise ShapeError(f"layout: unknown weight layout {layout!r}")


def to_linear(fmt: Format, shape: tuple[int, int], arrays: Mapping[str, mx.array], layout: str) -> Arrays:
    """`layout` arrays -> the linear layout: `to_layout`'s exact inverse."""
    if layout == LINEAR:
        return dict(arrays)
    target = _stream_target(layout)
    if target is not None:
        return linear_arrays_mx(fmt, target, shape, arrays)
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
