"""Formats that are not built in, declared in spec files under examples/, run through the
whole pipeline: quantize -> prune -> pack_codes -> validate -> unpack -> dequantize ->
reference_matmul, checked against decoders written here by hand from each file's docstring.
"""
from __future__ import annotations

import ast
import runpy
from pathlib import Path

import numpy as np
import pytest

import marlin_dsl as m

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
INT3_FILE = EXAMPLES / "int3_zero_point.py"
PAIRWISE_FILE = EXAMPLES / "nf4_pairwise_4of8.py"


def load_formats(path: Path) -> list[m.Format]:
    namespace = runpy.run_path(str(path))
    return [v for v in namespace.values() if isinstance(v, m.Format)]


def load_format(path: Path) -> m.Format:
    formats = load_formats(path)
    assert len(formats) == 1, [f.name for f in formats]
    return formats[0]


def random_weights(seed: int, k: int, n: int) -> np.ndarray:
    """Normal weights, random scale, some exact zeros and outliers; never all zeros."""
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.uniform(-3, 2)
    w = rng.normal(size=(k, n)) * scale
    w[rng.random((k, n)) < 0.1] = 0.0
    outliers = rng.random((k, n)) < 0.01
    w[outliers] *= rng.uniform(5, 30, size=int(outliers.sum()))
    if not w.any():
        w[0, 0] = scale
    return w


