"""Element encodings: how an n-bit code maps to a real number, described as data.

Each encoding derives its full value table (`table()`, float64, indexed by code) from
its fields. The table is the reference semantics; the fields are what a target uses to
derive an in-kernel decode (bit fields for floats, a magic-number subtract for
integers, a constant lookup for value tables).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..errors import FormatError, SourceLocation
from ..source import caller_location
from .chunking import BLOCK_ELEMENTS


#: FloatEncoding.specials conventions (see its docstring).
FLOAT_SPECIALS = ("none", "fn", "ieee")


def _integers(obj: object, *names: str) -> None:
    """FormatError at the declaration unless each named field holds an integer."""
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise FormatError(f"{type(obj).__name__}: {name} must be an integer, got {value!r}",
                              getattr(obj, "location", None))


@dataclass(frozen=True)
class Encoding:
    """Base of all element encodings: `bits` wide codes, decoded through a table."""

    bits: int
    location: SourceLocation | None = field(
        default=None, compare=False, repr=False, kw_only=True
    )

    def __post_init__(self) -> None:
        if self.location is None:
            object.__setattr__(self, "location", caller_location())
        if not isinstance(self.bits, int) or isinstance(self.bits, bool) or not 1 <= self.bits <= 8:
            raise FormatError(
                f"{type(self).__name__}: bits must be an integer in 1..8, got {self.bits!r}",
                self.location,
            )

    @property
    def kind(self) -> str:
        raise NotImplementedError

    def table(self) -> np.ndarray:
        """Decoded value of every code, float64, shape [2**bits]."""
        return self._table.copy()

    @cached_property
    def _table(self) -> np.ndarray:
        values = self._compute_table()
        values.setflags(write=False)
        return values

    def _compute_table(self) -> np.ndarray:
        raise NotImplementedError

    @cached_property
    def reserved_codes(self) -> np.ndarray:
        """Codes that decode to NaN or infinity (FloatEncoding.specials): never stored."""
        return np.flatnonzero(~np.isfinite(self._table))

    @property
    def value_range(self) -> tuple[float, float]:
        """(smallest, largest) finite value: what quantising maps a group onto."""
        finite = self._table[np.isfinite(self._table)]
        return float(finite.min()), float(finite.max())

    @cached_property
    def _rounding(self) -> tuple[np.ndarray, np.ndarray, bool]:
        """For `nearest_codes`: the midpoints between consecutive distinct table values, the
        (smallest) code of each distinct value, and whether those codes are just 0, 1, 2, ...
        (integer encodings, NF4), so that the index of the nearest value is the code."""
        table = self._table
        # Stable sort: among equal values the smallest code comes first; reserved codes
        # (NaN, infinities) are never chosen.
        order = np.argsort(table, kind="stable")
        order = order[np.isfinite(table[order])]
        sorted_values = table[order]
        unique_values, first = np.unique(sorted_values, return_index=True)
        unique_codes = order[first].astype(np.uint8)
        midpoints = (unique_values[1:] + unique_values[:-1]) / 2.0
        midpoints.setflags(write=False)
        unique_codes.setflags(write=False)
        identity = bool(np.array_equal(unique_codes, np.arange(len(unique_codes))))
        return midpoints, unique_codes, identity

    @property
    def is_integer_grid(self) -> bool:
        """True when decoded values are consecutive integers (needed for zero points)."""
        t = np.unique(self._table)
        return bool(np.all(t == np.round(t)) and np.all(np.diff(t) == 1) and t.size == 2**self.bits)

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class FloatEncoding(Encoding):
    """A minifloat: [sign][exponent][mantissa], IEEE-style with subnormals.

    FP4 E2M1 (seed 002) is `FloatEncoding(bits=4, exp_bits=2, man_bits=1, bias=1)`: the sign
    is bit 3, exponent 0 is subnormal (value = M * 2**(1-bias) / 2**man_bits).

    `specials` says which codes are not numbers (they are never produced by quantising and
    are refused in loaded weights):
    - "none" (default): every code is a finite value (OCP FP4 E2M1 and FP6 have no specials);
    - "fn": the all-ones exponent with the all-ones mantissa is NaN, there is no infinity
      (OCP FP8 E4M3FN: 0x7F and 0xFF are NaN, 448 is the largest value);
    - "ieee": the all-ones exponent is infinity (mantissa 0) or NaN (OCP FP8 E5M2).
    """

    exp_bits: int = 2
    man_bits: int = 1
    bias: int = 1
    signed: bool = True
    specials: str = "none"

    def __post_init__(self) -> None:
        super().__post_init__()
        _integers(self, "exp_bits", "man_bits", "bias")
        if self.exp_bits < 1 or self.man_bits < 0:
            raise FormatError(f"FloatEncoding: exp_bits must be >= 1 and man_bits >= 0, got "
                              f"exp_bits={self.exp_bits}, man_bits={self.man_bits}", self.location)
        width = self.exp_bits + self.man_bits + (1 if self.signed else 0)
        if width != self.bits:
            raise FormatError(
                f"FloatEncoding: sign({int(self.signed)}) + exp_bits({self.exp_bits}) + "
                f"man_bits({self.man_bits}) must equal bits({self.bits})",
                self.location,
            )
        if self.specials not in FLOAT_SPECIALS:
            raise FormatError(f"FloatEncoding: specials must be one of {list(FLOAT_SPECIALS)}, "
                              f"got {self.specials!r}", self.location)
        if self.specials == "ieee" and self.exp_bits < 2:
            raise FormatError("FloatEncoding: specials='ieee' reserves the all-ones exponent; it "
                              "needs exp_bits >= 2", self.location)
        table = self._table
        if not (np.isfinite(table) & (table != 0)).any():
            # e.g. exp_bits=1, man_bits=0, specials="fn": the one non-zero exponent is NaN.
            # No scale maps a weight onto zeros; refused here, not deep in quantisation.
            codes = ", ".join(f"{c:#x}: {v}" for c, v in enumerate(table))
            raise FormatError(f"FloatEncoding: {self.describe()} has no finite non-zero value "
                              f"(codes {codes}), so there is no value to scale a weight to",
                              self.location)

    @property
    def kind(self) -> str:
        return "float"

    @property
    def sign_bit(self) -> int | None:
        return self.exp_bits + self.man_bits if self.signed else None

    def _compute_table(self) -> np.ndarray:
        codes = np.arange(2**self.bits, dtype=np.int64)
        mantissa = (codes & ((1 << self.man_bits) - 1)).astype(np.float64)
        exponent = (codes >> self.man_bits) & ((1 << self.exp_bits) - 1)
        frac = mantissa / float(1 << self.man_bits)
        normal = np.ldexp(1.0 + frac, (exponent - self.bias).astype(np.int32))
        subnormal = np.ldexp(frac, 1 - self.bias)
        magnitude = np.where(exponent == 0, subnormal, normal)
        top_exponent = exponent == (1 << self.exp_bits) - 1
        all_ones = (codes & ((1 << self.man_bits) - 1)) == (1 << self.man_bits) - 1
        if self.specials == "fn":
            magnitude = np.where(top_exponent & all_ones, np.nan, magnitude)
        elif self.specials == "ieee":
            magnitude = np.where(top_exponent, np.where(mantissa == 0, np.inf, np.nan), magnitude)
        if self.signed:
            negative = (codes >> (self.exp_bits + self.man_bits)) & 1
            return np.where(negative == 1, -magnitude, magnitude)
        return magnitude

    def describe(self) -> str:
        sign = "S1" if self.signed else "S0"
        special = {"none": "", "fn": " FN (NaN code)", "ieee": " (inf/NaN codes)"}[self.specials]
        return f"float {sign}E{self.exp_bits}M{self.man_bits} bias {self.bias}{special}"


@dataclass(frozen=True)
class IntEncoding(Encoding):
    """An integer code with an offset: value = code - offset.

    Unsigned INT4 is `IntEncoding(4)` (values 0..15, normally used with zero points);
    signed INT4 as offset binary is `IntEncoding(4, offset=8)` (stored = actual + 8).
    """

    offset: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        _integers(self, "offset")
        if not 0 <= self.offset < 2**self.bits:
            raise FormatError(
                f"IntEncoding: offset must be in 0..{2**self.bits - 1}, got {self.offset}",
                self.location,
            )

    @property
    def kind(self) -> str:
        return "int"

    def _compute_table(self) -> np.ndarray:
        return np.arange(2**self.bits, dtype=np.float64) - self.offset

    def describe(self) -> str:
        return f"int{self.bits}" + (f" offset {self.offset}" if self.offset else "")


@dataclass(frozen=True)
class TableEncoding(Encoding):
    """Codes index an explicit value table (non-uniform formats such as NF4)."""

    values: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "values", tuple(float(v) for v in self.values))
        if len(self.values) != 2**self.bits:
            raise FormatError(
                f"TableEncoding: needs exactly 2**bits = {2**self.bits} values, "
                f"got {len(self.values)}",
                self.location,
            )
        if not all(np.isfinite(self.values)):
            raise FormatError("TableEncoding: values must be finite", self.location)
        if not any(self.values):  # a scale cannot map any weight onto an all-zero table
            raise FormatError("TableEncoding: values are all zero; a table needs a non-zero value",
                              self.location)

    @property
    def kind(self) -> str:
        return "table"

    def _compute_table(self) -> np.ndarray:
        return np.array(self.values, dtype=np.float64)

    def describe(self) -> str:
        return f"table{self.bits}"


#: Up to this many midpoints (tables of up to 65 distinct values, so every encoding of up
#: to 6 bits), `nearest_codes` counts the midpoints below each value with one vectorised
#: comparison per midpoint, which is several times faster than np.searchsorted's
#: per-element binary search; longer tables still use np.searchsorted.
_MAX_COUNTED_MIDPOINTS = 64


def nearest_codes(encoding: Encoding, scaled: np.ndarray) -> np.ndarray:
    """Round each element of `scaled` to the code whose table value is nearest.

    Exact ties go to the lower value. Equal table values (such as +0 and -0 in a signed
    float) map to the smallest code, so 0.0 always becomes the canonical zero code.
    """
    midpoints, unique_codes, _ = encoding._rounding
    values = scaled
    if (not isinstance(values, np.ndarray) or values.ndim == 0
            or len(midpoints) > _MAX_COUNTED_MIDPOINTS or values.dtype.kind not in "biuf"
            or not np.can_cast(values.dtype, np.float64)):
        index = np.searchsorted(midpoints, scaled, side="left")
        return unique_codes[index]
    out = np.empty(values.shape, dtype=np.uint8)
    flat_values, flat_out = values.reshape(-1), out.reshape(-1)
    for start in range(0, flat_values.size, BLOCK_ELEMENTS):
        stop = start + BLOCK_ELEMENTS
        nearest_codes_into(encoding, flat_values[start:stop], flat_out[start:stop])
    return out


def nearest_codes_into(encoding: Encoding, values: np.ndarray, out: np.ndarray) -> None:
    """`out[...] = nearest_codes(encoding, values)` for one cache-sized block of values of a
    real type that numpy casts safely to float64 (as np.searchsorted casts them).

    np.searchsorted(midpoints, x, side="left") is the number of midpoints m with m < x, which
    is len(midpoints) minus the number with x <= m. Counting those with one comparison per
    midpoint, in float64 as searchsorted compares, gives the same index for every x: a tie
    x == m is not counted as m < x (ties go to the lower value), -0.0 compares equal to 0.0,
    and NaN (which searchsorted sorts last) fails every x <= m, giving the last index.
    """
    midpoints, unique_codes, identity = encoding._rounding
    if len(midpoints) > _MAX_COUNTED_MIDPOINTS:
        out[...] = unique_codes[np.searchsorted(midpoints, values, side="left")]
        return
    x = values.astype(np.float64, copy=False)
    index = np.full(x.shape, len(midpoints), dtype=np.uint8)
    at_or_below = np.empty(x.shape, dtype=bool)
    for m in midpoints:  # m is an np.float64, so the comparison is done in float64
        np.less_equal(x, m, out=at_or_below)
        np.subtract(index, at_or_below.view(np.uint8), out=index)
    if identity:
        out[...] = index
    else:
        np.take(unique_codes, index, out=out, mode="clip")  # every index is in range
