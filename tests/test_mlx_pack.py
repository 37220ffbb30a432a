"""`pack_mx`: packing on the device with MLX ops must give exactly the bytes of the numpy
packer (`marlin_dsl.pack`), for every format it runs on the device, every input dtype and
shapes with tails; formats it hands to numpy (value tables, biases, f32 scales) must come
back identical too, including the column-parallel host path; bad input raises our errors."""
from __future__ import annotations

import zlib

import mlx.core as mx
import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl.errors import ShapeError, ValueRangeError
from marlin_dsl.layers.interop import mlx_format
from marlin_dsl.layers.mlx_ops import packed_to_numpy
from marlin_dsl.layers.mlx_pack import device_exact, pack_columns, pack_mx
from marlin_dsl.checks.format_check import sample_weights

DEVICE_FORMATS = {name: md.builtin_format(name)
                  for name in ("fp4", "int4", "uint4_zp", "nf4", "fp4_2of4", "int4_2of4", "fp4_blockpattern")}
DEVICE_FORMATS |= {
    "mxfp4": mlx_format("mxfp4", 4, 32), "nvfp4": mlx_format("nvfp4", 4, 16),
    "mxfp8": mlx_format("mxfp8", 8, 32),
    "int4_bf16": md.Format("int4_bf16", md.IntEncoding(4, offset=8), md.GroupScale(64, dtype="bf16")),
    "nf4_blockpattern": md.Format("nf4_bp", md.builtin_format("nf4").element, md.GroupScale(64),
                                  sparsity=md.BlockPatternSparsity(block_k=8, block_n=32)),
    "uint8_zp": md.Format("uint8_zp", md.IntEncoding(8), md.GroupScale(32),
                          zero_point=md.ZeroPoint()),
}
HOST_FORMATS = {"nf4_2of4": md.Format("nf4_2of4", md.builtin_format("nf4").element, md.GroupScale(64),
                                      sparsity=md.NMSparsity(2, 4)),
                "affine4_g64_f16": mlx_format("affine", 4, 64, mx.float16),
                "affine3_g32_bf16": mlx_format("affine", 3, 32, mx.bfloat16),
                "int4_f32": md.Format("int4_f32", md.IntEncoding(4, offset=8), md.GroupScale(32, dtype="f32"))}
SHAPES = [(128, 16), (256, 40), (512, 65)]


def _weights(fmt: md.Format, shape: tuple[int, int], dtype: mx.Dtype, tag: str) -> mx.array:
    rng = np.random.default_rng(zlib.crc32(f"{tag}{shape}{dtype}".encode()))
    w = sample_weights(fmt, *shape, rng)
    # Put some weights exactly on rounding boundaries (table midpoints times the group's
    # scale) where float32 comparisons and float64 division could disagree if done wrong.
    return mx.array(w.astype(np.float32)).astype(dtype)


def _same(got: md.PackedWeights, want: md.PackedWeights, what: str) -> None:
    assert got.shape == want.shape and list(got.arrays) == list(want.arrays), what
    for name, arr in packed_to_numpy(got.arrays).items():
        np.testing.assert_array_equal(arr, want.arrays[name], err_msg=f"{what}: {name}")


def test_device_formats_are_the_ones_claimed() -> None:
    assert all(device_exact(f) for f in DEVICE_FORMATS.values())
    assert not any(device_exact(f) for f in HOST_FORMATS.values())


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32], ids=str)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", sorted(DEVICE_FORMATS))
def test_device_pack_is_bit_identical(name: str, shape: tuple[int, int], dtype: mx.Dtype) -> None:
    fmt = DEVICE_FORMATS[name]
    if fmt.group_size_for(shape[0]) > shape[0] or shape[0] % fmt.group_size_for(shape[0]):
        pytest.skip(f"{name}: K={shape[0]} is not a whole number of groups")
    w = _weights(fmt, shape, dtype, name)
    want = md.pack(fmt, np.array(w.astype(mx.float32)))
    _same(pack_mx(fmt, w, on_device=True), want, f"{name} {shape} {dtype}")


def test_boundary_values_round_as_numpy_does() -> None:
    """Weights that are exactly a midpoint times the scale (ties) and one ulp either side."""
    fmt = DEVICE_FORMATS["fp4"]
    rng = np.random.default_rng(7)
    w = sample_weights(fmt, 256, 32, rng).astype(np.float32)
    scales = md.pack(fmt, w).arrays["scales"].astype(np.float32)  # [K/G, N]
    g = fmt.group_size_for(256)
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)
    pick = rng.integers(0, len(mids), size=w.shape)
    sign = rng.choice([-1.0, 1.0], size=w.shape).astype(np.float32)
    tie = sign * mids[pick] * np.repeat(scales, g, axis=0)
    nudge = rng.integers(-1, 2, size=w.shape)
    tie = np.where(nudge > 0, np.nextafter(tie, np.inf), np.where(nudge < 0, np.nextafter(tie, -np.inf), tie))
    mask = rng.random(w.shape) < 0.5
    mask[np.argmax(np.abs(w), axis=0), np.arange(w.shape[1])] = False  # keep each group's max
    w = np.where(mask, tie, w).astype(np.float32)
    _same(pack_mx(fmt, mx.array(w), on_device=True), md.pack(fmt, w), "ties")


