"""How far a correct kernel's output may sit from the float64 reference, from an error model.

A kernel computes Y = X @ W with X already in the activation type (the reference is computed
from the same rounded X, so rounding X is no error), and three roundings:

- the decoded weight w * scale (+ bias) rounded to the activation type, once where the decode
  runs in f32 or in exact f16 arithmetic, twice where an f16 bias is added in f16
  (`kernel_weights` repeats the kernel's decode arithmetic); kernels that apply the scale to
  f32 sums round no weight, and the model then over-estimates their error by up to sqrt(2),
  which the checks accept;
- the f32 accumulation (each partial sum rounded: about sqrt(K / 6) * 2**-24 relative, tiny);
- the output rounded once to the activation type.

Each rounding to nearest is an error uniform in +-ulp/2, variance ulp**2 / 12, independent of
every other for random normal inputs, so the variances add. Per output element (i, j):

    var_ij = ulp(ref_ij)**2 / 12 + sum_k x_ik**2 d_kj**2 + acc_ij

with d = w_kernel - w the weight's realised decode error (decoded codes times 16-bit scales
sit on a grid one or two bits finer than the type: exact, or a tie at ulp / 2), all computed
from the data itself (no assumption on the weight distribution). Three checks follow:

- the relative Frobenius error ||y - ref|| / ||ref|| within a factor (1.5 plus a sampling
  allowance 4 / sqrt(outputs)) of the model's sqrt(sum var) / ||ref||;
- the bias: the least-squares slope of y on ref minus 1, each element weighted by 1 / var_ij
  (`bias_of`). The output rounding is unbiased and independent per element: noise on the
  slope that falls as 1 / sqrt(outputs). The weight roundings are shared (every weight of one
  code and scale rounds alike), so their effect on the slope is computed exactly from the
  data; a correct kernel's slope lies between 1 and 1 plus that, within the noise. A uniform decode error of 0.05% (every weight times 1 + 5e-4) moves it by
  5e-4, many standard deviations for both f16 and bf16 once there are a few thousand outputs,
  although bf16's rounding noise (~2.4e-3) hides it from the norm;
- the worst element: no output off by more than 5% of the reference's rms plus its own
  rounding bound. A wrong block of a few hundred outputs barely moves the norm of a large
  output but is far outside this.

Everything is vectorised numpy over the whole output.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..formats.evaluate import dequantize
from ..formats.packing import unpack
from ..formats.reference import parameters_f64
from ..formats.tensors import PackedWeights, QuantizedWeights
from ..ir import ScalarType
from ..lowering.group_params import compute_type

#: (mantissa bits, smallest normal exponent) of the types a kernel rounds to.
_FLOAT = {"f16": (10, -14), "bf16": (7, -126), "f32": (23, -126)}

#: The Frobenius tolerance is this many times the model's prediction, plus `NORM_SAMPLING / sqrt(n)`
#: (the norm of n independent errors fluctuates by about 1 / sqrt(2 n) of itself).
NORM_FACTOR = 1.5
NORM_SAMPLING = 4.0
#: Standard deviations of the slope estimator a correct kernel's bias may reach. High because
#: the suite runs thousands of checks and small outputs are far from Gaussian.
BIAS_SIGMAS = 6.0
#: No output element may be further from the reference than this fraction of the reference's
#: rms (plus the element's own rounding bound).
MAX_ELEMENT_FRACTION = 0.05


def ulp(values: np.ndarray, dtype: str) -> np.ndarray:
    """The spacing of `dtype`'s numbers at each of `values` (subnormal spacing below the
    normal range), as float64."""
    man, emin = _FLOAT[dtype]
    _, e = np.frexp(np.abs(values))  # |v| = f * 2**e, f in [0.5, 1)
    return np.ldexp(1.0, np.maximum(e - 1, emin) - man)


def round_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """`values` rounded to nearest-even `dtype` numbers, as float64 (bf16 through f32, whose
    double rounding is off by at most 2**-24 relative: far below what the model resolves)."""
    v = np.asarray(values, dtype=np.float64)
    if dtype == "f16":
        with np.errstate(over="ignore"):
            return v.astype(np.float16).astype(np.float64)
    f = v.astype(np.float32)
    if dtype == "f32":
        return f.astype(np.float64)
    bits = f.view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round to nearest even
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def rounding_variance(values: np.ndarray, dtype: str) -> np.ndarray:
    """Expected squared error of rounding each value to `dtype`: ulp**2 / 12 where the value
    is not a `dtype` number, 0 where it is (zeros, pruned weights, exactly decoded codes)."""
    exact = round_to(values, dtype) == values
    return np.where(exact, 0.0, np.square(ulp(values, dtype)) / 12.0)


def kernel_weights(weights: PackedWeights | QuantizedWeights, activation: str) -> np.ndarray:
    """The weights [K, N] as a kernel decodes them (float64): in f16 arithmetic where the
    decode runs in f16 (`group_params.compute_type`: (t - zero) exact, times the scale rounded,
    plus the bias rounded again: two roundings of which the first is of s * q, larger than
    the weight where a bias cancels it), else exact and rounded once to the activation type.
    A GPU may contract the multiply and add into one FMA: one rounding less, within the model."""
    q = unpack(weights) if isinstance(weights, PackedWeights) else weights
    fmt = q.format
    if compute_type(fmt, ScalarType(activation)).name != "f16":  # type: ignore[arg-type]
        return round_to(dequantize(q), activation)
    k, n = q.codes.shape
    g = fmt.group_size_for(k)
    t = fmt.element.table()[q.codes].reshape(k // g, g, n)
    a = fmt.scaling.affine(parameters_f64(q))
    if a.zero is not None:
        t = t - a.zero[:, None, :]
    v = round_to(t * a.scale[:, None, :], "f16")
    if a.bias is not None:
        v = round_to(v + a.bias[:, None, :], "f16")
    v = v.reshape(k, n)
    keep = q.keep
    return np.where(keep, v, 0.0) if keep is not None else v


@dataclass(frozen=True)
class Prediction:
    """The model's expected error of one output, from its inputs and reference."""

    variance: np.ndarray  # [M, N]: expected squared error of each element
    rel_error: float  # sqrt(sum variance) / ||ref||
    weight_bias: float  # the slope the decode's own roundings give (`bias_of` of x @ (w_kernel - w))
    slope_sigma: float  # standard deviation of the slope estimator from the output roundings


