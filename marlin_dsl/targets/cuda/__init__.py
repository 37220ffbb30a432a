"""The CUDA target: description (`description.py`, with the hardware-checked model of mma.sp in
`sparse_layout.py`), printer (`printer.py`; the printed kernel `CudaSource` in `source.py`,
its compact form in `compact.py`), the launcher through `mx.fast.cuda_kernel` (`launch.py`) or,
compiled by NVRTC (`nvrtc.py`), through `mx.fast.precompiled_cuda_kernel`
(`launch_precompiled.py`), nvcc compile checks (`nvcc.py`), the H100-tuned tile tables (`tuning.py`) and the runtime that
compiles on first use (`runtime.py`)."""
from ..base import register
from .description import CUDA
from .printer import print_cuda

register(CUDA, print_cuda)

__all__ = ["CUDA", "print_cuda"]
