"""Issue 31: a converted layer returns the dtype the layer it replaces returned. MLX promotes:
f16 x through an nn.Linear with f32 weights (or an nn.QuantizedLinear with f32 scales) gives
f32, computed in f32; a MarlinLinear made from it does the same (`source_dtype`), and keeps
doing so after a save and a load. Layers made without a source keep x's dtype."""
from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from marlin_dsl.nn import MarlinLinear

DTYPES = [mx.float16, mx.bfloat16, mx.float32]


def _linear(k: int, n: int, dtype: mx.Dtype, seed: int) -> nn.Linear:
    mx.random.seed(seed)
    layer = nn.Linear(k, n)
    layer.set_dtype(dtype)
    return layer


def _rel(a: mx.array, b: mx.array) -> float:
    a64, b64 = (np.array(v.astype(mx.float32)).astype(np.float64) for v in (a, b))
    return float(np.linalg.norm(a64 - b64) / np.linalg.norm(b64))


@pytest.mark.parametrize("weight_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("x_dtype", DTYPES, ids=str)
def test_from_linear_returns_what_the_linear_returns(weight_dtype: mx.Dtype, x_dtype: mx.Dtype) -> None:
    source = _linear(256, 48, weight_dtype, seed=11)
    layer = MarlinLinear.from_linear(source, "fp4")
    x = mx.random.normal((3, 256), key=mx.random.key(7)).astype(x_dtype)
    want, got = source(x), layer(x)
    assert got.dtype == want.dtype, (weight_dtype, x_dtype, got.dtype, want.dtype)
    assert _rel(got, want) < 0.15  # 4-bit weights


def test_from_quantized_linear_follows_its_scales() -> None:
    source = _linear(256, 64, mx.float32, seed=3)
    ql = nn.QuantizedLinear.from_linear(source, group_size=64, bits=4)  # f32 scales and biases
    x = mx.random.normal((2, 256), key=mx.random.key(1)).astype(mx.float16)
    got, want = MarlinLinear.from_quantized_linear(ql, backend="mlx")(x), ql(x)
    assert got.dtype == want.dtype == mx.float32
    assert _rel(got, want) < 1e-5  # the same weights, computed in f32 by both (MLX ops)


def test_layers_without_a_source_keep_the_activation_dtype() -> None:
    layer = MarlinLinear(256, 32, format="int4")
    assert layer.source_dtype is None
    x = mx.random.normal((2, 256), key=mx.random.key(2)).astype(mx.float16)
    assert layer(x).dtype == mx.float16
    layer.source_dtype = "float32"
    assert layer(x).dtype == mx.float32
    layer.set_dtype(mx.bfloat16)  # as nn.Linear.set_dtype would cast its weight
    assert layer.source_dtype == mx.bfloat16 and layer(x).dtype == mx.float32  # f16 with bf16: f32


def test_a_converted_model_keeps_its_source_dtype_through_save_and_load(tmp_path: Path) -> None:
    from marlin_dsl.models import convert, load_into, save_model

    def model(seed: int) -> nn.Module:
        mx.random.seed(seed)
        return nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 64, bias=False))

    float_model = model(0)
    converted = model(0)
    convert(converted, "fp4")
    x = mx.random.normal((4, 256), key=mx.random.key(5)).astype(mx.float16)
    assert converted(x).dtype == float_model(x).dtype == mx.float32
    save_model(converted, tmp_path / "m")
    loaded = load_into(model(1), tmp_path / "m")
    assert loaded.layers[0].source_dtype == mx.float32
    y = loaded(x)
    assert y.dtype == mx.float32
    np.testing.assert_array_equal(np.array(y), np.array(converted(x)))
