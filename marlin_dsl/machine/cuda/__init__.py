"""The CUDA target as data: its description (`description.py`, `CUDA`) and the two
hardware-checked numpy models it is made from: the 2:4 sparse mma.sp (`sparse_layout.py`,
`bench/probes/mma_sp_probe.py`) and Hopper's warpgroup MMA (`wgmma_layout.py`,
`bench/probes/wgmma_probe.py`). Data only; what prints and runs CUDA is `marlin_dsl/targets/cuda/`."""
from .description import CUDA

__all__ = ["CUDA"]
