"""Pins the format errata of shared/SEEDS.md (numbers 1-3: the ones about the weight format).

Each test's docstring names the erratum it pins.
"""
from __future__ import annotations

import numpy as np
import pytest

import marlin_dsl as m
from marlin_dsl.formats.builtin import E2M1, builtin_format

E2M1_TABLE = E2M1.table()


def _code(value: float) -> int:
    """The E2M1 code of an exactly representable value (+0 for zero)."""
    return int(np.flatnonzero(E2M1_TABLE == value)[0])


def _fp4_2of4_with_block(block: list[float], n: int = 3, seed: int = 0) -> m.QuantizedWeights:
    """K=32 fp4_2of4 weight (group 32, scale 1) whose column 0 starts with `block`."""
    rng = np.random.default_rng(seed)
    w = rng.choice(np.array([0.5, 1.0, -1.5, 2.0, -3.0]), size=(32, n))
    w[:4, 0] = block
    w[31, :] = 6.0  # max |w| of every column's group is 6: scale 1, all values exact
    q = m.quantize(builtin_format("fp4_2of4", 32), w)
    np.testing.assert_array_equal(q.scales, 1.0)
    np.testing.assert_array_equal(E2M1_TABLE[q.codes], w)
    return q


# ----- erratum 1 --------------------------------------------------------------------------


