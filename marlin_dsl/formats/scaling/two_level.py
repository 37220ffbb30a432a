"""`TwoLevelScale`: a per-output-channel scale times a per-group 8-bit sub-scale.

    value = table[code] * (channel[n] * sub[g, n])

`channel_scales` is [1, N] (f32 by default, or f16/bf16); `scales` holds the sub-scales,
[K/G, N], one byte each, in one of two meanings:

- `sub_dtype="u8"`: an integer multiplier 1..255. Quantisation sets channel[n] to the
  column's largest group scale / 255 (rounded up to its storage) and sub to the smallest
  integer with channel * sub >= the group's own scale, so no value clips. Storage is 8 bits
  per group instead of 16; a group whose needed scale is far below the column's largest
  (under channel / 2) loses its resolution, the price of the second level.
- `sub_dtype="e8m0"`: a power of two 2**(e - 127) <= 1 (OCP microscaling's E8M0). channel[n]
  is the column's largest group scale, each group scales it down by the smallest power of two
  that still covers it.

Sub-scales and channel scales must be positive (0 would zero a group or a column). In a
kernel the product channel * sub is formed once per (group, column), in f32.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Sequence

import numpy as np

from ...errors import SourceLocation
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

SUB_DTYPES = ("u8", "e8m0")
CHANNEL_DTYPES = ("f32", "f16", "bf16")


@dataclass(frozen=True)
class TwoLevelScale(Scaling):
    """Declared in place of a GroupScale: `Format("x", INT4, TwoLevelScale(128))`."""

    group_size: int | Literal["K"] = 128
    sub_dtype: Literal["u8", "e8m0"] = "u8"
    channel_dtype: Literal["f32", "f16", "bf16"] = "f32"
    location: SourceLocation | None = field(default=None, compare=False, repr=False, kw_only=True)

    text_kind = "two_level"
    text_attrs = (("size", "group_size", "group_size"), ("sub", "sub_dtype", "ident"),
                  ("channel", "channel_dtype", "ident"))

    def __post_init__(self) -> None:
        if self.location is None:
            object.__setattr__(self, "location", caller_location())
        check_group_size("TwoLevelScale", self.group_size, self.location)
        check_dtype("TwoLevelScale sub", self.sub_dtype, SUB_DTYPES, self.location)
        check_dtype("TwoLevelScale channel", self.channel_dtype, CHANNEL_DTYPES, self.location)

    def arrays(self) -> tuple[ParamArray, ...]:
        return (ParamArray("scales", STORAGE_TYPES[self.sub_dtype], "per-group sub-scales", "s"),
                ParamArray("channel_scales", STORAGE_TYPES[self.channel_dtype],
                           "per-column scales", "cs", per_group=False))

    def describe_parts(self) -> list[str]:
        return [f"{self.channel_dtype} column x {self.sub_dtype} group scales"]

    # ----- host side -----------------------------------------------------------------------

    def choose(self, fmt: ScaledFormat, group_max: np.ndarray, group_min: np.ndarray,
               weights: Callable[[], np.ndarray]) -> GroupChoice:
        table = fmt.element.table()
        table = table[np.isfinite(table)]
        needed = symmetric_scale(fmt, weights, group_max, group_min, table)  # [K/G, N]
        top = 255.0 if self.sub_dtype == "u8" else 1.0  # the largest sub-scale
        column = needed.max(axis=0, keepdims=True) / top
        channel, channel_values = scale_at_least(column, fmt, STORAGE_TYPES[self.channel_dtype])
        ratio = needed / channel_values  # <= top (up to float64 rounding)
        if self.sub_dtype == "u8":
            sub = np.clip(np.ceil(ratio), 1.0, 255.0).astype(np.uint8)
        else:
            sub = STORAGE_TYPES["e8m0"].round_up(np.minimum(ratio, 1.0))
        scale = STORAGE_TYPES[self.sub_dtype].to_float64(sub) * channel_values
        return GroupChoice({"scales": sub, "channel_scales": channel}, scale, None, None,
                           (float(table.min()), float(table.max())))

    def affine(self, params: dict[str, Any]) -> Affine:
        # float64: an 8-bit integer or a power of two times an f32 value is exact
        return Affine(params["scales"] * params["channel_scales"])

    # ----- in a kernel ---------------------------------------------------------------------

    def emit_load(self, b: Builder, group: Value, col: Value, n_cols: Value, pred: Value | None,
                  ctype: ScalarType, prefix: str = "") -> tuple[Value, ...]:
        sub_array, channel_array = self.arrays()
        sub = load_param(b, sub_array, flat_index(b, group, col, n_cols), pred, ctype, prefix)
        channel = load_param(b, channel_array, col, pred, ctype, prefix)
        return (b.binary("mul", sub, channel, hint="s"),)

    def loaded_values(self) -> int:
        return 1  # the product channel * sub

    def emit_apply(self, b: Builder, t: Value, params: Sequence[Value], lanes: int = 1) -> Value:
        return apply_affine(b, t, params[0], lanes=lanes)

    def scale_factors_out(self) -> bool:
        return True  # channel * sub is one factor per (group, column)

    def emit_zero(self, params: Sequence[Value]) -> Value | None:
        return None

    def emit_scale(self, b: Builder, params: Sequence[Value]) -> Value:
        return params[0]
