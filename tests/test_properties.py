"""Property tests (hypothesis) over every built-in format and group sizes 32/64/128/'K'.

Hypothesis draws the format, the shape and a numpy seed; the arrays come from
`np.random.default_rng(seed)`, so a failure shrinks to a small shape and a reproducible seed.
Shapes keep K*N bounded (large K with small N and the other way round) so that the whole file
runs in well under a minute on two cores.
"""
from __future__ import annotations

from math import lcm

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import marlin_dsl as m
from marlin_dsl.formats import pack_bits, unpack_bits
from marlin_dsl.formats.bitstream import fields_per_group

GROUP_SIZES = (32, 64, 128, "K")
MAX_ELEMENTS = 1 << 17  # K * N at most


def _valid_cases() -> list[tuple[str, object]]:
    cases = []
    for name, factory in m.BUILTIN_FORMATS.items():
        for g in GROUP_SIZES:
            try:
                factory(g)
            except m.FormatError:
                continue
            cases.append((name, g))
    return cases


FORMAT_CASES = _valid_cases()


def test_every_builtin_has_cases():
    """Every built-in format takes every group size here (their K granules divide 32)."""
    assert {name for name, _ in FORMAT_CASES} == set(m.BUILTIN_FORMATS)
    assert len(FORMAT_CASES) == len(m.BUILTIN_FORMATS) * len(GROUP_SIZES)


