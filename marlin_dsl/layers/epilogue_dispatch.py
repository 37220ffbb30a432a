"""What a layer runs for a call with an epilogue (marlin_dsl/epilogue.py): y = E(x @ W) with E
of bias, a gated activation and a residual add.

One `EpilogueDispatch` per (format, [K, N], backend, steps), shared like `Dispatch`, holds one
launch per activation shape and dtype, built on first use:
- where the target's kernel for those rows applies epilogues (`TargetRuntime.layer_epilogue`:
  the weight stream and the multistage pipeline), one kernel launch: x, the weights and the epilogue's
  inputs in, y out, rounded once;
- else the plain launch (`Dispatch`, which may take the dequantize route) followed by the same
  steps in MLX ops (`compose`), as the unfused model computes them.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable, Sequence

import mlx.core as mx
import mlx.nn as nn

from ..errors import MarlinDSLError, ScheduleError, ShapeError
from ..formats import Format
from ..machine.outputs import GATE_ROWS, GATES, epilogue_inputs, out_columns
from ..pipelines import applies_epilogue
from .dispatch import _INIT_VALUE, _KERNEL_ACTIVATION, _OUTPUT_DTYPE, Dispatch, check_activation, dispatch_for

#: launch(x, weights, extras) -> y; extras are the epilogue's inputs in `epilogue_inputs` order
EpilogueLaunch = Callable[[mx.array, Sequence[mx.array], Sequence[mx.array]], mx.array]


def deinterleave(y: mx.array) -> tuple[mx.array, mx.array]:
    """(gate, up) columns of a gated GEMM's y [..., N] (runs of GATE_ROWS), each [..., N / 2]."""
    lead, n = y.shape[:-1], y.shape[-1]
    pairs = y.reshape(*lead, n // (2 * GATE_ROWS), 2, GATE_ROWS)
    return pairs[..., 0, :].reshape(*lead, n // 2), pairs[..., 1, :].reshape(*lead, n // 2)


def compose(steps: tuple[str, ...], y: mx.array, extras: Sequence[mx.array]) -> mx.array:
    """The epilogue in MLX ops on y (the unfused composition, rounded after each step)."""
    named = dict(zip(epilogue_inputs(steps), extras))
    if "bias" in steps:
        y = y + named["bias"]
    gate = next((s for s in steps if s in GATES), None)
    if gate is not None:
        g, u = deinterleave(y)
        y = (nn.silu(g) if gate == "silu" else nn.gelu_approx(g)) * u
    if "residual" in steps:
        y = y + named["residual"]
    return y


class EpilogueDispatch:
    """y [..., N_out] = E(x [..., K] @ W) for one (format, [K, N], backend, steps); see the
    module docstring. `launch(x)` is the launch for x's shape and dtype."""

    def __init__(self, fmt: Format, k: int, n: int, backend: str, steps: tuple[str, ...]) -> None:
        self.fmt, self.k, self.n, self.steps = fmt, k, n, steps
        self.n_out = out_columns(steps, n, "output_dims")
        self.base: Dispatch = dispatch_for(fmt, k, n, backend)
        self.names = self.base.names
        self.extra_names = epilogue_inputs(steps)
        self.launches: dict[tuple, EpilogueLaunch] = {}

    def launch(self, x: mx.array) -> EpilogueLaunch:
        key = (x.shape, x.dtype)
        found = self.launches.get(key)
        if found is None:
            found = self.launches[key] = self._build(x)
        return found

    def __call__(self, x: mx.array, weights: Sequence[mx.array], extras: Sequence[mx.array]) -> mx.array:
        return self.launch(x)(x, weights, extras)

    def _build(self, x: mx.array) -> EpilogueLaunch:
        check_activation(x, self.k)
        shape, dtype = tuple(x.shape), x.dtype
        runtime = getattr(self.base, "runtime", None)
        kernel = None
        if runtime is not None and dtype != mx.float32:  # f32 activations: composed in f16 kernels' way
            kernel = runtime.layer_epilogue(self.fmt, _KERNEL_ACTIVATION[dtype], math.prod(shape[:-1]),
                                            self.k, self.n, self.steps)
        if kernel is None:  # the plain launch (built only here: it may be another kernel)
            steps, plain = self.steps, self.base.launch(x)
            return lambda x, weights, extras: compose(steps, plain(x, weights), extras)
        self.base._check_kernel(kernel, ["x", *self.names, *self.extra_names, "dims"], [["y"]])  # type: ignore[attr-defined]
        fn, grid, threadgroup = kernel.kernel, kernel.grid, kernel.threadgroup
        dims = mx.array(kernel.dims, dtype=mx.uint32)
        out_shape, out_dtype = [(*shape[:-1], self.n_out)], [_OUTPUT_DTYPE[_KERNEL_ACTIVATION[dtype]]]

        def run(x: mx.array, weights: Sequence[mx.array], extras: Sequence[mx.array]) -> mx.array:
            return fn(inputs=[x, *weights, *extras, dims], output_shapes=out_shape, output_dtypes=out_dtype,
                      grid=grid, threadgroup=threadgroup, init_value=_INIT_VALUE)[0]

        return run


@lru_cache(maxsize=None)
def epilogue_dispatch_for(fmt: Format, k: int, n: int, backend: str, steps: tuple[str, ...]) -> EpilogueDispatch:
    """The shared EpilogueDispatch of (format, [K, N], concrete backend, epilogue steps)."""
    return EpilogueDispatch(fmt, k, n, backend, steps)


def applies_at_decode(fmt: Format, k: int, n: int, backend: str) -> bool:
    """Whether a layer of [K, N] on `backend` (concrete) runs a kernel with an epilogue for one
    row of activations (its target's tuned pipeline applies epilogues); on MLX ops, never."""
    runtime = getattr(dispatch_for(fmt, k, n, backend), "runtime", None)
    if runtime is None:
        return False
    try:
        return applies_epilogue(runtime.tuned_schedule(fmt, 1, k, n).pipeline)
    except ScheduleError:  # no tuned schedule for the format
        return False


def check_extras(steps: tuple[str, ...], x: mx.array, n: int, n_out: int, extras: Sequence[object],
                 dtype: mx.Dtype) -> list[mx.array]:
    """The caller's epilogue inputs for x (the residual; a layer adds its own bias) as the kernel
    reads them (cast to `dtype`); ShapeError naming the one that is misshapen, MarlinDSLError
    for a wrong count."""
    want = {"bias": (n,), "residual": (*x.shape[:-1], n_out)}
    names = [name for name in epilogue_inputs(steps) if name != "bias"]  # the layer's own bias
    out = []
    for name, value in zip(names, extras):
        if not isinstance(value, mx.array):
            raise ShapeError(f"{name}: expected an mlx.core.array of shape {list(want[name])}, "
                             f"got {type(value).__name__}")
        if tuple(value.shape) != want[name]:
            raise ShapeError(f"{name}: expected shape {list(want[name])} for x of shape {list(x.shape)}, "
                             f"got {list(value.shape)}")
        out.append(value if value.dtype == dtype else value.astype(dtype))
    if len(extras) != len(names):
        raise MarlinDSLError(f"epilogue {'+'.join(steps)}: takes {names or 'no arrays'}, got {len(extras)}")
    return out


__all__ = ["EpilogueDispatch", "applies_at_decode", "check_extras", "compose", "deinterleave", "epilogue_dispatch_for"]
