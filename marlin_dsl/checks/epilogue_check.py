"""The error model through a Gemm's epilogue (bias, gated activation, residual add).

A kernel with an epilogue computes out = E(x @ w_kernel) in f32 and rounds once. Its error
against the float64 reference E(x @ w) is the product's error (the error model's weight and
accumulation terms, `error_model.predict`, without the product's own output rounding: the
epilogue does not round the product) carried through E to first order, plus the one output
rounding:

    var_out = (dE/dy)^2 var_y  (+ the gate's two inputs: (act'(g) u)^2 var_g + act(g)^2 var_u)
              + ulp(out)^2 / 12

The exp2 and reciprocal the activations use are within a few f32 ulp: far below the f16 / bf16
terms. The checks are the error model's norm and worst-element checks on these variances
(`compare`'s factors); the slope check stays with the GEMM without an epilogue (a nonlinear E
has no single slope), so `bias_range` here is unbounded and only reported.
"""
from __future__ import annotations

import numpy as np

from ..epilogue import activation, reference_epilogue
from ..machine.outputs import GATE_ROWS, GATES
from .error_model import (_FLOAT, MAX_ELEMENT_FRACTION, NORM_FACTOR, NORM_SAMPLING, OutputCheck, predict,
                          rounding_variance)


def _pairs(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(gate, up) columns of an interleaved [M, N] array, each [M, N / 2]."""
    m, n = a.shape
    p = a.reshape(m, n // (2 * GATE_ROWS), 2, GATE_ROWS)
    return p[:, :, 0, :].reshape(m, -1), p[:, :, 1, :].reshape(m, -1)


def _derivative(gate: str, g: np.ndarray) -> np.ndarray:
    if gate == "silu":
        s = 1.0 / (1.0 + np.exp(-g))
        return s * (1.0 + g * (1.0 - s))
    h = 1e-6 * np.maximum(np.abs(g), 1.0)
    return (activation(gate, g + h) - activation(gate, g - h)) / (2.0 * h)


def compare_epilogue(y: np.ndarray, steps: tuple[str, ...], x: np.ndarray, w: np.ndarray, activation_type: str,
                     w_kernel: np.ndarray | None = None, bias: np.ndarray | None = None,
                     residual: np.ndarray | None = None) -> OutputCheck:
    """Kernel output `y` [M, N_out] of an epilogue with `steps` against the float64 reference,
    from the activations `x` as the kernel read them, the weights `w` (float64) and as decoded
    (`w_kernel`), and the epilogue's inputs as the kernel read them."""
    y = np.asarray(y, dtype=np.float64)
    product = x @ w
    pred = predict(x, w, product, activation_type, w_kernel)
    var = np.maximum(pred.variance - rounding_variance(product, activation_type), 0.0)
    pre = product + (bias[None, :] if "bias" in steps else 0.0)
    gate = next((s for s in steps if s in GATES), None)
    if gate is not None:
        (g, u), (vg, vu) = _pairs(pre), _pairs(var)
        var = np.square(_derivative(gate, g) * u) * vg + np.square(activation(gate, g)) * vu
    ref = reference_epilogue(steps, product, bias, residual)
    var = var + rounding_variance(ref, activation_type)
    untouched = int(np.isnan(y).sum())
    diff = np.where(np.isnan(y), 0.0, y) - ref
    n = max(ref.size, 1)
    ref2 = float(np.square(ref).sum())
    ref_norm = max(float(np.sqrt(ref2)), 1e-300)
    predicted = float(np.sqrt(var.sum())) / ref_norm
    rel = float(np.linalg.norm(diff)) / ref_norm
    man, _ = _FLOAT[activation_type]
    slack = 2.0 ** -(man + 1) * np.abs(ref) + 6.0 * np.sqrt(var)
    rms = max(float(np.sqrt(ref2 / n)), 1e-300)
    over = (np.abs(diff) - slack) / rms
    flat = int(np.argmax(over)) if over.size else 0
    worst = tuple(int(i) for i in np.unravel_index(flat, ref.shape)) if over.size else (0, 0)
    slope = float((diff * ref).sum() / ref2) if ref2 > 0 else 0.0
    return OutputCheck(rel, predicted * (NORM_FACTOR + NORM_SAMPLING / np.sqrt(n)), predicted, slope,
                       (-np.inf, np.inf), float(max(over.flat[flat], 0.0)) if over.size else 0.0,
                       MAX_ELEMENT_FRACTION, worst, untouched)  # type: ignore[arg-type]


__all__ = ["compare_epilogue"]
