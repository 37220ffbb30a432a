"""Bad input raises a ValueError subclass whose message names the argument and the offending
shape or index; bad format declarations raise FormatError located at the declaring line."""
from __future__ import annotations

import re

import numpy as np
import pytest

import marlin_dsl as m
from marlin_dsl.errors import MarlinDSLError
from marlin_dsl.formats.builtin import E2M1, builtin_format


def _weights(seed: int, k: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(k, n)) * 10 ** rng.uniform(-2, 2)


def _packed(name: str, k: int = 64, n: int = 40, group=32, seed: int = 0) -> m.PackedWeights:
    return m.pack(builtin_format(name, group), _weights(seed, k, n))


def _replace(packed: m.PackedWeights, **arrays) -> m.PackedWeights:
    new = dict(packed.arrays)
    for name, value in arrays.items():
        if value is None:
            del new[name]
        else:
            new[name] = value
    return m.PackedWeights(packed.format, packed.shape, new)


def test_error_hierarchy():
    """Every marlin-dsl error is a ValueError (callers can catch the usual exception)."""
    for cls in (m.FormatError, m.ShapeError, m.ValueRangeError, m.SpecError):
        assert issubclass(cls, MarlinDSLError) and issubclass(cls, ValueError)


# ----- shapes of float weights ------------------------------------------------------------


@pytest.mark.parametrize("name, k", [("fp4", 12), ("fp4", 4), ("fp4_2of4", 48),
                                     ("int4_2of4", 16), ("fp4_blockpattern", 20)])
def test_k_not_multiple_of_granule(name, k):
    """K must be a multiple of the format's K granule; the message names weights, K and the
    granule."""
    fmt = builtin_format(name, "K")
    with pytest.raises(m.ShapeError) as info:
        m.quantize(fmt, _weights(k, k, 5))
    msg = str(info.value)
    assert msg.startswith("weights:")
    assert f"K={k}" in msg and f"K granule {fmt.k_granule}" in msg


@pytest.mark.parametrize("name, group, k", [("fp4", 128, 64), ("nf4", 64, 96), ("uint4_zp", 32, 8),
                                            ("fp4_2of4", 128, 96)])
def test_group_size_not_dividing_k(name, group, k):
    """The group size must divide K; the message names weights, the group size and K."""
    with pytest.raises(m.ShapeError) as info:
        m.quantize(builtin_format(name, group), _weights(k, k, 3))
    msg = str(info.value)
    assert msg.startswith("weights:")
    assert f"group_size {group}" in msg and f"K={k}" in msg


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("index", [(0, 0), (5, 2), (63, 6)])
def test_non_finite_weights_name_the_index(bad, index):
    """NaN and Inf weights are rejected with the index of the first bad element."""
    w = _weights(1, 64, 7)
    w[index] = bad
    with pytest.raises(m.ValueRangeError) as info:
        m.quantize(builtin_format("fp4", 32), w)
    msg = str(info.value)
    assert msg.startswith("weights:") and f"index {index}" in msg
    assert str(bad) in msg or repr(float(bad)) in msg


def test_first_non_finite_is_reported():
    """With several bad elements the first in row-major order is the one named."""
    w = _weights(2, 32, 8)
    w[20, 1] = np.nan
    w[3, 7] = np.inf
    w[3, 5] = -np.inf
    with pytest.raises(m.ValueRangeError, match=re.escape("index (3, 5)")):
        m.quantize(builtin_format("int4", 32), w)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, bool, np.complex128, object])
def test_weights_wrong_dtype(dtype):
    """Weights must be floating point; the message names weights and the dtype."""
    w = np.ones((32, 4), dtype=dtype)
    with pytest.raises(m.ShapeError) as info:
        m.quantize(builtin_format("fp4", 32), w)
    msg = str(info.value)
    assert msg.startswith("weights:") and str(np.dtype(dtype)) in msg


@pytest.mark.parametrize("shape", [(32,), (), (32, 4, 1), (1, 32, 4)])
def test_weights_wrong_rank(shape):
    """Weights must be 2-D [K, N]; the message names weights, the rank and the shape."""
    with pytest.raises(m.ShapeError) as info:
        m.quantize(builtin_format("fp4", 32), np.ones(shape))
    msg = str(info.value)
    assert msg.startswith("weights:")
    assert f"rank {len(shape)}" in msg and str(shape) in msg


