"""The float64 reference of a weight in either form: `dequantize` and `reference_matmul` take
QuantizedWeights or PackedWeights (unpacked and validated first). They sit above both
`reference` (the arithmetic on codes) and `packing` (unpacking), which therefore need not
import each other."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from . import reference
from .packing import unpack
from .tensors import PackedWeights, QuantizedWeights, check_float_matrix


def dequantize(weights: QuantizedWeights | PackedWeights) -> np.ndarray:
    """The exact float64 value of every weight, [K, N] (formats/reference.py says how)."""
    if isinstance(weights, PackedWeights):
        weights = unpack(weights)
    return reference.dequantize(weights)


def reference_matmul(x: object, weights: QuantizedWeights | PackedWeights) -> np.ndarray:
    """x [M, K] @ dequantize(weights) [K, N], computed in float64."""
    xs = check_float_matrix(x, "x").astype(np.float64)
    w = dequantize(weights)
    if xs.shape[1] != w.shape[0]:
        raise ShapeError(f"x: has K={xs.shape[1]} columns but the weight has K={w.shape[0]} rows")
    return xs @ w


__all__ = ["dequantize", "reference_matmul"]
