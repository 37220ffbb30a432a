"""Round-to-nearest quantisation of float weights into any format's codes and scales."""
from __future__ import annotations

from typing import Callable

import numpy as np

from .chunking import block_rows, row_blocks
from .encodings import nearest_codes_into
from .format import Format
from .scaling import GroupChoice
from .tensors import QuantizedWeights, check_float_matrix


def quantize(fmt: Format, weights: object) -> QuantizedWeights:
    """Quantise float weights [K, N] to codes and the parameters of the format's scale scheme.

    The scheme picks each group's parameters (`Scaling.choose`; for a GroupScale: symmetric
    formats take the smallest scale that maps the group's range into the encoding's table;
    formats with zero points use the affine range [min(w, 0), max(w, 0)] so that 0.0 is
    exactly representable; formats with a bias map the group's [min, max] onto the table's
    range, MLX's affine mode: s = (max - min) / (hi - lo), b = min - lo * s). Scales are
    rounded *up* to their storage type (never shrinking, so no
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
    return QuantizedWeights.from_arrays(fmt, codes, params.stored)


#: What quantisation chose per group (the scheme's `GroupChoice`).
GroupParameters = GroupChoice


def group_parameters(fmt: Format, group_max: np.ndarray, group_min: np.ndarray,
                     weights: Callable[[], np.ndarray]) -> GroupChoice:
    """Scale parameters from the float64 extremes [K/G, N] of each group, as `quantize` picks
    them: the format's scale scheme chooses (`Scaling.choose`). `weights()` gives the [K, N]
    weights, needed only to name an offending element in an error. The MLX packer
    (layers/mlx_pack.py) shares this with numpy."""
    return fmt.scaling.choose(fmt, group_max, group_min, weights)


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


