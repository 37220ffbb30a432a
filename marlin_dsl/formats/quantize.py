"""Round-to-nearest quantisation of float weights into any format's codes and scales."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import ValueRangeError
from .chunking import block_rows, row_blocks
from .encodings import nearest_codes_into
from .format import Format
from .tensors import QuantizedWeights, check_float_matrix


def quantize(fmt: Format, weights: object) -> QuantizedWeights:
    """Quantise float weights [K, N] to codes, scales and (if declared) zero points or biases.

    Symmetric formats pick per group the smallest scale that maps the group's range into
    the encoding's table; formats with zero points use the affine range [min(w, 0),
    max(w, 0)] so that 0.0 is exactly representable; formats with a bias map the group's
    [min, max] onto the table's range (MLX's affine mode: s = (max - min) / (hi - lo),
    b = min - lo * s). Scales are rounded *up* to their storage type (never shrinking, so no
    value clips), biases to the nearest. Each element then rounds to the nearest
    representable value, so |dequantize - w| is at most half a quantisation step (plus the
    bias's own rounding). Sparsity is not applied here: see `prune`.

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
    # Converting to float64 is exact and preserves order, so the group extremes of the input
    # converted are those of its float64 copy.
    params = group_parameters(fmt, grouped.max(axis=1).astype(np.float64),
                              grouped.min(axis=1).astype(np.float64), lambda: w)
    if params.zero is not None:
        codes = _round_to_codes(fmt, w, g, params.scale, affine=(params.zero, *params.table_range))
    else:
        codes = _round_to_codes(fmt, w, g, params.scale, bias=params.bias)
    return QuantizedWeights(fmt, codes, params.stored["scales"], params.stored.get("zeros"),
                            biases=params.stored.get("biases"))


@dataclass
class GroupParameters:
    """What quantisation chose per group: the stored arrays by name ("scales", "zeros",
    "biases", in their storage types) and the exact float64 values the codes are rounded
    with (scale; zero for zero-point formats; bias for bias formats)."""

    stored: dict[str, np.ndarray]
    scale: np.ndarray
    zero: np.ndarray | None
    bias: np.ndarray | None
    table_range: tuple[float, float]


def group_parameters(fmt: Format, group_max: np.ndarray, group_min: np.ndarray,
                     weights: Callable[[], np.ndarray]) -> GroupParameters:
    """Scales (and zero points or biases) from the float64 extremes [K/G, N] of each group,
    as `quantize` picks them. `weights()` gives the [K, N] weights, needed only to name an
    offending element in an error. The MLX packer (mlx_pack.py) shares this with numpy."""
    table = fmt.element.table()
    table = table[np.isfinite(table)]  # reserved codes (NaN, infinities) are never chosen
    lo, hi = float(table.min()), float(table.max())
    zero = bias = None
    stored: dict[str, np.ndarray] = {}
    if fmt.zero_point is not None:
        top = np.maximum(group_max, 0.0)
        bottom = np.minimum(group_min, 0.0)
        stored["scales"], s = _scale_at_least((top - bottom) / (hi - lo), fmt)
        zero = np.clip(lo - np.rint(bottom / s), lo, hi)
        stored["zeros"] = zero.astype(fmt.zero_point.numpy_dtype)
    elif fmt.bias is not None:
        stored["scales"], s = _scale_at_least((group_max - group_min) / (hi - lo), fmt)
        storage = fmt.bias.storage
        stored["biases"] = storage.round_nearest(group_min - lo * s)
        bias = storage.to_float64(stored["biases"])
    else:
        stored["scales"], s = _scale_at_least(_symmetric_scale(fmt, weights, group_max, group_min, table), fmt)
    return GroupParameters(stored, s, zero, bias, (lo, hi))


def _round_to_codes(fmt: Format, w: np.ndarray, g: int, s: np.ndarray,
                    affine: tuple[np.ndarray, float, float] | None = None,
                    bias: np.ndarray | None = None) -> np.ndarray:
    """[K, N] codes of w with float64 group scales s [K/G, N]: without zero points the code
    nearest (w - bias) / s; with `affine` = (zero [K/G, N], lo, hi) the code of the level
    clip(rint(w / s) + zero, lo, hi). Computed over cache-sized blocks of rows, with the same
    float64 operations, element by element, as on whole [K/G, G, N] arrays."""
    k, n = w.shape
    codes = np.empty((k, n), dtype=np.uint8)
    scratch = np.empty((block_rows(n, g), n), dtype=np.float64)
    for r0, r1, group in row_blocks(k, n, g):
        x = scratch[: r1 - r0]
        if bias is not None:
            np.subtract(w[r0:r1], bias[group], out=x)
            np.divide(x, s[group], out=x)
        else:
            np.divide(w[r0:r1], s[group], out=x)  # float64: the input converts exactly
        if affine is not None:
            zero, lo, hi = affine
            np.rint(x, out=x)
            np.add(x, zero[group], out=x)
            np.clip(x, lo, hi, out=x)
        nearest_codes_into(fmt.element, x, codes[r0:r1])
    return codes


def _symmetric_scale(fmt: Format, weights: Callable[[], np.ndarray], group_max: np.ndarray,
                     group_min: np.ndarray, table: np.ndarray) -> np.ndarray:
    t_max, t_min = float(table.max()), float(table.min())
    if t_min >= 0 and (group_min < 0).any():
        w = weights()
        bad = tuple(int(i) for i in np.argwhere(w < 0)[0])
        raise ValueRangeError(
            f"weights: format {fmt.name!r} ({fmt.element.describe()}) has no negative values "
            f"and no zero point, but weights{bad} = {np.float64(w[bad])} is negative"
        )
    if t_max <= 0 and (group_max > 0).any():
        w = weights()
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


def _scale_at_least(scale: np.ndarray, fmt: Format) -> tuple[np.ndarray, np.ndarray]:
    """Scales rounded up to the format's scale storage, so no value clips later: (stored,
    their exact float64 values). All-zero groups (scale 0) get 1.0, any positive scale works."""
    storage = fmt.scale.storage
    if (scale > storage.max_value).any():
        g, col = (int(i) for i in np.argwhere(scale > storage.max_value)[0])
        raise ValueRangeError(
            f"weights: group {g} of column {col} needs scale {scale[g, col]:.6g}, beyond "
            f"{storage.name}'s largest value {storage.max_value} for format {fmt.name!r}"
        )
    stored = storage.round_up(np.where(scale > 0, scale, 1.0))
    values = storage.to_float64(stored)
    # Below the storage type's range a scale rounds up to its smallest value; a group whose
    # every weight then rounds to zero is lost. An error where that group matters in the
    # weight (the whole weight scaled by 1e-9), not for groups that are ~0 anyway.
    table = fmt.element.table()
    table = np.abs(table[np.isfinite(table)])
    finest = float(table[table > 0].min()) / (2.0 * float(table.max()))  # smallest kept / range
    lost = (scale > 0) & (scale < values * finest) & (scale > 1e-3 * float(scale.max()))
    if lost.any():
        g, col = (int(i) for i in np.argwhere(lost)[0])
        raise ValueRangeError(
            f"weights: group {g} of column {col} needs scale {scale[g, col]:.6g}, below what "
            f"{storage.name} scales of format {fmt.name!r} hold (it would be stored as "
            f"{values[g, col]:.6g} and the group would quantise to zeros); rescale the weights "
            f"or declare a wider scale type (GroupScale(dtype='f32'))")
    return stored, values
