"""The error model's checks for outputs a GPU computed from host-side inputs (the bench
scripts): the same `error_model.compare` that `check_kernel` uses, from a packed weight and
the activations as the GPU read them."""
from __future__ import annotations

import numpy as np

from ..formats.evaluate import dequantize
from ..formats.tensors import PackedWeights
from .error_model import OutputCheck, compare, kernel_weights


#: K positions one tensor-core accumulation step adds (mma.sync m16n8k16, wgmma k16)
TENSOR_CORE_K = 16


def tensor_core_bias(k: int) -> float:
    """How far toward zero a GPU's f32 accumulation may pull the slope of y on the reference
    over K: one rounding toward zero (at most one f32 ulp, 2^-23 relative) per accumulation
    step of TENSOR_CORE_K positions, half of that on average. Measured on the H100
    (bench/results/issue15_h100_2026-11-25d/error_model_gpu): slopes 1.8e-6 to 1.1e-5 below
    1 for K = 4096-4224 on every kernel, where this allows 1.5e-5 to 1.6e-5; a 0.05% decode
    error is 5e-4."""
    return (k / TENSOR_CORE_K) * 2.0 ** -24


def check_gpu_output(y: np.ndarray, x: np.ndarray, packed: PackedWeights, activation: str,
                     w: np.ndarray | None = None, w_kernel: np.ndarray | None = None) -> OutputCheck:
    """`y` [M, N] (NaN where unwritten) against x @ W in float64; `x` [M, K] exactly as the
    kernel read it (rounded to `activation`). `w` / `w_kernel`: the dequantised weight and its
    kernel decode when the caller already has them (one per weight, many activations). The
    bias may reach `tensor_core_bias(K)` toward zero: the tensor cores' f32 sums do not round
    to nearest."""
    w = dequantize(packed) if w is None else w
    wk = kernel_weights(packed, activation) if w_kernel is None else w_kernel
    return compare(y, x @ w, x, w, activation, wk, accumulation_bias=tensor_core_bias(x.shape[1]))


def record(check: OutputCheck) -> dict:
    """The check as JSON fields for a result file."""
    return {"rel_error": check.rel_error, "tolerance": check.tolerance, "predicted": check.predicted,
            "bias": check.bias, "bias_range": list(check.bias_range), "max_error": check.max_error,
            "untouched": check.untouched, "ok": check.ok, "failures": check.failures()}


__all__ = ["TENSOR_CORE_K", "check_gpu_output", "record", "tensor_core_bias"]