def predict(x: np.ndarray, w: np.ndarray, ref: np.ndarray, activation: str,
            w_kernel: np.ndarray | None = None) -> Prediction:
    """The error model for y = round(x @ w_kernel) against ref = x @ w (float64), where
    `w_kernel` is the weight as the kernel decodes it (`kernel_weights`; by default w rounded
    once to the activation type)."""
    x2 = np.square(x)
    out_var = rounding_variance(ref, activation)
    # The weight's realised rounding error, not ulp**2 / 12: a decoded code times a 16-bit
    # scale has one or two bits more than the type, so it is exact or rounds at a tie (an
    # error of exactly ulp / 2), three times the uniform model's variance.
    wk = round_to(w, activation) if w_kernel is None else w_kernel
    w_var = x2 @ np.square(wk - w)
    k = max(w.shape[0], 1)
    acc_var = (k / 6.0) * 2.0 ** -48 * (x2 @ np.square(w))  # f32 partial sums, ~u**2 each
    variance = out_var + w_var + acc_var
    ref2 = np.square(ref)
    s = float(ref2.sum())
    if s == 0.0:
        return Prediction(variance, 0.0, 0.0, 0.0)
    rel = float(np.sqrt(variance.sum() / s))
    # The weight roundings are not independent noise for the slope: every weight with the same
    # code and scale rounds alike, so a few hundred (code, group) pairs decide their mean, and
    # it moves the slope by up to ~2e-4 in bf16. That part is computed exactly instead:
    # the slope of x @ (w_kernel - w). A kernel that scales f32 sums rounds no weight (slope
    # 0), so the checks accept anything between 0 and this.
    weight_bias = bias_of(x @ (wk - w), ref, variance)
    # What is left is independent per element: the output and accumulation roundings, whose
    # variance through the weighted estimator is sum(wt**2 ref**2 var) / sum(wt ref**2)**2.
    wt = slope_weights(ref, variance)
    den = float((wt * ref2).sum())
    slope_var = float((np.square(wt) * ref2 * (out_var + acc_var)).sum()) / max(den, 1e-300) ** 2
    return Prediction(variance, rel, weight_bias, float(np.sqrt(slope_var)))


def slope_weights(ref: np.ndarray, variance: np.ndarray) -> np.ndarray:
    """Weights of the least-squares slope of y on ref under errors of `variance`: 1 / var
    (generalised least squares). An element's rounding error grows with |ref|, so plain least
    squares, sum(e * ref) / sum(ref**2), lets the largest outputs' noise dominate; weighting
    by 1 / var makes every element count alike, about sqrt(3) less noise for normal data."""
    floor = np.square(2.0 ** -24 * ref) + 1e-300  # f32's own rounding: var is never 0
    # An element whose reference is exactly 0 (a column of zero weights: block-sparse
    # formats) says nothing about the slope; its weight would be 1e300 and overflow the sums.
    return np.divide(1.0, variance + floor, out=np.zeros_like(ref, dtype=np.float64), where=ref != 0)


def bias_of(diff: np.ndarray, ref: np.ndarray, variance: np.ndarray) -> float:
    """The weighted least-squares slope of y = ref + diff on ref, minus 1: a uniform relative
    error of the kernel (every weight times 1 + b) shows as b."""
    wt = slope_weights(ref, variance)
    den = float((wt * np.square(ref)).sum())
    return float((wt * diff * ref).sum()) / den if den > 0 else 0.0