@pytest.mark.parametrize("shape", [(0, 4), (32, 0)])
def test_weights_empty(shape):
    """Empty weights are rejected with their shape."""
    with pytest.raises(m.ShapeError, match=r"weights: shape \[K=\d+, N=\d+\]"):
        m.quantize(builtin_format("fp4", "K"), np.ones(shape))


# ----- value ranges -----------------------------------------------------------------------


def test_negative_weights_without_negative_values_or_zero_point():
    """An encoding with no negative values and no zero point cannot take a negative weight:
    the message names the format and the index and value of the first negative weight."""
    fmt = m.Format("u4_nozp", m.IntEncoding(bits=4), m.GroupScale(32))
    w = np.abs(_weights(3, 64, 6))
    w[17, 4] = -0.25
    w[40, 1] = -3.0
    with pytest.raises(m.ValueRangeError) as info:
        m.quantize(fmt, w)
    msg = str(info.value)
    assert "u4_nozp" in msg and "weights(17, 4)" in msg and "-0.25" in msg
    m.quantize(fmt, np.abs(w))  # non-negative weights are fine
    # With a zero point the same weights are fine too.
    m.quantize(m.Format("u4_zp", m.IntEncoding(bits=4), m.GroupScale(32), m.ZeroPoint()), w)


def test_positive_weights_without_positive_values():
    """The mirror case: an encoding with no positive values rejects positive weights."""
    fmt = m.Format("nonpos", m.TableEncoding(bits=2, values=(-3.0, -2.0, -1.0, 0.0)),
                   m.GroupScale("K"))
    w = -np.abs(_weights(4, 16, 3))  # 2-bit codes: 16 a word, K granule 16
    w[2, 2] = 0.5
    with pytest.raises(m.ValueRangeError, match=re.escape("weights(2, 2)")):
        m.quantize(fmt, w)


def test_scale_beyond_fp16_names_group_and_column():
    """A group whose scale would overflow fp16 is named by group and column."""
    w = _weights(5, 64, 4)
    w[40, 3] = 1e6  # fp4's largest value is 6: scale 1.7e5 > 65504
    with pytest.raises(m.ValueRangeError, match="group 1 of column 3"):
        m.quantize(builtin_format("fp4", 32), w)


# ----- loaded (packed) arrays -------------------------------------------------------------


def test_invalid_metadata_nibble_names_meta_index():
    """An invalid 2:4 nibble in loaded metadata is named as meta[word, column] and field."""
    packed = _packed("fp4_2of4", k=128, n=9)
    meta = packed["meta"].copy()
    meta[2, 7] = (meta[2, 7] & np.uint32(0xFFFF0FFF)) | np.uint32(0x3 << 12)  # nibble 3
    bad = _replace(packed, meta=meta)
    for call in (m.validate, m.unpack, m.dequantize):
        with pytest.raises(m.ValueRangeError) as info:
            call(bad)
        msg = str(info.value)
        assert msg.startswith("meta[2, 7] field 3:") and "value 3" in msg


@pytest.mark.parametrize("name, array, dtype", [
    ("fp4", "qweight", np.int32), ("fp4", "scales", np.float32),
    ("uint4_zp", "zeros", np.float16), ("fp4_2of4", "meta", np.uint16),
    ("fp4_blockpattern", "patterns", np.int8),
])
def test_loaded_array_wrong_dtype(name, array, dtype):
    """A loaded array of the wrong dtype is named with both dtypes."""
    packed = _packed(name)
    expected = packed[array].dtype
    bad = _replace(packed, **{array: packed[array].astype(dtype)})
    with pytest.raises(m.ShapeError) as info:
        m.validate(bad)
    msg = str(info.value)
    assert msg.startswith(f"{array}:") and str(np.dtype(dtype)) in msg and str(expected) in msg


