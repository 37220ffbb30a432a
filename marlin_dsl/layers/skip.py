"""A layer's block-skipping path: decode rows of a block-pattern weight through the kernel that
reads only each block's stored vectors (`WeightStream(skip_empty=True)`, issue 33).

Which vectors a block stores depends on the weight's patterns, not on its shape, so the
choice is made per weight when it arrives (`MarlinLinear._install`): on a target with a
skipping layout (`Target.skip_layout`: CUDA), for a format with block patterns, when the
stored share of the dense stream's vectors is at most the target runtime's `skip_max_stored`
(CUDA: `tuning.max_stored`, 0.52; 0.35 for small weights). There the skipping kernel is
faster than dense fp4's tuned one at M = 1 and 16 on the H200 (1.05-1.25x at half the vectors
stored on 4096 x 14336 and 14336 x 4096, 1.11-1.57x at a quarter;
bench/results/issue33_h200_2026-11-29 run 11). Where (nearly) every vector is
stored (random sparsity: a 50%-zero weight leaves no 64 x 32 run empty) the skipping kernel
is slower than dense (0.65-0.81x: it reads the same bytes behind a dependent K table), so
the layer keeps the dense kernels there: the same kernel as dense fp4's.

The layer keeps its parameters (the dense stream's arrays: what `to_packed`, `save` and
`load_weights` see) and holds the skipping arrays beside them, derived on the device: the
stored vectors gathered from the dense stream's qweight, `vec_start` and `vec_k` from the
patterns (`layouts/block_skip.py` gives the layout; its numpy `skip_arrays` is the oracle of
the tests). That costs the stored share of qweight again in device memory. Row counts above
the runtime's `skip_max_m` (prefill) and fused groups' parts run the dense kernels.
`quantized_linear` does the same with the arrays it caches on a PackedWeights object.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable, Mapping

import mlx.core as mx
import numpy as np

from ..errors import ScheduleError
from ..formats import BlockPatternSparsity, Format, PackedWeights
from ..layouts.block_skip import skip_layout
from ..machine.target import Target
from ..targets.runtimes import RUNTIMES
from .dispatch import TargetDispatch, layout_for

def skip_arrays_mx(fmt: Format, target: Target, shape: tuple[int, int], linear: Mapping[str, mx.array],
                   held: Mapping[str, mx.array], limit: float | None = None) -> dict[str, mx.array] | None:
    """The skipping layout's arrays of a weight held in `target`'s dense stream layout
    (`held`; `linear`: the same weight in the format's own layout, for its patterns), or None
    where the target or format cannot skip or more than `limit` (default: the target
    runtime's `skip_max_stored`) of the vectors are stored. The stored order is the numpy
    layout's (`SkipLayout.tables`); the gather runs on the device."""
    if target.skip_layout is None or not isinstance(fmt.sparsity, BlockPatternSparsity):
        return None
    try:
        layout = skip_layout(fmt, target)
    except ScheduleError:
        return None
    k, n = shape
    tables = layout.tables(np.asarray(linear["patterns"]), k, n)  # the patterns: a small copy
    if tables.share > (RUNTIMES[target.name].skip_max_stored(k, n) if limit is None else limit):
        return None
    view, axes = layout.by_vector_shape(k, n)
    qweight = held["qweight"].reshape(-1, view[2], view[3])
    if view[0] * view[1] > qweight.shape[0]:  # the last block's missing tiles: zeros
        qweight = mx.concatenate([qweight, mx.zeros((view[0] * view[1] - qweight.shape[0], *view[2:]), qweight.dtype)])
    by_vector = qweight.reshape(view).transpose(axes).reshape(view[0] * view[2], -1)
    stored = mx.take(by_vector, mx.array(tables.rows.astype(np.uint32)), axis=0)
    return {**held, "qweight": stored.reshape(-1), "vec_start": mx.array(tables.vec_start),
            "vec_k": mx.array(tables.vec_k)}


class SkipDispatch(TargetDispatch):
    """The skipping kernels of one (format, [K, N], backend) for up to `skip_max_m` rows: the
    format's arrays in the skipping layout, then vec_start and vec_k."""

    def __init__(self, fmt: Format, k: int, n: int, backend: str) -> None:
        super().__init__(fmt, k, n, backend)
        self.layout = self.runtime.target.skip_layout
        self.names = (*self.names, "vec_start", "vec_k")

    def _kernel(self, activation: str, m: int):
        return self.runtime.layer_kernel(self.fmt, activation, m, self.k, self.n, skip=True)

    def _dequantize(self, activation: str, m: int):
        return None  # the skipping layout is for the decode's few rows; the dense path does the rest


class SkipPath:
    """A layer's skipping dispatch and the arrays it reads (`weights`, in its input order)."""

    def __init__(self, dispatch: SkipDispatch, arrays: Mapping[str, mx.array]) -> None:
        self.dispatch = dispatch
        self.weights = tuple(arrays[name] for name in dispatch.names)

    def wrap(self, dense: Callable[[mx.array], object],
             check: Callable[[mx.array], None] | None = None) -> Callable[[mx.array], object]:
        """x -> the skipping launch for x's shape where x has at most the runtime's `skip_max_m`
        rows, else `dense(x)`; `check` runs first on the skipping path (the dense one checks
        itself)."""
        table: dict[tuple, Callable | None] = {}  # (shape, dtype) -> launch, or None: dense
        launch_for, weights, serves = self.dispatch.launch, self.weights, self.serves

        def run(x: mx.array):
            try:
                launch = table[(x.shape, x.dtype)]
            except (KeyError, AttributeError, TypeError):  # first call with this shape, or bad x
                if not isinstance(x, mx.array) or x.ndim < 1:
                    return dense(x)  # which says what is wrong with x
                launch = table[(x.shape, x.dtype)] = launch_for(x) if serves(x) else None
            if launch is None:
                return dense(x)
            if check is not None:
                check(x)
            return launch(x, weights)

        return run

    def serves(self, x: mx.array) -> bool:
        """x's rows are few enough for the skipping kernels."""
        return math.prod(x.shape[:-1]) <= self.dispatch.runtime.skip_max_m

    def __call__(self, x: mx.array) -> mx.array:
        return self.dispatch(x, self.weights)


def skip_path_of_packed(packed: PackedWeights, backend: str, held: Mapping[str, mx.array]) -> SkipPath | None:
    """`quantized_linear`'s skipping path for `packed` held as `held` on `backend`: cached on
    the object for as long as `held` (the device arrays `device_arrays` caches there) is
    the same object."""
    cached = packed.device_cache.get("skip")
    if cached is None or cached[0] is not held:
        k, n = (int(d) for d in packed.shape)
        path = skip_path(packed.format, (k, n), packed.arrays, held, backend, layout_for(packed.format, k, n, backend))
        cached = packed.device_cache["skip"] = (held, path)
    return cached[1]


def skip_path(fmt: Format, shape: tuple[int, int], linear: Mapping[str, mx.array],
              held: Mapping[str, mx.array], backend: str, layout: str) -> SkipPath | None:
    """The skipping path of a layer holding `held` in `layout` on `backend`, or None (a
    backend or format that cannot skip, a weight with too much stored: `skip_arrays_mx`)."""
    runtime = RUNTIMES.get(backend)
    if runtime is None or layout not in runtime.target.weight_layouts:
        return None  # the dense stream's arrays are what the skipping layout is made from
    arrays = skip_arrays_mx(fmt, runtime.target, shape, linear, held)
    if arrays is None:
        return None
    return SkipPath(skip_dispatch_for(fmt, int(shape[0]), int(shape[1]), backend), arrays)


@lru_cache(maxsize=None)
def skip_dispatch_for(fmt: Format, k: int, n: int, backend: str) -> SkipDispatch:
    """The shared SkipDispatch of (format, [K, N], backend), as `dispatch_for` shares dense ones."""
    return SkipDispatch(fmt, k, n, backend)


__all__ = ["SkipDispatch", "SkipPath", "skip_arrays_mx", "skip_dispatch_for", "skip_path", "skip_path_of_packed"]
