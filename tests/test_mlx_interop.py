"""MLX's quantised layers load as marlin-dsl formats bit for bit (layers/interop.py): affine
(bits 2-8, groups 32/64/128, f16/bf16/f32 models), mxfp4, nvfp4 and mxfp8.

Oracles: `mx.dequantize` and `mx.quantized_matmul` (MLX's own implementation) against our
MLX-ops dequantisation (equal bit for bit: it follows MLX's arithmetic), our float64 reference
(exact: within MLX's two roundings of the product and the sum), and the layer's output.
"""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl.errors import MarlinDSLError, ShapeError, ValueRangeError
from marlin_dsl.layers.interop import mlx_format, packed_from_quantized
from marlin_dsl.layers.mlx_ops import dequantize_mx, packed_to_numpy

DTYPES = {"f16": mx.float16, "bf16": mx.bfloat16, "f32": mx.float32}
ULP = {mx.float16: 2.0 ** -10, mx.bfloat16: 2.0 ** -7, mx.float32: 2.0 ** -23}


def quantized_linear(k: int, n: int, seed: int, dtype=mx.float16, **kwargs) -> nn.QuantizedLinear:
    """MLX's own QuantizedLinear of a random Linear (fresh weights, with a bias)."""
    mx.random.seed(seed)
    linear = nn.Linear(k, n)
    linear.set_dtype(dtype)
    return nn.QuantizedLinear.from_linear(linear, **kwargs)


def mlx_dequantized(ql: nn.QuantizedLinear) -> mx.array:
    """MLX's dequantised weight, transposed to our [K, N]."""
    return mx.dequantize(ql["weight"], ql["scales"], ql.get("biases"), ql.group_size, ql.bits,
                         ql.mode).T


CASES = ([("affine", bits, g, t) for bits in (4, 8) for g in (32, 64, 128) for t in ("f16", "f32")]
         + [("affine", bits, 64, "bf16") for bits in (2, 3, 4, 5, 6, 8)]
         + [("mxfp4", 4, 32, "bf16"), ("nvfp4", 4, 16, "bf16"), ("mxfp8", 8, 32, "bf16")])


@pytest.mark.parametrize("mode, bits, group, dtype", CASES, ids=[f"{m}{b}-g{g}-{t}" for m, b, g, t in CASES])
def test_quantized_layers_load_exactly(mode: str, bits: int, group: int, dtype: str) -> None:
    k, n = 256, 40
    ql = quantized_linear(k, n, seed=bits * 1000 + group, dtype=DTYPES[dtype], group_size=group,
                          bits=bits, mode=mode)
    packed = packed_from_quantized(ql)
    fmt = packed.format
    assert fmt == mlx_format(mode, bits, group, ql["scales"].dtype if mode == "affine" else None)
    assert fmt.scale.group_size == group and fmt.element.bits == bits
    expected = mlx_dequantized(ql)
    # The MLX-ops dequantisation is MLX's own arithmetic: equal bit for bit.
    got = dequantize_mx(fmt, packed.shape, packed.arrays)
    np.testing.assert_array_equal(np.array(got.astype(expected.dtype).astype(mx.float32)),
                                  np.array(expected.astype(mx.float32)))
    # The float64 reference is the exact s * q + b: within MLX's roundings (<= 1 ulp of the
    # scale type, relative to the largest magnitude of the product and the bias).
    host = md.PackedWeights(fmt, packed.shape, packed_to_numpy(packed.arrays))
    md.validate(host)
    ref = md.dequantize(host)
    mlx_w = np.array(expected.astype(mx.float32)).astype(np.float64)
    if mode == "affine":
        s = np.repeat(md.formats.STORAGE_TYPES[dtype].to_float64(host["scales"]), group, axis=0)
        b = np.repeat(md.formats.STORAGE_TYPES[dtype].to_float64(host["biases"]), group, axis=0)
        bound = ULP[DTYPES[dtype]] * (np.abs(s) * (2 ** bits - 1) + np.abs(b) + np.abs(ref))
        assert np.all(np.abs(ref - mlx_w) <= bound)
    else:  # a code times a power of two or an E4M3 scale: exact in bf16? compare in float32
        np.testing.assert_array_equal(ref.astype(np.float32).astype(np.float64),
                                      np.array(dequantize_mx(fmt, packed.shape, packed.arrays)).astype(np.float64))


@pytest.mark.parametrize("mode, bits, group", [("affine", 4, 64), ("affine", 8, 32), ("mxfp4", 4, 32),
                                               ("nvfp4", 4, 16), ("mxfp8", 8, 32)])
def test_layer_matches_quantized_matmul(mode: str, bits: int, group: int) -> None:
    """MarlinLinear.from_quantized_linear(ql)(x) against ql(x) = mx.quantized_matmul."""
    from marlin_dsl.nn import MarlinLinear

    k, n = 256, 48
    ql = quantized_linear(k, n, seed=7, dtype=mx.float16, group_size=group, bits=bits, mode=mode)
    layer = MarlinLinear.from_quantized_linear(ql)
    for m in (1, 3, 65):
        x = mx.random.normal((m, k), key=mx.random.key(m)).astype(mx.float16)
        want = np.array(ql(x).astype(mx.float32)).astype(np.float64)
        got = np.array(layer(x).astype(mx.float32)).astype(np.float64)
        w = np.array(mlx_dequantized(ql).astype(mx.float32)).astype(np.float64)
        scale = np.abs(np.array(x.astype(mx.float32))) @ np.abs(w) + np.abs(np.array(ql["bias"].astype(mx.float32)))
        assert got.shape == want.shape
        assert np.max(np.abs(got - want) / scale) < 4e-3  # two f16 results, each rounded


def test_mxfp8_nan_codes_are_refused() -> None:
    ql = quantized_linear(64, 8, seed=1, group_size=32, bits=8, mode="mxfp8")
    q = np.array(ql["weight"])
    q[3, 5] = (q[3, 5] & ~np.uint32(0xFF00)) | np.uint32(0x7F00)  # byte 1 of word 5, row 3
    ql.weight = mx.array(q)
    with pytest.raises(ValueRangeError, match=r"ql.weight\[3, 5\] byte 1: E4M3 code 0x7f is NaN .*input feature 21, output feature 3"):
        packed_from_quantized(ql)


def test_bad_quantized_layers_are_named() -> None:
    ql = quantized_linear(64, 8, seed=2, group_size=32, bits=4)
    ql.biases = None
    with pytest.raises(ShapeError, match="ql.biases: mode 'affine' needs biases"):
        packed_from_quantized(ql)
    ql = quantized_linear(64, 8, seed=2, group_size=32, bits=4)
    ql.mode = "int1"
    with pytest.raises(MarlinDSLError, match="mode 'int1' has no marlin-dsl format"):
        packed_from_quantized(ql)
    with pytest.raises(ShapeError, match=r"nvfp4: expected bits=4 and group_size=16"):
        mlx_format("nvfp4", 4, 32)