@pytest.mark.parametrize("array", ["qweight", "scales", "meta"])
def test_loaded_array_wrong_shape_and_rank(array):
    """A loaded array of the wrong shape or rank is named with the expected and actual shape."""
    packed = _packed("int4_2of4")
    good = packed[array]
    for bad_value in (good[:-1], good.reshape(-1), good[:, :, None], good.T.copy()):
        if bad_value.shape == good.shape:
            continue
        with pytest.raises(m.ShapeError) as info:
            m.validate(_replace(packed, **{array: bad_value}))
        msg = str(info.value)
        assert msg.startswith(f"{array}:")
        assert str(good.shape) in msg and str(bad_value.shape) in msg


def test_loaded_array_not_numpy():
    """A loaded array that is not a numpy array (a list) is named."""
    packed = _packed("fp4")
    with pytest.raises(m.ShapeError, match=r"^scales: expected a numpy array, got list"):
        m.validate(_replace(packed, scales=packed["scales"].tolist()))


@pytest.mark.parametrize("name, missing", [("fp4", "scales"), ("uint4_zp", "zeros"),
                                           ("fp4_2of4", "meta"), ("fp4_blockpattern", "patterns")])
def test_missing_array(name, missing):
    """A missing array: the message lists the expected and the given arrays."""
    packed = _packed(name)
    with pytest.raises(m.ShapeError) as info:
        m.validate(_replace(packed, **{missing: None}))
    msg = str(info.value)
    assert msg.startswith("arrays:") and repr(missing) in msg
    expected_part, given_part = msg.split("got")
    assert repr(missing) in expected_part and repr(missing) not in given_part


@pytest.mark.parametrize("name, extra", [("fp4", "zeros"), ("fp4", "meta"), ("int4_2of4", "bias")])
def test_extra_array(name, extra):
    """An unexpected array is named in the message."""
    packed = _packed(name)
    with pytest.raises(m.ShapeError) as info:
        m.validate(_replace(packed, **{extra: np.zeros((1, 1), dtype=np.uint8)}))
    msg = str(info.value)
    assert msg.startswith("arrays:")
    expected_part, given_part = msg.split("got")
    assert repr(extra) not in expected_part and repr(extra) in given_part


@pytest.mark.parametrize("shape", [(64,), (64, 40, 1), "64x40"])
def test_packed_shape_not_k_n(shape):
    """PackedWeights.shape must be (K, N)."""
    packed = _packed("fp4")
    bad = m.PackedWeights(packed.format, shape, packed.arrays)
    with pytest.raises(m.ShapeError, match=r"^shape: expected \(K, N\)"):
        m.validate(bad)


@pytest.mark.parametrize("array, index", [("scales", (1, 3)), ("zeros", (0, 39))])
def test_non_finite_loaded_scales_and_zeros(array, index):
    """Non-finite scales or (f16) zero points in loaded arrays are named with their index."""
    fmt = m.Format("u4_f16zp", m.IntEncoding(bits=4), m.GroupScale(32), m.ZeroPoint("f16"))
    packed = m.pack(fmt, _weights(6, 64, 40))
    values = packed[array].copy()
    values[index] = np.inf
    with pytest.raises(m.ValueRangeError) as info:
        m.validate(_replace(packed, **{array: values}))
    msg = str(info.value)
    assert msg.startswith(f"{array}[{index[0]}, {index[1]}]") and "not finite" in msg


def test_block_pattern_omitting_a_nonzero():
    """A loaded pattern that clears the bit of a K position holding a non-zero is named as
    patterns[kb, nb] with the missing bits."""
    rng = np.random.default_rng(7)
    k, n = 64, 70  # 3 column blocks of 32, the last one partial
    w = rng.normal(size=(k, n))
    w[rng.random(k) < 0.5, :] = 0.0
    w[19, 66] = 1.0  # K position 19 = block 2, bit 3; column 66 = column block 2
    packed = m.pack(builtin_format("fp4_blockpattern", 32), w)
    patterns = packed["patterns"].copy()
    assert patterns[2, 2] & (1 << 3)
    patterns[2, 2] &= np.uint8(~(1 << 3) & 0xFF)
    with pytest.raises(m.ValueRangeError) as info:
        m.validate(_replace(packed, patterns=patterns))
    msg = str(info.value)
    assert msg.startswith("patterns[2, 2]") and "0x08" in msg
    # Extra bits (a conservative pattern) are allowed: the kernel just does more work.
    superset = packed["patterns"] | np.uint8(0xFF)
    m.validate(_replace(packed, patterns=superset))


