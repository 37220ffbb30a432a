"""Launch a printed CUDA kernel compiled ahead by NVRTC, through `mx.fast.precompiled_cuda_kernel`.

Why: MLX's `mx.fast.cuda_kernel` compiles with NVRTC for the device's plain `sm_<cc>`
(mlx/backend/cuda/jit_module.cpp), so a kernel written for an architecture-specific target
(`attrs["cuda_arch"] == "sm_90a"`: Hopper's `wgmma`) cannot go through it. And it rebuilds and
hashes the kernel's source string on every call; a precompiled launch hands MLX the compiled
bytes instead, which may cost less host time per call (bench/probes/launch_path_bench.py measures it).

How MLX 0.32.4 runs it (mlx/backend/cuda/custom_kernel.cpp, `precompiled_custom_kernel` and
`CustomKernel::eval_gpu`): the bytes (a cubin or PTX) are loaded with `cuModuleLoadDataEx`
once per *name* for the life of the process (the name is also the module cache key, so it
carries a hash of the source), the function is looked up by exactly that name (so the kernel
is `extern "C"`: `CudaSource.precompiled_source`), its parameters are the inputs' device
pointers, then the outputs', then `scalars` (none here: launch scalars travel in `dims`);
grid is in threads as for `cuda_kernel` (blocks = ceil(grid / threadgroup)); `shared_memory`
is dynamic shared memory, opted in with CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES above
48000 bytes; outputs are filled with `init_value` when given. `ensure_row_contiguous` defaults
to False there and True in `cuda_kernel`: we pass True, so both paths see the same inputs.

Which path a kernel takes (`launch_path`): an architecture-specific `cuda_arch` (suffix "a" or
"f") or a `launch_bounds` attribute (the printer's `__launch_bounds__`, which only our own
signature carries) always launches precompiled; every other kernel goes through `cuda_kernel` unless
$MARLIN_DSL_CUDA_LAUNCH=precompiled selects this path for all (to compare host costs). The
variable is read when a kernel is bound to MLX, once per kernel and process (layers share
their kernels), so set it before the first launch.

Importing this module needs no MLX; MLX is imported when a kernel is built.
"""
from __future__ import annotations

import os
import re
from typing import Any, Sequence

from ...errors import EnvironmentUnavailable, MarlinDSLError
from .nvrtc import compile_cuda
from .source import CudaSource

__all__ = ["LAUNCH_PATHS", "PrecompiledKernel", "arch_specific", "device_arch", "kernel_arch",
           "launch_path", "precompiled_kernel"]

#: "cuda_kernel": MLX compiles the text (the default); "precompiled": NVRTC here, MLX loads the bytes.
LAUNCH_PATHS = ("cuda_kernel", "precompiled")
_ARCH = re.compile(r"(sm|compute)_(\d+)([af]?)$")


def arch_specific(arch: str | None) -> bool:
    """Whether `arch` names an architecture-specific feature set (sm_90a, sm_100f...), which
    code for plain sm_<cc> (what MLX's JIT compiles for) does not have."""
    m = _ARCH.match(arch or "")
    return bool(m and m.group(3))


def launch_path(source: CudaSource) -> str:
    """"precompiled" for a kernel that needs an architecture-specific target or
    `__launch_bounds__` (MLX's `cuda_kernel` writes the signature itself, without it), else
    $MARLIN_DSL_CUDA_LAUNCH (default "cuda_kernel")."""
    if arch_specific(source.attrs.get("cuda_arch")) or source.attrs.get("launch_bounds"):
        return "precompiled"
    path = os.environ.get("MARLIN_DSL_CUDA_LAUNCH", "").strip().lower() or "cuda_kernel"
    if path not in LAUNCH_PATHS:
        raise MarlinDSLError(f"MARLIN_DSL_CUDA_LAUNCH={path!r}: expected one of {', '.join(LAUNCH_PATHS)}")
    return path


