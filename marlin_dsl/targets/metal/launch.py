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
stand-in for `mx.fast.metal_kernel`)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ShapeError
from ...ir.core import Kernel
from .printer import DIMS_NAME, MetalSource, print_metal

__all__ = ["MetalGemm", "build_metal_kernel"]

#: MLX dtype names of the printed kernels' buffer types (`MetalSource.dtypes`).
_MX_DTYPE = {"float16_t": "float16", "bfloat16_t": "bfloat16", "float": "float32", "uint32_t": "uint32",
             "uint8_t": "uint8", "uint16_t": "uint16", "int32_t": "int32", "bool": "bool_"}


def _mx() -> Any:
    import mlx.core as mx

    return mx


class MetalGemm:
    """A printed GEMM kernel bound to `mx.fast.metal_kernel`; see the module docstring."""

    def __init__(self, source: MetalSource, attrs: dict) -> None:
        self.source = source
        self.attrs = dict(attrs)
        self.tile = tuple(int(v) for v in attrs.get("tile", (0, 0, 0)))
        self.parallel = int(attrs.get("parallel", 1))
        self._kernel = None

    @property
    def kernel(self) -> Any:
        """The `mx.fast.metal_kernel` object (created on first use)."""
        if self._kernel is None:
            self._kernel = self.source.mlx_kernel()
        return self._kernel

    def sizes(self, m: int, n: int, k: int) -> dict[str, int]:
        """Element counts of the outputs for an M x N x K problem."""
        tm, tn, _ = self.tile
        tiles = -(-m // tm) * -(-n // tn) if tm and tn else 0
        sizes = {"y": m * n, "partials": tiles * self.parallel * tm * tn, "counters": tiles}
        return {name: sizes[name] for name in self.source.output_names}

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
        inputs = []
        for name in s.input_names:
            if name == "x":
                inputs.append(x)
            elif name == DIMS_NAME:
                inputs.append(mx.array(s.dims(scalars)))
            elif name not in arrays:
                raise ShapeError(f"weights: no array {name!r} (kernel {s.name} reads it)")
            else:
                inputs.append(mx.array(np.ascontiguousarray(arrays[name]).ravel())
                              if isinstance(arrays[name], np.ndarray) else arrays[name].reshape(-1))
        sizes = self.sizes(m, n, k)
        grid, threadgroup = s.launch_dims(scalars)
        outs = self.kernel(inputs=inputs, grid=grid, threadgroup=threadgroup,
                           output_shapes=[(m, n) if name == "y" else (sizes[name],) for name in s.output_names],
                           output_dtypes=[getattr(mx, _MX_DTYPE[s.dtypes[name]]) for name in s.output_names],
                           init_value=0)
        return outs[s.output_names.index("y")]


def build_metal_kernel(kernel: Kernel) -> MetalGemm:
    """A launcher for a lowered GEMM kernel."""
    return MetalGemm(print_metal(kernel), kernel.attrs)
