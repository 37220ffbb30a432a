"""Launch a printed GEMM kernel in process through MLX's `mx.fast.metal_kernel` (the `Launcher`
protocol, as `targets/cuda/launch.py` does for CUDA): `build_metal_kernel(kernel)` returns a
`MetalGemm`; call it with the packed weights (a `PackedWeights`, numpy or MLX arrays, in the
format's own layout: Metal kernels read no other) and activations x [M, K] to get y [M, N] as
an MLX array in the kernel's activation type.

Buffers as `kernel_args.gemm_buffers` lays them out for every executor: x (flat [M, K]), the packed
arrays by name (flat), `dims` = [M, N, K] (u32), then the outputs. The striped pipeline's
arrival counters are an output that must start at zero, so every output is filled with 0
(`init_value`), as the generated launcher of `ship.py` does. Grid in threads (MLX's
dispatch_threads), from `MetalSource.launch_dims`.

Importing this module needs only numpy and the printer; MLX is imported when a kernel is
launched (there is no Apple GPU in this project's test machines: the launch is exercised with a
stand-in for `mx.fast.metal_kernel`).

`MetalLaunch` binds any printed kernel (the activation sparsify kernels) the same way
(`TargetRuntime.kernel_launcher`): both go through `launch_source`, which builds the `dims`
input, the grid and threadgroup and the output dtypes from the `MetalSource`."""
from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ShapeError
from ...ir.core import Kernel
from ...machine.outputs import y_columns
from .printer import DIMS_NAME, MetalSource, print_metal

__all__ = ["MetalGemm", "MetalLaunch", "build_metal_kernel", "launch_source"]

#: MLX dtype names of the printed kernels' buffer types (`MetalSource.dtypes`).
_MX_DTYPE = {"float16_t": "float16", "bfloat16_t": "bfloat16", "float": "float32", "uint32_t": "uint32",
             "uint8_t": "uint8", "uint16_t": "uint16", "int32_t": "int32", "bool": "bool_"}


def _mx() -> Any:
    import mlx.core as mx

    return mx


class _MlxKernel:
    """A printed kernel's `mx.fast.metal_kernel` object, made on first use (`source`: its
    MetalSource), so nothing touches MLX until a launch."""

    source: MetalSource
    _kernel: Any = None

    @property
    def kernel(self) -> Any:
        """The `mx.fast.metal_kernel` object (created on first use)."""
        if self._kernel is None:
            self._kernel = self.source.mlx_kernel()
        return self._kernel


