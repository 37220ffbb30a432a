"""A format's per-group parameters inside a kernel: their buffers, how one group's set is
loaded, and how it is applied to decoded table values. Every pipeline's decode (the scalar
`UnitDecoder`, the pair decoder of the weight-stream layouts) goes through one `GroupParams`,
so a new scale type or parameter is one edit here, derived from the format's description:

    value = (t - zero) * scale + bias        (each part only where the format declares it)

Scales stored as 8-bit codes (E8M0, E4M3) are loaded as u8 and decoded through a 256-entry
constant table of their values; bf16 and f32 parameters are loaded as such and converted to
the compute type.
"""
from __future__ import annotations

import numpy as np

from typing import Iterator, NamedTuple

from ..formats import FloatEncoding, Format, IntEncoding
from ..ir import F16, F32, U32, BufferParam, Builder, ConstTable, ScalarType, Value, VectorType


class GroupValues(NamedTuple):
    """One group's parameters in the compute type (None where the format has none)."""

    scale: Value
    zero: Value | None = None
    bias: Value | None = None

    def flat(self) -> list[Value]:
        return [v for v in self if v is not None]


def compute_type(fmt: Format, activation: ScalarType) -> ScalarType:
    """Dequantise in f16 when that is exact up to the final rounding(s); else in f32.

    Float and integer codes (minus integer zero points) are exact in f16, and so are scales
    stored as f16 or E4M3 (whose values all convert exactly), so (t - z) * s rounds once, as
    the float64 reference rounded to f16 does. An f16 bias adds a second rounding, which is
    MLX's own affine arithmetic. Value tables (NF4), bf16/f32/E8M0 parameters and bf16
    activations go through f32, then round once to the activation type.
    """
    exact_in_f16 = (isinstance(fmt.element, (FloatEncoding, IntEncoding))
                    and codes_exact_in_f16(fmt.element)
                    and fmt.scale.dtype in ("f16", "e4m3")
                    and (fmt.zero_point is None or fmt.zero_point.dtype == "u8")
                    and (fmt.bias is None or fmt.bias.dtype == "f16"))
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


def parameter_table_name(prefix: str, name: str) -> str:
    return f"{prefix}{name}_values"


def parameter_tables(fmt: Format, prefix: str = "") -> list[ConstTable]:
    """Value tables of the parameters stored as codes (their invalid codes hold NaN)."""
    return [ConstTable(parameter_table_name(prefix, name), F32, tuple(float(v) for v in s.table))
            for name, s in fmt.parameters().items() if s.table is not None]


class GroupParams:
    """Loads and applies `fmt`'s per-group parameters in a kernel built with `b`."""

    def __init__(self, b: Builder, fmt: Format, activation: ScalarType, prefix: str = "") -> None:
        self.b, self.fmt, self.act = b, fmt, activation
        self.ctype = compute_type(fmt, activation)
        self.prefix = prefix
        #: name -> storage of each parameter array, in buffer order (scales first)
        self.storage = fmt.parameters()

    # ----- what the kernel declares ----------------------------------------------------------

    def buffers(self) -> list[BufferParam]:
        return [BufferParam(name, ScalarType(s.kernel_type), "read") for name, s in self.storage.items()]

    def _table_name(self, name: str) -> str:
        return parameter_table_name(self.prefix, name)

    # ----- one group ---------------------------------------------------------------------------

    def load(self, gidx: Value, pred: Value) -> GroupValues:
        """The parameters at flat index gidx (group * N + column) of each array, in the compute
        type; 0 where `pred` is false."""
        hints = {"scales": "s", "zeros": "z", "biases": "bi"}
        values = {name: self._load_one(name, gidx, pred, hints[name]) for name in self.storage}
        return GroupValues(values["scales"], values.get("zeros"), values.get("biases"))

    def _load_one(self, name: str, gidx: Value, pred: Value, hint: str) -> Value:
        b, storage = self.b, self.storage[name]
        stored_type = ScalarType(storage.kernel_type)
        value = b.load(name, gidx, stored_type, pred, hint=hint)
        if storage.table is not None:  # an 8-bit code: decode through its value table
            code = b.cast(value, U32, hint=hint)
            value = b.value("table", [code], F32, {"name": self._table_name(name)}, hint=hint)
        return value if value.type == self.ctype else b.cast(value, self.ctype, hint=hint)

    def unflatten(self, values: Iterator[Value]) -> GroupValues:
        """`GroupValues.flat()` read back from an iterator (values carried through loops)."""
        scale = next(values)
        zero = next(values) if "zeros" in self.storage else None
        bias = next(values) if "biases" in self.storage else None
        return GroupValues(scale, zero, bias)

    # ----- applying them -----------------------------------------------------------------------

    def apply(self, t: Value, params: GroupValues) -> Value:
        """(t - zero) * scale + bias for a decoded table value t in the compute type."""
        b = self.b
        if params.zero is not None:
            t = b.binary("sub", t, params.zero, hint="t")
        v = b.binary("mul", t, params.scale, hint="w")
        if params.bias is not None:
            v = b.binary("add", v, params.bias, hint="w")
        return v

    def apply_pair(self, t: Value, params: GroupValues) -> Value:
        """The same for a vector of two decoded values (both of one group)."""
        b = self.b
        if params.zero is not None:
            t = b.binary("sub", t, self.splat(params.zero), hint="t2")
        v = b.binary("mul", t, self.splat(params.scale), hint="w2")
        if params.bias is not None:
            v = b.binary("add", v, self.splat(params.bias), hint="w2")
        return v

    def splat(self, x: Value) -> Value:
        return self.b.value("vec", [x, x], VectorType(x.type, 2), hint="v2")  # type: ignore[arg-type]


__all__ = ["GroupParams", "GroupValues", "compute_type", "parameter_tables"]