def bit_stream_words(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes [L, N] -> uint32 words by hand: code i of a column at stream bits [i*bits,
    (i+1)*bits), LSB first; word w holds stream bits [32w, 32w+32)."""
    rows, cols = codes.shape
    stream = (codes[:, None, :].astype(np.uint64) >> np.arange(bits, dtype=np.uint64)[None, :, None]) & 1
    stream = stream.reshape(rows * bits // 32, 32, cols)
    return (stream << np.arange(32, dtype=np.uint64)[None, :, None]).sum(axis=1).astype(np.uint32)


# ----- the spec files themselves ----------------------------------------------------------


@pytest.mark.parametrize("path, name", [(INT3_FILE, "int3_zp"), (PAIRWISE_FILE, "nf4_pairwise_4of8")])
def test_spec_file_declares_one_new_format(path, name):
    """Each spec file has a docstring, imports only from marlin_dsl (never the built-ins) and
    declares at module level one Format that is not built in, located in that file."""
    tree = ast.parse(path.read_text())
    assert ast.get_docstring(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.module == "marlin_dsl", node.module
        elif isinstance(node, ast.Import):
            pytest.fail(f"{path.name} imports {[a.name for a in node.names]}")
    fmt = load_format(path)
    assert fmt.name == name and name not in m.BUILTIN_FORMATS
    assert not any(fmt == factory() for factory in m.BUILTIN_FORMATS.values())
    assert fmt.location is not None and Path(fmt.location.file).resolve() == path


def test_int3_declaration():
    """INT3 codes 0..7, u8 zero points, group 32; 32 codes fill exactly 3 uint32 words."""
    fmt = load_format(INT3_FILE)
    np.testing.assert_array_equal(fmt.element.table(), np.arange(8))
    assert fmt.element.is_integer_grid and fmt.zero_point.dtype == "u8"
    assert fmt.scale.group_size == 32 and fmt.sparsity is None
    assert fmt.values_per_word_group == 32 and fmt.k_granule == 32
    specs = {b.name: b for b in fmt.buffers(128, 5)}
    assert specs["qweight"].shape == (12, 5)  # 3 words per 32 codes
    assert specs["scales"].shape == specs["zeros"].shape == (4, 5)
    assert specs["zeros"].dtype == np.uint8
    assert fmt.bits_per_weight(128, 5, include_scales=False) == 3.0


def test_pairwise_declaration():
    """NF4-like table, 2 of 4 two-wide chunks (4 of 8 values), the six 2:4 nibbles."""
    fmt = load_format(PAIRWISE_FILE)
    sp = fmt.sparsity
    assert (sp.n, sp.m, sp.chunk, sp.block_k, sp.kept_per_block) == (2, 4, 2, 8, 4)
    np.testing.assert_array_equal(sp.valid_fields, [4, 8, 9, 12, 13, 14])
    table = fmt.element.table()
    assert table.shape == (16,) and (np.diff(table) > 0).all()
    assert table[0] == -1.0 and table[-1] == 1.0 and 0.0 in table
    assert fmt.k_granule == 64  # one metadata word = 8 blocks of 8
    specs = {b.name: b for b in fmt.buffers(256, 3)}
    assert specs["qweight"].shape == (256 // 16, 3) and specs["meta"].shape == (256 // 64, 3)


# ----- INT3: bit stream -------------------------------------------------------------------


def test_int3_fields_straddle_words():
    """Codes 10 and 21 of each 32 straddle words: code 10 = stream bits 30..32 (word 0 bits
    [31:30], word 1 bit 0), code 21 = stream bits 63..65 (word 1 bit 31, word 2 bits [1:0])."""
    fmt = load_format(INT3_FILE)
    codes = np.zeros((64, 2), dtype=np.uint8)
    codes[10, 0] = 0b101
    codes[21, 0] = 0b011
    codes[32 + 10, 1] = 0b110
    codes[32 + 21, 1] = 0b100
    q = m.QuantizedWeights(fmt, codes, np.ones((2, 2), np.float16), np.zeros((2, 2), np.uint8))
    words = m.pack_codes(q)["qweight"]
    assert words.shape == (6, 2)
    np.testing.assert_array_equal(words[:, 0], [1 << 30, (1 << 31) | 1, 0b01, 0, 0, 0])
    np.testing.assert_array_equal(words[:, 1], [0, 0, 0, 1 << 31, 1 << 0, 0b10])
    np.testing.assert_array_equal(m.unpack(m.pack_codes(q)).codes, codes)


@pytest.mark.parametrize("seed", range(5))
def test_int3_packing_matches_hand_built_stream(seed):
    """Packed INT3 words equal the hand-built 3-bit stream, for random codes of every value."""
    fmt = load_format(INT3_FILE)
    rng = np.random.default_rng(100 + seed)
    k, n = 32 * int(rng.integers(1, 20)), int(rng.integers(1, 50))
    codes = rng.integers(0, 8, size=(k, n), dtype=np.uint8)
    zeros = rng.integers(0, 8, size=(k // 32, n), dtype=np.uint8)
    scales = rng.uniform(0.01, 2, size=(k // 32, n)).astype(np.float16)
    packed = m.pack_codes(m.QuantizedWeights(fmt, codes, scales, zeros))
    assert packed["qweight"].shape == (3 * k // 32, n)
    np.testing.assert_array_equal(packed["qweight"], bit_stream_words(codes, 3))


# ----- 4:8 pair-wise: hand decoder --------------------------------------------------------


def decode_pairwise(packed: m.PackedWeights, table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values [K, N] float64, keep [K, N]) from the packed arrays, by the docstring: block b
    (8 K positions) keeps 4 codes at stream positions 4b..4b+3 of the 4-bit stream, and its
    metadata nibble is nibble b % 8 of meta word b // 8: pos0 = nib & 3, pos1 = nib >> 2 are
    the kept pairs (K 8b+2p, 8b+2p+1)."""
    k, n = packed.shape
    blocks = k // 8
    shifts = (4 * np.arange(8, dtype=np.uint32))[None, :, None]
    stored = ((packed["qweight"][:, None, :] >> shifts) & 0xF).reshape(blocks, 2, 2, n)
    nib = ((packed["meta"][:, None, :] >> shifts) & 0xF).reshape(blocks, n).astype(np.int64)
    pos = np.stack([nib & 3, nib >> 2], axis=1)  # [B, 2, N]
    codes = np.zeros((blocks, 4, 2, n), dtype=np.int64)
    np.put_along_axis(codes, pos[:, :, None, :], stored.astype(np.int64), axis=1)
    kept = np.zeros((blocks, 4, n), dtype=bool)
    np.put_along_axis(kept, pos, True, axis=1)
    keep = np.repeat(kept, 2, axis=1).reshape(k, n)
    scales = np.repeat(packed["scales"].astype(np.float64), 64, axis=0)
    values = np.where(keep, table[codes.reshape(k, n)] * scales, 0.0)
    return values, keep


# ----- the full pipeline ------------------------------------------------------------------

SHAPES = [(64, 1), (128, 17), (640, 33), (4096, 5), (64, 300)]


@pytest.mark.parametrize("k, n", SHAPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_int3_pipeline(k, n, seed):
    """INT3 with zero points: every stage, with a hand decoder for the packed arrays."""
    fmt = load_format(INT3_FILE)
    w = random_weights(1000 * seed + k + n, k, n)
    q = m.quantize(fmt, w)
    assert m.prune(q) is q or np.array_equal(m.prune(q).codes, q.codes)
    assert q.codes.max() <= 7 and q.zeros.dtype == np.uint8 and q.zeros.max() <= 7
    packed = m.pack_codes(m.prune(q))
    m.validate(packed)
    u = m.unpack(packed)
    np.testing.assert_array_equal(u.codes, q.codes)
    np.testing.assert_array_equal(u.scales, q.scales)
    np.testing.assert_array_equal(u.zeros, q.zeros)
    # Hand decoder: 3-bit stream -> codes; value = (code - zero) * scale of group k // 32.
    np.testing.assert_array_equal(packed["qweight"], bit_stream_words(q.codes, 3))
    s = np.repeat(packed["scales"].astype(np.float64), 32, axis=0)
    z = np.repeat(packed["zeros"].astype(np.float64), 32, axis=0)
    by_hand = (q.codes - z) * s
    deq = m.dequantize(packed)
    np.testing.assert_array_equal(deq, by_hand)
    # Half a quantisation step, and zero stays exactly zero (the affine range contains 0).
    assert (np.abs(deq - w) <= s / 2 * (1 + 1e-12)).all()
    assert (deq[w == 0] == 0).all()
    x = np.random.default_rng(seed).normal(size=(7, k))
    np.testing.assert_allclose(m.reference_matmul(x, packed), x @ by_hand,
                               rtol=1e-12, atol=1e-12 * float((np.abs(x) @ np.abs(by_hand)).max()))


@pytest.mark.parametrize("k, n", SHAPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_pairwise_pipeline(k, n, seed):
    """NF4-like 4:8 pair-wise: every stage, with a hand decoder for the packed arrays."""
    fmt = load_format(PAIRWISE_FILE)
    table = fmt.element.table()
    w = random_weights(2000 * seed + k + n, k, n)
    q = m.quantize(fmt, w)
    s = np.repeat(q.scales.astype(np.float64), 64, axis=0)
    # Quantisation: each value is the nearest table value times the group scale.
    err = np.abs(m.dequantize(q) - w)
    best = np.abs(table[None, None, :] * s[:, :, None] - w[:, :, None]).min(axis=2)
    assert (err <= best + 1e-12 * (np.abs(w) + s)).all()
    p = m.prune(q)
    # Pairs: positions 2i and 2i+1 are kept or dropped together; 2 pairs kept per 8.
    pairs = p.keep.reshape(k // 2, 2, n)
    assert (pairs[:, 0, :] == pairs[:, 1, :]).all()
    assert (p.keep.reshape(k // 8, 8, n).sum(axis=1) == 4).all()
    assert (pairs[:, 0, :].reshape(k // 8, 4, n).sum(axis=1) == 2).all()
    # The kept pairs have the largest |a| + |b| (ties to the lower pair).
    pair_mag = np.abs(m.dequantize(q)).reshape(k // 8, 4, 2, n).sum(axis=2)
    order = np.argsort(-pair_mag, axis=1, kind="stable")[:, :2, :]
    expected = np.zeros((k // 8, 4, n), dtype=bool)
    np.put_along_axis(expected, order, True, axis=1)
    np.testing.assert_array_equal(pairs[:, 0, :].reshape(k // 8, 4, n), expected)
    np.testing.assert_array_equal(m.prune(p).keep, p.keep)
    packed = m.pack_codes(p)
    m.validate(packed)
    nibbles = (packed["meta"][:, None, :] >> (4 * np.arange(8, dtype=np.uint32))[None, :, None]) & 0xF
    assert np.isin(nibbles, [4, 8, 9, 12, 13, 14]).all()
    u = m.unpack(packed)
    np.testing.assert_array_equal(u.codes, p.codes)
    np.testing.assert_array_equal(u.keep, p.keep)
    np.testing.assert_array_equal(u.scales, p.scales)
    by_hand, keep = decode_pairwise(packed, table)
    np.testing.assert_array_equal(keep, p.keep)
    deq = m.dequantize(packed)
    np.testing.assert_array_equal(deq, by_hand)
    np.testing.assert_array_equal(deq, np.where(p.keep, m.dequantize(q), 0.0))
    x = np.random.default_rng(seed).normal(size=(5, k))
    np.testing.assert_allclose(m.reference_matmul(x, packed), x @ by_hand,
                               rtol=1e-12, atol=1e-12 * float((np.abs(x) @ np.abs(by_hand)).max()))


def test_pairwise_invalid_nibble_rejected():
    """An invalid nibble in the 4:8 metadata (e.g. 0b0101: both pairs at position 1) is named."""
    fmt = load_format(PAIRWISE_FILE)
    packed = m.pack(fmt, random_weights(7, 128, 6))
    meta = packed["meta"].copy()
    meta[1, 4] = (meta[1, 4] & np.uint32(0xFFFFFF0F)) | np.uint32(0b0101 << 4)
    bad = m.PackedWeights(fmt, packed.shape, {**packed.arrays, "meta": meta})
    with pytest.raises(m.ValueRangeError, match=r"^meta\[1, 4\] field 1: invalid 2:4 metadata value 5"):
        m.unpack(bad)
