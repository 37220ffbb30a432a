"""The two-level scale scheme (issue 14): a scale scheme the lowering and the printers have no
code for. Its format description round-trips through text; quantise, pack, validate and unpack
agree with the float64 definition; bad arrays raise errors naming the array and index; and
kernels of every pipeline (fused, double-buffered, weight stream, multistage) match the
reference at M = 1, 3, 65 with a ragged N tail, on the interpreter (and nvcc compiles the
printed CUDA where it is installed)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import marlin_dsl as m
from marlin_dsl.targets.cuda.printer import print_cuda
from marlin_dsl.targets.cuda.nvcc import find_nvcc, nvcc_check
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.errors import FormatError, ShapeError, ValueRangeError
from marlin_dsl.formats import STORAGE_TYPES
from marlin_dsl.formats.text import format_to_text, formats_from_text
from marlin_dsl.checks.kernel_check import check_kernel
from marlin_dsl.targets.cuda.tuning import multistage_schedule, tuned_schedule
from marlin_dsl.spec import load_spec
from marlin_dsl.machine import CUDA, METAL

ROOT = Path(__file__).resolve().parent.parent
E2M1 = m.FloatEncoding(bits=4, exp_bits=2, man_bits=1, bias=1)
INT4 = m.IntEncoding(bits=4, offset=8)
FORMATS = {sub: m.Format(f"t2l_{sub}", INT4 if sub == "u8" else E2M1, m.TwoLevelScale(32, sub))
           for sub in ("u8", "e8m0")}


@pytest.mark.parametrize("sub", ["u8", "e8m0"])
def test_description_buffers_and_text(sub: str) -> None:
    fmt = FORMATS[sub]
    assert fmt.scaling is fmt.scale and fmt.zero_point is None and fmt.bias is None
    specs = {s.name: (s.shape, s.dtype, s.elem) for s in fmt.buffers(128, 10)}
    assert specs["scales"] == ((4, 10), np.dtype(np.uint8), sub)
    assert specs["channel_scales"] == ((1, 10), np.dtype(np.float32), "f32")
    text = format_to_text(fmt)
    assert f"scale two_level(size=32, sub={sub}, channel=f32)" in text
    (back,) = formats_from_text(text)
    assert back == fmt and format_to_text(back) == text


@pytest.mark.parametrize("sub", ["u8", "e8m0"])
def test_quantise_pack_validate_round_trip(sub: str) -> None:
    fmt = FORMATS[sub]
    rng = np.random.default_rng(1)
    w = rng.standard_normal((96, 37)) * np.linspace(0.01, 3.0, 37)
    q = m.quantize(fmt, w)
    packed = m.pack_codes(q)
    m.validate(packed)
    back = m.unpack(packed)
    assert np.array_equal(back.codes, q.codes)
    assert np.array_equal(back.parameter("channel_scales"), packed["channel_scales"])
    # the definition: table[code] * (channel * sub), sub an integer or a power of two
    storage = STORAGE_TYPES[sub]
    scale = np.repeat(storage.to_float64(packed["scales"]), 32, axis=0) * packed["channel_scales"].astype(np.float64)
    expected = fmt.element.table()[q.codes] * scale
    assert np.array_equal(m.dequantize(packed), expected)
    # no value clips: every group's effective scale covers its largest magnitude
    assert np.all(np.abs(w) <= np.abs(fmt.element.table()).max() * scale * (1 + 1e-12))
    assert np.allclose(m.dequantize(packed), w, atol=0.35 * np.abs(w).max())


def test_u8_sub_scales_are_integers_and_column_scale_is_max_over_255() -> None:
    fmt = FORMATS["u8"]
    w = np.ones((64, 3))
    w[:32, 1] = 4.0
    q = m.quantize(fmt, w)
    channel = q.parameter("channel_scales")
    assert channel.shape == (1, 3) and channel.dtype == np.float32
    assert q.scales[0, 1] == 255 and 1 <= q.scales[1, 1] <= 255


def test_bad_arrays_name_the_array_and_index() -> None:
    fmt = FORMATS["u8"]
    packed = m.pack(fmt, np.random.default_rng(2).standard_normal((64, 9)))
    arrays = {k: v.copy() for k, v in packed.arrays.items()}
    arrays["scales"][1, 3] = 0
    with pytest.raises(ValueRangeError, match=r"scales\[1, 3\] = 0.0 is not positive"):
        m.validate(m.PackedWeights(fmt, (64, 9), arrays))
    arrays = {k: v.copy() for k, v in packed.arrays.items()}
    arrays["channel_scales"][0, 5] = np.nan
    with pytest.raises(ValueRangeError, match=r"channel_scales\[0, 5\] is not finite"):
        m.validate(m.PackedWeights(fmt, (64, 9), arrays))
    arrays["channel_scales"] = np.ones((2, 9), np.float32)
    with pytest.raises(ShapeError, match=r"channel_scales: expected shape \(1, 9\)"):
        m.validate(m.PackedWeights(fmt, (64, 9), arrays))
    q = m.quantize(fmt, np.ones((64, 9)))
    q.extra.clear()
    with pytest.raises(ShapeError, match="weights.channel_scales"):
        m.pack_codes(q)
    e8 = FORMATS["e8m0"]
    arrays = {k: v.copy() for k, v in m.pack(e8, np.ones((64, 9))).arrays.items()}
    arrays["scales"][0, 2] = 255
    with pytest.raises(ValueRangeError, match=r"scales\[0, 2\] is not finite: nan \(e8m0 code 0xff\)"):
        m.validate(m.PackedWeights(e8, (64, 9), arrays))


@pytest.mark.parametrize("channel", ["f16", "bf16"])
def test_mlx_ops_form_the_two_level_product_in_f32(channel: str) -> None:
    """`dequantize_mx` (MarlinLinear's "mlx" backend) multiplies a u8 sub-scale by an f16 or
    bf16 column scale in f32, as the reference and the kernels do: MLX promotes uint8 x
    float16 to float16, which rounded the product to 11 bits and overflowed it past 65504
    (found by tests/test_fuzz.py drawing tests/format_catalogue.py's formats). Every step is
    exact in f32 (8 + 11 + 4 significant bits), so the result is the reference, bit for bit."""
    import mlx.core as mx

    from marlin_dsl.layers.mlx_ops import dequantize_mx, packed_to_mx
    from marlin_dsl.nn import MarlinLinear

    fmt = m.Format(f"t2l_u8_{channel}", INT4, m.TwoLevelScale(32, "u8", channel_dtype=channel))
    packed = m.pack(fmt, np.random.default_rng(4).standard_normal((64, 9)))
    arrays = {k: v.copy() for k, v in packed.arrays.items()}
    storage = STORAGE_TYPES[channel]
    arrays["channel_scales"][0, 4:6] = storage.round_nearest(np.array([1000.0, 1.1]))
    arrays["scales"][:, 4:6] = [[255, 201], [254, 255]]  # 255000 > 65504; 201 * 1.1 not in f16
    weights = m.PackedWeights(fmt, packed.shape, arrays)
    m.validate(weights)
    got = np.array(dequantize_mx(fmt, weights.shape, packed_to_mx(arrays, fmt)))
    assert got.dtype == np.float32 and np.isfinite(got).all()
    np.testing.assert_array_equal(got, m.dequantize(weights).astype(np.float32))
    layer = MarlinLinear.from_packed(weights, backend="mlx")
    rows = np.eye(64, dtype=np.float32)[[0, 33, 63]]  # x = unit rows: y is those rows of w
    np.testing.assert_array_equal(np.array(layer(mx.array(rows))), got[[0, 33, 63]])


def test_declaration_errors() -> None:
    with pytest.raises(FormatError, match="owns its parameters"):
        m.Format("bad", INT4, m.TwoLevelScale(32), m.ZeroPoint("u8"))
    with pytest.raises(FormatError, match="TwoLevelScale sub: dtype must be one of"):
        m.TwoLevelScale(32, "f16")
    with pytest.raises(FormatError, match="group_size must be a positive integer"):
        m.TwoLevelScale(0)
    with pytest.raises(FormatError, match="unknown attribute 'dtype'"):
        formats_from_text("format x {\n  element int(bits=4)\n  scale two_level(size=32, dtype=u8)\n}\n")


def _gemms() -> list[tuple[m.Gemm, m.Target]]:
    spec = load_spec(ROOT / "examples" / "two_level_scale.py")
    # the spec's weight-stream gemms are Metal's (128-position K steps; CUDA's are tuned below)
    out = [(g, t) for g in spec.gemms for t in (METAL, CUDA)
           if t is METAL or not isinstance(g.schedule.pipeline, m.WeightStream)]
    for fmt in FORMATS.values():
        out.append((m.Gemm(f"{fmt.name}_stream", fmt, tuned_schedule(fmt, 1, CUDA, 256, 256)), CUDA))
        out.append((m.Gemm(f"{fmt.name}_ms", fmt, multistage_schedule(fmt, 256, CUDA, 256, 256)), CUDA))
    return out


GEMMS = _gemms()


@pytest.mark.parametrize("gemm,target", GEMMS, ids=[f"{g.name}-{t.name}" for g, t in GEMMS])
def test_kernels_match_the_reference_at_odd_shapes(gemm: m.Gemm, target: m.Target) -> None:
    kernel = compile_gemm(gemm, target).kernel
    assert [b.name for b in kernel.buffers][:4] == ["x", "qweight", "scales", "channel_scales"]
    rng = np.random.default_rng(3)
    n = gemm.schedule.tile_n + 17
    k = 2 * max(gemm.schedule.tile_k, 64)
    for mm in (1, 3, 65):
        result = check_kernel(gemm, kernel, (mm, n, k), rng)
        assert result.ok, (mm, result)


def test_no_lowering_or_printer_code_names_the_scheme() -> None:
    for folder in ("lowering", "machine", "targets", "passes"):
        for path in (ROOT / "marlin_dsl" / folder).rglob("*.py"):
            text = path.read_text()
            assert "channel_scales" not in text and "TwoLevel" not in text, path


@pytest.mark.slow  # an nvcc/ptxas sweep: CI runs it (-m slow)
@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed")
def test_nvcc_compiles_the_two_level_kernels(tmp_path: Path) -> None:
    sources = [print_cuda(compile_gemm(g, t).kernel) for g, t in GEMMS if t is CUDA]
    results = nvcc_check(sources, archs=("sm_80",), jobs=2, cache_dir=tmp_path)
    assert all(r.ok for r in results), [r for r in results if not r.ok][:1]


def test_mlx_pack_validate_and_dequantize_agree_with_numpy() -> None:
    mx = pytest.importorskip("mlx.core")
    from marlin_dsl.layers.validate import validate_mx
    from marlin_dsl.layers.mlx_ops import dequantize_mx
    from marlin_dsl.layers.mlx_pack import pack_mx

    fmt = FORMATS["u8"]
    w = np.random.default_rng(4).standard_normal((64, 9)).astype(np.float32)
    packed = pack_mx(fmt, mx.array(w))
    validate_mx(fmt, (64, 9), packed.arrays)
    reference = m.dequantize(m.pack(fmt, w))
    assert np.allclose(np.array(dequantize_mx(fmt, (64, 9), packed.arrays)), reference, rtol=1e-6, atol=1e-6)
    bad = dict(packed.arrays)
    bad["channel_scales"] = mx.zeros((1, 9), dtype=mx.float32)
    with pytest.raises(ValueRangeError, match=r"channel_scales\[0, 0\] = 0.0 is not positive"):
        validate_mx(fmt, (64, 9), bad)