# ----- logical weights handed to pack_codes -----------------------------------------------


def test_pack_codes_nm_needs_prune():
    """Packing an N:M format without a keep mask says to prune first."""
    q = m.quantize(builtin_format("fp4_2of4", 32), _weights(8, 64, 4))
    with pytest.raises(m.ValueRangeError, match=r"prune\(\)"):
        m.pack_codes(q)


def test_pack_codes_code_too_wide():
    """A code that does not fit the encoding's bits is named with its index."""
    q = m.quantize(builtin_format("int4", 32), _weights(9, 64, 4))
    q.codes[33, 2] = 16
    with pytest.raises(m.ValueRangeError, match=re.escape("weights.codes(33, 2) = 16")):
        m.pack_codes(q)


def test_pack_codes_bad_keep_mask():
    """A keep mask that keeps the wrong number of chunks names the block and column."""
    q = m.prune(m.quantize(builtin_format("int4_2of4", 32), _weights(10, 64, 4)))
    keep = q.keep.copy()
    keep[8:12, 3] = True  # block 2 of column 3 keeps 4 of 4
    bad = m.QuantizedWeights(q.format, q.codes, q.scales, q.zeros, keep)
    with pytest.raises(m.ValueRangeError, match=r"weights.keep: block 2 of column 3"):
        m.pack_codes(bad)


def test_pack_codes_missing_zeros_and_wrong_scales():
    """Missing zero points and wrong-dtype scales are named."""
    q = m.quantize(builtin_format("uint4_zp", 32), _weights(11, 64, 4))
    with pytest.raises(m.ShapeError, match=r"^weights.zeros: .*needs zero points"):
        m.pack_codes(m.QuantizedWeights(q.format, q.codes, q.scales, None))
    with pytest.raises(m.ShapeError, match=r"^weights.scales: expected dtype float16, got float32"):
        m.pack_codes(m.QuantizedWeights(q.format, q.codes, q.scales.astype(np.float32), q.zeros))
    with pytest.raises(m.ShapeError, match=r"^weights.scales: expected shape \(2, 4\), got \(1, 4\)"):
        m.pack_codes(m.QuantizedWeights(q.format, q.codes, q.scales[:1], q.zeros))


def test_reference_matmul_bad_x():
    """reference_matmul names x: its K mismatch, its rank, its non-finite entries."""
    packed = _packed("fp4", k=64, n=8)
    with pytest.raises(m.ShapeError, match=r"^x: has K=32 columns but the weight has K=64 rows"):
        m.reference_matmul(np.ones((3, 32)), packed)
    with pytest.raises(m.ShapeError, match=r"^x: expected a 2-D"):
        m.reference_matmul(np.ones(64), packed)
    x = np.ones((3, 64))
    x[2, 10] = np.nan
    with pytest.raises(m.ValueRangeError, match=re.escape("x: non-finite value nan at index (2, 10)")):
        m.reference_matmul(x, packed)


# ----- format declarations ----------------------------------------------------------------

