"""The bit order of codes inside the weight-stream words, chosen at pack time so that the
in-kernel decode takes few instructions.

The weight-stream layout (`weight_stream.py`) puts a lane's codes in pairs into the two 16-bit
halves of its words: `slots = 16 // bits` pairs per word, both codes of slot k at the same bit
positions of their half. A `BitPlacement` says which: `positions[k][i]` is the bit (0..15 in
each half) holding bit i of slot k's code. The natural order puts slot k at bits
k * bits .. k * bits + bits - 1. Where the width does not divide 16 (3, 5, 6, 7 bits) the
16 - slots * bits bits left over in each half are *spare*: never a code's, always 0.

The decode (lowering/pair_decode.py) moves a slot's code bits to *target* positions in their
half and masks everything else away: for float codes the fields of an f16 (magnitude under
f16's exponent and mantissa, sign at bit 15: the half2 is the value up to a power of two), for
integer codes the low mantissa bits under f16's magic number 1024. Bits whose target lies the
same distance d from their position move together: one shift of the whole word by d (shared by
every slot of the word that needs it) and one mask (a LOP3; an AND-OR of a second mask is one
LOP3 too). So a placement costs, per word,

    (distinct non-zero shifts) + (for each slot, the distinct shifts among its bits)

instructions (`decode_cost`). FP4 E2M1 in the natural order costs 16 per word (4 per pair:
magnitude and sign move by different amounts in every slot); `float_placement` searches the
placements of (sign, contiguous magnitude) fields for the cheapest, 11 per word, by putting
two slots' sign three bits above their magnitude as f16 has it. Everything is derived from the
encoding's field widths; no format is named here.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..formats import Encoding, FloatEncoding

#: (exponent bias, mantissa bits, width) of the float types codes decode into. f16 is the one
#: the placement is chosen for (the weight stream's pair decode: half2 values, f16 MMAs).
FLOAT_FIELDS = {"f16": (15, 10, 16), "bf16": (127, 7, 16), "f32": (127, 23, 32)}
#: The width of one half of a word: a code's bits never leave their half.
HALF = 16
#: Search nodes `float_placement` may visit (FP4: ~6k; wide slot counts stop at the best found).
_SEARCH_BUDGET = 200_000


@dataclass(frozen=True)
class BitPlacement:
    bits: int
    positions: tuple[tuple[int, ...], ...]  # [slot][code bit] -> bit within a 16-bit half

    def __post_init__(self) -> None:
        # Every bit of a half holds at most one code bit, and the slots fill the half as far
        # as whole codes go (16 // bits of them): only the remainder, 16 % bits, is spare.
        flat = [p for slot in self.positions for p in slot]
        if (len(set(flat)) != len(flat) or not all(0 <= p < HALF for p in flat)
                or any(len(s) != self.bits for s in self.positions) or self.slots != HALF // self.bits):
            raise ValueError(f"bit placement {self.positions} is not a permutation of "
                             f"{HALF // self.bits * self.bits} of a half's {HALF} bits")

    @property
    def slots(self) -> int:
        return len(self.positions)

    @property
    def spare(self) -> int:
        """Bits of each half that hold no code (16 % bits): the layout leaves them 0."""
        return HALF - self.slots * self.bits

    @property
    def natural(self) -> bool:
        return self.positions == natural_placement(self.bits).positions

    def shift_groups(self, slot: int, targets: tuple[int, ...]) -> list[tuple[int, int]]:
        """[(shift, mask)]: slot's code bits grouped by the left shift d (negative: right)
        that moves each to its target; mask has the targets of the group in one half."""
        groups: dict[int, int] = {}
        for i, target in enumerate(targets):
            d = target - self.positions[slot][i]
            groups[d] = groups.get(d, 0) | 1 << target
        return sorted(groups.items())

    def spread(self) -> np.ndarray:
        """[slots, 2**bits] u32: each code value with its bits moved to the slot's positions
        (in the low half)."""
        codes = np.arange(1 << self.bits, dtype=np.uint32)
        table = np.zeros((self.slots, codes.size), np.uint32)
        for k, slot in enumerate(self.positions):
            for i, pos in enumerate(slot):
                table[k] |= ((codes >> np.uint32(i)) & np.uint32(1)) << np.uint32(pos)
        return table

    def pack(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Codes [..., slots] of the low and high halves -> u32 words [...]: a lookup of each
        code in its slot's `spread` table (vectorised; disjoint bits, so OR)."""
        table = self.spread()
        words = np.zeros(lo.shape[:-1], np.uint32)
        for k in range(self.slots):
            words |= table[k][lo[..., k]] | (table[k][hi[..., k]] << np.uint32(HALF))
        return words

    def unpack(self, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`pack`'s inverse: (lo, hi) codes [..., slots]."""
        words = words.astype(np.uint32)
        lo = np.zeros(words.shape + (self.slots,), np.uint32)
        hi = np.zeros_like(lo)
        for k, slot in enumerate(self.positions):
            for i, pos in enumerate(slot):
                lo[..., k] |= ((words >> np.uint32(pos)) & np.uint32(1)) << np.uint32(i)
                hi[..., k] |= ((words >> np.uint32(HALF + pos)) & np.uint32(1)) << np.uint32(i)
        return lo, hi


def natural_placement(bits: int) -> BitPlacement:
    return BitPlacement(bits, tuple(tuple(k * bits + i for i in range(bits)) for k in range(HALF // bits)))


def float_targets(enc: FloatEncoding, fields: str = "f16") -> tuple[int, ...] | None:
    """Where each bit of a float code goes in a half of the decode type (mantissa and exponent
    fields under the type's, their low ends aligned at the mantissa's top; the sign at the
    top), or None where the code's fields do not fit under the type's."""
    _, t_man, width = FLOAT_FIELDS[fields]
    magnitude = enc.exp_bits + enc.man_bits
    base = t_man - enc.man_bits
    if width != HALF or base < 0 or base + magnitude > width - 1:
        return None
    return tuple(base + i for i in range(magnitude)) + ((width - 1,) if enc.signed else ())


def decode_cost(placement: BitPlacement, targets: tuple[int, ...]) -> int:
    """Instructions per word to move every slot's bits to `targets` (see the module doc)."""
    shifts, masks = set(), 0
    for k in range(placement.slots):
        groups = placement.shift_groups(k, targets)
        masks += len(groups)
        shifts |= {d for d, _ in groups if d}
    return len(shifts) + masks


def magic_shifts(placement: BitPlacement, mantissa_bits: int = 10) -> tuple[tuple[int, int], ...]:
    """Per slot (shift d, bit p) for the integer decode: the slot's contiguous code, shifted
    by d, lands at bits p .. p + bits - 1 of its half, inside the mantissa (p + bits <=
    mantissa_bits: f16's 10, bf16's 7) under the magic number 2**mantissa_bits, where it reads
    (2**mantissa_bits + code * 2**p). Chooses few distinct non-zero
    shifts, then few distinct p (each p is one constant of the subtraction): greedily, a slot
    that needs a shift takes the one serving the most slots still unserved, then the one
    landing them on bits already used, then the shortest."""
    bits = placement.bits
    starts = []
    for slot in placement.positions:
        if list(slot) != list(range(slot[0], slot[0] + bits)):
            raise ValueError(f"magic_shifts: slot bits {slot} are not contiguous")
        starts.append(slot[0])
    top = mantissa_bits - bits
    if top < 0:
        raise ValueError(f"{bits}-bit codes do not fit under a {mantissa_bits}-bit mantissa")
    chosen = {k: 0 for k, start in enumerate(starts) if start <= top}
    while len(chosen) < len(starts):
        k = next(k for k in range(len(starts)) if k not in chosen)
        used = {starts[j] + d for j, d in chosen.items()}

        def rank(d: int) -> tuple[int, int, int]:
            served = [s + d for j, s in enumerate(starts) if j not in chosen and 0 <= s + d <= top]
            return len(served), -len(set(served) - used), -abs(d)

        best = max((d for d in range(-starts[k], top - starts[k] + 1) if d), key=rank)
        for j, s in enumerate(starts):
            if j not in chosen and 0 <= s + best <= top:
                chosen[j] = best
    return tuple((chosen[k], starts[k] + chosen[k]) for k in range(len(starts)))


@lru_cache(maxsize=None)
def float_placement(enc: FloatEncoding) -> BitPlacement:
    """The cheapest placement of a float code's (contiguous magnitude, sign) fields for the f16
    decode (`decode_cost` against `float_targets`), by a depth-first search over exact covers
    of the 16 bits, each slot placed at the lowest free bit (slots are interchangeable), pruned
    by the best cost found; the natural order where nothing is cheaper (ties keep it), and for
    widths that leave spare bits (the search enumerates exact covers only; not searched yet)."""
    bits, natural = enc.bits, natural_placement(enc.bits)
    targets = float_targets(enc)
    if targets is None or HALF % bits:
        return natural
    magnitude = enc.exp_bits + enc.man_bits
    slots = HALF // bits
    best = [decode_cost(natural, targets), natural.positions]
    budget = [_SEARCH_BUDGET]

    def code_positions(mag: int, sign: int | None) -> tuple[int, ...]:
        return tuple(range(mag, mag + magnitude)) + (() if sign is None else (sign,))

    def cost(placed: list[tuple[int, ...]]) -> tuple[int, int]:
        """(shifts, masks) of a partial placement."""
        shifts, masks = set(), 0
        for slot in placed:
            ds = {t - p for t, p in zip(targets, slot)}
            masks += len(ds)
            shifts |= ds - {0}
        return len(shifts), masks

    def search(used: int, placed: list[tuple[int, ...]]) -> None:
        budget[0] -= 1
        shifts, masks = cost(placed)
        if budget[0] < 0 or shifts + masks + (slots - len(placed)) >= best[0]:
            return
        if len(placed) == slots:
            best[0], best[1] = shifts + masks, tuple(placed)
            return
        low = next(i for i in range(HALF) if not used >> i & 1)
        free = [i for i in range(HALF) if not used >> i & 1]
        candidates = []
        if enc.signed:  # the lowest free bit is this slot's sign, or the start of its magnitude
            candidates += [code_positions(mag, low) for mag in free if mag != low]
            candidates += [code_positions(low, sign) for sign in free if not low <= sign < low + magnitude]
        else:
            candidates.append(code_positions(low, None))
        for slot in candidates:
            mask = sum(1 << p for p in slot)
            if max(slot) < HALF and not used & mask:
                search(used | mask, placed + [slot])

    search(0, [])
    return BitPlacement(bits, best[1])


def placement_for(enc: Encoding) -> BitPlacement:
    """The pack-time bit order of an encoding's codes: the searched one for float codes, the
    natural one for integer and table codes (their decode reads contiguous codes:
    `magic_shifts`, or shifts and masks down to bit 0)."""
    if isinstance(enc, FloatEncoding):
        return float_placement(enc)
    return natural_placement(enc.bits)


__all__ = ["BitPlacement", "FLOAT_FIELDS", "decode_cost", "float_placement", "float_targets",
           "magic_shifts", "natural_placement", "placement_for"]
