"""The pack-time bit order of the weight-stream words (layouts/bit_placement.py): a permutation
of each half's 16 bits, packed and unpacked exactly, chosen so the decode's shift groups are
cheap, and the integer decode's shifts land every code inside f16's mantissa. The kernels
that decode it are checked against the float64 reference in test_weight_stream.py and
test_multistage.py."""
from __future__ import annotations

import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl import CUDA
from marlin_dsl.formats import FloatEncoding
from marlin_dsl.layouts.bit_placement import (
    BitPlacement, decode_cost, float_placement, float_targets, magic_shifts, natural_placement, placement_for,
)
from marlin_dsl.layouts.weight_stream import stream_layout

E2M1 = FloatEncoding(bits=4, exp_bits=2, man_bits=1, bias=1)
FLOATS = [E2M1, FloatEncoding(bits=8, exp_bits=4, man_bits=3, bias=7, specials="fn"),
          FloatEncoding(bits=8, exp_bits=5, man_bits=2, bias=15, specials="ieee"),
          FloatEncoding(bits=4, exp_bits=1, man_bits=2, bias=1),
          FloatEncoding(bits=4, exp_bits=3, man_bits=1, bias=3, signed=False),
          FloatEncoding(bits=2, exp_bits=1, man_bits=0, bias=0)]


def _brute_force_decode(placement: BitPlacement, words: np.ndarray, slot: int, targets) -> np.ndarray:
    """What `PairDecoder.gather` computes, by shift groups: bit i of the slot's codes at targets[i]."""
    out = np.zeros_like(words)
    for d, mask in placement.shift_groups(slot, targets):
        moved = words << np.uint32(d) if d >= 0 else words >> np.uint32(-d)
        out |= moved & np.uint32(mask * 0x00010001)
    return out


@pytest.mark.parametrize("enc", FLOATS, ids=lambda e: e.describe())
def test_float_placement_is_a_cheaper_permutation_and_decodes(enc: FloatEncoding) -> None:
    placement = float_placement(enc)
    targets = float_targets(enc)
    assert targets is not None
    assert decode_cost(placement, targets) <= decode_cost(natural_placement(enc.bits), targets)
    rng = np.random.default_rng(enc.bits)
    lo, hi = (rng.integers(0, 2 ** enc.bits, size=(64, placement.slots)) for _ in range(2))
    words = placement.pack(lo, hi)
    back_lo, back_hi = placement.unpack(words)
    np.testing.assert_array_equal(back_lo, lo)
    np.testing.assert_array_equal(back_hi, hi)
    for slot in range(placement.slots):  # the shift groups place each code's bits at the targets
        got = _brute_force_decode(placement, words, slot, targets)
        for i, t in enumerate(targets):
            np.testing.assert_array_equal((got >> np.uint32(t)) & 1, (lo[:, slot] >> i) & 1)
            np.testing.assert_array_equal((got >> np.uint32(16 + t)) & 1, (hi[:, slot] >> i) & 1)
        want_bits = sum(1 << t for t in targets) * 0x00010001
        assert not (got & ~np.uint32(want_bits)).any()


def test_fp4_costs_eleven_per_word_natural_fifteen() -> None:
    """The issue-15 number: E2M1's sign and magnitude move by different amounts in every
    natural slot (4 shifts + ...); the searched order puts two slots' signs 3 bits above their
    magnitudes (f16's gap) and shares the rest."""
    targets = float_targets(E2M1)
    assert targets == (9, 10, 11, 15)
    assert decode_cost(natural_placement(4), targets) == 15
    assert decode_cost(float_placement(E2M1), targets) == 11
    assert placement_for(md.builtin_format("fp4").element) == float_placement(E2M1)
    assert stream_layout(md.builtin_format("fp4_2of4"), CUDA).bit_order == float_placement(E2M1)


@pytest.mark.parametrize("name", ["int4", "uint4_zp", "nf4"])
def test_integer_and_table_codes_keep_the_natural_order(name: str) -> None:
    assert stream_layout(md.builtin_format(name), CUDA).bit_order.natural


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 7, 8])
def test_magic_shifts_land_codes_inside_the_mantissa(bits: int) -> None:
    placement = natural_placement(bits)
    shifts = magic_shifts(placement)
    for (d, p), slot in zip(shifts, placement.positions):
        assert slot[0] + d == p and 0 <= p and p + bits <= 10
    nonzero = {d for d, _ in shifts if d}
    assert len(nonzero) == 1  # one shift of the word serves every slot above the mantissa
    assert shifts == {4: ((0, 0), (0, 4), (-8, 0), (-8, 4))}.get(bits, shifts)


def test_a_placement_must_be_a_permutation() -> None:
    with pytest.raises(ValueError, match="permutation"):
        BitPlacement(4, ((0, 1, 2, 3), (0, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)))
    with pytest.raises(ValueError, match="permutation"):  # 3-bit codes: 5 a half, not 4
        BitPlacement(3, ((0, 1, 2), (3, 4, 5), (6, 7, 8), (9, 10, 11)))


@pytest.mark.parametrize("bits", [3, 5, 6, 7])
def test_widths_not_dividing_16_leave_spare_bits_zero(bits: int) -> None:
    """floor(16 / bits) codes a half; the 16 % bits bits above them hold nothing and pack 0."""
    placement = natural_placement(bits)
    assert (placement.slots, placement.spare) == (16 // bits, 16 % bits)
    rng = np.random.default_rng(bits)
    lo, hi = (rng.integers(0, 1 << bits, size=(64, placement.slots)) for _ in range(2))
    words = placement.pack(lo, hi)
    used = sum(1 << p for slot in placement.positions for p in slot) * 0x00010001
    assert not (words & np.uint32(~used & 0xFFFFFFFF)).any()
    back_lo, back_hi = placement.unpack(words)
    np.testing.assert_array_equal(back_lo, lo)
    np.testing.assert_array_equal(back_hi, hi)
