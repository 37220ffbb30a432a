"""Number types of the per-group parameters (scales, zero points, biases), described as data.

A format's scales may be stored as fp16 (the default), as bf16 or f32 (what MLX's affine
quantisation stores for bf16 and f32 models), or as an 8-bit minifloat code: E8M0 (a bare
power of two, the OCP microscaling "mx" formats) or E4M3 (NVIDIA's nvfp4). Zero points are
u8 integers or fp16. Everything that touches such an array asks its `StorageType`:

- numpy holds it in `numpy_dtype`: fp16/f32 natively, bf16 as its uint16 bit pattern (numpy
  has no bfloat16), E8M0/E4M3 as their uint8 codes;
- MLX holds it in `mlx_dtype` (bf16 as mlx.core.bfloat16, codes as uint8);
- kernels load `kernel_type` and, for codes, decode through `table` (a 256-entry value table);
- `to_float64` is the exact value (the reference semantics), `round_up` / `round_nearest`
  the quantiser's roundings.

Non-finite decoded values (E8M0's code 255, E4M3's codes 0x7F and 0xFF, NaN/Inf floats) are
not valid parameters: `validate` rejects them.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..ir.numerics import f64_to_f32_odd


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float64 -> the uint16 bits of the nearest bf16 value (ties to even), rounded once."""
    b = f64_to_f32_odd(x).view(np.uint32)
    rounded = (b + (np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    return np.where(np.isnan(x), np.uint32(0x7FC0), rounded).astype(np.uint16)


def bf16_to_float64(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def _minifloat_table(exp_bits: int, man_bits: int, bias: int, signed: bool,
                     nan_codes: tuple[int, ...] = ()) -> np.ndarray:
    """float64 value of each 8-bit code of an IEEE-style minifloat with subnormals."""
    codes = np.arange(256, dtype=np.int64)
    mantissa = (codes & ((1 << man_bits) - 1)).astype(np.float64) / (1 << man_bits)
    exponent = (codes >> man_bits) & ((1 << exp_bits) - 1)
    magnitude = np.where(exponent == 0, np.ldexp(mantissa, 1 - bias),
                         np.ldexp(1.0 + mantissa, (exponent - bias).astype(np.int32)))
    if signed:
        magnitude = np.where((codes >> (exp_bits + man_bits)) & 1, -magnitude, magnitude)
    magnitude[list(nan_codes)] = np.nan
    return magnitude


@dataclass(frozen=True)
class StorageType:
    """One number type of a per-group parameter array (see the module docstring)."""

    name: str
    numpy_dtype: np.dtype
    mlx_dtype: str
    kernel_type: str
    description: str
    #: exponent, mantissa bits, bias, signed, NaN codes of an 8-bit code type; None for floats
    minifloat: tuple[int, int, int, bool, tuple[int, ...]] | None = None
    #: E8M0 has no mantissa and no subnormals: code e is 2**(e - 127); 255 is NaN
    power_of_two: bool = False
    #: an 8-bit two's complement integer, held as its uint8 bits (code c is c or c - 256)
    twos_complement: bool = False

    @cached_property
    def table(self) -> np.ndarray | None:
        """float64 value of every code (code types only; NaN/inf where a code is invalid)."""
        if self.power_of_two:
            values = np.ldexp(1.0, np.arange(256) - 127).astype(np.float64)
            values[255] = np.nan  # the OCP spec's NaN (MLX computes inf); never a valid scale
            return values
        if self.minifloat is not None:
            return _minifloat_table(*self.minifloat)
        if self.twos_complement:
            return np.arange(256, dtype=np.int64).astype(np.int8).astype(np.float64)
        return None

    @property
    def is_code(self) -> bool:
        return self.table is not None

    def to_float64(self, stored: np.ndarray) -> np.ndarray:
        """The exact value of stored elements (any shape), float64."""
        stored = np.asarray(stored)
        if self.table is not None:
            return self.table[stored.astype(np.intp)]
        if self.name == "bf16":
            return bf16_to_float64(stored)
        return stored.astype(np.float64)

    @cached_property
    def _positive_values(self) -> tuple[np.ndarray, np.ndarray]:
        """(sorted finite positive values, their codes) of a code type."""
        table = self.table
        assert table is not None
        ok = np.isfinite(table) & (table > 0)
        codes = np.nonzero(ok)[0]
        order = np.argsort(table[codes], kind="stable")
        return table[codes][order], codes[order].astype(np.uint8)

    @property
    def max_value(self) -> float:
        if self.table is not None:
            return float(self._positive_values[0][-1])
        return {"f16": float(np.finfo(np.float16).max), "f32": float(np.finfo(np.float32).max),
                "bf16": float(bf16_to_float64(np.uint16(0x7F7F)))}[self.name]

    @property
    def significant_bits(self) -> int:
        """The most significant bits any finite stored value has (its binary significand's
        length: 11 for f16, 8 for bf16, 4 for E4M3, 1 for E8M0's powers of two)."""
        if self.table is not None:
            return significant_bits(self.table)
        return {"f16": 11, "bf16": 8, "f32": 24, "u8": 8}[self.name]

    def round_nearest(self, values: np.ndarray) -> np.ndarray:
        """float64 -> stored elements, each the nearest representable value (floats only)."""
        if self.name == "bf16":
            return bf16_bits(values)
        if self.table is not None:
            raise NotImplementedError(f"{self.name}: nearest rounding of codes is not needed")
        return np.asarray(values, dtype=np.float64).astype(self.numpy_dtype)

    def round_up(self, values: np.ndarray) -> np.ndarray:
        """Positive float64 values (all <= max_value) -> stored elements, each the smallest
        representable value >= the input, so that a scale never shrinks (no clipping later)."""
        values = np.asarray(values, dtype=np.float64)
        if self.table is not None:
            positive, codes = self._positive_values
            index = np.minimum(np.searchsorted(positive, values, side="left"), len(positive) - 1)
            return codes[index]
        stored = self.round_nearest(values)
        low = self.to_float64(stored) < values
        if low.any():
            if self.name == "bf16":  # positive bf16: the next value up is the next bit pattern
                stored[low] += np.uint16(1)
            else:
                stored[low] = np.nextafter(stored[low], self.numpy_dtype.type(np.inf))
        return stored


def significant_bits(values: np.ndarray) -> int:
    """The longest binary significand among the finite values (0 for none or only zeros):
    the bits from a value's leading one to its last one."""
    v = np.abs(np.asarray(values, dtype=np.float64))
    v = v[np.isfinite(v) & (v > 0)]
    if v.size == 0:
        return 0
    mant, _ = np.frexp(v)  # v = mant * 2**e, mant in [0.5, 1): 53-bit integer significands
    ints = (mant * 2.0 ** 53).astype(np.uint64)
    lowest = ints & (~ints + np.uint64(1))  # the lowest set bit, a power of two (exact as f64)
    return int((53 - np.log2(lowest.astype(np.float64))).max())


STORAGE_TYPES: dict[str, StorageType] = {t.name: t for t in (
    StorageType("f16", np.dtype(np.float16), "float16", "f16", "IEEE fp16"),
    StorageType("bf16", np.dtype(np.uint16), "bfloat16", "bf16", "bfloat16 (numpy: its uint16 bits)"),
    StorageType("f32", np.dtype(np.float32), "float32", "f32", "IEEE fp32"),
    StorageType("u8", np.dtype(np.uint8), "uint8", "u8", "unsigned 8-bit integer"),
    StorageType("i8", np.dtype(np.uint8), "uint8", "u8",
                "signed 8-bit integer (two's complement; numpy and MLX: its uint8 bits)",
                twos_complement=True),
    StorageType("e8m0", np.dtype(np.uint8), "uint8", "u8",
                "E8M0 power of two 2**(e - 127) (OCP microscaling scale)", power_of_two=True),
    StorageType("e4m3", np.dtype(np.uint8), "uint8", "u8",
                "FP8 E4M3FN (bias 7, no inf, NaN at 0x7F and 0xFF)",
                minifloat=(4, 3, 7, True, (0x7F, 0xFF))),
)}


def storage_type(name: str) -> StorageType:
    return STORAGE_TYPES[name]
