"""The CUDA target above the compiler (its description, `CUDA`, is data in
`marlin_dsl/machine/cuda/`): printer (`printer.py`; the printed kernel `CudaSource` in `source.py`,
its compact form in `compact.py`), the launcher through `mx.fast.cuda_kernel` (`launch.py`) or,
compiled by NVRTC (`nvrtc.py`), through `mx.fast.precompiled_cuda_kernel`
(`launch_precompiled.py`), nvcc compile checks (`nvcc.py`), the H100-tuned tile tables (`tuning.py`) and the runtime that
compiles on first use (`runtime.py`)."""
from ...machine.cuda import CUDA
from ..base import register
from .printer import print_cuda

register(CUDA, print_cuda)

__all__ = ["print_cuda"]
