"""CUDA kernels compiled on first use for `quantized_linear` (MLX's CUDA backend): the default
schedule of the format, lowered, passed and printed as `marlin-dsl compile` does, and launched
through `build_cuda_kernel`. Cached per (format, activation) for the process."""
from __future__ import annotations

from functools import lru_cache

from ..formats import Format
from ..schedule import Gemm, default_schedule
from ..targets import CUDA
from .cuda_launch import CudaGemm, build_cuda_kernel


@lru_cache(maxsize=None)
def cuda_gemm(fmt: Format, activation: str) -> CudaGemm:
    from ..compiler import compile_gemm

    gemm = Gemm(f"{fmt.name}_{activation}_auto", fmt, default_schedule(fmt), activation)
    return build_cuda_kernel(compile_gemm(gemm, CUDA).kernel)
