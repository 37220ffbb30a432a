"""What a layer runs for each call: one `Dispatch` per (format, weight shape, backend), shared
by every layer of that kind, holding one *launch* per activation shape and dtype.

A call of `MarlinLinear` is `dispatch.launches[(x.shape, x.dtype)](x, weights)`: a dictionary
lookup, then one `mx.fast.*_kernel` call with the layer's arrays (a tuple, in the kernel's
input order). Everything else is fixed when the launch is built on the first call with that
shape (schedule by row count, kernel, grid, output shape, the `dims` array), which is also
where x is checked. Nothing on this path touches numpy, copies to the host or synchronises,
so it runs inside `mx.compile` too. Kernels are compiled on first use of a schedule (cached
per schedule by the target's runtime, `targets/<name>/runtime.py`) and shared by all layers of
the format.

`layout` is the physical layout a backend's kernels read (`layers.weights`): the one the
target's runtime names (`layer_layout`: CUDA's weight-stream layout where the format has one),
else the format's own linear layout.
"""
from __future__ import annotations

import math
import os
from functools import lru_cache, partial
from typing import Callable, Sequence

import mlx.core as mx

from ..errors import MarlinDSLError, ShapeError
from ..formats import Format
from .mlx_ops import dequantize_mx
from ..machine.outputs import output_names
from ..targets.runtimes import RUNTIMES, runtime_for

LINEAR = "linear"
#: MARLIN_DSL_POISON=1 fills kernel outputs with NaN before each launch, so that an element a
#: kernel fails to write shows (for checks; it costs a fill per call).
_INIT_VALUE = float("nan") if os.environ.get("MARLIN_DSL_POISON") else None
#: Activation dtypes layers take; the kernels compute in f16 or bf16 (f32 runs as f16).
ACTIVATION_DTYPES = (mx.float16, mx.bfloat16, mx.float32)
_KERNEL_ACTIVATION = {mx.float16: "f16", mx.bfloat16: "bf16", mx.float32: "f16"}
#: What a kernel of each activation type writes.
_OUTPUT_DTYPE = {"f16": mx.float16, "bf16": mx.bfloat16}
#: Launches kept per Dispatch (one per distinct activation shape seen); beyond, start over.
_MAX_LAUNCHES = 4096

Launch = Callable[[mx.array, Sequence[mx.array]], mx.array]


def check_activation(x: object, k: int) -> mx.array:
    """x, or ShapeError saying what is wrong with it as a layer's input [..., K]."""
    if not isinstance(x, mx.array):
        raise ShapeError(f"x: expected an mlx.core.array [..., K={k}], got {type(x).__name__}")
    if x.ndim < 1:
        raise ShapeError(f"x: expected rank >= 1 with shape [..., K={k}], got rank 0 (a scalar)")
    if x.dtype not in ACTIVATION_DTYPES:
        raise ShapeError(f"x: expected dtype float16, bfloat16 or float32, got {x.dtype}")
    if x.shape[-1] != k:
        raise ShapeError(f"x: has K={x.shape[-1]} features (shape {tuple(x.shape)}) but the "
                         f"weight has K={k} input features")
    return x


class Dispatch:
    """y [..., N] = x [..., K] @ W for one (format, [K, N], backend); see the module docstring.
    `launch(x)` is the launch for x's shape and dtype; `names` the weight arrays it takes."""

    layout: str = LINEAR

    def __init__(self, fmt: Format, k: int, n: int, parts: tuple[int, ...] = ()) -> None:
        self.fmt, self.k, self.n = fmt, k, n
        #: y's columns as parts of these widths: launches return the list of parts
        self.parts = parts
        self.splits = [sum(parts[:i]) for i in range(1, len(parts))]
        self.names = tuple(spec.name for spec in fmt.buffers(k, n))
        self.launches: dict[tuple, Launch] = {}

    def launch(self, x: mx.array) -> Launch:
        key = (x.shape, x.dtype)
        found = self.launches.get(key)
        if found is None:
            check_activation(x, self.k)
            if len(self.launches) >= _MAX_LAUNCHES:
                self.launches.clear()
            found = self.launches[key] = self._build(tuple(x.shape), x.dtype)
        return found

    def __call__(self, x: mx.array, weights: Sequence[mx.array]) -> mx.array:
        return self.launch(x)(x, weights)

    def split_after(self, launch: Launch) -> Launch:
        """`launch` (one y) followed by one `mx.split` into the parts (where the kernel does
        not write them itself)."""
        splits = self.splits
        return lambda x, weights: mx.split(launch(x, weights), splits, axis=-1)

    def _build(self, shape: tuple[int, ...], dtype: mx.Dtype) -> Launch:
        raise NotImplementedError