# Each declaration sits on one line of this file; FormatError must point at that line.
BAD_DECLARATIONS = [
    ("int bits 0", lambda: m.IntEncoding(bits=0), "bits must be an integer in 1..8"),
    ("int bits 9", lambda: m.IntEncoding(bits=9), "bits must be an integer in 1..8"),
    ("int offset", lambda: m.IntEncoding(bits=4, offset=16), "offset must be in 0..15"),
    ("float width", lambda: m.FloatEncoding(bits=4, exp_bits=3, man_bits=1), "must equal bits(4)"),
    ("table size", lambda: m.TableEncoding(bits=2, values=(0.0, 1.0, 2.0)), "exactly 2**bits = 4"),
    ("table nan", lambda: m.TableEncoding(bits=1, values=(0.0, float("nan"))), "values must be finite"),
    ("group 0", lambda: m.GroupScale(0), "group_size must be a positive integer or 'K'"),
    ("group str", lambda: m.GroupScale("N"), "group_size must be a positive integer or 'K'"),
    ("group bool", lambda: m.GroupScale(True), "group_size must be a positive integer or 'K'"),
    ("scale dtype", lambda: m.GroupScale(32, dtype="f64"), "dtype must be one of"),
    ("zp dtype", lambda: m.ZeroPoint("i8"), "ZeroPoint: dtype must be one of"),
    ("n >= m", lambda: m.NMSparsity(4, 4), "need n < m, got 4:4"),
    ("chunk 0", lambda: m.NMSparsity(2, 4, chunk=0), "chunk must be a positive integer"),
    ("block_k", lambda: m.BlockPatternSparsity(block_k=9), "block_k must be 1..8"),
    ("word bits", lambda: m.Packing(word_bits=12), "word_bits must be one of [8, 16, 32]"),
    ("name", lambda: m.Format("bad name", E2M1), "Format name must be an identifier"),
    ("element", lambda: m.Format("f", "e2m1"), "element must be"),
    ("zp float", lambda: m.Format("f", E2M1, m.GroupScale(32), m.ZeroPoint()), "zero points need an integer encoding"),
    ("zp signed", lambda: m.Format("f", m.IntEncoding(4, offset=8), zero_point=m.ZeroPoint("u8")), "u8 zero points need"),
    ("granule", lambda: m.Format("f", E2M1, m.GroupScale(12)), "group_size 12 must be a multiple"),
    ("granule nm", lambda: m.Format("f", E2M1, m.GroupScale(16), sparsity=m.NMSparsity(2, 4)), "K granule 32"),
    ("meta width", lambda: m.Format("f", E2M1, m.GroupScale("K"), sparsity=m.NMSparsity(3, 8), packing=m.Packing(8)), "metadata fields of 9 bits are wider than a 8-bit"),
    ("wide codes", lambda: m.Format("f", m.IntEncoding(8), packing=m.Packing(word_bits=8)), None),
]


@pytest.mark.parametrize("label, declare, text", BAD_DECLARATIONS,
                         ids=[d[0] for d in BAD_DECLARATIONS])
def test_bad_declaration_located_at_caller(label, declare, text):
    """A bad declaration raises FormatError whose message starts with this file's path and the
    line of the declaration (the location is captured from the caller, outside marlin_dsl)."""
    line = declare.__code__.co_firstlineno
    if text is None:  # 8-bit codes in 8-bit words are fine: the declaration is valid
        declare()
        return
    with pytest.raises(m.FormatError) as info:
        declare()
    err = info.value
    assert str(err).startswith(f"{__file__}:{line}: "), str(err)
    assert err.location is not None
    assert (err.location.file, err.location.line) == (__file__, line)
    assert text in err.message


def test_group_size_error_points_at_the_group_scale_line():
    """A group size that does not fit the format's K granule is reported at the line that
    declared the GroupScale, not at the Format that combined it."""
    scale = m.GroupScale(16)
    scale_line = test_group_size_error_points_at_the_group_scale_line.__code__.co_firstlineno + 3
    with pytest.raises(m.FormatError) as info:
        m.Format("sparse16", E2M1, scale, sparsity=m.NMSparsity(2, 4))
    assert str(info.value).startswith(f"{__file__}:{scale_line}: ")
    assert "group_size 16" in str(info.value) and "K granule 32" in str(info.value)


def test_declarations_in_a_helper_are_located_at_the_helper_line(tmp_path):
    """A declaration made in a file outside the package (here a written spec file executed
    with runpy) is located in that file, at its line."""
    import runpy

    spec = tmp_path / "bad_spec.py"
    spec.write_text("from marlin_dsl import Format, IntEncoding\n\n"
                    "ok = IntEncoding(4)\n"
                    "bad = Format('x', IntEncoding(bits=3, offset=9))\n")
    with pytest.raises(m.FormatError) as info:
        runpy.run_path(str(spec))
    assert str(info.value).startswith(f"{spec}:4: ")
