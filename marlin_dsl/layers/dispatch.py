"""What a layer runs for each call: one `Dispatch` per (format, weight shape, backend), shared
by every layer of that kind, holding the kernels per row count.

A call of `MarlinLinear` is `dispatch(x2, arrays)`: a dictionary lookup of the launch bound to
this row count and activation type (built once: schedule, kernel, grid, output shapes, the
`dims` array), then one `mx.fast.*_kernel` call. Nothing on this path touches numpy, copies
to the host or synchronises, so it runs inside `mx.compile` too. Kernels are compiled on
first use of a schedule (compilation is cached per schedule by `cuda_runtime.cuda_gemm`) and
shared by all layers of the format.

`layout` is the physical layout a backend's kernels read (`layers.weights`): the CUDA
weight-stream layout where the format has one, else the format's own linear layout.
"""
from __future__ import annotations

import os
from functools import lru_cache
from typing import Callable, Mapping

import mlx.core as mx

from ..errors import MarlinDSLError, ScheduleError
from ..formats import Format
from ..mlx_ops import dequantize_mx

LINEAR = "linear"
#: MARLIN_DSL_POISON=1 fills kernel outputs with NaN before each launch, so that an element a
#: kernel fails to write shows (for checks; it costs a fill per call).
_INIT_VALUE = float("nan") if os.environ.get("MARLIN_DSL_POISON") else None

#: MLX activation dtype -> the kernels' activation type name.
_KERNEL_ACTIVATION = {mx.float16: "f16", mx.bfloat16: "bf16"}


class Dispatch:
    """y [M, N] = x2 [M, K] @ W for one (format, [K, N], backend); see the module docstring.
    `arrays` maps the weight's array names to the arrays in `layout` (it may hold more)."""

    layout: str = LINEAR

    def __init__(self, fmt: Format, k: int, n: int) -> None:
        self.fmt, self.k, self.n = fmt, k, n

    def __call__(self, x2: mx.array, arrays: Mapping[str, mx.array]) -> mx.array:
        raise NotImplementedError


class MlxOpsDispatch(Dispatch):
    """Dequantise with MLX ops, then `mx.matmul`: runs on every MLX device (the CPU too)."""

    def __init__(self, fmt: Format, k: int, n: int) -> None:
        super().__init__(fmt, k, n)
        self.names = [spec.name for spec in fmt.buffers(k, n)]

    def __call__(self, x2: mx.array, arrays: Mapping[str, mx.array]) -> mx.array:
        w = dequantize_mx(self.fmt, (self.k, self.n), {name: arrays[name] for name in self.names})
        return mx.matmul(x2, w.astype(x2.dtype))


class _BoundLaunch:
    """One kernel bound to one problem size: everything but x and the weight arrays is fixed."""

    __slots__ = ("kernel", "names", "dims", "grid", "threadgroup", "shapes", "dtypes", "y_index")

    def __init__(self, kernel, names, dims, grid, threadgroup, shapes, dtypes, y_index) -> None:
        self.kernel, self.names, self.dims = kernel, names, dims
        self.grid, self.threadgroup, self.shapes, self.dtypes = grid, threadgroup, shapes, dtypes
        self.y_index = y_index

    def __call__(self, x2: mx.array, arrays: Mapping[str, mx.array]) -> mx.array:
        inputs = [x2 if n == "x" else self.dims if n == "dims" else arrays[n] for n in self.names]
        outs = self.kernel(inputs=inputs, output_shapes=self.shapes, output_dtypes=self.dtypes,
                           grid=self.grid, threadgroup=self.threadgroup, init_value=_INIT_VALUE)
        return outs[self.y_index]


class _KernelDispatch(Dispatch):
    """Our kernels: a launch bound per (row count, activation dtype), made on first use."""

    def __init__(self, fmt: Format, k: int, n: int) -> None:
        super().__init__(fmt, k, n)
        self._bound: dict[tuple[int, mx.Dtype], _BoundLaunch] = {}

    def __call__(self, x2: mx.array, arrays: Mapping[str, mx.array]) -> mx.array:
        m, dtype = x2.shape[0], x2.dtype
        launch = self._bound.get((m, dtype))
        if launch is None:
            launch = self._bound[(m, dtype)] = self._bind(m, dtype)
        if dtype not in _KERNEL_ACTIVATION:  # f32 activations run as f16
            return launch(x2.astype(mx.float16), arrays).astype(dtype)
        return launch(x2, arrays)

    def _bind(self, m: int, dtype: mx.Dtype) -> _BoundLaunch:
        raise NotImplementedError


