"""Decode two codes at once: a u32 whose two 16-bit halves each hold one code of a slot, at the
bits the layout's `BitPlacement` gives it (layouts/bit_placement.py; the weight-stream layouts
put fragment pairs there), becomes a vec<act, 2>.

Every path moves the slot's code bits to *target* bits of their half with the placement's
shift groups (one shift of the word and one mask per group; shifts of a word are shared by
its slots through cse):

- float codes, when the whole dequantisation is exact in f16 (f16 activations, a scale scheme
  exact in f16: `group_params.compute_type`): targets under f16's sign, exponent and mantissa;
  reinterpret as half2 and rescale by 2**(15 - bias) (exact), or leave the rescale to the
  sums (`unscaled`);
- integer codes, likewise: each slot's code lands at bits p.. under the magic number 0x6400
  (f16 1024; the placement's `magic_shifts` choose p so that few shifts serve a word), one
  LOP3 masks and ORs it in, and one subtraction (p = 0) or FMA by 2**-p removes 1024 * 2**-p
  + offset (+ zero point); with bf16 activations the same under 0x4300 (bf16 128, a 7-bit
  mantissa) where the scale is plain (no zero point), then the split scale as below;
- float codes with bf16 activations, when the weight is code value * scale and the two
  round once in bf16 pair arithmetic (`bf16_split_exact`): targets under bf16's fields,
  rescale by 2**(127 - bias) (exact), then fma(t, hi, t * lo) with the f32 scale split into
  bf16 hi + lo (`scheme.mul_rounded_once`): the f32 product's single rounding, bit for bit,
  in 3 pair ops instead of 2 f32 multiplies and a conversion per element;
- otherwise (bf16 with zero points, value tables, f32 parameters): the codes are
  gathered down to bit 0 of each half and go through the scalar `UnitDecoder` path; the pair
  is then packed.

All of it reads only the format's fields and the placement.
"""
from __future__ import annotations

import numpy as np

from ..formats import FloatEncoding, Format, IntEncoding
from ..formats.storage import significant_bits
from ..ir.numerics import round_bf16
from ..ir import BF16, F16, U32, Builder, ScalarType, Value, VectorType
from ..layouts.bit_placement import FLOAT_FIELDS, BitPlacement, float_targets, magic_shifts
from .decode import UnitDecoder
from .group_params import GroupValues

_BOTH_HALVES = 0x00010001  # a mask for the low half, repeated in the high half
_AND_OR = 0xEA  # lop3 truth table of (a & b) | c


def bf16_split_exact(fmt: Format) -> bool:
    """bf16 pairs of `fmt`'s codes times their scale round once (`scheme.mul_rounded_once`):
    the weight is code value * scale alone, a scale has at most 16 significant bits (its low
    part at most 8 past bf16's), and every code value's significand with the low part's fits 8
    bits, so code * low is exact in bf16. Integer codes also fit under bf16's 7-bit mantissa
    with every magic-number subtrahend exact (`_int_pair`)."""
    bits = fmt.scaling.plain_scale_bits()
    if bits is None or bits > 16:
        return False
    enc = fmt.element
    if isinstance(enc, IntEncoding):
        man = FLOAT_FIELDS["bf16"][1]
        if enc.bits > man:
            return False
        bases = np.array([2.0 ** man * 2.0 ** -p + enc.offset for p in range(man - enc.bits + 1)])
        if not np.array_equal(round_bf16(bases).astype(np.float64), bases):
            return False
    return significant_bits(enc.table()) + max(0, bits - 8) <= 8


def magic_number(fields: str) -> int:
    """The bits of 2**mantissa in a 16-bit float type (f16 1024.0 = 0x6400, bf16 128.0 =
    0x4300): integer codes OR-ed under its mantissa read 2**mantissa + code * 2**p."""
    bias, man, _ = FLOAT_FIELDS[fields]
    return (bias + man) << man


