"""Float64 reference semantics: dequantisation and the reference matmul."""
from __future__ import annotations

import numpy as np

from .chunking import block_rows, row_blocks
from .tensors import QuantizedWeights


def dequantize(weights: QuantizedWeights) -> np.ndarray:
    """The exact float64 value of every weight, [K, N].

    value = (table[code] - zero) * scale + bias, with the (scale, zero, bias) the format's
    scale scheme makes of group k // G's parameters (each decoded exactly from its storage
    type; `Scaling.affine`), and 0.0 at positions an N:M format does not store.
    `marlin_dsl.dequantize` (formats/evaluate.py) also takes PackedWeights: it unpacks first.
    """
    if not blockwise_ok(weights):
        return _dequantize_whole(weights)
    k, n = weights.codes.shape
    out = np.empty((k, n), dtype=np.float64)
    for r0, r1, _ in row_blocks(k, n, weights.format.group_size_for(k)):
        dequantize_rows(weights, r0, r1, out[r0:r1])
    return out


def _dequantize_whole(weights: QuantizedWeights) -> np.ndarray:
    """`dequantize` on whole arrays: the definition, used as is for inputs `blockwise_ok`
    does not accept (other dtypes or shapes, where numpy's broadcasting rules apply)."""
    fmt = weights.format
    k, n = weights.codes.shape
    g = fmt.group_size_for(k)
    values = fmt.element.table()[weights.codes].reshape(k // g, g, n)
    a = fmt.scaling.affine(parameters_f64(weights))
    if a.zero is not None:
        values = values - a.zero[:, None, :]
    values = values * a.scale[:, None, :]
    if a.bias is not None:
        values = values + a.bias[:, None, :]
    values = values.reshape(k, n)
    if weights.keep is not None:
        values = np.where(weights.keep, values, 0.0)
    return values


def parameters_f64(weights: QuantizedWeights, rows: slice | int = slice(None)) -> dict[str, np.ndarray]:
    """The exact float64 value of the format's parameter arrays, by name: `rows` of the
    per-group ones; of the per-column ones ([1, N]) the whole array, or its row for an int."""
    out = {}
    for spec in weights.format.scaling.arrays():
        own = spec.row_of(rows) if isinstance(rows, int) else rows
        out[spec.name] = spec.storage.to_float64(weights.parameter(spec.name)[own])
    return out


def blockwise_ok(weights: QuantizedWeights) -> bool:
    """True when `dequantize_rows` gives exactly the rows of `_dequantize_whole`: uint8 codes
    [K, N] that index the table, real parameter arrays of the declared shapes, a bool keep
    mask."""
    fmt = weights.format
    codes, keep = weights.codes, weights.keep

    def real_matrix(a: object, shape: tuple[int, int]) -> bool:
        return (isinstance(a, np.ndarray) and a.shape == shape and a.dtype.kind in "fiu"
                and a.dtype.itemsize <= 8)

    if not (isinstance(codes, np.ndarray) and codes.ndim == 2 and codes.dtype == np.uint8):
        return False
    k, n = codes.shape
    g = fmt.group_size_for(k)
    if k == 0 or n == 0 or k % g:
        return False
    scaling = fmt.scaling
    return (all(real_matrix(weights.parameter(a.name), (a.rows(scaling, k), n))
                for a in scaling.arrays())
            and (keep is None or (isinstance(keep, np.ndarray) and keep.shape == (k, n)
                                  and keep.dtype == np.bool_))
            and int(codes.max()) < 2**fmt.element.bits)


def dequantize_rows(weights: QuantizedWeights, r0: int, r1: int, out: np.ndarray) -> None:
    """out[...] = dequantize(weights)[r0:r1], for rows r0..r1-1 of one scale group and
    weights that `blockwise_ok` accepts: the same float64 operations, element by element."""
    group = r0 // weights.format.group_size_for(weights.codes.shape[0])
    # Every code is below the table's length (checked), so "clip" never clips; unlike the
    # default mode it writes `out` directly.
    np.take(weights.format.element._table, weights.codes[r0:r1], out=out, mode="clip")
    weights.format.scaling.apply_f64(out, parameters_f64(weights, group))
    if weights.keep is not None:
        # np.where(keep, value, 0.0) as a bitwise AND of each float64 with all ones (kept) or
        # all zeros (+0.0), several times faster than a masked copy.
        mask = weights.keep[r0:r1].astype(np.int64)
        np.negative(mask, out=mask)  # True -> -1: every bit set
        np.bitwise_and(out.view(np.uint64), mask.view(np.uint64), out=out.view(np.uint64))


def dequantized_nonzero(weights: QuantizedWeights) -> np.ndarray:
    """dequantize(weights) != 0, [K, N] bool, without the float64 [K, N] array."""
    if not blockwise_ok(weights):
        return dequantize(weights) != 0
    k, n = weights.codes.shape
    g = weights.format.group_size_for(k)
    nonzero = np.empty((k, n), dtype=bool)
    values = np.empty((block_rows(n, g), n), dtype=np.float64)
    for r0, r1, _ in row_blocks(k, n, g):
        dequantize_rows(weights, r0, r1, values[: r1 - r0])
        np.not_equal(values[: r1 - r0], 0.0, out=nonzero[r0:r1])
    return nonzero