class MlxOpsDispatch(Dispatch):
    """Dequantise with MLX ops, then `mx.matmul`: runs on every MLX device (the CPU too)."""

    def _build(self, shape: tuple[int, ...], dtype: mx.Dtype) -> Launch:
        fmt, kn, names = self.fmt, (self.k, self.n), self.names

        def run(x: mx.array, weights: Sequence[mx.array]) -> mx.array:
            w = dequantize_mx(fmt, kn, dict(zip(names, weights)))
            return mx.matmul(x, w.astype(x.dtype))

        return self.split_after(run) if self.parts else run


class _KernelLaunch:
    """One kernel bound to one activation shape: everything but x and the weights is fixed.
    Returns y, or with several outputs (y's parts: `Gemm.outputs`) the list of them."""

    __slots__ = ("kernel", "dims", "grid", "threadgroup", "shapes", "dtypes", "cast", "one")

    def __init__(self, kernel, dims: mx.array, grid, threadgroup, out_shapes: list, out_dtype,
                 cast: mx.Dtype | None) -> None:
        self.kernel, self.dims, self.grid, self.threadgroup = kernel, dims, grid, threadgroup
        self.shapes, self.dtypes, self.cast = out_shapes, [out_dtype] * len(out_shapes), cast
        self.one = len(out_shapes) == 1

    def __call__(self, x: mx.array, weights: Sequence[mx.array]) -> mx.array | list[mx.array]:
        if self.cast is not None:  # f32 activations: the kernel runs in f16
            x = x.astype(mx.float16)
        outs = self.kernel(inputs=[x, *weights, self.dims], output_shapes=self.shapes,
                           output_dtypes=self.dtypes, grid=self.grid, threadgroup=self.threadgroup,
                           init_value=_INIT_VALUE)
        if self.cast is not None:
            outs = [y.astype(self.cast) for y in outs]
        return outs[0] if self.one else outs


class _KernelDispatch(Dispatch):
    """Our kernels: inputs x, the weight arrays in buffer order, dims; the only output y."""

    def _check_kernel(self, kernel, expected: list[str], allowed: list[list[str]], verb: str = "launch") -> None:
        """MarlinDSLError unless `kernel` (a `LayerKernel`) takes `expected` inputs, writes one of
        the `allowed` output lists and reads the layout the layer holds."""
        inputs, outputs = list(kernel.input_names), list(kernel.output_names)
        if inputs != expected or outputs not in allowed:
            raise MarlinDSLError(f"kernel {kernel.name}: takes {inputs} -> {outputs}; layers "
                                 f"{verb} with kernels of {expected} -> {' or '.join(map(str, allowed))}")
        if (kernel.weight_layout or LINEAR) != self.layout:
            raise MarlinDSLError(f"kernel {kernel.name}: reads layout {kernel.weight_layout or LINEAR!r}, "
                                 f"the layer holds {self.layout!r}")