def device_arch() -> str:
    """sm_<cc> of MLX's default GPU (mx.device_info()); EnvironmentUnavailable without one."""
    import mlx.core as mx

    info = mx.device_info() if hasattr(mx, "device_info") else {}
    arch = str(info.get("architecture", ""))
    if not arch.startswith("sm_") and "compute_capability_major" in info:
        arch = f"sm_{info['compute_capability_major']}{info.get('compute_capability_minor', 0)}"
    if not _ARCH.match(arch):
        raise EnvironmentUnavailable(f"cuda: no NVIDIA GPU architecture from mx.device_info() ({dict(info)}): "
                                     "a precompiled launch needs MLX's CUDA backend")
    return arch


def kernel_arch(source: CudaSource, device: str) -> str:
    """The architecture to compile `source` for on a `device` (sm_<cc>): its architecture-
    specific `cuda_arch` where it has one (which must be the device's: sm_90a code runs on
    cc 9.0 only), else the device's own (a cubin runs only on its major version)."""
    want = source.attrs.get("cuda_arch")
    if not arch_specific(want):
        return device
    m, d = _ARCH.match(str(want)), _ARCH.match(device)
    if m is None or d is None or m.group(2) != d.group(2):
        raise EnvironmentUnavailable(f"cuda: kernel {source.name} is written for {want}; this GPU is {device}")
    return f"sm_{m.group(2)}{m.group(3)}"


class PrecompiledKernel:
    """A kernel compiled by NVRTC, callable like the object `mx.fast.cuda_kernel` returns
    (`inputs=, output_shapes=, output_dtypes=, grid=, threadgroup=, init_value=`), so that
    every launcher (CudaGemm, CudaLaunch, the layers' dispatch) takes either path unchanged."""

    def __init__(self, source: CudaSource, name: str, arch: str) -> None:
        self.name, self.arch = name, arch
        #: the translation unit compiled (the function is `extern "C"` `name`)
        self.text = source.precompiled_source(name)
        self.compiled: bytes = compile_cuda(self.text, name, arch)
        self.shared_memory = int(source.dynamic_shared_bytes)
        self.input_names, self.output_names = list(source.input_names), list(source.output_names)
        self._launch: Any = None  # mx.fast.precompiled_cuda_kernel, looked up on the first call

    def __call__(self, *, inputs: Sequence[Any], output_shapes: Sequence[Sequence[int]],
                 output_dtypes: Sequence[Any], grid: tuple[int, int, int], threadgroup: tuple[int, int, int],
                 init_value: float | None = None, verbose: bool = False, template: Any = None,
                 stream: Any = None) -> list:
        if self._launch is None:
            import mlx.core as mx

            self._launch = mx.fast.precompiled_cuda_kernel
        if template:
            raise MarlinDSLError(f"cuda: kernel {self.name} is precompiled: it takes no template arguments")
        if verbose:
            print(f"precompiled kernel {self.name} ({self.arch}, {len(self.compiled)} bytes):\n{self.text}")
        return self._launch(
            name=self.name, compiled_source=self.compiled, inputs=inputs, output_shapes=output_shapes,
            output_dtypes=output_dtypes, scalars=[], grid=grid, threadgroup=threadgroup,
            shared_memory=self.shared_memory, init_value=init_value, ensure_row_contiguous=True,
            stream=stream)


def precompiled_kernel(source: CudaSource, name: str | None = None, arch: str | None = None) -> PrecompiledKernel:
    """`source` compiled for `arch` (default: `kernel_arch` on MLX's GPU) and bound to
    `mx.fast.precompiled_cuda_kernel`; EnvironmentUnavailable where MLX lacks it."""
    name = name or f"{source.name}_{source.digest[:12]}"
    if arch is None:
        import mlx.core as mx

        if not hasattr(mx.fast, "precompiled_cuda_kernel"):
            raise EnvironmentUnavailable(f"cuda: kernel {source.name} needs mx.fast.precompiled_cuda_kernel, "
                                         f"which MLX {mx.__version__} lacks (0.32.4 has it)")
        arch = kernel_arch(source, device_arch())
    return PrecompiledKernel(source, name, arch)
