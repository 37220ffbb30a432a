"""Block skipping in the layer (issue 33, `layers/skip.py`): `MarlinLinear` on backend "cuda"
runs decode rows of a block-pattern weight through the skipping kernels where at most
`tuning.max_stored` of the vectors are stored, and the dense kernels otherwise.

- The skipping arrays made on the device with MLX ops equal the numpy layout
  (`layouts.block_skip.skip_arrays`) bit for bit: odd N (a partial last block), K not a
  multiple of 256 (640), a block with no non-zero.
- The choice: clustered 75% skips; random 50% (nothing empty) and dense weights do not; nor
  the "mlx" backend, nor a format without block patterns; a limit of 1.0 skips everything;
  small weights skip below a lower share.
- Calls through the fake CUDA backend (the kernels' IR in the interpreter, `fake_cuda`):
  M = 1, 3, 16 run the skipping kernel, M = 17 and 70 the dense ones, every output against
  the float64 reference; the layer's parameters (what is saved) stay the dense stream's;
  after `update` with random weights the layer stops skipping.
"""
from __future__ import annotations

import numpy as np
import pytest

import mlx.core as mx

import marlin_dsl as md
from marlin_dsl import CUDA
from marlin_dsl.checks.format_check import clustered_mask
from marlin_dsl.layers.skip import skip_arrays_mx
from marlin_dsl.targets.cuda.tuning import SKIP_MAX_STORED, SKIP_MAX_STORED_SMALL, max_stored
from marlin_dsl.layers.weights import to_layout
from marlin_dsl.layouts.block_skip import skip_arrays
from marlin_dsl.nn import MarlinLinear

FMT = md.builtin_format("fp4_blockpattern")


def weights(k: int, n: int, rng: np.random.Generator, kind: str) -> np.ndarray:
    w = rng.standard_normal((k, n))
    if kind == "clustered75":
        w[clustered_mask(k, n, rng, 64, 32, keep=0.25, empty_block=True)] = 0.0
    elif kind == "random50":
        w[rng.random((k, n)) < 0.5] = 0.0
    return w


def device_arrays(packed) -> tuple[dict, dict]:
    linear = {name: mx.array(a) for name, a in packed.arrays.items()}
    return linear, to_layout(packed.format, packed.shape, linear, CUDA.weight_layouts[0])


@pytest.mark.parametrize("k,n", [(512, 70), (768, 33), (1024, 96), (640, 64)])
def test_device_skip_arrays_equal_the_numpy_layout(k: int, n: int) -> None:
    rng = np.random.default_rng(k * n)
    packed = md.pack(FMT, weights(k, n, rng, "clustered75"))
    linear, held = device_arrays(packed)
    got = skip_arrays_mx(FMT, CUDA, (k, n), linear, held, limit=1.0)
    want = skip_arrays(FMT, CUDA, packed)
    assert got is not None and sorted(got) == sorted(want)
    for name in ("qweight", "vec_start", "vec_k"):
        assert got[name].dtype == mx.uint32, name
        np.testing.assert_array_equal(np.array(got[name]).ravel(), np.asarray(want[name]).ravel(), err_msg=name)


def test_the_stored_share_decides() -> None:
    rng = np.random.default_rng(3)
    k, n = 1024, 96
    for kind, skips in (("clustered75", True), ("random50", False), ("dense", False)):
        packed = md.pack(FMT, weights(k, n, rng, kind))
        linear, held = device_arrays(packed)
        assert (skip_arrays_mx(FMT, CUDA, (k, n), linear, held) is not None) == skips, kind
        assert skip_arrays_mx(FMT, CUDA, (k, n), linear, held, limit=1.0) is not None, kind
    assert 0 < SKIP_MAX_STORED_SMALL < SKIP_MAX_STORED < 1
    assert max_stored(4096, 4096) == SKIP_MAX_STORED_SMALL and max_stored(4096, 14336) == SKIP_MAX_STORED
    plain = md.pack(md.builtin_format("fp4"), weights(k, n, rng, "clustered75"))
    linear, held = device_arrays(plain)
    assert skip_arrays_mx(plain.format, CUDA, (k, n), linear, held, limit=1.0) is None