class TargetDispatch(_KernelDispatch):
    """Our kernels on one target, through its runtime (`targets.runtimes`): the weight layout
    its kernels read, and the kernel for each row count (the target picks the schedule)."""

    def __init__(self, fmt: Format, k: int, n: int, backend: str, parts: tuple[int, ...] = ()) -> None:
        super().__init__(fmt, k, n, parts)
        self.runtime = runtime_for(backend)
        self.layout = self.runtime.layer_layout(fmt, k, n) or LINEAR

    def _kernel(self, activation: str, m: int):
        """The runtime's kernel for m rows (a `LayerKernel`)."""
        return self.runtime.layer_kernel(self.fmt, activation, m, self.k, self.n, self.parts)

    def _dequantize(self, activation: str, m: int):
        """The runtime's dequantize kernel where m rows take that route (a `LayerKernel`), else None."""
        return self.runtime.layer_dequantize(self.fmt, activation, m, self.k, self.n)

    def _build(self, shape: tuple[int, ...], dtype: mx.Dtype) -> Launch:
        m = math.prod(shape[:-1])
        activation = _KERNEL_ACTIVATION[dtype]
        dequantize = self._dequantize(activation, m)
        if dequantize is not None:
            launch = self._dequantize_launch(dequantize, activation, dtype)
            return self.split_after(launch) if self.parts else launch
        kernel = self._kernel(activation, m)
        self._check_kernel(kernel, ["x", *self.names, "dims"],
                           [["y"], output_names(self.parts)] if self.parts else [["y"]])
        out_dtype = _OUTPUT_DTYPE[activation]
        split = len(kernel.output_names) > 1  # the kernel writes the parts
        launch = _KernelLaunch(kernel.kernel, mx.array(kernel.dims, dtype=mx.uint32), kernel.grid, kernel.threadgroup,
                               [(*shape[:-1], w) for w in (self.parts if split else (self.n,))], out_dtype,
                               mx.float32 if dtype == mx.float32 else None)
        return self.split_after(launch) if self.parts and not split else launch  # one y (larger M): split

    def _dequantize_launch(self, dq, activation: str, dtype: mx.Dtype) -> Launch:
        """The weight decoded to W^T [N, K] by the target's dequantize kernel, then `mx.matmul`
        (for many rows: `TargetRuntime.layer_dequantize`)."""
        self._check_kernel(dq, [*self.names, "dims"], [["w"]], verb="decode")
        kernel, grid, threadgroup = dq.kernel, dq.grid, dq.threadgroup
        dims = mx.array(dq.dims, dtype=mx.uint32)
        w_shape, w_dtype = [(self.n, self.k)], [_OUTPUT_DTYPE[activation]]
        cast = mx.float32 if dtype == mx.float32 else None

        def run(x: mx.array, weights: Sequence[mx.array]) -> mx.array:
            w = kernel(inputs=[*weights, dims], output_shapes=w_shape, output_dtypes=w_dtype, grid=grid,
                       threadgroup=threadgroup, init_value=_INIT_VALUE)[0]
            if cast is not None:  # f32 activations: the product runs in f16, as the kernels do
                return mx.matmul(x.astype(mx.float16), w.T).astype(cast)
            return mx.matmul(x, w.T)

        return run


#: Concrete backends by name: MLX ops, and every target with a runtime (its kernels).
_DISPATCH: dict[str, Callable[..., Dispatch]] = {
    "mlx": MlxOpsDispatch, **{name: partial(TargetDispatch, backend=name) for name in RUNTIMES}}


@lru_cache(maxsize=None)
def dispatch_for(fmt: Format, k: int, n: int, backend: str, parts: tuple[int, ...] = ()) -> Dispatch:
    """The shared Dispatch of (format, [K, N], concrete backend); with `parts` (widths adding
    up to N) its launches return y's columns as those parts."""
    return _DISPATCH[backend](fmt, k, n, parts=parts)


def layout_for(fmt: Format, k: int, n: int, backend: str) -> str:
    """The physical layout a concrete backend's kernels read for this weight."""
    return dispatch_for(fmt, k, n, backend).layout


__all__ = ["ACTIVATION_DTYPES", "Dispatch", "LINEAR", "check_activation", "dispatch_for", "layout_for"]
