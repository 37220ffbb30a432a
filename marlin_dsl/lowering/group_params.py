"""A format's scale parameters inside a kernel. Every pipeline's decode (the scalar
`UnitDecoder`, the pair decoder of the weight-stream layouts) goes through one `GroupParams`,
which hands each question to the format's scale scheme (`fmt.scaling`, formats/scaling/):
which buffers the kernel declares, which group a K position is in (`group_of`, the one place
a kernel computes it), how one (group, column)'s parameters load (`Scaling.emit_load`) and
how they apply to a decoded table value (`Scaling.emit_apply`; for a GroupScale
(t - zero) * scale + bias). Nothing here knows a scheme, so a new one needs no edit here.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from ..formats import FloatEncoding, Format, IntEncoding
from ..formats.scaling import parameter_table_name
from ..formats.scaling.scheme import splat
from ..ir import F16, F32, BufferParam, Builder, ConstTable, ScalarType, Value


class GroupValues(tuple):
    """One (group, column)'s parameters in the compute type, as the scale scheme's
    `emit_load` returned them (carried through loops as they are)."""

    def flat(self) -> list[Value]:
        return list(self)


def compute_type(fmt: Format, activation: ScalarType) -> ScalarType:
    """Dequantise in f16 when that is exact up to the final rounding(s); else in f32.

    Float and integer codes are exact in f16; whether the scale scheme's parameters keep it so
    is the scheme's answer (`Scaling.exact_in_f16`: f16 or E4M3 scales, u8 zero points, an f16
    bias, whose second rounding is MLX's own affine arithmetic). Value tables (NF4), other
    parameters and bf16 activations go through f32, then round once to the activation type.
    """
    exact_in_f16 = (isinstance(fmt.element, (FloatEncoding, IntEncoding))
                    and codes_exact_in_f16(fmt.element)
                    and fmt.scaling.exact_in_f16())
    return F16 if activation == F16 and exact_in_f16 else F32


def codes_exact_in_f16(enc) -> bool:
    """Every value of the encoding is an f16 number, and the f16 decode (code bits placed
    under f16's exponent, decode.py) never lands on f16's all-ones exponent unless the
    encoding's own all-ones exponent is inf/NaN too (E5M2 with specials="ieee")."""
    table = enc.table()
    finite = table[np.isfinite(table)]
    with np.errstate(over="ignore"):  # values beyond f16's range become inf: not exact
        as_f16 = finite.astype(np.float16).astype(np.float64)
    if not np.array_equal(as_f16, finite):
        return False
    return not isinstance(enc, FloatEncoding) or enc.exp_bits < 5 or enc.specials == "ieee"


def parameter_tables(fmt: Format, prefix: str = "") -> list[ConstTable]:
    """Value tables of the parameters stored as codes (their invalid codes hold NaN)."""
    return [ConstTable(parameter_table_name(prefix, name), F32, tuple(float(v) for v in s.table))
            for name, s in fmt.parameters().items() if s.table is not None]


class GroupParams:
    """Loads and applies `fmt`'s scale parameters in a kernel built with `b`."""

    def __init__(self, b: Builder, fmt: Format, activation: ScalarType, prefix: str = "") -> None:
        self.b, self.fmt, self.act = b, fmt, activation
        self.scaling = fmt.scaling
        self.ctype = compute_type(fmt, activation)
        self.prefix = prefix

    def buffers(self) -> list[BufferParam]:
        """The parameter buffers the kernel declares, in buffer order."""
        return [BufferParam(a.name, ScalarType(a.storage.kernel_type), "read")
                for a in self.scaling.arrays()]

    def group_of(self, dense_k: Value) -> Value:
        """The group index of dense K position `dense_k`."""
        return self.scaling.emit_group(self.b, dense_k)

    def load_at(self, group: Value, col: Value, n_cols: Value, pred: Value | None) -> GroupValues:
        """The parameters of (group, column col) in the compute type; 0 where `pred` is false
        (None: it exists)."""
        return GroupValues(self.scaling.emit_load(self.b, group, col, n_cols, pred, self.ctype,
                                                  self.prefix))

    def unflatten(self, values: Iterator[Value]) -> GroupValues:
        """`GroupValues.flat()` read back from an iterator (values carried through loops)."""
        return GroupValues(next(values) for _ in range(self.scaling.loaded_values()))

    def apply(self, t: Value, params: GroupValues) -> Value:
        """The weight value of a decoded table value t in the compute type."""
        return self.scaling.emit_apply(self.b, t, params)

    def apply_pair(self, t: Value, params: GroupValues) -> Value:
        """The same for a vector of two decoded values (both of one group)."""
        return self.scaling.emit_apply(self.b, t, params, lanes=2)

    def splat(self, x: Value) -> Value:
        return splat(self.b, x, 2)


__all__ = ["GroupParams", "GroupValues", "compute_type", "parameter_tables"]
