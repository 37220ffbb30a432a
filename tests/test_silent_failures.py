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
from marlin_dsl.layers.mlx_ops import packed_to_mx


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


def test_a_few_negligible_groups_do_not_stop_a_layer() -> None:
    """Groups that are ~0 next to the rest of the weight (1e-9 beside 1) quantise to zeros
    without an error: nothing of the weight is lost (found by the property tests)."""
    w = np.random.default_rng(7).standard_normal((256, 32))
    w[128:256, 3] *= 1e-9
    packed = md.pack(md.builtin_format("fp4"), w)
    assert np.linalg.norm(md.dequantize(packed) - w) / np.linalg.norm(w) < 0.2


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


# ----- codes that are not numbers (FloatEncoding.specials) -----------------------------------------

E4M3FN = md.FloatEncoding(bits=8, exp_bits=4, man_bits=3, bias=7, specials="fn")


def test_e4m3fn_has_nan_codes_and_448_as_its_largest_value() -> None:
    table = E4M3FN.table()
    assert np.isnan(table[0x7F]) and np.isnan(table[0xFF]) and np.isfinite(np.delete(table, [0x7F, 0xFF])).all()
    assert E4M3FN.value_range == (-448.0, 448.0)
    # Without specials every code is a number: 0x7F is 480 (not OCP E4M3FN).
    plain = md.FloatEncoding(bits=8, exp_bits=4, man_bits=3, bias=7)
    assert plain.table()[0x7F] == 480.0 and plain.value_range == (-480.0, 480.0)
    e5m2 = md.FloatEncoding(bits=8, exp_bits=5, man_bits=2, bias=15, specials="ieee")
    assert np.isinf(e5m2.table()[0x7C]) and e5m2.value_range == (-57344.0, 57344.0)


def test_quantising_never_stores_a_nan_code() -> None:
    from marlin_dsl.formats.bitstream import unpack_bits

    fmt = md.Format("fp8_e4m3", E4M3FN, md.GroupScale(32))
    w = np.random.default_rng(4).standard_normal((256, 64))
    packed = md.pack(fmt, w)
    codes = unpack_bits(packed["qweight"], 8, 32)
    assert not np.isin(codes, [0x7F, 0xFF]).any()
    assert np.isin(codes & 0x7F, [0x7E]).any()  # each group's largest value is 448 (0x7E)
    assert np.isfinite(md.dequantize(packed)).all()


def test_loaded_nan_codes_are_refused_by_name() -> None:
    fmt = md.Format("fp8_e4m3", E4M3FN, md.GroupScale(32))
    packed = md.pack(fmt, np.random.default_rng(5).standard_normal((128, 16)))
    word = packed.arrays["qweight"][3, 5]
    packed.arrays["qweight"][3, 5] = (word & ~np.uint32(0xFF << 16)) | np.uint32(0xFF << 16)
    message = r"qweight\[3, 5\] field 2: code 0xff is nan in format 'fp8_e4m3'"
    with pytest.raises(ValueRangeError, match=message):
        md.validate(packed)
    with pytest.raises(ValueRangeError, match=message):
        validate_mx(fmt, packed.shape, packed_to_mx(packed.arrays, fmt))


def test_specials_are_checked_and_survive_the_text_form() -> None:
    from marlin_dsl.formats.text import format_to_text, formats_from_text

    with pytest.raises(md.FormatError, match=r"specials must be one of \['none', 'fn', 'ieee'\], got 'nan'"):
        md.FloatEncoding(bits=8, exp_bits=4, man_bits=3, bias=7, specials="nan")
    fmt = md.Format("fp8_e4m3", E4M3FN, md.GroupScale(32))
    text = format_to_text(fmt)
    assert "specials=fn" in text and formats_from_text(text)[0] == fmt
    assert "specials" not in format_to_text(md.builtin_format("fp4"))  # older texts unchanged


def test_e5m2_without_specials_decodes_right_with_f16_activations() -> None:
    """Its all-ones exponent holds numbers (to 114688), which f16's decode would make inf:
    the kernel dequantises in f32 instead (found by the spec reference's author)."""
    from marlin_dsl import METAL, FusedDequant, Gemm, Schedule
    from marlin_dsl.compiler import compile_gemm
    from marlin_dsl.checks.kernel_check import check_kernel, check_shapes

    e5m2 = md.FloatEncoding(bits=8, exp_bits=5, man_bits=2, bias=15)
    fmt = md.Format("e5m2", e5m2, md.GroupScale(32))
    gemm = Gemm("e5m2_f16", fmt, Schedule("s", tile_m=32, tile_n=32, tile_k=32, warps_m=1, warps_n=2,
                                          pipeline=FusedDequant()), "f16")
    kernel = compile_gemm(gemm, METAL).kernel
    rng = np.random.default_rng(6)
    assert all(check_kernel(gemm, kernel, shape, rng).ok for shape in check_shapes(gemm))


def test_gemm_names_must_be_identifiers(tmp_path) -> None:
    from marlin_dsl.errors import SpecError
    from marlin_dsl.spec import load_spec

    spec = tmp_path / "names.py"
    spec.write_text("from marlin_dsl import Gemm, FusedDequant, Schedule, builtin_format\n"
                    "s = Schedule('s', tile_m=32, tile_n=32, tile_k=32, warps_m=1, warps_n=2, pipeline=FusedDequant())\n"
                    "g = Gemm('my gemm', builtin_format('fp4'), s)\n")
    with pytest.raises(md.MarlinDSLError, match=r"names.py:3: Gemm name must be an identifier"):
        load_spec(spec)


def test_builtin_formats_with_other_groups_have_their_own_names(tmp_path) -> None:
    from marlin_dsl.spec import load_spec

    assert md.builtin_format("fp4", 64).name == "fp4_g64" and md.builtin_format("fp4", 128).name == "fp4"
    spec = tmp_path / "two.py"
    spec.write_text("import marlin_dsl as md\na = md.builtin_format('fp4')\nb = md.builtin_format('fp4', 64)\n")
    assert [f.name for f in load_spec(spec).formats] == ["fp4", "fp4_g64"]


@pytest.mark.parametrize("make", [lambda: md.BlockPatternSparsity(block_k=4, block_n=True),
                                  lambda: md.IntEncoding(True), lambda: md.NMSparsity(True, 4),
                                  lambda: md.FloatEncoding(bits=4, exp_bits=True, man_bits=2)])
def test_booleans_are_not_integers_in_declarations(make) -> None:
    """Found by the fuzz test: block_n=True passed as 1 and failed deep in numpy later."""
    with pytest.raises(md.FormatError, match="must be|integer"):
        make()