def test_erratum1_block1_val1_from_dense_4_to_7():
    """Erratum 1 (seed 000 section 3.1): block1_val1 comes from dense[k*16+4..7], not
    dense[k*16+8..11]: bits [15:12] of a values word hold the second kept value of block 1."""
    rng = np.random.default_rng(101)
    k, n = 64, 4
    w = np.zeros((k, n))
    # Block b of each 16-wide segment holds values only from its own distinct set, so the
    # block a nibble came from is recognisable: block 0 -> 0.5/1, block 1 -> 1.5/2, ...
    sets = np.array([[0.5, 1.0], [1.5, 2.0], [3.0, 4.0], [-0.5, -6.0]])
    for b in range(k // 4):
        block = np.repeat(np.array([*sets[b % 4], 0.0, 0.0])[:, None], n, axis=1)
        w[4 * b:4 * b + 4, :] = rng.permuted(block, axis=0)  # own arrangement per column
    # Block 3 of each segment holds -6: the group max |w| is 6, scale 1, all values exact.
    packed = m.pack(builtin_format("fp4_2of4", "K"), w)
    words = packed["qweight"]  # [K/16, N]
    for j in range(k // 16):
        for col in range(n):
            word = int(words[j, col])
            nib = [(word >> (4 * i)) & 0xF for i in range(8)]
            dense = w[16 * j:16 * j + 16, col]
            for b in range(4):
                nonzero = dense[4 * b:4 * b + 4][dense[4 * b:4 * b + 4] != 0]
                assert E2M1_TABLE[nib[2 * b]] == nonzero[0]
                assert E2M1_TABLE[nib[2 * b + 1]] == nonzero[1]
            # The named field: block1_val1 at bits [15:12], from dense 4..7 and not 8..11.
            block1_val1 = E2M1_TABLE[(word >> 12) & 0xF]
            assert block1_val1 in dense[4:8][dense[4:8] != 0]
            assert block1_val1 not in dense[8:12]


def test_erratum1_block_b_at_bits_8b_and_8b_plus_4():
    """Erratum 1: the consistent definition is section 8.2's: block b of a values word sits at
    bits 8*(b%4) and 8*(b%4)+4. Here block 1 of column 0 is [0, x, 0, y]: bits [11:8] = x,
    bits [15:12] = y."""
    q = _fp4_2of4_with_block([4.0, 1.5, -2.0, 0.5])
    q.codes[4:8, 0] = [0, _code(3.0), 0, _code(-4.0)]
    packed = m.pack_codes(m.prune(q))
    word = int(packed["qweight"][0, 0])
    assert (word >> 8) & 0xF == _code(3.0)
    assert (word >> 12) & 0xF == _code(-4.0)
    assert (word >> 0) & 0xF == _code(4.0) and (word >> 4) & 0xF == _code(-2.0)
    assert (int(packed["meta"][0, 0]) >> 4) & 0xF == (3 << 2) | 1


# ----- erratum 2 --------------------------------------------------------------------------


@pytest.mark.parametrize("k, n", [(32, 2), (64, 6), (256, 16), (4096, 64)])
def test_erratum2_metadata_is_k32_by_n(k, n):
    """Erratum 2 (seed 000 section 3.2): metadata is [K/32, N], which is not the same layout as
    [K/16, N/2] (same size, different addressing); section 6's address computation is the
    definition: values word k_iter pairs with metadata word k_iter // 2 of the same column,
    nibbles 4*(k_iter % 2) .. 4*(k_iter % 2)+3."""
    for name in ("fp4_2of4", "int4_2of4"):
        spec = {b.name: b for b in builtin_format(name, 32).buffers(k, n)}["meta"]
        assert spec.shape == (k // 32, n)
        assert spec.shape != (k // 16, n // 2)
        assert spec.dtype == np.uint32
    rng = np.random.default_rng(k + n)
    q = m.prune(m.quantize(builtin_format("fp4_2of4", 32), rng.normal(size=(k, n))))
    packed = m.pack_codes(q)
    meta, values = packed["meta"], packed["qweight"]
    assert values.shape == (k // 16, n)
    keep = q.keep.reshape(k // 16, 4, 4, n)  # [k_iter, block, position, col]
    for k_iter in range(k // 16):
        meta_word = meta[k_iter // 2, :].astype(np.int64)
        offset = (k_iter % 2) * 4
        for b in range(4):
            nibble = (meta_word >> (4 * (offset + b))) & 0xF
            pos0, pos1 = nibble & 3, nibble >> 2
            cols = np.arange(n)
            assert keep[k_iter, b, pos0, cols].all() and keep[k_iter, b, pos1, cols].all()
            assert (pos0 < pos1).all()


def test_erratum2_n_odd_has_no_n_half_layout():
    """Erratum 2: an [K/16, N/2] metadata array cannot even exist for odd N; [K/32, N] does."""
    spec = {b.name: b for b in builtin_format("fp4_2of4", 32).buffers(64, 7)}["meta"]
    assert spec.shape == (2, 7)
    assert spec.nbytes * 8 == 64 * 7  # one metadata bit per weight, as [K/32, N] u32


# ----- erratum 3 --------------------------------------------------------------------------


def _kept(block: list[float], seed: int = 0) -> list[int]:
    q = m.prune(_fp4_2of4_with_block(block, seed=seed))
    return [int(i) for i in np.flatnonzero(q.keep[:4, 0])]


def test_erratum3_negative_values_ranked_by_decoded_magnitude():
    """Erratum 3 (seed 000 section 8.2): prune ranks by the decoded magnitude, not by |code|.
    [-6, 0.5, 1, -0.5] keeps -6 and 1; ranking sign-magnitude codes would keep both negatives."""
    block = [-6.0, 0.5, 1.0, -0.5]
    codes = np.array([_code(v) for v in block])
    np.testing.assert_array_equal(codes, [15, 1, 2, 9])
    seed_choice = sorted(int(i) for i in np.argsort(np.abs(codes))[-2:])
    assert seed_choice == [0, 3]  # the seed's code ranking: -6 and -0.5
    assert _kept(block) == [0, 2]  # the library: -6 and 1
    q = m.prune(_fp4_2of4_with_block(block))
    np.testing.assert_array_equal(m.dequantize(q)[:4, 0], [-6.0, 0.0, 1.0, 0.0])


def test_erratum3_negative_beats_smaller_positive():
    """Erratum 3: with codes, every negative outranks every positive; by value, -0.5 loses to
    4 and 3 (the two largest magnitudes win whatever their sign)."""
    block = [-0.5, 4.0, -1.0, 3.0]
    codes = np.array([_code(v) for v in block])
    assert sorted(int(i) for i in np.argsort(np.abs(codes))[-2:]) == [0, 2]
    assert _kept(block) == [1, 3]


def test_erratum3_ties_keep_lower_index_four_equal():
    """Erratum 3: ties go to the lower index. Four equal magnitudes keep positions 0 and 1;
    np.argsort(...)[-2:] takes the last two of the ascending order, i.e. the higher indices."""
    for value in (1.0, -1.0, 6.0):
        block = [value] * 4
        assert _kept(block) == [0, 1], value
        magnitudes = np.abs(np.array(block))
        assert sorted(int(i) for i in np.argsort(magnitudes)[-2:]) == [2, 3]


def test_erratum3_ties_mixed_sign():
    """Erratum 3: [1, -1, 1, 0] has three equal magnitudes and keeps positions 0 and 1. The
    seed's code ranking keeps 1 and 2 (code 10 for -1 outranks code 2 for 1, and of the tied
    1s the last in ascending order wins); even argsort on the decoded magnitudes keeps 1 and 2
    (taking the last two prefers the higher index on ties)."""
    block = [1.0, -1.0, 1.0, 0.0]
    codes = np.array([_code(v) for v in block])
    np.testing.assert_array_equal(codes, [2, 10, 2, 0])
    assert _kept(block) == [0, 1]
    assert sorted(int(i) for i in np.argsort(np.abs(codes))[-2:]) == [1, 2]
    magnitudes = np.abs(np.array(block))
    assert sorted(int(i) for i in np.argsort(magnitudes)[-2:]) == [1, 2]


def test_erratum3_vectorised_against_stable_ranking():
    """Erratum 3 over many random blocks (values drawn from a small set, so ties are common):
    the library keeps exactly the two positions a stable descending sort of |decoded value|
    gives; a code-magnitude ranking disagrees on a large share of blocks."""
    rng = np.random.default_rng(303)
    k, n = 256, 64
    w = rng.choice(np.array([0.0, 0.5, -0.5, 1.0, -1.0, 3.0, -3.0]), size=(k, n))
    w[0, :] = 6.0  # scale 1 everywhere (group 'K')
    q = m.quantize(builtin_format("fp4_2of4", "K"), w)
    pruned = m.prune(q)
    mag = np.abs(w).reshape(k // 4, 4, n)
    order = np.argsort(-mag, axis=1, kind="stable")[:, :2, :]
    expected = np.zeros_like(mag, dtype=bool)
    np.put_along_axis(expected, order, True, axis=1)
    np.testing.assert_array_equal(pruned.keep, expected.reshape(k, n))
    code_mag = q.codes.reshape(k // 4, 4, n).astype(np.int64)
    code_order = np.argsort(code_mag, axis=1)[:, -2:, :]
    by_code = np.zeros_like(expected)
    np.put_along_axis(by_code, code_order, True, axis=1)
    differs = (by_code != expected).any(axis=1).mean()
    assert differs > 0.3, differs  # about 0.6 for this seed