@dataclass(frozen=True)
class OutputCheck:
    """One kernel output compared with the reference under the error model."""

    rel_error: float  # ||y - ref|| / ||ref|| (unwritten NaN elements counted as 0)
    tolerance: float  # allowed rel_error
    predicted: float  # the model's expected rel_error
    bias: float  # slope of y on ref (weighted least squares, `bias_of`), minus 1
    bias_range: tuple[float, float]  # allowed bias: 0 to the decode's own, +- BIAS_SIGMAS sigma
    max_error: float  # worst element's |y - ref| beyond its own rounding bound, over rms(ref)
    max_tolerance: float  # allowed max_error
    worst: tuple[int, int]  # (row, column) of the element furthest over its bound
    untouched: int  # NaN elements: outputs the kernel never wrote

    @property
    def norm_ok(self) -> bool:
        return self.rel_error <= self.tolerance

    @property
    def bias_ok(self) -> bool:
        return self.bias_range[0] <= self.bias <= self.bias_range[1]

    @property
    def max_ok(self) -> bool:
        return self.max_error <= self.max_tolerance

    @property
    def ok(self) -> bool:
        return self.untouched == 0 and self.norm_ok and self.bias_ok and self.max_ok

    def failures(self) -> list[str]:
        """What failed, in words (empty when ok)."""
        out = []
        if self.untouched:
            out.append(f"{self.untouched} unwritten")
        if not self.norm_ok:
            out.append(f"rel {self.rel_error:.2e} > {self.tolerance:.2e} (model {self.predicted:.2e})")
        if not self.bias_ok:
            out.append(f"bias {self.bias:+.2e} outside [{self.bias_range[0]:+.2e}, {self.bias_range[1]:+.2e}]")
        if not self.max_ok:
            out.append(f"element {self.worst} off by {self.max_error:.2e} rms > {self.max_tolerance:.2e}")
        return out

    def summary(self) -> str:
        return "; ".join(self.failures()) or f"ok rel {self.rel_error:.2e} bias {self.bias:+.1e}"


def compare(y: np.ndarray, ref: np.ndarray, x: np.ndarray, w: np.ndarray, activation: str,
            w_kernel: np.ndarray | None = None, accumulation_bias: float = 0.0) -> OutputCheck:
    """Check kernel output `y` [M, N] against `ref` = x @ w (float64), where `x` [M, K] holds
    the activations exactly as the kernel read them, `w` [K, N] the float64 weights and
    `w_kernel` the weights as the kernel decodes them (`kernel_weights`).
    `accumulation_bias`: how far toward zero the accumulator's own rounding may pull the
    slope (0 for the interpreter and the CPU harnesses, which round f32 sums to nearest; a
    GPU's tensor cores do not, `gpu_output.tensor_core_bias`)."""
    y = np.asarray(y, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    untouched = int(np.isnan(y).sum())
    diff = np.where(np.isnan(y), 0.0, y) - ref
    pred = predict(x, w, ref, activation, w_kernel)
    ref2 = float(np.square(ref).sum())
    n = max(ref.size, 1)
    ref_norm = float(np.sqrt(ref2))
    rel = float(np.linalg.norm(diff) / max(ref_norm, 1e-300))
    tol = pred.rel_error * (NORM_FACTOR + NORM_SAMPLING / np.sqrt(n))
    bias = bias_of(diff, ref, pred.variance)
    rms = max(float(np.sqrt(ref2 / n)), 1e-300)
    # Each element's own bound: its output rounding (half an ulp) and six standard deviations
    # of the weight rounding it sums, on top of the fraction of the rms.
    man, _ = _FLOAT[activation]
    slack = 2.0 ** -(man + 1) * np.abs(ref) + 6.0 * np.sqrt(pred.variance)
    over = (np.abs(diff) - slack) / rms
    flat = int(np.argmax(over)) if over.size else 0
    worst = tuple(int(i) for i in np.unravel_index(flat, ref.shape)) if over.size else (0, 0)
    max_error = float(max(over.flat[flat], 0.0)) if over.size else 0.0
    margin = BIAS_SIGMAS * pred.slope_sigma
    bias_range = (min(0.0, pred.weight_bias) - margin - accumulation_bias, max(0.0, pred.weight_bias) + margin)
    return OutputCheck(rel, float(tol), pred.rel_error, bias, bias_range,
                       max_error, MAX_ELEMENT_FRACTION, worst, untouched)  # type: ignore[arg-type]


__all__ = ["BIAS_SIGMAS", "MAX_ELEMENT_FRACTION", "NORM_FACTOR", "NORM_SAMPLING", "OutputCheck",
           "Prediction", "bias_of", "compare", "kernel_weights", "predict", "round_to", "rounding_variance", "slope_weights", "ulp"]
