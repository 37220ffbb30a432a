"""Issue 13: inputs that used to give a silently wrong or useless result now raise our errors,
naming the argument and index."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl.errors import ValueRangeError
from marlin_dsl.layers.interop import mlx_format
from marlin_dsl.layers.validate import validate_mx
from marlin_dsl.mlx_ops import packed_to_mx


def test_weights_below_the_scale_range_are_an_error_not_zeros() -> None:
    w = np.random.default_rng(0).standard_normal((256, 32)) * 1e-9
    with pytest.raises(ValueRangeError, match=r"weights: group 0 of column \d+ needs scale .*below what f16 "
                                              r"scales of format 'fp4' hold.*GroupScale\(dtype='f32'\)"):
        md.pack(md.builtin_format("fp4"), w)
    # The same weights in a format with f32 scales quantise fine.
    f32 = md.Format("fp4_f32", md.builtin_format("fp4").element, md.GroupScale(128, dtype="f32"))
    packed = md.pack(f32, w)
    rel = np.linalg.norm(md.dequantize(packed) - w) / np.linalg.norm(w)
    assert rel < 0.2


def test_small_but_representable_weights_still_pack() -> None:
    w = np.random.default_rng(1).standard_normal((256, 32)) * 1e-4  # scales ~6e-5: f16 subnormal
    packed = md.pack(md.builtin_format("fp4"), w)
    assert np.linalg.norm(md.dequantize(packed) - w) / np.linalg.norm(w) < 0.2


@pytest.mark.parametrize("value", [0.0, -0.5])
def test_zero_or_negative_loaded_scales_are_refused(value: float) -> None:
    fmt = md.builtin_format("uint4_zp")
    packed = md.pack(fmt, np.random.default_rng(2).standard_normal((256, 32)))
    packed.arrays["scales"][1, 7] = value
    with pytest.raises(ValueRangeError, match=r"scales\[1, 7\] = -?[0-9.]+ is not positive"):
        md.validate(packed)
    with pytest.raises(ValueRangeError, match=r"scales\[1, 7\] = -?[0-9.]+ is not positive"):
        validate_mx(fmt, packed.shape, packed_to_mx(packed.arrays, fmt))


def test_affine_formats_take_any_scale_sign() -> None:
    """w = s * q + b is meaningful for any s (MLX's affine mode may store such scales)."""
    fmt = mlx_format("affine", 4, 64, mx.float16)
    packed = md.pack(fmt, np.random.default_rng(3).standard_normal((128, 16)))
    packed.arrays["scales"][0, 3] = 0.0
    md.validate(packed)
    validate_mx(fmt, packed.shape, packed_to_mx(packed.arrays, fmt))
