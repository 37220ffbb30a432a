"""The error model's checks for outputs a GPU computed from host-side inputs (the bench
scripts): the same `error_model.compare` that `check_kernel` uses, from a packed weight and
the activations as the GPU read them."""
from __future__ import annotations

import numpy as np

from ..formats.evaluate import dequantize
from ..formats.tensors import PackedWeights
from .error_model import OutputCheck, compare, kernel_weights


def check_gpu_output(y: np.ndarray, x: np.ndarray, packed: PackedWeights, activation: str,
                     w: np.ndarray | None = None, w_kernel: np.ndarray | None = None) -> OutputCheck:
    """`y` [M, N] (NaN where unwritten) against x @ W in float64; `x` [M, K] exactly as the
    kernel read it (rounded to `activation`). `w` / `w_kernel`: the dequantised weight and its
    kernel decode when the caller already has them (one per weight, many activations)."""
    w = dequantize(packed) if w is None else w
    wk = kernel_weights(packed, activation) if w_kernel is None else w_kernel
    return compare(y, x @ w, x, w, activation, wk)


def record(check: OutputCheck) -> dict:
    """The check as JSON fields for a result file."""
    return {"rel_error": check.rel_error, "tolerance": check.tolerance, "predicted": check.predicted,
            "bias": check.bias, "bias_range": list(check.bias_range), "max_error": check.max_error,
            "untouched": check.untouched, "ok": check.ok, "failures": check.failures()}


__all__ = ["check_gpu_output", "record"]
