"""Decode two codes at once: a u32 whose two 16-bit halves each hold one code in their low bits
(the weight-stream layout puts fragment pairs there) becomes a vec<act, 2>.

When the whole dequantisation is exact in f16 (f16 activations; float or integer codes; a
scale scheme exact in f16: `group_params.compute_type`), it runs as vector (half2) arithmetic
on both halves:

- float codes: mask the magnitude and sign fields of both halves, shift them under f16's
  exponent and mantissa, reinterpret as half2 and rescale by 2**(15 - bias) (exact);
- integer codes: OR in 0x6400 (f16 1024.0) in both halves, reinterpret, subtract 1024 + offset.

Otherwise each half goes through the scalar `UnitDecoder` path and the pair is packed. Both
paths read only the format's fields.
"""
from __future__ import annotations

from ..formats import FloatEncoding, Format, IntEncoding
from ..ir import F16, Builder, ScalarType, Value, VectorType
from .decode import _FLOAT_LAYOUT, UnitDecoder, float_code_bits
from .group_params import GroupValues

_BOTH_HALVES = 0x00010001  # a mask for the low half, repeated in the high half


class PairDecoder:
    def __init__(self, b: Builder, fmt: Format, activation: ScalarType) -> None:
        self.b, self.fmt, self.act = b, fmt, activation
        self.scalar = UnitDecoder(b, fmt, activation)
        self.bits = fmt.element.bits
        enc = fmt.element
        self.vector = self.scalar.ctype == F16 == activation and (
            (isinstance(enc, FloatEncoding) and enc.exp_bits <= 5 and enc.man_bits <= 10)
            or (isinstance(enc, IntEncoding) and enc.bits <= 10))
        self.pair_type = VectorType(activation, 2)

    def splat(self, x: Value) -> Value:
        return self.scalar.params.splat(x)

    def dequant(self, word: Value, shift: int, params: GroupValues) -> Value:
        """The scale scheme applied to the codes at bit `shift` of each half of `word`."""
        b = self.b
        v = b.binary("shr", word, shift, hint="pw") if shift else word
        if not self.vector:
            mask = (1 << self.bits) - 1
            lo = b.binary("and", v, mask, hint="code")
            hi = b.binary("and", b.binary("shr", v, 16, hint="pw"), mask, hint="code")
            values = [self.scalar.dequant(c, params) for c in (lo, hi)]
            return b.value("vec", values, self.pair_type, hint="w2")
        return self.scalar.params.apply_pair(self._decode_pair(v), params)

    def unscaled(self, word: Value, shift: int, params: GroupValues) -> Value:
        """The codes at bit `shift` of each half of `word` as (t - zero) * 2**-rebias, without
        the scale (only when `self.vector` and the format's scale factors out,
        `Scaling.scale_factors_out`): every value exact in f16; the kernel multiplies a group's
        MMA sums by scale * `self.rebias` instead (stream_family.py). An integer code's zero
        point joins the magic number's subtraction (one op: 1024 + offset + zero is exact)."""
        b, enc = self.b, self.fmt.element
        v = b.binary("shr", word, shift, hint="pw") if shift else word
        zero = self.fmt.scaling.emit_zero(params)
        if isinstance(enc, IntEncoding):
            return self._int_pair(v, zero)
        raw = self._decode_pair(v, rebias=False)
        if zero is None:
            return raw
        # zero * 2**-rebias: a u8 zero point times a power of two, exact in f16
        shifted = b.binary("mul", zero, b.const(1.0 / self.rebias, F16), hint="z") if self.rebias != 1.0 else zero
        return b.binary("sub", raw, self.splat(shifted), hint="t2")

    def _int_pair(self, v: Value, zero: Value | None = None) -> Value:
        """Integer codes of both halves as f16 (t - zero): OR under 1024.0's exponent, subtract
        1024 + offset (+ zero)."""
        b, enc = self.b, self.fmt.element
        codes = b.binary("and", v, ((1 << enc.bits) - 1) * _BOTH_HALVES, hint="code")
        magic = b.bitcast(b.binary("or", codes, 0x6400 * _BOTH_HALVES, hint="mag"), self.pair_type, hint="mag")
        base = b.const(1024.0 + enc.offset, F16)
        if zero is not None:
            base = b.binary("add", base, zero, hint="zb")
        return b.binary("sub", magic, self.splat(base), hint="t2")

    @property
    def rebias(self) -> float:
        """The power of two `_decode_pair` multiplies a float code's raw f16 bits by (1 for
        integer codes): a float code's exponent field placed under f16's has f16's bias."""
        enc = self.fmt.element
        return 2.0 ** (_FLOAT_LAYOUT["f16"][0] - enc.bias) if isinstance(enc, FloatEncoding) else 1.0

    def _decode_pair(self, v: Value, rebias: bool = True) -> Value:
        b, enc = self.b, self.fmt.element
        if isinstance(enc, IntEncoding):
            return self._int_pair(v)
        assert isinstance(enc, FloatEncoding)
        t_bias, t_man, width = _FLOAT_LAYOUT["f16"]
        bits = float_code_bits(b, v, enc, t_man, width, repeat=_BOTH_HALVES)
        raw = b.bitcast(bits, self.pair_type, hint="raw")
        if not rebias or self.rebias == 1.0:
            return raw
        return b.binary("mul", raw, self.splat(b.const(self.rebias, F16)), hint="t2")


__all__ = ["PairDecoder"]
