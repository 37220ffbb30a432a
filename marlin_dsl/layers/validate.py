"""Validation of packed weights held as MLX arrays (loaded checkpoints, `update`, `from_packed`),
on the device, once, with the messages of the numpy `marlin_dsl.validate`.

The checks are those of `validate`: names, shapes and dtypes; finite scale parameters
(decoded from their storage type); positive (or non-negative) ones where the scale scheme
says so;
valid N:M metadata fields; block patterns that cover every non-zero weight. They run as MLX ops and end in one host sync (a handful of
booleans). Only when one fails are the arrays copied to the host and handed to the numpy
`validate`, so that the error names the same array, index and value as for numpy arrays.
"""
from __future__ import annotations

from typing import Mapping

import mlx.core as mx
import numpy as np

from ..errors import ValueRangeError
from ..formats import BlockPatternSparsity, Format, NMSparsity, PackedWeights, validate
from ..formats.validate import sign_checked_arrays
from .mlx_ops import check_mx_arrays, packed_to_numpy, parameter_mx, unpack_bits_mx


def validate_mx(fmt: Format, shape: tuple[int, int], arrays: Mapping[str, mx.array],
                argument: str = "arrays") -> None:
    """Raise ShapeError/ValueRangeError (as `marlin_dsl.validate` does) unless the MLX arrays
    are a valid packed [K, N] weight of `fmt` in its linear layout. One device sync."""
    check_mx_arrays(fmt, shape, arrays, argument)
    checks = [mx.all(mx.isfinite(parameter_mx(storage, arrays[name]).astype(mx.float32)))
              for name, storage in fmt.parameters().items()]
    storage = fmt.parameters()
    for spec in sign_checked_arrays(fmt):
        checks.append(mx.all(spec.sign_ok(parameter_mx(storage[spec.name], arrays[spec.name]).astype(mx.float32))))
    reserved = fmt.element.reserved_codes
    if reserved.size:  # codes that are NaN / infinite in the encoding (FloatEncoding.specials)
        finite = np.isfinite(fmt.element.table())
        codes = unpack_bits_mx(arrays["qweight"], fmt.element.bits, fmt.packing.word_bits)
        checks.append(mx.all(mx.take(mx.array(finite), codes)))
    sp = fmt.sparsity
    if isinstance(sp, NMSparsity):
        fields = unpack_bits_mx(arrays["meta"], sp.meta_bits, fmt.packing.word_bits)
        valid = np.zeros(1 << sp.meta_bits, dtype=np.bool_)
        valid[sp.valid_fields] = True
        checks.append(mx.all(mx.take(mx.array(valid), fields)))
    passed = all(mx.stack(checks).tolist())
    if passed and not isinstance(sp, BlockPatternSparsity):
        return
    # A check failed, or block patterns (their check dequantises the whole weight and is
    # rare enough to run on the host): the numpy validator finds and names the problem.
    validate(PackedWeights(fmt, (int(shape[0]), int(shape[1])), packed_to_numpy(arrays)))
    if not passed:  # the two validators must agree; this would be a bug of ours
        raise ValueRangeError(f"{argument}: the device check of format {fmt.name!r} failed but "
                              "the host check found nothing; please report this")


__all__ = ["validate_mx"]
