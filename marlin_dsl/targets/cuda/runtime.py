"""CUDA kernels compiled on first use for `quantized_linear` (MLX's CUDA backend), lowered,
passed and printed as `marlin-dsl compile` does, and launched through `build_cuda_kernel`.

The schedule follows the rows of x: the weight-stream pipeline's schedule for that many rows
(`schedule.stream_schedule`) where the format has a weight-stream layout on CUDA, else the
format's default schedule. Kernels are cached per (format, activation, schedule) for the process;
the weights' CUDA layout is made once per packed weight (`cuda_weights`)."""
from __future__ import annotations

import weakref
from functools import lru_cache

import numpy as np

from ..errors import ScheduleError
from ..formats import Format, PackedWeights
from ..schedule import Gemm, Schedule, default_schedule, stream_schedule
from ..targets import CUDA
from .cuda_launch import CudaGemm, CudaWeights, build_cuda_kernel


def cuda_schedule(fmt: Format, m: int, k: int | None = None, n: int | None = None) -> Schedule:
    """The schedule `quantized_linear` runs `fmt` with for m rows of activations (and a [K, N]
    weight) on CUDA."""
    try:
        return stream_schedule(fmt, m, CUDA, k, n)
    except ScheduleError:  # no weight-stream layout for this format (block patterns, 4:8, 3-bit)
        return default_schedule(fmt)


@lru_cache(maxsize=None)
def cuda_gemm(fmt: Format, activation: str, schedule: Schedule | None = None) -> CudaGemm:
    from ..compiler import compile_gemm

    schedule = schedule or default_schedule(fmt)
    gemm = Gemm(f"{fmt.name}_{activation}_{schedule.name}", fmt, schedule, activation)
    return build_cuda_kernel(compile_gemm(gemm, CUDA).kernel)


#: id(packed) -> (weak reference to it, {layout: CudaWeights}): one conversion per weight.
_WEIGHTS: dict[int, tuple[weakref.ref, dict]] = {}


def cuda_weights(gemm: CudaGemm, packed: PackedWeights) -> CudaWeights:
    """`packed` (numpy or MLX arrays) as the flat MLX arrays `gemm` reads, in its layout."""
    import mlx.core as mx

    layout = gemm.source.attrs.get("weight_layout")
    if layout is None:  # the format's own layout: no copy
        flat = {n: a.reshape(-1) for n, a in packed.arrays.items()}
        return CudaWeights(flat, tuple(int(v) for v in packed.shape), packed.format.name)
    key = id(packed)
    entry = _WEIGHTS.get(key)
    if entry is None or entry[0]() is not packed:
        entry = _WEIGHTS[key] = (weakref.ref(packed, lambda _, k=key: _WEIGHTS.pop(k, None)), {})
    if layout not in entry[1]:
        host = PackedWeights(packed.format, packed.shape, {n: np.array(a) for n, a in packed.arrays.items()},
                             packed.layout)
        weights = gemm.weights(host)
        mx.eval(*weights.arrays.values())
        entry[1][layout] = weights
    return entry[1][layout]