class PairDecoder:
    def __init__(self, b: Builder, fmt: Format, activation: ScalarType, placement: BitPlacement) -> None:
        self.b, self.fmt, self.act = b, fmt, activation
        self.scalar = UnitDecoder(b, fmt, activation)
        self.bits = fmt.element.bits
        self.placement = placement
        enc = fmt.element
        #: the pair type's float fields (its exponent bias sets a float code's rebias)
        self.fields = "bf16" if activation == BF16 else "f16"
        self.targets = float_targets(enc, self.fields) if isinstance(enc, FloatEncoding) else None
        #: every code decodes exactly as an f16 pair (what the sums' scaling needs, whatever
        #: the compute type of the parameters: they are applied to the MMA's f32 sums)
        self.f16_codes = activation == F16 and (
            self.targets is not None or (isinstance(enc, IntEncoding) and enc.bits <= 10))
        f16_pairs = self.f16_codes and self.scalar.ctype == F16
        #: bf16 pairs of float or integer codes, each pair times its f32 scale rounded once in
        #: bf16 arithmetic (`scheme.mul_rounded_once`): exact where every code value and the
        #: low part of every scale together have at most bf16's 8 significant bits
        self.split = (activation == BF16 and (self.targets is not None or isinstance(enc, IntEncoding))
                      and bf16_split_exact(fmt))
        self.vector = f16_pairs or self.split
        #: the pair type's mantissa bits (integer codes go under it)
        self.mantissa = FLOAT_FIELDS[self.fields][1]
        self.magic = (magic_shifts(placement, self.mantissa)
                      if (self.vector or self.f16_codes) and isinstance(enc, IntEncoding) else None)
        self.pair_type = VectorType(activation, 2)

    def splat(self, x: Value) -> Value:
        return self.scalar.params.splat(x)

    def dequant(self, word: Value, slot: int, params: GroupValues) -> Value:
        """The scale scheme applied to slot `slot`'s codes of both halves of `word`."""
        b = self.b
        if not self.vector:
            codes = self.gather(word, slot, tuple(range(self.bits)))  # each half's code at its bit 0
            lo = b.binary("and", codes, (1 << self.bits) - 1, hint="code")
            hi = b.binary("shr", codes, 16, hint="code")
            values = [self.scalar.dequant(c, params) for c in (lo, hi)]
            return b.value("vec", values, self.pair_type, hint="w2")
        return self.scalar.params.apply_pair(self._decode_pair(word, slot), params)

    def unscaled(self, word: Value, slot: int, params: GroupValues) -> Value:
        """Slot `slot`'s codes of both halves of `word` as (t - zero) * 2**-rebias, without
        the scale (only when `self.vector` and the format's scale factors out,
        `Scaling.scale_factors_out`): every value exact in f16; the kernel multiplies a group's
        MMA sums by scale * `self.rebias` instead (stream_family.py). An integer code's zero
        point joins the magic number's subtraction (one op: 1024 + offset + zero is exact)."""
        b, enc = self.b, self.fmt.element
        zero = self.fmt.scaling.emit_zero(params)
        if isinstance(enc, IntEncoding):
            return self._int_pair(word, slot, zero)
        raw = self._decode_pair(word, slot, rebias=False)
        if zero is None:
            return raw
        # zero * 2**-rebias: a u8 zero point times a power of two, exact in f16
        shifted = b.binary("mul", zero, b.const(1.0 / self.rebias, F16), hint="z") if self.rebias != 1.0 else zero
        return b.binary("sub", raw, self.splat(shifted), hint="t2")

    def gather(self, word: Value, slot: int, targets: tuple[int, ...]) -> Value:
        """A u32 holding slot `slot`'s code bits of both halves of `word` at `targets` (bit i
        of the code at targets[i] of its half), every other bit 0: per shift group one shift
        of the word (shared through cse) and one mask, OR-ed together (ptxas: one LOP3 each)."""
        b = self.b
        out = None
        for d, mask in self.placement.shift_groups(slot, targets):
            moved = self._shift(word, d)
            part = b.binary("and", moved, mask * _BOTH_HALVES, hint="fld")
            out = part if out is None else b.binary("or", part, out, hint="fld")
        assert out is not None
        return out

    def _shift(self, word: Value, d: int) -> Value:
        if d == 0:
            return word
        return self.b.binary("shl" if d > 0 else "shr", word, abs(d), hint="pw")

    def _int_pair(self, word: Value, slot: int, zero: Value | None = None) -> Value:
        """Integer codes of both halves as the pair type (t - zero): the code, shifted to bits
        p.., masked and OR-ed under the magic number 2**mantissa (f16 1024.0, bf16 128.0) in
        one lop3 (ptxas keeps one LOP3: PTX lop3 with the magic number in a register), reads
        2**mantissa + code * 2**p; subtract 2**mantissa + offset (+ zero) where p = 0, else
        FMA by 2**-p and add -(2**mantissa * 2**-p + offset (+ zero)). Every step is exact: the
        subtrahend is a multiple of 2**-p below 2**(mantissa + 1) (f16; bf16's are checked,
        `bf16_split_exact`) and the results are the small integers t."""
        b, enc, act = self.b, self.fmt.element, self.act
        assert self.magic is not None
        d, p = self.magic[slot]
        mask = b.const((((1 << enc.bits) - 1) << p) * _BOTH_HALVES, U32)
        shifted = self._shift(word, d)
        placed = b.value("lop3", [shifted, mask, b.const(magic_number(self.fields) * _BOTH_HALVES, U32)], U32,
                         {"lut": _AND_OR}, hint="mag")
        magic = b.bitcast(placed, self.pair_type, hint="mag")
        base = b.const(2.0 ** self.mantissa * 2.0 ** -p + enc.offset, act)
        if zero is not None:
            base = b.binary("add", base, zero, hint="zb")
        if p == 0:
            return b.binary("sub", magic, self.splat(base), hint="t2")
        neg = b.binary("sub", b.const(0.0, act), base, hint="zb")
        return b.value("fma", [magic, self.splat(b.const(2.0 ** -p, act)), self.splat(neg)], self.pair_type, hint="t2")

    @property
    def sums_scalable(self) -> bool:
        """Pairs may be decoded `unscaled`, their scale applied to the MMA's sums: f16 pairs
        (bf16 ones would hand the MMA a float code's raw bits, subnormal bf16 numbers), also
        where the parameters' own compute type is f32 (SuperBlockScale)."""
        return self.f16_codes and not self.split

    @property
    def rebias(self) -> float:
        """The power of two `_decode_pair` multiplies a float code's raw bits by (1 for
        integer codes): a float code's exponent field placed under the pair type's (f16's or
        bf16's) has that type's bias."""
        enc = self.fmt.element
        return 2.0 ** (FLOAT_FIELDS[self.fields][0] - enc.bias) if isinstance(enc, FloatEncoding) else 1.0

    def _decode_pair(self, word: Value, slot: int, rebias: bool = True) -> Value:
        b, enc = self.b, self.fmt.element
        if isinstance(enc, IntEncoding):
            return self._int_pair(word, slot)
        assert isinstance(enc, FloatEncoding) and self.targets is not None
        raw = b.bitcast(self.gather(word, slot, self.targets), self.pair_type, hint="raw")
        if not rebias or self.rebias == 1.0:
            return raw
        return b.binary("mul", raw, self.splat(b.const(self.rebias, self.act)), hint="t2")


__all__ = ["PairDecoder"]