@st.composite
def format_shapes(draw, cases=tuple(FORMAT_CASES)):
    """(format, K, N, seed): K a multiple of the K granule and the group size, K <= 4096."""
    name, g = draw(st.sampled_from(cases))
    fmt = m.builtin_format(name, g)
    step = fmt.k_granule if g == "K" else lcm(fmt.k_granule, g)
    if draw(st.booleans()):  # long K, narrow N
        k = step * draw(st.integers(1, 4096 // step))
        n = draw(st.integers(1, max(1, min(512, MAX_ELEMENTS // k, 48))))
    else:  # short K, wide N
        k = step * draw(st.integers(1, max(1, 256 // step)))
        n = draw(st.integers(1, min(512, MAX_ELEMENTS // k)))
    seed = draw(st.integers(0, 2**32 - 1))
    return fmt, k, n, seed


def random_weights(rng: np.random.Generator, k: int, n: int) -> np.ndarray:
    """Normal weights with a random scale, some exact zeros (scattered and whole K rows, the
    clustered kind block patterns can skip), some outliers; never all zeros."""
    scale = 10.0 ** rng.uniform(-3, 2)
    w = rng.normal(size=(k, n)) * scale
    w[rng.random((k, n)) < rng.choice([0.0, 0.05, 0.3, 0.8])] = 0.0
    if rng.random() < 0.5:
        w[rng.random(k) < rng.uniform(0.1, 0.9), :] = 0.0
    outliers = rng.random((k, n)) < rng.choice([0.0, 1e-3, 1e-2])
    w[outliers] *= rng.uniform(10, 50, size=int(outliers.sum())) * rng.choice([-1, 1])
    if not w.any():
        w[rng.integers(k), rng.integers(n)] = scale * rng.choice([-1.0, 1.0])
    return w


def expand_groups(per_group: np.ndarray, k: int) -> np.ndarray:
    """[K/G, N] -> [K, N]: the value of each element's group."""
    return np.repeat(per_group, k // per_group.shape[0], axis=0)


PROPERTY = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ----- quantisation error -----------------------------------------------------------------


@PROPERTY
@given(format_shapes())
def test_dequantize_quantize_within_half_step(case):
    """dequantize(quantize(w)) is within half a quantisation step of w, elementwise.

    Integer-grid encodings: |err| <= scale/2 of the element's group. Float and table
    encodings: the result is the nearest representable value table*scale, i.e. |err| <=
    min_t |t*scale - w| (plus 1e-12 relative slack for the division by the scale)."""
    fmt, k, n, seed = case
    w = random_weights(np.random.default_rng(seed), k, n)
    q = m.quantize(fmt, w)
    assert q.codes.shape == (k, n) and q.codes.dtype == np.uint8
    assert q.scales.shape == (fmt.scale.groups(k), n) and q.scales.dtype == np.float16
    assert (q.scales > 0).all() and np.isfinite(q.scales).all()
    deq = m.dequantize(q)
    err = np.abs(deq - w)
    s = expand_groups(q.scales.astype(np.float64), k)
    table = fmt.element.table()
    slack = 1e-12 * (np.abs(w) + s * np.abs(table).max())
    if fmt.element.is_integer_grid:
        assert (err <= s / 2 + slack).all(), float((err - s / 2).max())
    else:
        best = np.abs(table[None, None, :] * s[:, :, None] - w[:, :, None]).min(axis=2)
        assert (err <= best + slack).all(), float((err - best).max())
    # Exact zeros stay exact zeros (every built-in can represent 0 exactly).
    assert (deq[w == 0] == 0).all()


@PROPERTY
@given(format_shapes())
def test_scales_are_tight(case):
    """The fp16 scale is the smallest one that maps the group into the table: rounding up to
    fp16 loses less than one fp16 ulp, so the group's extreme still needs a code near the
    table's end (the error bound above is not met by a uselessly large scale)."""
    fmt, k, n, seed = case
    w = random_weights(np.random.default_rng(seed), k, n)
    q = m.quantize(fmt, w)
    g = fmt.group_size_for(k)
    grouped = w.reshape(k // g, g, n)
    table = fmt.element.table()
    if fmt.zero_point is None:
        ideal = np.maximum(grouped.max(axis=1) / table.max(), grouped.min(axis=1) / table.min())
    else:
        ideal = ((np.maximum(grouped.max(axis=1), 0) - np.minimum(grouped.min(axis=1), 0))
                 / (table.max() - table.min()))
    s = q.scales.astype(np.float64)
    live = ideal > 0
    assert (s[live] >= ideal[live]).all()
    ulp = np.spacing(q.scales[live]).astype(np.float64)
    assert (s[live] - ideal[live] <= ulp).all()


# ----- prune ------------------------------------------------------------------------------

NM_CASES = tuple(c for c in FORMAT_CASES
                 if isinstance(m.builtin_format(*c).sparsity, m.NMSparsity))


@PROPERTY
@given(format_shapes(NM_CASES))
def test_prune_keeps_n_largest_of_m(case):
    """prune keeps exactly n of every m chunks, the ones with the largest decoded magnitude
    (ties to the lower index), zeroes the codes it drops and leaves kept codes alone."""
    fmt, k, n, seed = case
    sp = fmt.sparsity
    q = m.quantize(fmt, random_weights(np.random.default_rng(seed), k, n))
    p = m.prune(q)
    blocks = k // sp.block_k
    keep = p.keep.reshape(blocks, sp.m, sp.chunk, n)
    assert (keep == keep[:, :, :1, :]).all()  # whole chunks
    kept = keep[:, :, 0, :]
    assert (kept.sum(axis=1) == sp.n).all()
    mag = np.abs(m.dequantize(q)).reshape(blocks, sp.m, sp.chunk, n).sum(axis=2)
    # Every kept chunk i outranks every dropped chunk j: larger, or equal and lower index.
    idx = np.arange(sp.m)
    mi, mj = mag[:, :, None, :], mag[:, None, :, :]
    outranks = (mi > mj) | ((mi == mj) & (idx[:, None] < idx[None, :])[None, :, :, None])
    pair = kept[:, :, None, :] & ~kept[:, None, :, :]
    assert (outranks | ~pair).all()
    np.testing.assert_array_equal(p.codes, np.where(p.keep, q.codes, 0))
    np.testing.assert_array_equal(m.dequantize(p), np.where(p.keep, m.dequantize(q), 0.0))


@PROPERTY
@given(format_shapes())
def test_prune_is_idempotent(case):
    """Pruning twice changes nothing; formats without N:M sparsity pass through unchanged."""
    fmt, k, n, seed = case
    q = m.quantize(fmt, random_weights(np.random.default_rng(seed), k, n))
    once = m.prune(q)
    twice = m.prune(once)
    np.testing.assert_array_equal(twice.codes, once.codes)
    if isinstance(fmt.sparsity, m.NMSparsity):
        np.testing.assert_array_equal(twice.keep, once.keep)
    else:
        assert once.keep is None and twice.keep is None
        np.testing.assert_array_equal(once.codes, q.codes)


# ----- pack / unpack ----------------------------------------------------------------------


def _assert_same_logical(a: m.QuantizedWeights, b: m.QuantizedWeights) -> None:
    np.testing.assert_array_equal(a.codes, b.codes)
    assert a.codes.dtype == b.codes.dtype == np.uint8
    np.testing.assert_array_equal(a.scales, b.scales)
    assert a.scales.dtype == b.scales.dtype
    if a.zeros is None:
        assert b.zeros is None
    else:
        np.testing.assert_array_equal(a.zeros, b.zeros)
        assert a.zeros.dtype == b.zeros.dtype
    if a.keep is None:
        assert b.keep is None
    else:
        np.testing.assert_array_equal(a.keep, b.keep)


@PROPERTY
@given(format_shapes())
def test_pack_unpack_round_trip(case):
    """unpack(pack_codes(q)) == q (codes, scales, zeros, keep); the arrays match
    Format.buffers; validate accepts them; dequantize agrees before and after packing."""
    fmt, k, n, seed = case
    q = m.prune(m.quantize(fmt, random_weights(np.random.default_rng(seed), k, n)))
    packed = m.pack_codes(q)
    specs = fmt.buffers(k, n)
    assert list(packed.arrays) == [s.name for s in specs]
    for spec in specs:
        assert packed[spec.name].shape == spec.shape and packed[spec.name].dtype == spec.dtype
    assert packed.nbytes == fmt.storage_bytes(k, n)
    m.validate(packed)
    _assert_same_logical(m.unpack(packed), q)
    np.testing.assert_array_equal(m.dequantize(packed), m.dequantize(q))


@PROPERTY
@given(format_shapes())
def test_pack_unpack_round_trip_arbitrary_codes(case):
    """The round trip holds for any codes, not only the ones quantize makes (all 2**bits codes
    including FP4's -0, random scales and zero points, random valid N:M keep masks)."""
    fmt, k, n, seed = case
    rng = np.random.default_rng(seed)
    groups = fmt.scale.groups(k)
    codes = rng.integers(0, 2**fmt.element.bits, size=(k, n), dtype=np.uint8)
    scales = (10.0 ** rng.uniform(-4, 4, size=(groups, n))).astype(np.float16)
    zeros = None
    if fmt.zero_point is not None:
        zeros = rng.integers(0, 2**fmt.element.bits, size=(groups, n)).astype(
            fmt.zero_point.numpy_dtype)
    keep = None
    sp = fmt.sparsity
    if isinstance(sp, m.NMSparsity):
        base = np.zeros((k // sp.block_k, sp.m, n), dtype=bool)
        base[:, :sp.n, :] = True
        chunks = rng.permuted(base, axis=1)
        keep = np.repeat(chunks, sp.chunk, axis=1).reshape(k, n)
        codes = np.where(keep, codes, 0).astype(np.uint8)
    q = m.QuantizedWeights(fmt, codes, scales, zeros, keep)
    _assert_same_logical(m.unpack(m.pack_codes(q)), q)


@PROPERTY
@given(format_shapes())
def test_pack_api_equals_pipeline(case):
    """marlin_dsl.pack(fmt, w) is quantize -> prune -> pack_codes, array for array."""
    fmt, k, n, seed = case
    w = random_weights(np.random.default_rng(seed), k, n)
    a = m.pack(fmt, w)
    b = m.pack_codes(m.prune(m.quantize(fmt, w)))
    assert a.arrays.keys() == b.arrays.keys()
    for name in a.arrays:
        np.testing.assert_array_equal(a[name], b[name])


# ----- block patterns ---------------------------------------------------------------------

BP_CASES = tuple(c for c in FORMAT_CASES
                 if isinstance(m.builtin_format(*c).sparsity, m.BlockPatternSparsity))


@PROPERTY
@given(format_shapes(BP_CASES))
def test_block_patterns_cover_every_nonzero_exactly(case):
    """Bit j of patterns[kb, nb] is set iff some column of block nb is non-zero at K position
    kb*block_k + j: every non-zero is covered, and no bit is set for an empty K position."""
    fmt, k, n, seed = case
    sp = fmt.sparsity
    packed = m.pack(fmt, random_weights(np.random.default_rng(seed), k, n))
    patterns = packed["patterns"]
    nb = -(-n // sp.block_n)
    assert patterns.shape == (k // sp.block_k, nb) and patterns.dtype == np.uint8
    nonzero = m.dequantize(packed) != 0
    ks, cols = np.nonzero(nonzero)
    bits = (patterns[ks // sp.block_k, cols // sp.block_n] >> (ks % sp.block_k)) & 1
    assert (bits == 1).all()  # covers
    # Exact: the expected OR over each block's columns, via a padded reshape.
    padded = np.zeros((k, nb * sp.block_n), dtype=bool)
    padded[:, :n] = nonzero
    any_col = padded.reshape(k, nb, sp.block_n).any(axis=2)  # [K, nb]
    set_bits = ((patterns[np.arange(k) // sp.block_k, :] >> (np.arange(k) % sp.block_k)[:, None])
                & 1).astype(bool)
    np.testing.assert_array_equal(set_bits, any_col)


# ----- bit streams ------------------------------------------------------------------------


def reference_pack(fields: np.ndarray, bits: int, word_bits: int) -> np.ndarray:
    """The bit stream by hand: field i of a column at stream bits [i*bits, (i+1)*bits), word w
    = stream bits [w*word_bits, (w+1)*word_bits), LSB first."""
    rows, cols = fields.shape
    stream = (fields[:, None, :].astype(np.uint64) >> np.arange(bits, dtype=np.uint64)[None, :, None]) & 1
    stream = stream.reshape(rows * bits // word_bits, word_bits, cols)
    weights = np.uint64(1) << np.arange(word_bits, dtype=np.uint64)
    return (stream * weights[None, :, None]).sum(axis=1).astype(np.dtype(f"uint{word_bits}"))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 8), st.sampled_from([8, 16, 32]), st.integers(1, 6), st.integers(1, 40),
       st.integers(0, 2**32 - 1))
def test_pack_bits_round_trip(bits, word_bits, groups, cols, seed):
    """pack_bits/unpack_bits round trip for bit widths 1..8 and word widths 8/16/32, and
    pack_bits equals the hand-built LSB-first bit stream (fields may straddle words)."""
    rng = np.random.default_rng(seed)
    rows = fields_per_group(bits, word_bits) * groups
    fields = rng.integers(0, 2**bits, size=(rows, cols), dtype=np.uint8)
    words = pack_bits(fields, bits, word_bits)
    assert words.shape == (rows * bits // word_bits, cols)
    assert words.dtype == np.dtype(f"uint{word_bits}")
    np.testing.assert_array_equal(words, reference_pack(fields, bits, word_bits))
    back = unpack_bits(words, bits, word_bits)
    assert back.dtype == np.uint8
    np.testing.assert_array_equal(back, fields)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([16, 32]), st.data())
def test_pack_bits_round_trip_wide_fields(word_bits, data):
    """Fields wider than a byte (N:M metadata such as 3:8's 9 bits or 4:8's 12) round trip
    too, unpacked into a dtype wide enough to hold them."""
    bits = data.draw(st.integers(9, word_bits))
    groups, cols = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 20))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    rows = fields_per_group(bits, word_bits) * groups
    fields = rng.integers(0, 2**bits, size=(rows, cols), dtype=np.uint64)
    fields[0, 0] = 2**bits - 1  # the top bit is used
    words = pack_bits(fields, bits, word_bits)
    np.testing.assert_array_equal(words, reference_pack(fields, bits, word_bits))
    back = unpack_bits(words, bits, word_bits)
    assert np.iinfo(back.dtype).bits >= bits
    np.testing.assert_array_equal(back, fields)


# N:M sparsities beyond the built-ins: wide metadata fields (3:8 = 9 bits, 4:8 = 12 bits,
# 5:32 = 25 bits), m not a power of two (1:3, 2:6), chunks, and 8/16-bit packing words.
NM_VARIANTS = [(1, 2, 1, 32), (1, 3, 1, 8), (2, 6, 1, 16), (3, 8, 1, 32), (4, 8, 1, 16),
               (4, 8, 2, 32), (2, 16, 1, 8), (5, 32, 1, 32), (2, 4, 4, 8), (3, 4, 1, 32)]


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(NM_VARIANTS), st.integers(1, 3), st.integers(1, 40),
       st.integers(0, 2**32 - 1))
def test_nm_variants_round_trip(variant, blocks_of_granule, n, seed):
    """Any declarable N:M sparsity packs and unpacks losslessly (keep mask and codes), its
    metadata validates, and prune keeps whole chunks, n of every m."""
    sn, sm, chunk, word_bits = variant
    fmt = m.Format("nm", m.FloatEncoding(4), m.GroupScale("K"),
                   sparsity=m.NMSparsity(sn, sm, chunk=chunk), packing=m.Packing(word_bits))
    sp = fmt.sparsity
    k = fmt.k_granule * blocks_of_granule
    rng = np.random.default_rng(seed)
    q = m.prune(m.quantize(fmt, random_weights(rng, k, n)))
    kept = q.keep.reshape(k // sp.block_k, sp.m, sp.chunk, n)
    assert (kept == kept[:, :, :1, :]).all() and (kept[:, :, 0, :].sum(axis=1) == sn).all()
    packed = m.pack_codes(q)
    assert packed["meta"].shape == (k // sp.block_k * sp.meta_bits // word_bits, n)
    m.validate(packed)
    _assert_same_logical(m.unpack(packed), q)


@pytest.mark.parametrize("bits, word_bits, per_group", [
    (1, 8, 8), (3, 8, 8), (3, 32, 32), (4, 32, 8), (5, 16, 16), (6, 32, 16), (7, 8, 8), (8, 32, 4),
])
def test_fields_per_group(bits, word_bits, per_group):
    """Fields that fill a whole number of words: lcm(bits, word_bits) / bits."""
    assert fields_per_group(bits, word_bits) == per_group
