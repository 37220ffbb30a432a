"""`stream_arrays_mx` / `linear_arrays_mx`: the CUDA weight-stream layout made and undone with
MLX ops must be bit-identical to the numpy `stream_arrays` (the layout the kernels were
verified on), and the inverse must give back the linear arrays exactly."""
from __future__ import annotations

import zlib

import mlx.core as mx
import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl import CUDA
from marlin_dsl.errors import ShapeError
from marlin_dsl.layers.interop import mlx_format
from marlin_dsl.layouts.weight_stream import stream_arrays
from marlin_dsl.layers.weight_stream_mx import linear_arrays_mx, stream_arrays_mx, stream_shapes
from marlin_dsl.layers.mlx_ops import packed_to_mx
from marlin_dsl.checks.format_check import sample_weights

FORMATS = {name: md.builtin_format(name)
           for name in ("fp4", "int4", "uint4_zp", "nf4", "fp4_2of4", "int4_2of4")}
FORMATS |= {"affine4_g32_f16": mlx_format("affine", 4, 32, mx.float16),
            "affine8_g64_bf16": mlx_format("affine", 8, 64, mx.bfloat16),
            "mxfp4": mlx_format("mxfp4", 4, 32), "nvfp4": mlx_format("nvfp4", 4, 16),
            # 3-bit codes: 5 a 16-bit half, the spare bit 0; block patterns: dense values
            "int3_zp": md.Format("int3_zp", md.IntEncoding(3), md.GroupScale(32), md.ZeroPoint("u8")),
            "fp4_blockpattern": md.builtin_format("fp4_blockpattern")}
# N tails (N % 16 != 0), several K vectors, and the smallest legal shapes.
SHAPES = [(128, 16), (256, 40), (384, 72)]


def _numpy(a) -> np.ndarray:
    """Bits of an MLX array (bf16 through uint16, as the numpy packer stores it)."""
    return np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_bit_identical_to_numpy_and_inverse_exact(name: str, shape: tuple[int, int]) -> None:
    fmt = FORMATS[name]
    k, n = shape
    rng = np.random.default_rng(zlib.crc32(f"{name}{shape}".encode()))
    packed = md.pack(fmt, sample_weights(fmt, k, n, rng))
    linear = packed_to_mx(packed.arrays, fmt)
    want = stream_arrays(fmt, CUDA, packed)
    got = stream_arrays_mx(fmt, CUDA, shape, linear)
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_array_equal(_numpy(got[key]), want[key], err_msg=f"{name} {key}")
    assert {key: tuple(got[key].shape) for key in stream_shapes(fmt, CUDA, k, n)} == \
        stream_shapes(fmt, CUDA, k, n)
    back = linear_arrays_mx(fmt, CUDA, shape, got)
    for key, arr in packed.arrays.items():
        np.testing.assert_array_equal(_numpy(back[key]), arr, err_msg=f"{name} {key} round trip")


def test_layout_changes_only_weight_words() -> None:
    fmt = FORMATS["uint4_zp"]
    packed = md.pack(fmt, sample_weights(fmt, 128, 32, np.random.default_rng(3)))
    linear = packed_to_mx(packed.arrays, fmt)
    got = stream_arrays_mx(fmt, CUDA, (128, 32), linear)
    for key in ("scales", "zeros"):
        assert got[key] is linear[key]  # passed through, not copied


@pytest.mark.parametrize("name", ["fp4", "fp4_2of4"])
def test_wrong_shape_or_dtype_names_the_array(name: str) -> None:
    fmt = FORMATS[name]
    packed = md.pack(fmt, sample_weights(fmt, 128, 32, np.random.default_rng(4)))
    linear = packed_to_mx(packed.arrays, fmt)
    bad = dict(linear, qweight=linear["qweight"][:-1])
    with pytest.raises(ShapeError, match=r"arrays\['qweight'\].*linear"):
        stream_arrays_mx(fmt, CUDA, (128, 32), bad)
    bad = dict(linear, qweight=linear["qweight"].astype(mx.int32))
    with pytest.raises(ShapeError, match=r"arrays\['qweight'\]"):
        stream_arrays_mx(fmt, CUDA, (128, 32), bad)
    streamed = stream_arrays_mx(fmt, CUDA, (128, 32), linear)
    with pytest.raises(ShapeError, match=r"weight-stream"):
        linear_arrays_mx(fmt, CUDA, (128, 32), linear)  # linear arrays are not the stream layout
    if fmt.sparsity is not None:
        bad = dict(streamed, meta=streamed["meta"][:3])
        with pytest.raises(ShapeError, match=r"arrays\['meta'\]"):
            linear_arrays_mx(fmt, CUDA, (128, 32), bad)
