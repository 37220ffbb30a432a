"""Number types of per-group parameters (formats/storage.py) and the formats that use them:
bf16/f32/E8M0/E4M3 scales and MLX's affine bias (`GroupBias`), through quantise, pack,
validate, the textual form and the reference dequantisation. The 8-bit code tables are checked
against MLX's own decoding (mx.dequantize), an independent implementation."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl.errors import FormatError, ValueRangeError
from marlin_dsl.formats.storage import STORAGE_TYPES, bf16_bits, bf16_to_float64
from marlin_dsl.formats.text import format_to_text, formats_from_text
from marlin_dsl.checks.format_check import verify_format

E2M1 = md.FloatEncoding(4, exp_bits=2, man_bits=1, bias=1)


def test_e8m0_table_is_mlx_mxfp4_scale() -> None:
    """MLX decodes mxfp4 code 2 (value 1.0) times scale code e as 2**(e - 127); 255 is not a
    value (MLX gives inf, the OCP spec NaN; ours NaN, and validate refuses it)."""
    q = mx.array(np.full((1, 4), 0x22222222, dtype=np.uint32))  # every code 2 = 1.0
    codes = np.arange(255, dtype=np.uint8)
    got = [float(np.array(mx.dequantize(q, mx.array(np.array([[c]], np.uint8)), group_size=32, bits=4,
                                        mode="mxfp4", dtype=mx.float32))[0, 0]) for c in codes]
    table = STORAGE_TYPES["e8m0"].table
    np.testing.assert_array_equal(np.array(got, np.float64), table[:255].astype(np.float32).astype(np.float64))
    assert np.isnan(table[255])


def test_e4m3_table_is_mlx_nvfp4_scale() -> None:
    # Row c: 64 codes 2 (= 1.0) in 4 groups of 16 (MLX's nvfp4 wants K >= 64), scale code c.
    q = mx.array(np.full((256, 8), 0x22222222, dtype=np.uint32))
    scales = mx.array(np.repeat(np.arange(256, dtype=np.uint8)[:, None], 4, axis=1))
    decoded = np.array(mx.dequantize(q, scales, group_size=16, bits=4, mode="nvfp4", dtype=mx.float32))
    table = STORAGE_TYPES["e4m3"].table
    for code in range(256):
        got = float(decoded[code, 0])
        if np.isnan(table[code]):
            assert code & 0x7F == 0x7F and np.isnan(got)
        else:
            assert got == table[code], (code, got, table[code])
    assert np.nanmax(table) == 448.0


def test_bf16_rounding_is_correct_to_nearest_even() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(20000) * 10.0 ** rng.integers(-8, 8, 20000)
    bits = bf16_bits(x)
    value = bf16_to_float64(bits)
    up = bf16_to_float64(bits + 1)
    down = bf16_to_float64(bits - 1)
    # No representable bf16 is nearer than the chosen one.
    assert np.all(np.abs(value - x) <= np.abs(up - x)) and np.all(np.abs(value - x) <= np.abs(down - x))
    # Ties (exactly half way) go to the even pattern; float64 -> bf16 directly, not via f32.
    halfway = (bf16_to_float64(np.uint16(0x3F80)) + bf16_to_float64(np.uint16(0x3F81))) / 2
    assert bf16_bits(np.array([halfway]))[0] == 0x3F80
    just_above = np.nextafter(halfway, 2.0)
    assert bf16_bits(np.array([just_above]))[0] == 0x3F81  # a float32 detour would tie to even


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "e8m0", "e4m3"])
def test_round_up_never_shrinks(dtype: str) -> None:
    storage = STORAGE_TYPES[dtype]
    rng = np.random.default_rng(1)
    x = np.abs(rng.standard_normal(5000)) * 10.0 ** rng.uniform(-2, 2, 5000)
    stored = storage.round_up(x)
    value = storage.to_float64(stored)
    assert np.all(value >= x)
    # ... and is the smallest such value: one step down is below x (for positive values).
    if storage.table is not None:
        positive = np.sort(storage.table[np.isfinite(storage.table) & (storage.table > 0)])
        below = positive[np.maximum(np.searchsorted(positive, value) - 1, 0)]
        assert np.all((below < x) | (below == value))


SCALED = {
    "fp4_bf16": md.Format("fp4_bf16", E2M1, md.GroupScale(64, "bf16")),
    "fp4_f32": md.Format("fp4_f32", E2M1, md.GroupScale(32, "f32")),
    "mxfp4": md.Format("mxfp4", E2M1, md.GroupScale(32, "e8m0")),
    "nvfp4": md.Format("nvfp4", E2M1, md.GroupScale(16, "e4m3")),
    "aff4_f16": md.Format("aff4_f16", md.IntEncoding(4), md.GroupScale(64), bias=md.GroupBias("f16")),
    "aff3_bf16": md.Format("aff3_bf16", md.IntEncoding(3), md.GroupScale(32, "bf16"), bias=md.GroupBias("bf16")),
    "aff8_f32": md.Format("aff8_f32", md.IntEncoding(8), md.GroupScale(128, "f32"), bias=md.GroupBias("f32")),
    "nf4_bias": md.Format("nf4_bias", md.builtin_format("nf4").element, md.GroupScale(64), bias=md.GroupBias("f16")),
}


@pytest.mark.parametrize("name", sorted(SCALED))
def test_new_parameter_types_verify(name: str) -> None:
    """Quantise (round to nearest: no value is farther than the nearest representable one),
    pack, reload, validate, unpack and the reference matmul, as `marlin-dsl compile` checks."""
    check = verify_format(SCALED[name], np.random.default_rng(3))
    assert check.ok, check.checks
    assert check.quant_excess <= 1e-9


@pytest.mark.parametrize("name", sorted(SCALED))
def test_textual_form_round_trips(name: str) -> None:
    fmt = SCALED[name]
    text = format_to_text(fmt)
    assert formats_from_text(text)[0] == fmt
    assert format_to_text(formats_from_text(text)[0]) == text


def test_bias_and_zero_point_are_exclusive_and_dtypes_named() -> None:
    with pytest.raises(FormatError, match="zero_point or a bias, not both"):
        md.Format("x", md.IntEncoding(4), md.GroupScale(32), md.ZeroPoint(), bias=md.GroupBias())
    with pytest.raises(FormatError, match=r"GroupBias: dtype must be one of \['f16', 'bf16', 'f32'\]"):
        md.GroupBias("e8m0")
    with pytest.raises(FormatError, match=r"^<text>:3: GroupBias: dtype must be one of"):
        formats_from_text('format x {\n  element int(bits=4)\n  bias(dtype=u8)\n}\n')


def test_bias_dequantises_as_s_times_q_plus_b() -> None:
    fmt = SCALED["aff4_f16"]
    rng = np.random.default_rng(4)
    codes = rng.integers(0, 16, (128, 5)).astype(np.uint8)
    scales = rng.uniform(-0.1, 0.1, (2, 5)).astype(np.float16)
    biases = rng.uniform(-1, 1, (2, 5)).astype(np.float16)
    q = md.QuantizedWeights(fmt, codes, scales, biases=biases)
    expected = (codes.reshape(2, 64, 5) * scales.astype(np.float64)[:, None] + biases.astype(np.float64)[:, None])
    np.testing.assert_array_equal(md.dequantize(q), expected.reshape(128, 5))
    np.testing.assert_array_equal(md.dequantize(md.pack_codes(q)), expected.reshape(128, 5))


@pytest.mark.parametrize("dtype, bad, shown", [("e8m0", 255, "e8m0 code 0xff"), ("e4m3", 0x7F, "e4m3 code 0x7f"),
                                               ("e4m3", 0xFF, "e4m3 code 0xff")])
def test_validate_refuses_non_value_codes(dtype: str, bad: int, shown: str) -> None:
    fmt = md.Format("f", E2M1, md.GroupScale(32, dtype))
    packed = md.pack(fmt, np.random.default_rng(5).standard_normal((64, 6)))
    packed.arrays["scales"][1, 4] = bad
    with pytest.raises(ValueRangeError, match=rf"scales\[1, 4\] is not finite: nan \({shown}\)"):
        md.validate(packed)


def test_validate_refuses_non_finite_biases() -> None:
    fmt = SCALED["aff3_bf16"]
    packed = md.pack(fmt, np.random.default_rng(6).standard_normal((64, 6)))
    packed.arrays["biases"][0, 2] = 0x7F80  # bf16 +inf
    with pytest.raises(ValueRangeError, match=r"biases\[0, 2\] is not finite: inf"):
        md.validate(packed)


def test_scale_out_of_range_is_named() -> None:
    fmt = md.Format("f", E2M1, md.GroupScale(32, "e4m3"))
    w = np.ones((32, 3))
    w[:, 1] = 1e4  # needs scale 1e4 / 6 > 448
    with pytest.raises(ValueRangeError, match="group 0 of column 1 needs scale .* beyond e4m3's largest value 448"):
        md.pack(fmt, w)