def test_value_table_near_ties_are_decided_on_the_host(monkeypatch) -> None:
    """NF4 midpoints have 24+ significant bits: weights within float32 rounding of a
    midpoint times the scale go to numpy's float64 decision (and must come out identical)."""
    import marlin_dsl.layers.mlx_pack as mp

    fmt = md.builtin_format("nf4")
    rng = np.random.default_rng(5)
    w = sample_weights(fmt, 256, 48, rng).astype(np.float32)
    scales = md.pack(fmt, w).arrays["scales"].astype(np.float64)
    g = fmt.group_size_for(256)
    mids = fmt.element._rounding[0]
    near = (mids[rng.integers(0, len(mids), size=w.shape)] * np.repeat(scales, g, axis=0)).astype(np.float32)
    near = np.where(rng.integers(0, 3, size=w.shape) == 0, np.nextafter(near, np.inf), near)
    mask = rng.random(w.shape) < 0.3
    mask[np.argmax(np.abs(w), axis=0), np.arange(w.shape[1])] = False  # keep each group's max
    w = np.where(mask, near, w).astype(np.float32)
    calls = []
    real = np.searchsorted
    monkeypatch.setattr(mp.np, "searchsorted", lambda *a, **k: calls.append(a[1].size) or real(*a, **k))
    got = pack_mx(fmt, mx.array(w), on_device=True)
    monkeypatch.undo()
    assert calls and calls[0] > 0, "no element went to the host decision"
    _same(got, md.pack(fmt, w), "nf4 near ties")


@pytest.mark.parametrize("name", sorted(HOST_FORMATS))
def test_host_formats_match(name: str) -> None:
    fmt = HOST_FORMATS[name]
    w = _weights(fmt, (256, 40), mx.float16, name)
    _same(pack_mx(fmt, w, on_device=True), md.pack(fmt, np.array(w.astype(mx.float32))), name)


@pytest.mark.parametrize("name", ["nf4_2of4", "affine4_g64_f16", "fp4_blockpattern", "fp4_2of4"])
def test_column_parallel_host_pack_is_bit_identical(name: str) -> None:
    fmt = (HOST_FORMATS | DEVICE_FORMATS)[name]
    shape = (1024, 4100 + 33)  # 4.2M weights: above the split threshold; a ragged last slice
    w = sample_weights(fmt, *shape, np.random.default_rng(11)).astype(np.float32)
    got = pack_columns(fmt, w, workers=3)
    want = md.pack(fmt, w).arrays
    assert list(got) == list(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=f"{name} {key}")


def test_column_parallel_error_names_whole_matrix_index() -> None:
    w = np.random.default_rng(2).standard_normal((1024, 4160)).astype(np.float32)
    w[700, 3000] = np.nan
    with pytest.raises(ValueRangeError, match=r"weights: non-finite value nan at index \(700, 3000\)"):
        pack_columns(md.builtin_format("nf4"), w, workers=4)


@pytest.mark.parametrize("on_device", [True, False])
def test_non_finite_weight_names_its_index(on_device: bool) -> None:
    w = np.random.default_rng(3).standard_normal((128, 32)).astype(np.float32)
    w[77, 5] = np.inf
    with pytest.raises(ValueRangeError, match=r"weights: non-finite value inf at index \(77, 5\)"):
        pack_mx(md.builtin_format("fp4"), mx.array(w), on_device=on_device)


def test_bad_arguments_raise_our_errors() -> None:
    fmt = md.builtin_format("fp4")
    with pytest.raises(TypeError, match="fmt: expected a marlin_dsl Format"):
        pack_mx("fp4", mx.zeros((128, 16)))  # type: ignore[arg-type]
    with pytest.raises(ShapeError, match="weights: expected a 2-D float16"):
        pack_mx(fmt, mx.zeros((128,)))
    with pytest.raises(ShapeError, match="weights: expected a 2-D float16"):
        pack_mx(fmt, mx.zeros((128, 16), dtype=mx.int32))
    with pytest.raises(ShapeError, match="weights: expected a 2-D float16"):
        pack_mx(fmt, np.zeros((128, 16), np.float32))  # type: ignore[arg-type]
    with pytest.raises(ShapeError, match="K"):
        pack_mx(fmt, mx.ones((100, 16)), on_device=True)
