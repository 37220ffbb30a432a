"""MLX stores a scale of 0 for an nvfp4 group whose scale underflows E4M3 (and dequantises the
group to zeros). A format imported from MLX declares that encoding (`GroupScale(zero="allowed")`),
so such a layer loads and runs; negative scales, and zero scales in formats that do not declare
it (our own quantiser never stores 0), are still refused (issue 13)."""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl.errors import FormatError, ValueRangeError
from marlin_dsl.formats.text import format_to_text, formats_from_text
from marlin_dsl.layers.interop import mlx_format, packed_from_quantized
from marlin_dsl.layers.mlx_ops import dequantize_mx, packed_to_mx, packed_to_numpy
from marlin_dsl.layers.validate import validate_mx
from marlin_dsl.nn import MarlinLinear

K, N = 128, 48
TINY_ROW, TINY_GROUP = 5, 3  # output feature 5, input features 48..63: one nvfp4 group


def nvfp4_layer_with_a_zero_scale() -> nn.QuantizedLinear:
    rng = np.random.default_rng(11)
    w = rng.standard_normal((N, K)).astype(np.float32) * 0.05
    w[TINY_ROW, 16 * TINY_GROUP:16 * (TINY_GROUP + 1)] = 1e-6  # its scale underflows E4M3
    linear = nn.Linear(K, N)
    linear.weight = mx.array(w).astype(mx.float16)
    linear.bias = mx.array(rng.standard_normal(N).astype(np.float32)).astype(mx.float16)
    ql = nn.QuantizedLinear.from_linear(linear, group_size=16, bits=4, mode="nvfp4")
    assert int(np.array(ql["scales"])[TINY_ROW, TINY_GROUP]) == 0  # MLX's own zero scale
    return ql


def test_mlx_nvfp4_zero_scale_loads_and_matches_mlx() -> None:
    ql = nvfp4_layer_with_a_zero_scale()
    packed = packed_from_quantized(ql)
    assert packed.format.scale.zero == "allowed"
    want_w = mx.dequantize(ql["weight"], ql["scales"], None, 16, 4, "nvfp4").T.astype(mx.float32)
    got_w = dequantize_mx(packed.format, packed.shape, packed.arrays).astype(mx.float32)
    np.testing.assert_array_equal(np.array(got_w), np.array(want_w))
    host = md.PackedWeights(packed.format, packed.shape, packed_to_numpy(packed.arrays))
    ref = md.dequantize(host)  # validates first
    assert not ref[16 * TINY_GROUP:16 * (TINY_GROUP + 1), TINY_ROW].any()  # the group is zeros
    np.testing.assert_array_equal(ref.astype(np.float32), np.array(want_w))
    layer = MarlinLinear.from_quantized_linear(ql, backend="mlx")
    for m in (1, 7):
        x = mx.random.normal((m, K), key=mx.random.key(m)).astype(mx.float16)
        want = np.array(ql(x).astype(mx.float32)).astype(np.float64)
        got = np.array(layer(x).astype(mx.float32)).astype(np.float64)
        w = np.array(want_w).astype(np.float64)
        scale = np.abs(np.array(x.astype(mx.float32))) @ np.abs(w) + np.abs(np.array(ql["bias"].astype(mx.float32)))
        assert np.max(np.abs(got - want) / scale) < 4e-3


def test_mlx_nvfp4_negative_scale_is_still_refused() -> None:
    ql = nvfp4_layer_with_a_zero_scale()
    s = np.array(ql["scales"])
    s[2, 1] = 0xB8  # E4M3 -1.0
    ql.scales = mx.array(s)
    packed = packed_from_quantized(ql)
    host = md.PackedWeights(packed.format, packed.shape, packed_to_numpy(packed.arrays))
    message = r"scales\[1, 2\] = -1.0 \(e4m3 code 0xb8\) is negative \(format 'mlx_nvfp4'"
    with pytest.raises(ValueRangeError, match=message):
        md.validate(host)
    with pytest.raises(ValueRangeError, match=message):
        validate_mx(packed.format, packed.shape, packed.arrays)
    with pytest.raises(ValueRangeError, match=message):
        MarlinLinear.from_quantized_linear(ql, backend="mlx")


def test_own_e4m3_format_still_refuses_a_zero_scale() -> None:
    fmt = md.Format("nvfp4_own", mlx_format("nvfp4", 4, 16).element, md.GroupScale(16, "e4m3"))
    assert fmt.scale.zero == "refused"
    packed = md.pack(fmt, np.random.default_rng(2).standard_normal((64, 16)))
    packed.arrays["scales"][1, 7] = 0
    with pytest.raises(ValueRangeError, match=r"scales\[1, 7\] = 0.0 \(e4m3 code 0x0\) is not positive"):
        md.validate(packed)
    with pytest.raises(ValueRangeError, match=r"scales\[1, 7\] = 0.0 \(e4m3 code 0x0\) is not positive"):
        validate_mx(fmt, packed.shape, packed_to_mx(packed.arrays, fmt))


def test_zero_allowed_is_declared_data_and_round_trips_through_text() -> None:
    fmt = mlx_format("nvfp4", 4, 16)
    text = format_to_text(fmt)
    assert "scale group(size=16, dtype=e4m3, zero=allowed)" in text
    assert formats_from_text(text) == [fmt]
    # The default is not written, so the texts of other formats did not change.
    assert "zero=" not in format_to_text(md.builtin_format("fp4"))
    with pytest.raises(FormatError, match=r"GroupScale: zero must be one of \['refused', 'allowed'\], got 'maybe'"):
        md.GroupScale(16, "e4m3", zero="maybe")
