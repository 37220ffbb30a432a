"""Lowering of formats and schedules to kernel IR."""
from .gemm import lower_gemm

__all__ = ["lower_gemm"]
