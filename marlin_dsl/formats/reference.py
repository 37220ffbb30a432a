"""Float64 reference semantics: dequantisation and the reference matmul."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from .tensors import PackedWeights, QuantizedWeights, check_float_matrix


def dequantize(weights: QuantizedWeights | PackedWeights) -> np.ndarray:
    """The exact float64 value of every weight, [K, N].

    value = (table[code] - zero) * scale, with the scale and zero of group k // G, and 0.0 at
    positions an N:M format does not store.
    """
    if isinstance(weights, PackedWeights):
        from .layout import unpack

        weights = unpack(weights)
    fmt = weights.format
    k, n = weights.codes.shape
    g = fmt.group_size_for(k)
    values = fmt.element.table()[weights.codes].reshape(k // g, g, n)
    if weights.zeros is not None:
        values = values - weights.zeros.astype(np.float64)[:, None, :]
    values = (values * weights.scales.astype(np.float64)[:, None, :]).reshape(k, n)
    if weights.keep is not None:
        values = np.where(weights.keep, values, 0.0)
    return values


def reference_matmul(x: object, weights: QuantizedWeights | PackedWeights) -> np.ndarray:
    """x [M, K] @ dequantize(weights) [K, N], computed in float64."""
    xs = check_float_matrix(x, "x").astype(np.float64)
    w = dequantize(weights)
    if xs.shape[1] != w.shape[0]:
        raise ShapeError(f"x: has K={xs.shape[1]} columns but the weight has K={w.shape[0]} rows")
    return xs @ w
