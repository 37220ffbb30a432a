"""Validation of packed arrays, e.g. ones loaded from disk, before anything reads them."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError, ValueRangeError
from .bitstream import unpack_bits
from .sparsity import BlockPatternSparsity, NMSparsity
from .scaling import GroupAffine, ParamArray
from .storage import StorageType
from .reference import dequantized_nonzero
from .tensors import PackedWeights, QuantizedWeights, check_array, first_index


def validate(packed: PackedWeights) -> None:
    """Raise a ValueError subclass naming the array and index of the first problem.

    Checks: the exact set of arrays, each one's shape and dtype, finite scale parameters
    (decoded from their storage type: E8M0 code 255 and E4M3's NaN codes fail), positive
    ones where the scale scheme says so (scales of formats without a bias; >= 0 where the
    format declares a zero scale an all-zero group, `GroupScale.zero`), N:M metadata fields (strictly increasing positions below m: for 2:4 the six
    nibbles 4, 8, 9, 12, 13, 14), and block patterns that cover every non-zero value.
    """
    fmt = packed.format
    if not isinstance(packed.shape, tuple) or len(packed.shape) != 2:
        raise ShapeError(f"shape: expected (K, N), got {packed.shape!r}")
    k, n = packed.shape
    specs = fmt.buffers(k, n)
    expected = [s.name for s in specs]
    if sorted(packed.arrays) != sorted(expected):
        raise ShapeError(
            f"arrays: format {fmt.name!r} expects arrays {expected}, got {sorted(packed.arrays)}"
        )
    for spec in specs:
        check_array(packed.arrays[spec.name], spec.name, spec.shape, spec.dtype)
    for spec in fmt.scaling.arrays():
        name, storage = spec.name, spec.storage
        values = storage.to_float64(packed.arrays[name])
        if not np.isfinite(values).all():
            bad = first_index(~np.isfinite(values))
            raise ValueRangeError(f"{name}{_at(bad)} is not finite: {describe_stored(storage, packed.arrays[name][bad])}")
        ok = spec.sign_ok(values)
        if ok is not None and not ok.all():
            bad = first_index(~ok)
            raise ValueRangeError(f"{name}{_at(bad)} = {describe_stored(storage, packed.arrays[name][bad])} is "
                                  f"{_why_sign(fmt, spec.sign)}")
    _check_reserved_codes(packed)
    sp = fmt.sparsity
    if isinstance(sp, NMSparsity):
        fields = unpack_bits(packed["meta"], sp.meta_bits, fmt.packing.word_bits)
        invalid = ~np.isin(fields, sp.valid_fields)
        if invalid.any():
            block, col = first_index(invalid)
            per_word = fmt.packing.word_bits // sp.meta_bits if fmt.packing.word_bits % sp.meta_bits == 0 else None
            where = (f"meta[{block // per_word}, {col}] field {block % per_word}"
                     if per_word else f"meta block {block}, column {col}")
            raise ValueRangeError(
                f"{where}: invalid {sp.n}:{sp.m} metadata value {int(fields[block, col])} "
                f"(valid: {[int(v) for v in sp.valid_fields]})"
            )
    elif isinstance(sp, BlockPatternSparsity):
        _check_patterns(packed, sp)


def _check_reserved_codes(packed: PackedWeights) -> None:
    """Codes that are not numbers (FloatEncoding.specials) are never stored by quantising; in
    loaded weights they are refused, naming the word and the field within it."""
    fmt = packed.format
    reserved = fmt.element.reserved_codes
    if reserved.size == 0:
        return
    codes = unpack_bits(packed["qweight"], fmt.element.bits, fmt.packing.word_bits)
    bad = np.isin(codes, reserved)
    if bad.any():
        row, col = first_index(bad)
        per_word = fmt.packing.word_bits // fmt.element.bits
        value = fmt.element.table()[codes[row, col]]
        raise ValueRangeError(
            f"qweight[{row // per_word}, {col}] field {row % per_word}: code "
            f"{int(codes[row, col]):#x} is {value} in format {fmt.name!r} "
            f"({fmt.element.describe()}), not a value")


def _at(index: tuple) -> str:
    """An array index as code writes it: [1, 7]."""
    return "[" + ", ".join(str(int(i)) for i in index) + "]"


def _why_sign(fmt, sign: str) -> str:
    """Why a value of the wrong sign is refused, after "is"."""
    if sign == "non_negative":  # GroupScale(zero="allowed"): only negative values fail
        return (f"negative (format {fmt.name!r}: a negative scale flips its group; "
                f"a zero one is an all-zero group)")
    if isinstance(fmt.scaling, GroupAffine):
        return (f"not positive (format {fmt.name!r} has no bias: a zero or negative scale "
                f"zeroes or flips its group)")
    return f"not positive (format {fmt.name!r}: a zero or negative value zeroes or flips what it scales)"


def sign_checked_arrays(fmt) -> list[ParamArray]:
    """The parameter arrays whose sign is checked (`ParamArray.sign`): a GroupScale's scales
    where the format has no bias, > 0 (its quantiser never stores another; a zero scale would
    silently zero a group) or >= 0 where `GroupScale.zero` declares 0 an all-zero group (MLX's
    nvfp4); with a bias, MLX's affine mode, w = s * q + b is meaningful for any s, as MLX may
    store it. Both arrays of a TwoLevelScale, > 0."""
    return [a for a in fmt.scaling.arrays() if a.sign != "any"]


def describe_stored(storage: StorageType, stored: object) -> str:
    """One stored parameter as a message shows it: the value, and the code or bits it came
    from where the storage is not a plain float (bf16 bits, E8M0/E4M3 codes)."""
    value = float(storage.to_float64(np.asarray(stored)))
    if storage.numpy_dtype.kind == "u" and storage.name != "u8":
        return f"{value} ({storage.name} code {int(stored):#x})"
    return f"{value}"


def _check_patterns(packed: PackedWeights, sp: BlockPatternSparsity) -> None:

    fmt = packed.format
    codes = unpack_bits(packed["qweight"], fmt.element.bits, fmt.packing.word_bits)
    logical = QuantizedWeights.from_arrays(fmt, codes, packed.arrays)
    required = sp.patterns(dequantized_nonzero(logical))
    missing = required & ~packed["patterns"]
    if missing.any():
        kb, nb = first_index(missing != 0)
        raise ValueRangeError(
            f"patterns[{kb}, {nb}] = {int(packed['patterns'][kb, nb]):#04x} omits K positions "
            f"{int(missing[kb, nb]):#04x} that hold non-zero weights"
        )
