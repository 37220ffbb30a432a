"""Packing of n-bit fields into words along axis 0, LSB first, as one continuous bit stream.

Field i of a column occupies bits [i*bits, (i+1)*bits) of that column's stream; word w holds
stream bits [w*word_bits, (w+1)*word_bits). When `bits` divides the word size this is the
usual "8 nibbles per uint32, element 0 in bits [3:0]" layout of seeds 000 and 002; for other
widths (3, 5, 6 bits) a field may straddle two words. The Python loop below runs over the
fields of one word group (at most `word_bits` iterations), each step vectorised over the
whole array.
"""
from __future__ import annotations

from math import lcm

import numpy as np

WORD_DTYPES = {8: np.uint8, 16: np.uint16, 32: np.uint32}


def fields_per_group(bits: int, word_bits: int) -> int:
    """How many fields make a whole number of words."""
    return lcm(bits, word_bits) // bits


def packed_rows(rows: int, bits: int, word_bits: int) -> int:
    return rows * bits // word_bits


def pack_bits(fields: np.ndarray, bits: int, word_bits: int = 32) -> np.ndarray:
    """[L, N] fields (each < 2**bits) -> [L*bits/word_bits, N] words."""
    dtype = WORD_DTYPES[word_bits]
    per_group = fields_per_group(bits, word_bits)
    rows, cols = fields.shape
    assert rows % per_group == 0, f"{rows} fields do not fill whole words of {word_bits} bits"
    words_per_group = per_group * bits // word_bits
    grouped = fields.reshape(rows // per_group, per_group, cols)
    out = np.zeros((rows // per_group, words_per_group, cols), dtype=dtype)
    for i in range(per_group):
        value = grouped[:, i, :].astype(dtype, copy=False)
        word, shift = divmod(i * bits, word_bits)
        # Left shifts in the word dtype drop the bits that belong to the next word.
        out[:, word, :] |= value << dtype(shift)
        if shift + bits > word_bits:
            out[:, word + 1, :] |= value >> dtype(word_bits - shift)
    return out.reshape(-1, cols)


def unpack_bits(words: np.ndarray, bits: int, word_bits: int = 32) -> np.ndarray:
    """Inverse of `pack_bits`: [W, N] words -> [W*word_bits/bits, N] fields, uint8 for fields
    of up to 8 bits (element codes), else the smallest unsigned type that holds them (wide
    N:M metadata fields such as 3:8's 9 bits)."""
    assert bits <= word_bits, f"{bits}-bit fields do not fit {word_bits}-bit words"
    dtype = WORD_DTYPES[word_bits]
    field_dtype = next(WORD_DTYPES[w] for w in sorted(WORD_DTYPES) if bits <= w)
    per_group = fields_per_group(bits, word_bits)
    words_per_group = per_group * bits // word_bits
    rows, cols = words.shape
    grouped = words.reshape(rows // words_per_group, words_per_group, cols)
    mask = dtype((1 << bits) - 1)
    out = np.empty((rows // words_per_group, per_group, cols), dtype=field_dtype)
    for i in range(per_group):
        word, shift = divmod(i * bits, word_bits)
        value = grouped[:, word, :] >> dtype(shift)
        if shift + bits > word_bits:
            value = value | (grouped[:, word + 1, :] << dtype(word_bits - shift))
        out[:, i, :] = value & mask
    return out.reshape(-1, cols)