def test_mlx_backend_does_not_skip() -> None:
    rng = np.random.default_rng(4)
    packed = md.pack(FMT, weights(512, 64, rng, "clustered75"))
    assert not MarlinLinear.from_packed(packed, backend="mlx").skipping


def test_layer_skips_decode_rows_on_cuda(fake_cuda) -> None:
    rng = np.random.default_rng(5)
    k, n = 768, 70
    packed = md.pack(FMT, weights(k, n, rng, "clustered75"))
    layer = MarlinLinear.from_packed(packed, backend="cuda")
    assert layer.skipping and layer.layout == CUDA.weight_layouts[0]
    held = {name: np.array(a) for name, a in layer.weight_arrays.items()}
    for m in (1, 3, 16, 17, 70):
        fake_cuda.clear()
        x = rng.standard_normal((m, k)).astype(np.float16)
        y = np.array(layer(mx.array(x))).astype(np.float64)
        expected = md.reference_matmul(x.astype(np.float64), packed)
        rel = np.linalg.norm(y - expected) / np.linalg.norm(expected)
        assert y.shape == (m, n) and rel < 2e-3, (m, rel)
        (launch,) = fake_cuda
        assert ("vec_k" in launch["inputs"]) == (m <= 16), (m, launch["name"])
    for name, a in layer.weight_arrays.items():  # the parameters stay the dense stream's
        np.testing.assert_array_equal(np.array(a), held[name])
    np.testing.assert_array_equal(layer.to_packed().arrays["qweight"], packed.arrays["qweight"])


def test_new_weights_decide_again(fake_cuda) -> None:
    rng = np.random.default_rng(6)
    k, n = 512, 64
    layer = MarlinLinear.from_packed(md.pack(FMT, weights(k, n, rng, "clustered75")), backend="cuda")
    assert layer.skipping
    dense = md.pack(FMT, weights(k, n, rng, "random50"))
    layer.update({name: mx.array(a) for name, a in dense.arrays.items()})  # linear layout: converted
    x = rng.standard_normal((1, k)).astype(np.float16)
    y = np.array(layer(mx.array(x))).astype(np.float64)
    assert not layer.skipping
    expected = md.reference_matmul(x.astype(np.float64), dense)
    assert np.linalg.norm(y - expected) / np.linalg.norm(expected) < 2e-3


def test_quantized_linear_skips_too(fake_cuda) -> None:
    """The functional API takes the same path, its skipping arrays cached on the PackedWeights
    object with its device arrays (made once; new arrays, a new decision)."""
    from marlin_dsl.nn import quantized_linear

    rng = np.random.default_rng(7)
    k, n = 640, 48
    packed = md.pack(FMT, weights(k, n, rng, "clustered75"))
    for m in (1, 16, 17):
        fake_cuda.clear()
        x = rng.standard_normal((m, k)).astype(np.float16)
        y = np.array(quantized_linear(mx.array(x), packed, backend="cuda")).astype(np.float64)
        expected = md.reference_matmul(x.astype(np.float64), packed)
        assert np.linalg.norm(y - expected) / np.linalg.norm(expected) < 2e-3, m
        (launch,) = fake_cuda
        assert ("vec_k" in launch["inputs"]) == (m <= 16), m
    path = packed.device_cache["skip"][1]
    quantized_linear(mx.array(x), packed, backend="cuda")
    assert packed.device_cache["skip"][1] is path  # cached
    packed.arrays.update(md.pack(FMT, weights(k, n, rng, "random50")).arrays)
    quantized_linear(mx.array(x[:1]), packed, backend="cuda")
    assert packed.device_cache["skip"][1] is None
