"""Lowering of formats and schedules to kernel IR."""
from .pipelines import lower_gemm

__all__ = ["lower_gemm"]
