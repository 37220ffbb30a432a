"""A kernel printed for CUDA (`CudaSource`): the text `mx.fast.cuda_kernel` takes, complete
translation units for nvcc and for NVRTC (`precompiled_source`: the extern "C" kernel that
`mx.fast.precompiled_cuda_kernel` loads, targets/cuda/launch_precompiled.py), and manifests
for launching where the compiler does not run.

How MLX 0.32.4 builds and launches a custom CUDA kernel. Sources read (ml-explore/mlx, the
revision whose `JitModule` takes a `(precompiled, source, names)` builder and `use_disk_cache`,
as the 0.32.4 wheel's installed `mlx/backend/cuda/jit_module.h` does):
`mlx/backend/cuda/custom_kernel.cpp` (`default_header`, `build_kernel`, `cuda_kernel`,
`CustomKernel::eval_gpu`), `mlx/backend/cuda/jit_module.cpp` (`compile`, `get_jit_module`),
`mlx/backend/cuda/utils.cpp` (`dtype_to_cuda_type`), `mlx/backend/cuda/device/utils.cuh`;
the Python signature is the 0.32.4 wheel's own (`help(mx.fast.cuda_kernel)`):
`cuda_kernel(name, input_names, output_names, source, header="", ensure_row_contiguous=True,
shared_memory=0)`, called as `kernel(inputs=, output_shapes=, output_dtypes=, grid=,
threadgroup=, template=, init_value=, verbose=, stream=)`.

- The source text is MLX's default header (`#include "mlx/backend/cuda/device/utils.cuh"`,
  which includes <cuda_bf16.h>, <cuda_fp16.h> and cuda/std headers and defines `Shape` /
  `Strides`; `#include <cooperative_groups.h>`; `#define inf ...`), then our `header` at global
  scope, then `namespace mlx::core::cu {` + `namespace cg = cooperative_groups;` and
  `__global__ void custom_kernel_<name><template hash>(...)` (no `extern "C"`: NVRTC name
  expressions give the mangled name), `constexpr`/`using` lines for template arguments, then
  `source`, then `}` and the namespace's closing brace (`mlx_source()` reproduces it).
- Parameters: every input as `const T* <name>` in `input_names` order, then every output as
  `T* <name>`; T from `dtype_to_cuda_type`: `__half`, `__nv_bfloat16`, `float`, `uint32_t`,
  `uint8_t`, `int32_t`, `bool`... An input with ndim > 0 whose name followed by `_shape`,
  `_strides` or `_ndim` occurs in the source also gets `const __grid_constant__ Shape/Strides/
  int` parameters (the printer refuses bodies that would trigger this). There are no thread
  index parameters: the body uses `threadIdx` / `blockIdx`. No `__launch_bounds__`.
- Compilation: NVRTC with only `--gpu-architecture=sm_<cc>` (sm_90 on H100; compute_<cc> if
  NVRTC is too old for the device) and `--include-path`s for MLX's bundled CCCL and the CUDA
  headers: NVRTC's defaults otherwise, i.e. C++17, full optimisation, no fast-math, FMA contraction on (so
  the printer uses the `_rn` intrinsics, which are never contracted). The module is cached in
  process *by kernel name* (`get_jit_module(device, name, ...)`), and a PTX disk cache keyed
  by name is read (custom kernels do not write it), so two different sources must not share
  a name: the launcher appends a hash of the source to the name.
- Launch: `grid` and `threadgroup` are in threads as for `metal_kernel`: block =
  (min(tx, gx), min(ty, gy), min(tz, gz)), grid = ceil(g / t) per dimension (`launch_dims`
  gives both). Outputs are allocated by MLX, uninitialised or filled with `init_value` cast
  to each output's dtype; inputs are copied to row-contiguous ones first (by default).
  `shared_memory` is *dynamic* shared memory (opt-in above 48000 bytes); the printed kernels
  only use static `__shared__` arrays (<= 48 KB, the CUDA target's limit), so it stays 0.

Calling convention (as the Metal printer's): inputs are the read-only buffers in kernel order,
then `dims`, a u32 array holding the launch scalars in `kernel.scalars` order (M, N, K), so one
compiled kernel serves every shape; outputs are the write and readwrite buffers. A readwrite
buffer named in `inout_inputs` is passed as an input instead (after the read-only ones, before
`dims`): MLX declares it `const`, the body writes through a `const_cast` alias. That is for
state the kernel must find initialised and leaves as it found it (the striped pipeline's
arrival counters), so that the real outputs can still be poisoned through `init_value`.
MLX's CUDA command encoder orders the nodes of its CUDA graph through the arrays each node
*writes* (`CommandEncoder::set_output_array`, mlx/backend/cuda/device.cpp), so such an input
must not be shared by launches that are queued together: the launcher gives every launch its
own zeroed array.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace

import numpy as np

from ...ir.core import GridDim
from .compact import compact_cuda, trim_prelude

__all__ = ["CudaSource", "MLX_DEFAULT_HEADER", "CUDA_SCALAR", "NVRTC_PREAMBLE"]

#: The text MLX puts before the header (mlx/backend/cuda/custom_kernel.cpp, `default_header`).
MLX_DEFAULT_HEADER = """
#include "mlx/backend/cuda/device/utils.cuh"

