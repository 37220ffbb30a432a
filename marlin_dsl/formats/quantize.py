"""Round-to-nearest quantisation of float weights into any format's codes and scales."""
from __future__ import annotations

import numpy as np

from ..errors import ValueRangeError
from .chunking import block_rows, row_blocks
from .encodings import nearest_codes_into
from .format import Format
from .tensors import QuantizedWeights, check_float_matrix

_F16_MAX = float(np.finfo(np.float16).max)


def quantize(fmt: Format, weights: object) -> QuantizedWeights:
    """Quantise float weights [K, N] to codes, fp16 scales and (if declared) zero points.

    Symmetric formats pick per group the smallest scale that maps the group's range into
    the encoding's table; formats with zero points use the affine range [min(w, 0),
    max(w, 0)] so that 0.0 is exactly representable. Each element then rounds to the
    nearest representable value, so |dequantize - w| is at most half a quantisation step.
    Sparsity is not applied here: see `prune`.

    All arithmetic is float64 on the weights converted to float64 (exactly, for float16/32/64
    input); it runs block by block, without a float64 copy of the whole weight.
    """
    w = check_float_matrix(weights, "weights")
    if w.dtype.itemsize > 8:  # long double: round to float64 once, as every value is used
        w = w.astype(np.float64)
    k, n = w.shape
    fmt.check_shape(k, n)
    g = fmt.group_size_for(k)
    grouped = w.reshape(k // g, g, n)
    table = fmt.element.table()
    # Converting to float64 is exact and preserves order, so the group extremes of the input
    # converted are those of its float64 copy.
    group_max = grouped.max(axis=1).astype(np.float64)
    group_min = grouped.min(axis=1).astype(np.float64)

    if fmt.zero_point is None:
        scale = _symmetric_scale(fmt, w, group_max, group_min, table)
        scale16 = _to_f16_at_least(scale, fmt)
        codes = _round_to_codes(fmt, w, g, scale16.astype(np.float64), None)
        zeros = None
    else:
        lo, hi = float(table.min()), float(table.max())
        top = np.maximum(group_max, 0.0)
        bottom = np.minimum(group_min, 0.0)
        scale = (top - bottom) / (hi - lo)
        scale16 = _to_f16_at_least(scale, fmt)
        s = scale16.astype(np.float64)
        zero = np.clip(lo - np.rint(bottom / s), lo, hi)
        codes = _round_to_codes(fmt, w, g, s, (zero, lo, hi))
        zeros = zero.astype(fmt.zero_point.numpy_dtype)
    return QuantizedWeights(fmt, codes, scale16, zeros)


def _round_to_codes(fmt: Format, w: np.ndarray, g: int, s: np.ndarray,
                    affine: tuple[np.ndarray, float, float] | None) -> np.ndarray:
    """[K, N] codes of w with float64 group scales s [K/G, N]: without zero points the code
    nearest w / s; with `affine` = (zero [K/G, N], lo, hi) the code of the level
    clip(rint(w / s) + zero, lo, hi). Computed over cache-sized blocks of rows, with the same
    float64 operations, element by element, as on whole [K/G, G, N] arrays."""
    k, n = w.shape
    codes = np.empty((k, n), dtype=np.uint8)
    scratch = np.empty((block_rows(n, g), n), dtype=np.float64)
    for r0, r1, group in row_blocks(k, n, g):
        x = scratch[: r1 - r0]
        np.divide(w[r0:r1], s[group], out=x)  # float64: the input converts exactly
        if affine is not None:
            zero, lo, hi = affine
            np.rint(x, out=x)
            np.add(x, zero[group], out=x)
            np.clip(x, lo, hi, out=x)
        nearest_codes_into(fmt.element, x, codes[r0:r1])
    return codes


def _symmetric_scale(fmt: Format, w: np.ndarray, group_max: np.ndarray,
                     group_min: np.ndarray, table: np.ndarray) -> np.ndarray:
    t_max, t_min = float(table.max()), float(table.min())
    if t_min >= 0 and (group_min < 0).any():
        bad = tuple(int(i) for i in np.argwhere(w < 0)[0])
        raise ValueRangeError(
            f"weights: format {fmt.name!r} ({fmt.element.describe()}) has no negative values "
            f"and no zero point, but weights{bad} = {np.float64(w[bad])} is negative"
        )
    if t_max <= 0 and (group_max > 0).any():
        bad = tuple(int(i) for i in np.argwhere(w > 0)[0])
        raise ValueRangeError(
            f"weights: format {fmt.name!r} has no positive values, but weights{bad} = "
            f"{np.float64(w[bad])}"
        )
    scale = np.zeros_like(group_max)
    if t_max > 0:
        scale = np.maximum(scale, group_max / t_max)
    if t_min < 0:
        scale = np.maximum(scale, group_min / t_min)
    return scale


def _to_f16_at_least(scale: np.ndarray, fmt: Format) -> np.ndarray:
    """Round scales to fp16 without going below the float64 value (no clipping later)."""
    if (scale > _F16_MAX).any():
        g, col = (int(i) for i in np.argwhere(scale > _F16_MAX)[0])
        raise ValueRangeError(
            f"weights: group {g} of column {col} needs scale {scale[g, col]:.6g}, beyond "
            f"fp16's largest value {_F16_MAX} for format {fmt.name!r}"
        )
    scale = np.where(scale > 0, scale, 1.0)  # all-zero groups: any positive scale works
    s16 = scale.astype(np.float16)
    low = s16.astype(np.float64) < scale
    s16[low] = np.nextafter(s16[low], np.float16(np.inf))
    return s16