class CudaDispatch(_KernelDispatch):
    """Our CUDA kernels through MLX's CUDA backend, the schedule chosen by row count."""

    def __init__(self, fmt: Format, k: int, n: int) -> None:
        super().__init__(fmt, k, n)
        from ..lowering.stream_layout import LAYOUT_NAME, stream_layout
        from ..targets import CUDA

        try:
            stream_layout(fmt, CUDA)
            self.layout = LAYOUT_NAME
        except ScheduleError:  # no weight-stream layout: the fused kernel reads the linear one
            self.layout = LINEAR

    def _bind(self, m: int, dtype: mx.Dtype) -> _BoundLaunch:
        from ..backends.cuda_runtime import cuda_gemm, cuda_schedule

        gemm = cuda_gemm(self.fmt, _KERNEL_ACTIVATION.get(dtype, "f16"), cuda_schedule(self.fmt, m, self.k, self.n))
        source = gemm.source
        if source.inout_inputs:
            raise MarlinDSLError(f"kernel {source.name}: layers do not run kernels with zeroed "
                                 f"state buffers ({source.inout_inputs})")
        if (gemm.source.attrs.get("weight_layout") or LINEAR) != self.layout:
            raise MarlinDSLError(f"kernel {source.name}: reads layout "
                                 f"{gemm.source.attrs.get('weight_layout')!r}, the layer holds {self.layout!r}")
        scalars = {"M": m, "N": self.n, "K": self.k}
        grid, threadgroup = source.launch_dims(scalars)
        out_dtype = {"f16": mx.float16, "bf16": mx.bfloat16}
        shapes = [(m, self.n) if name == "y" else (0,) for name in source.output_names]
        dtypes = [out_dtype[source.elems[name]] if name == "y" else mx.float32 for name in source.output_names]
        if any(name != "y" for name in source.output_names):
            raise MarlinDSLError(f"kernel {source.name}: layers run kernels whose only output is y")
        return _BoundLaunch(gemm.kernel, list(source.input_names), mx.array(source.dims(scalars)),
                            grid, threadgroup, shapes, dtypes, source.output_names.index("y"))


class MetalDispatch(_KernelDispatch):
    """Our Metal kernels (the format's default schedule) through `mx.fast.metal_kernel`."""

    def _bind(self, m: int, dtype: mx.Dtype) -> _BoundLaunch:
        from ..backends.metal_runtime import metal_launcher

        module = metal_launcher(self.fmt, _KERNEL_ACTIVATION.get(dtype, "f16"))
        gx, gy, gz = module.threadgroups(m, self.n, self.k)
        specs = module.output_specs(m, self.n, self.k)
        names = list(module.OUTPUT_NAMES)
        shapes = [(m, self.n) if name == "y" else shape for name, shape, _ in specs]
        return _BoundLaunch(module.kernel(), list(module.INPUT_NAMES),
                            mx.array([m, self.n, self.k], dtype=mx.uint32),
                            (gx * module.THREADS, gy, gz), (module.THREADS, 1, 1), shapes,
                            [dtype_ for _, _, dtype_ in specs], names.index("y"))


_DISPATCH: dict[str, Callable[[Format, int, int], Dispatch]] = {
    "mlx": MlxOpsDispatch, "cuda": CudaDispatch, "metal": MetalDispatch}


@lru_cache(maxsize=None)
def dispatch_for(fmt: Format, k: int, n: int, backend: str) -> Dispatch:
    """The shared Dispatch of (format, [K, N], concrete backend)."""
    return _DISPATCH[backend](fmt, k, n)


def layout_for(fmt: Format, k: int, n: int, backend: str) -> str:
    """The physical layout a concrete backend's kernels read for this weight."""
    return dispatch_for(fmt, k, n, backend).layout


__all__ = ["Dispatch", "LINEAR", "dispatch_for", "layout_for"]