#include <cooperative_groups.h>

#define inf cuda::std::numeric_limits<float>::infinity()

"""

#: What a translation unit compiled by NVRTC outside MLX (`precompiled_source`) needs in front
#: of the prelude: under NVRTC there is no <cstdint>, and MLX's JIT path gets the fixed-width
#: integer types from its device/utils.cuh, which includes CCCL's cuda/std headers.
NVRTC_PREAMBLE = "#include <cuda/std/cstdint>\n"

#: MLX's `dtype_to_cuda_type` spelling of every scalar element type.
CUDA_SCALAR = {"bool": "bool", "u8": "uint8_t", "u16": "uint16_t", "u32": "uint32_t",
               "i32": "int32_t", "f16": "__half", "bf16": "__nv_bfloat16", "f32": "float"}


# ----- the printed kernel ---------------------------------------------------------------------

@dataclass
class CudaSource:
    """A kernel printed for CUDA: what `mx.fast.cuda_kernel` takes, and complete sources."""

    name: str
    #: The shared prelude (codegen/cuda_prelude.cuh); guarded, so several kernels can share a TU.
    prelude: str
    #: This kernel's program-scope declarations (constant tables).
    declarations: str
    body: str
    input_names: list[str]
    output_names: list[str]
    #: IR element type of every buffer and of `dims` (u32).
    elems: dict[str, str]
    threads: int
    grid: tuple  # the kernel's GridDims
    scalar_names: list[str] = field(default_factory=list)
    #: "read", "write" or "readwrite" for every buffer (dims: "read").
    access: dict[str, str] = field(default_factory=dict)
    #: readwrite buffers passed as inputs (see the module docstring).
    inout_inputs: list[str] = field(default_factory=list)
    shared_bytes: int = 0
    #: bytes of dynamic shared memory the launch must request (0: the arrays are static)
    dynamic_shared_bytes: int = 0
    #: the kernel's attrs that a launcher needs (tile, pipeline, parallel, format, activation...).
    #: "cuda_arch": the one architecture the kernel is written for (e.g. "sm_90a" for wgmma):
    #: nvcc checks compile it for that target only (nvcc.py) and an architecture-specific one
    #: (suffix a/f) launches precompiled (launch_precompiled.py): MLX's JIT cannot target it.
    attrs: dict = field(default_factory=dict)

    @property
    def header(self) -> str:
        """What `mx.fast.cuda_kernel(header=...)` takes: prelude + this kernel's declarations."""
        return self.prelude + "\n" + self.declarations

    @property
    def mlx_kernel_name(self) -> str:
        return f"custom_kernel_{self.name}"

    @property
    def dtypes(self) -> dict[str, str]:
        """CUDA type of every parameter (MLX's `dtype_to_cuda_type` spelling)."""
        return {n: CUDA_SCALAR[e] for n, e in self.elems.items()}

    @property
    def digest(self) -> str:
        """A hash of everything MLX compiles (header, body, parameter types)."""
        h = hashlib.sha256()
        for part in (self.header, self.body, repr(self.input_names), repr(self.output_names),
                     repr(sorted(self.elems.items()))):
            h.update(part.encode())
            h.update(b"\0")
        if self.attrs.get("launch_bounds"):  # compiled into the kernel (full_source's signature)
            h.update(f"launch_bounds={self.attrs['launch_bounds']}".encode())
        return h.hexdigest()

    def parameters(self) -> list[str]:
        """`const T* name` for inputs, `T* name` for outputs, as MLX writes them."""
        d = self.dtypes
        return [f"const {d[n]}* {n}" for n in self.input_names] + [f"{d[n]}* {n}" for n in self.output_names]

    def signature(self, name: str | None = None, extern_c: bool = True) -> str:
        name = name or self.mlx_kernel_name
        params = ",\n".join(f"    {p}" for p in self.parameters())
        prefix = 'extern "C" ' if extern_c else ""
        bounds = self.attrs.get("launch_bounds")
        qualifier = f"__launch_bounds__({int(bounds)}, 1) " if bounds else ""
        return f"{prefix}__global__ void {qualifier}{name}(\n{params}) {{\n"

    def full_source(self, name: str | None = None, namespace: str | None = None,
                    extern_c: bool = True) -> str:
        """A complete CUDA translation unit: prelude, declarations and the kernel with MLX's
        parameter list. With `namespace`, the declarations and the kernel go in that namespace
        (so that several kernels can be compiled as one translation unit)."""
        parts = [self.prelude, "\n"]
        if namespace:
            parts.append(f"namespace {namespace} {{\n\n")
        parts += [self.declarations, self.signature(name, extern_c), self.body, "}\n"]
        if namespace:
            parts.append(f"\n}}  // namespace {namespace}\n")
        return "".join(parts)

    def precompiled_source(self, name: str | None = None) -> str:
        """A complete translation unit for NVRTC (targets/cuda/nvrtc.py) whose kernel is
        `extern "C" __global__ void <name>(inputs..., outputs...)`: what
        `mx.fast.precompiled_cuda_kernel` loads and looks up by exactly that name, passing the
        inputs then the outputs (no scalars: the launch scalars travel in `dims`)."""
        return NVRTC_PREAMBLE + self.full_source(name=name or self.name, extern_c=True)

    def mlx_source(self, name: str | None = None) -> str:
        """The translation unit MLX 0.32 generates for this kernel (`build_kernel`), when
        launched as `mx.fast.cuda_kernel(name=name or self.name, ...)`."""
        name = name or self.name
        params = self.parameters()
        text = MLX_DEFAULT_HEADER + self.header
        text += "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
        text += f"__global__ void custom_kernel_{name}(\n"
        text += ",\n".join(f"    {p}" for p in params) + ") {\n"
        text += self.body + "\n}\n\n} // namespace mlx::core::cu\n"
        return text

    def groups(self, scalars: dict[str, int]) -> tuple[int, int, int]:
        sizes = {k: int(v) for k, v in scalars.items()}
        return tuple(d.evaluate(sizes) for d in self.grid)  # type: ignore[return-value]

    def launch_dims(self, scalars: dict[str, int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """(grid in threads, threadgroup) for `mx.fast.cuda_kernel(...)(grid=..., threadgroup=...)`."""
        gx, gy, gz = self.groups(scalars)
        return (gx * self.threads, gy, gz), (self.threads, 1, 1)

    def dims(self, scalars: dict[str, int]) -> np.ndarray:
        """The `dims` input for these launch scalars."""
        return np.array([int(scalars[n]) for n in self.scalar_names], dtype=np.uint32)

    def compact(self) -> "CudaSource":
        """The same kernel as compact text (targets/cuda/compact.py): comments and layout
        removed, the prelude cut to what this kernel uses. What MLX launches: its host cost
        per launch grows with the text."""
        return replace(self, prelude=trim_prelude(self.prelude, self.declarations + self.body),
                       declarations=compact_cuda(self.declarations), body=compact_cuda(self.body))

    @property
    def shared_memory_kwargs(self) -> dict:
        """`shared_memory=` for mx.fast.cuda_kernel where the kernel uses dynamic shared memory."""
        return {"shared_memory": self.dynamic_shared_bytes} if self.dynamic_shared_bytes else {}

    # ----- manifests (printed here, launched on a machine without the compiler) -------------

    def to_json(self) -> dict:
        return {
            "name": self.name, "prelude": self.prelude, "declarations": self.declarations,
            "body": self.body, "input_names": list(self.input_names),
            "output_names": list(self.output_names), "elems": dict(self.elems),
            "threads": self.threads,
            "grid": [[d.symbol, d.tile, d.count] for d in self.grid],
            "scalar_names": list(self.scalar_names), "access": dict(self.access),
            "inout_inputs": list(self.inout_inputs), "shared_bytes": self.shared_bytes,
            "attrs": {k: list(v) if isinstance(v, tuple) else v for k, v in self.attrs.items()},
            # only where needed, so manifests of static-memory kernels keep their form
            **({"dynamic_shared_bytes": self.dynamic_shared_bytes} if self.dynamic_shared_bytes else {}),
        }

    @classmethod
    def from_json(cls, data: dict) -> "CudaSource":
        d = dict(data)
        d["grid"] = tuple(GridDim(s, int(t), int(c)) for s, t, c in d["grid"])
        d["attrs"] = {k: tuple(v) if isinstance(v, list) else v for k, v in d.get("attrs", {}).items()}
        return cls(**d)
