"""`SuperBlockScale`: llama.cpp's k-quant scales, quantised sub-scales (and sub-mins) under
float super-scales:

    value = table[code] * (d[s, n] * sc[g, n]) - dmin[s, n] * m[g, n]

for group g = k // G of `group_size` K positions and super-block s = k // S of `super_size`
(S a multiple of G). `sc` and `m` are 8-bit integers ("scales", "mins", [K/G, N]); `d` and
`dmin` are f16 ("super_scales", "super_mins", [K/S, N]). Without mins (`mins="none"`,
llama.cpp's Q6_K and Q3_K) the value is table[code] * (d * sc) and only `scales` and
`super_scales` are stored.

`sub_dtype` is the sub-scales' number type: "u8" (0..255; Q4_K and Q5_K store 6-bit ones) or
"i8" (two's complement -128..127; Q6_K's scales are signed). Every sub-scale is exact in f32,
d * sc is exact in f32 (11 + 8 significant bits) and so is d * sc * t for codes of up to
5 bits (6 with i8's 7-bit magnitudes): a kernel forms the product in f32, as llama.cpp does,
and the one rounding left is the subtraction of dmin * m, where llama.cpp rounds too.

Sub-scales, mins and super parameters may be 0 or negative (llama.cpp's quantiser stores
negative Q6_K scales): only non-finite values are refused.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Sequence

import numpy as np

from ...errors import FormatError, SourceLocation
from ...ir.types import F32
from ...source import caller_location
from ..storage import STORAGE_TYPES
from .parts import check_dtype, check_group_size
from .rounding import scale_at_least, symmetric_scale
from .scheme import (Affine, GroupChoice, ParamArray, ScaledFormat, Scaling, apply_affine, flat_index,
                     load_param)

if TYPE_CHECKING:
    from ...ir.builder import Builder
    from ...ir.core import Value
    from ...ir.types import ScalarType

SUB_DTYPES = ("u8", "i8")
MIN_DTYPES = ("u8", "none")


@dataclass(frozen=True)
class SuperBlockScale(Scaling):
    """Declared in place of a GroupScale: `Format("q4_k", IntEncoding(4), SuperBlockScale(32, 256))`."""

    group_size: int = 32
    super_size: int = 256
    sub_dtype: Literal["u8", "i8"] = "u8"
    mins: Literal["u8", "none"] = "u8"
    #: the largest stored sub-scale and min the quantiser uses (llama.cpp: 6-bit fields, 63)
    sub_max: int = 63
    location: SourceLocation | None = field(default=None, compare=False, repr=False, kw_only=True)

    text_kind = "super_block"
    text_attrs = (("size", "group_size", "group_size"), ("super", "super_size", "int"),
                  ("sub", "sub_dtype", "ident"), ("mins", "mins", "ident"), ("sub_max", "sub_max", "int"))

    def __post_init__(self) -> None:
        if self.location is None:
            object.__setattr__(self, "location", caller_location())
        check_group_size("SuperBlockScale", self.group_size, self.location)
        if self.group_size == "K":
            raise FormatError("SuperBlockScale: group_size must be an integer", self.location)
        check_dtype("SuperBlockScale sub", self.sub_dtype, SUB_DTYPES, self.location)
        check_dtype("SuperBlockScale mins", self.mins, MIN_DTYPES, self.location)
        s = self.super_size
        if isinstance(s, bool) or not isinstance(s, int) or s < 1 or s % self.group_size:
            raise FormatError(f"SuperBlockScale: super_size must be a positive multiple of group_size "
                              f"{self.group_size}, got {s!r}", self.location)
        top = 127 if self.sub_dtype == "i8" else 255
        if isinstance(self.sub_max, bool) or not isinstance(self.sub_max, int) or not 1 <= self.sub_max <= top:
            raise FormatError(f"SuperBlockScale: sub_max must be an integer in 1..{top}, got {self.sub_max!r}",
                              self.location)

    @property
    def factor(self) -> int:
        """Groups per super-block."""
        return self.super_size // self.group_size

    def k_step(self) -> int:
        return self.super_size

    def arrays(self) -> tuple[ParamArray, ...]:
        out = [ParamArray("scales", STORAGE_TYPES[self.sub_dtype], "per-group sub-scales", "sc", sign="any"),
               ParamArray("super_scales", STORAGE_TYPES["f16"], "per-super-block scales", "d", sign="any",
                          super_groups=self.factor)]
        if self.mins != "none":
            out += [ParamArray("mins", STORAGE_TYPES[self.mins], "per-group sub-mins", "mn", sign="any"),
                    ParamArray("super_mins", STORAGE_TYPES["f16"], "per-super-block mins", "dm", sign="any",
                               super_groups=self.factor)]
        return tuple(out)

    def check(self, fmt: ScaledFormat) -> None:
        if self.mins != "none" and not fmt.element.is_integer_grid:
            raise FormatError(f"format {fmt.name!r}: super-block mins need an integer encoding, not "
                              f"{fmt.element.describe()}", self.location or fmt.location)

    def describe_parts(self) -> list[str]:
        mins = "" if self.mins == "none" else f" and {self.mins} mins"
        return [f"{self.sub_dtype} sub-scales{mins} under f16 super-blocks of {self.super_size}"]

    # ----- host side -----------------------------------------------------------------------

    def choose(self, fmt: ScaledFormat, group_max: np.ndarray, group_min: np.ndarray,
               weights: Callable[[], np.ndarray]) -> GroupChoice:
        """Each group's own scale (and min) first, then the super-block's f16 d (dmin) as the
        largest of them / `sub_max`, rounded up, and each sub-scale (min) the smallest integer
        with d * sc (dmin * m) covering the group, so nothing clips."""
        table = fmt.element.table()
        table = table[np.isfinite(table)]
        lo, hi = float(table.min()), float(table.max())
        f16 = STORAGE_TYPES["f16"]
        stored: dict[str, np.ndarray] = {}
        bias = None
        if self.mins != "none":
            need_min = np.maximum(-group_min, 0.0)  # subtracted: value = t * s - dmin * m
            m_store, dmin = self._two_level(need_min, fmt, f16)
            stored["mins"], stored["super_mins"] = m_store, dmin[0]
            bias = -dmin[1]
            needed = (np.maximum(group_max, 0.0) - bias) / (hi - lo)
        else:
            needed = symmetric_scale(fmt, weights, group_max, group_min, table)
        sc_store, d = self._two_level(needed, fmt, f16)
        stored["scales"], stored["super_scales"] = sc_store, d[0]
        return GroupChoice(stored, d[1], None, bias, (lo, hi))

    def _two_level(self, needed: np.ndarray, fmt: ScaledFormat,
                   f16: Any) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """needed [K/G, N] >= 0 -> (sub codes, (super stored, per-group float64 products))."""
        groups, n = needed.shape
        per_super = needed.reshape(groups // self.factor, self.factor, n).max(axis=1) / self.sub_max
        sup_stored, sup = scale_at_least(per_super, fmt, f16)
        sup_g = np.repeat(sup, self.factor, axis=0)
        sub = np.clip(np.ceil(needed / sup_g), 0, self.sub_max)
        sub = np.where(needed > 0, np.maximum(sub, 1), 0)
        product = sub * sup_g
        return sub.astype(np.uint8), (sup_stored, product)

    def affine(self, params: dict[str, Any]) -> Affine:
        scale = _times_super(params["scales"], params["super_scales"], self.factor)
        if self.mins == "none":
            return Affine(scale)
        return Affine(scale, None, -_times_super(params["mins"], params["super_mins"], self.factor))

    # ----- in a kernel ---------------------------------------------------------------------

    def emit_load(self, b: Builder, group: Value, col: Value, n_cols: Value, pred: Value | None,
                  ctype: ScalarType, prefix: str = "") -> tuple[Value, ...]:
        arrays = {a.name: a for a in self.arrays()}
        gidx = flat_index(b, group, col, n_cols)
        sidx = flat_index(b, b.binary("div", group, self.factor, hint="sb"), col, n_cols)

        def product(sub: str, sup: str, hint: str) -> Value:
            value = b.binary("mul", load_param(b, arrays[sup], sidx, pred, F32, prefix),
                             load_param(b, arrays[sub], gidx, pred, F32, prefix), hint=hint)
            return value if ctype == F32 else b.cast(value, ctype, hint=hint)

        scale = product("scales", "super_scales", "s")
        if self.mins == "none":
            return (scale,)
        # -(dmin * m) as 0 - dmin * m: exact, the negation of an f32 product
        return scale, b.binary("sub", b.const(0.0, ctype), product("mins", "super_mins", "bi"), hint="bi")

    def loaded_values(self) -> int:
        return 1 if self.mins == "none" else 2

    def emit_apply(self, b: Builder, t: Value, params: Sequence[Value], lanes: int = 1) -> Value:
        return apply_affine(b, t, params[0], None, params[1] if len(params) > 1 else None, lanes)

    def scale_factors_out(self) -> bool:
        return self.mins == "none"

    def bias_factors_out(self) -> bool:
        return self.mins != "none"  # - dmin * m, one per (group, column)

    def emit_bias(self, b: Builder, params: Sequence[Value]) -> Value:
        return params[1]

    def emit_zero(self, params: Sequence[Value]) -> Value | None:
        return None

    def emit_scale(self, b: Builder, params: Sequence[Value]) -> Value:
        return params[0]


def _times_super(sub: Any, sup: Any, factor: int) -> Any:
    """sub [G, ...] times sup [G / factor, ...] repeated along the first axis (numpy or MLX
    arrays of any rank; equal first axes, such as one group's row, multiply as they are)."""
    if sub.ndim == 0 or sub.shape[0] == sup.shape[0]:
        return sub * sup
    rest = tuple(sub.shape[1:])
    grouped = sub.reshape((sup.shape[0], factor) + rest) * sup.reshape((sup.shape[0], 1) + rest)
    return grouped.reshape((sub.shape[0],) + rest)