class MetalGemm(_MlxKernel):
    """A printed GEMM kernel bound to `mx.fast.metal_kernel`; see the module docstring."""

    def __init__(self, source: MetalSource, attrs: dict) -> None:
        self.source = source
        self.attrs = dict(attrs)
        self.tile = tuple(int(v) for v in attrs.get("tile", (0, 0, 0)))
        self.parallel = int(attrs.get("parallel", 1))
        self._kernel = None

    def sizes(self, m: int, n: int, k: int) -> dict[str, int]:
        """Element counts of the outputs for an M x N x K problem."""
        tm, tn, _ = self.tile
        tiles = -(-m // tm) * -(-n // tn) if tm and tn else 0
        sizes = {"y": m * n, "partials": tiles * self.parallel * tm * tn, "counters": tiles}
        sizes.update({name: m * w for name, w in self.y_columns(n).items()})
        return {name: sizes[name] for name in self.source.output_names}

    def y_columns(self, n: int) -> dict[str, int]:
        """The outputs holding Y and their columns (`base.y_columns`: y, or Y's parts)."""
        return y_columns(self.attrs, self.source.name, n, "weights")

    def __call__(self, weights: Any, x: Any) -> Any:
        """y = x @ W for x [M, K] (MLX or numpy); returns y [M, N]."""
        mx = _mx()
        s = self.source
        arrays = weights.arrays if hasattr(weights, "arrays") else dict(weights)
        k, n = (int(v) for v in weights.shape)
        if isinstance(x, np.ndarray):
            x = mx.array(np.asarray(x, dtype=np.float32))
        if x.ndim != 2 or x.shape[1] != k:
            raise ShapeError(f"x: expected [M, {k}], got {tuple(x.shape)}")
        m = int(x.shape[0])
        act = getattr(mx, _MX_DTYPE[s.dtypes["x"]])
        if x.dtype != act:
            x = x.astype(act)
        scalars = {"M": m, "N": n, "K": k}
        inputs = {"x": x}  # dims: launch_source builds it from the scalars
        for name in s.input_names:
            if name in ("x", DIMS_NAME):
                continue
            if name not in arrays:
                raise ShapeError(f"weights: no array {name!r} (kernel {s.name} reads it)")
            inputs[name] = (mx.array(np.ascontiguousarray(arrays[name]).ravel())
                            if isinstance(arrays[name], np.ndarray) else arrays[name].reshape(-1))
        sizes = self.sizes(m, n, k)
        cols = self.y_columns(n)
        shapes = {name: (m, cols[name]) if name in cols else (sizes[name],) for name in s.output_names}
        outs = launch_source(s, self.kernel, inputs, shapes, scalars, init_value=0)
        parts = [outs[name] for name in cols]
        return parts[0] if len(parts) == 1 else _mx().concatenate(parts, axis=1)  # Y's parts side by side


def launch_source(source: MetalSource, kernel: Any, arrays: dict[str, Any],
                  out_shapes: dict[str, tuple[int, ...]], scalars: dict[str, int],
                  init_value: float | None = None) -> dict[str, Any]:
    """One launch of `kernel` (`source.mlx_kernel()`): inputs in `source.input_names` order
    (`dims` built from `scalars` unless `arrays` has it), grid and threadgroup from the
    kernel's `GridDim`s, outputs in their printed dtypes; returns the outputs by name. MLX
    allocates every output (readwrite buffers included) and fills it with `init_value`."""
    mx = _mx()
    missing = [n for n in source.input_names if n not in arrays and n != DIMS_NAME]
    if missing:
        raise ShapeError(f"kernel {source.name}: no input array for {missing}")
    inputs = [arrays[n] if n in arrays else mx.array(source.dims(scalars)) for n in source.input_names]
    grid, threadgroup = source.launch_dims(scalars)
    outs = kernel(inputs=inputs, grid=grid, threadgroup=threadgroup,
                  output_shapes=[tuple(out_shapes[n]) for n in source.output_names],
                  output_dtypes=[getattr(mx, _MX_DTYPE[source.dtypes[n]]) for n in source.output_names],
                  init_value=init_value)
    return dict(zip(source.output_names, outs))


class MetalLaunch(_MlxKernel):
    """Any printed kernel bound to `mx.fast.metal_kernel` (the `KernelLaunch` protocol of
    targets/base.py): called with the input arrays by name, the output shapes by name, the
    launch scalars and the outputs' fill value; returns the outputs by name."""

    def __init__(self, kernel: Kernel, inout_inputs: tuple[str, ...] = ()) -> None:
        if inout_inputs:
            # MLX allocates a Metal kernel's outputs; the printer makes every readwrite buffer
            # an output (filled by init_value), so there is no zeroed-input convention here.
            raise ShapeError(f"metal: kernel {kernel.name}: readwrite buffers are outputs on Metal, "
                             f"not inputs ({list(inout_inputs)})")
        self.source: MetalSource = print_metal(kernel)
        self._kernel = None

    def __call__(self, arrays: dict[str, Any], out_shapes: dict[str, tuple[int, ...]],
                 scalars: dict[str, int], init_value: float | None = None) -> dict[str, Any]:
        return launch_source(self.source, self.kernel, arrays, out_shapes, scalars, init_value)


def build_metal_kernel(kernel: Kernel) -> MetalGemm:
    """A launcher for a lowered GEMM kernel."""
    return MetalGemm(print_metal(kernel), kernel.attrs)
