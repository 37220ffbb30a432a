"""`GroupAffine`: the built-in scheme of a `GroupScale` with an optional `ZeroPoint` or
`GroupBias` (parts.py):

    value = (table[code] - zero) * scale + bias        per group of G K positions and column

Symmetric formats (scale only), GPTQ-style zero points and MLX's affine mode (`s * q + b`)
are this one scheme; `Format(name, element, GroupScale(128), ZeroPoint("u8"))` builds it
(`Format.scaling`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ...errors import FormatError, SourceLocation
from .parts import GroupBias, GroupScale, ZeroPoint
from .rounding import scale_at_least, symmetric_scale
from .scheme import (Affine, GroupChoice, ParamArray, ScaledFormat, Scaling, apply_affine, flat_index,
                     load_param)

if TYPE_CHECKING:
    from ...ir.builder import Builder
    from ...ir.core import Value
    from ...ir.types import ScalarType


@dataclass(frozen=True)
class GroupAffine(Scaling):
    """Per-group scales [K/G, N], with zero points or biases [K/G, N] where declared."""

    scale: GroupScale
    zero_point: ZeroPoint | None = None
    bias: GroupBias | None = None
    location: SourceLocation | None = field(default=None, compare=False, repr=False, kw_only=True)

    @property
    def group_size(self):  # type: ignore[override]
        return self.scale.group_size

    def arrays(self) -> tuple[ParamArray, ...]:
        # A bias makes any scale meaningful (MLX may store zero or negative ones); without
        # one a zero scale would silently zero its group, unless the format declares 0 as
        # an all-zero group (GroupScale.zero, MLX's nvfp4).
        sign = "any" if self.bias is not None else (
            "non_negative" if self.scale.zero == "allowed" else "positive")
        out = [ParamArray("scales", self.scale.storage, "per-group scales", "s", sign=sign)]
        if self.zero_point is not None:
            out.append(ParamArray("zeros", self.zero_point.storage, "per-group zero points", "z",
                                  sign="any"))
        if self.bias is not None:
            out.append(ParamArray("biases", self.bias.storage, "per-group biases", "bi",
                                  sign="any"))
        return tuple(out)

    def check(self, fmt: ScaledFormat) -> None:
        where = fmt.location
        if self.bias is not None and self.zero_point is not None:
            raise FormatError(
                f"format {fmt.name!r}: declare a zero_point or a bias, not both (both offset "
                f"a group: (q - z) * s or q * s + b)", self.bias.location or where)
        if self.zero_point is not None and not fmt.element.is_integer_grid:
            raise FormatError(
                f"format {fmt.name!r}: zero points need an integer encoding "
                f"(consecutive integer values), not {fmt.element.describe()}",
                where,
            )
        if (self.zero_point is not None and self.zero_point.dtype == "u8"
                and fmt.element.value_range[0] < 0):
            raise FormatError(
                f"format {fmt.name!r}: u8 zero points need an encoding without negative "
                f"values (use IntEncoding offset 0, or ZeroPoint('f16'))",
                self.zero_point.location or where,
            )

    def describe_parts(self) -> list[str]:
        parts = []
        if self.scale.dtype != "f16":
            parts.append(f"{self.scale.dtype} scales")
        if self.scale.zero == "allowed":
            parts.append("scale 0 = zero group")
        if self.zero_point is not None:
            parts.append(f"zero points {self.zero_point.dtype}")
        if self.bias is not None:
            parts.append(f"biases {self.bias.dtype}")
        return parts

    # ----- host side -----------------------------------------------------------------------

    def choose(self, fmt: ScaledFormat, group_max: np.ndarray, group_min: np.ndarray,
               weights: Callable[[], np.ndarray]) -> GroupChoice:
        """Symmetric: the smallest scale that maps the group into the table. Zero points: the
        range [min(w, 0), max(w, 0)], so that 0.0 is exact. Bias (MLX's affine mode): the
        group's [min, max] onto the table's, s = (max - min) / (hi - lo), b = min - lo * s."""
        table = fmt.element.table()
        table = table[np.isfinite(table)]  # reserved codes (NaN, infinities) are never chosen
        lo, hi = float(table.min()), float(table.max())
        zero = bias = None
        stored: dict[str, np.ndarray] = {}
        storage = self.scale.storage
        if self.zero_point is not None:
            top = np.maximum(group_max, 0.0)
            bottom = np.minimum(group_min, 0.0)
            stored["scales"], s = scale_at_least((top - bottom) / (hi - lo), fmt, storage)
            zero = np.clip(lo - np.rint(bottom / s), lo, hi)
            stored["zeros"] = zero.astype(self.zero_point.numpy_dtype)
        elif self.bias is not None:
            stored["scales"], s = scale_at_least((group_max - group_min) / (hi - lo), fmt, storage)
            bias_storage = self.bias.storage
            stored["biases"] = bias_storage.round_nearest(group_min - lo * s)
            bias = bias_storage.to_float64(stored["biases"])
        else:
            needed = symmetric_scale(fmt, weights, group_max, group_min, table)
            stored["scales"], s = scale_at_least(needed, fmt, storage)
        return GroupChoice(stored, s, zero, bias, (lo, hi))

    def affine(self, params: dict[str, Any]) -> Affine:
        return Affine(params["scales"], params.get("zeros"), params.get("biases"))

    # ----- in a kernel ---------------------------------------------------------------------

    def exact_in_f16(self) -> bool:
        """f16 and E4M3 scales convert to f16 exactly and u8 zero points are small integers, so
        (t - z) * s rounds once, as the reference rounded to f16 does; an f16 bias adds a
        second rounding, which is MLX's own affine arithmetic."""
        return (self.scale.dtype in ("f16", "e4m3")
                and (self.zero_point is None or self.zero_point.dtype == "u8")
                and (self.bias is None or self.bias.dtype == "f16"))

    def emit_load(self, b: Builder, group: Value, col: Value, n_cols: Value, pred: Value | None,
                  ctype: ScalarType, prefix: str = "") -> tuple[Value, ...]:
        gidx = flat_index(b, group, col, n_cols)
        return tuple(load_param(b, a, gidx, pred, ctype, prefix) for a in self.arrays())

    def emit_apply(self, b: Builder, t: Value, params: Sequence[Value], lanes: int = 1) -> Value:
        rest = iter(params[1:])
        zero = next(rest) if self.zero_point is not None else None
        bias = next(rest) if self.bias is not None else None
        return apply_affine(b, t, params[0], zero, bias, lanes)

    def plain_scale_bits(self) -> int | None:
        if self.zero_point is not None or self.bias is not None:
            return None
        return self.scale.storage.significant_bits

    def scale_factors_out(self) -> bool:
        return self.bias is None  # s * q + b: the bias term would need the group's sum of x

    def emit_zero(self, params: Sequence[Value]) -> Value | None:
        return params[1] if self.zero_point is not None else None

    def emit_scale(self, b: Builder, params: Sequence[Value]) -> Value:
        return params[0]
