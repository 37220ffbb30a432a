"""bf16 pairs of float codes (lowering/pair_decode.py): codes placed under bf16's fields,
rebiased, and multiplied by their f32 scale split into bf16 hi + lo with fma(t, hi, t * lo)
(`scheme.mul_rounded_once`). The claim: one rounding, the same bits as the f32 product
rounded to bf16 (the scalar path). Pinned three ways: the arithmetic over every FP4 value and
every positive finite f16 scale, which formats take the path, and kernels of each pipeline
run by the interpreter bit-identical to the scalar path's. Also the warpgroup epilogue that
keeps ptxas pipelining the wgmmas (of bf16 and uint4_zp kernels among others)."""
from __future__ import annotations

import re

import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl import CUDA, Format, FloatEncoding, Gemm, GroupScale, IntEncoding, Schedule, Warpgroup
from marlin_dsl.checks.format_check import sample_weights
from marlin_dsl.checks.kernel_check import check_kernel
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.errors import ScheduleError
from marlin_dsl.formats.pack_weights import pack
from marlin_dsl.formats.scaling import scheme
from marlin_dsl.kernel_args import gemm_buffers, read_output
from marlin_dsl.formats.storage import significant_bits
from marlin_dsl.ir.interpret import run_kernel
from marlin_dsl.ir.numerics import round_bf16
from marlin_dsl.layouts.weight_stream import stream_layout
from marlin_dsl.lowering import pair_decode
from marlin_dsl.lowering.pair_decode import bf16_split_exact
from marlin_dsl.targets.cuda.nvcc import find_nvcc
from marlin_dsl.targets.cuda.printer import print_cuda
from marlin_dsl.targets.cuda.tuning import multistage_schedule, tuned_schedule, warpgroup_schedule
from test_warpgroup_roles import _ptxas_report


def _bf16(x: np.ndarray) -> np.ndarray:
    return round_bf16(np.asarray(x, dtype=np.float64)).astype(np.float64)


@pytest.mark.parametrize("fmt_name", ["fp4", "int4"])
def test_the_split_rounds_once_for_every_code_value_and_f16_scale(fmt_name: str) -> None:
    # every positive finite f16 (subnormals included) as a scale, every code value
    scales = np.arange(1, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    t = md.builtin_format(fmt_name).element.table()[:, None]
    hi = _bf16(scales)
    lo = _bf16(scales - hi)
    assert np.array_equal(lo, scales - hi)  # the low part is exact: 11 bits = 8 + at most 3
    low = _bf16(t * lo)
    assert np.array_equal(low, t * lo)  # the code's 2 (FP4) or 3 (INT4) bits times the low part's 3: exact
    assert np.array_equal(_bf16(t * hi + low), _bf16(t * scales))  # the fma rounds once, as f32 does


def test_a_scale_with_more_bits_would_round_twice() -> None:
    # why `bf16_split_exact` counts bits: an 11-bit code value times a 3-bit low part needs
    # 14 bits, and the rounding of t * lo shows
    t, s = np.float64(1 + 2.0**-10), np.float64(1 + 2.0**-8 + 2.0**-10)
    lo = _bf16(s - _bf16(s))
    assert _bf16(t * lo) != t * lo


@pytest.mark.parametrize("fmt, exact", [
    ("fp4", True),  # 2-bit values, 11-bit f16 scales: 2 + 3 <= 8
    ("int4", True),  # integer codes under bf16's 128.0: 3-bit values
    ("nf4", False),  # a value table of f32 numbers
    ("uint4_zp", False),  # zero points: t - z may have up to 9 bits
])
def test_which_builtin_formats_take_the_path(fmt: str, exact: bool) -> None:
    f = md.builtin_format(fmt)
    decoder = pair_decode.PairDecoder(md.ir.Builder(), f, md.ir.BF16, stream_layout(f, CUDA).bit_order)
    assert decoder.split is exact and decoder.vector is exact
    assert not decoder.sums_scalable  # the sums are never rescaled with bf16
    f16 = pair_decode.PairDecoder(md.ir.Builder(), f, md.ir.F16, stream_layout(f, CUDA).bit_order)
    assert not f16.split


@pytest.mark.parametrize("scale, exact", [("f16", True), ("bf16", True), ("e4m3", True), ("e8m0", True),
                                          ("f32", False)])
def test_the_scale_type_decides(scale: str, exact: bool) -> None:
    fmt = Format(f"fp4_{scale}", FloatEncoding(bits=4, exp_bits=2, man_bits=1, bias=1), GroupScale(32, dtype=scale))
    assert bf16_split_exact(fmt) is exact


def test_integer_codes_need_exact_magic_subtrahends() -> None:
    # 8-bit codes do not fit under bf16's 7-bit mantissa; 7-bit ones do (128 + offset exact),
    # but their 6-bit values times an f16 scale's 3 low bits do not fit 8 bits
    assert not bf16_split_exact(Format("i8", IntEncoding(bits=8, offset=128), GroupScale(32)))
    assert significant_bits(IntEncoding(bits=7, offset=64).table()) == 6
    assert not bf16_split_exact(Format("i7", IntEncoding(bits=7, offset=64), GroupScale(32)))
    assert bf16_split_exact(Format("i7_bf16", IntEncoding(bits=7, offset=64), GroupScale(32, dtype="bf16")))
    assert bf16_split_exact(Format("i5", IntEncoding(bits=5, offset=16), GroupScale(32)))
    assert pair_decode.magic_number("f16") == 0x6400 and pair_decode.magic_number("bf16") == 0x4300


def test_a_code_with_more_significant_bits_keeps_the_scalar_path() -> None:
    # E4M3 codes (4 bits) times f16 scales (3 low bits): 7 <= 8; E2M5 (6 bits): 9 > 8
    e4m3 = Format("e4m3_g32", FloatEncoding(bits=8, exp_bits=4, man_bits=3, bias=7, specials="fn"), GroupScale(32))
    e2m5 = Format("e2m5_g32", FloatEncoding(bits=8, exp_bits=2, man_bits=5, bias=1), GroupScale(32))
    assert significant_bits(e4m3.element.table()) == 4 and bf16_split_exact(e4m3)
    assert significant_bits(e2m5.element.table()) == 6 and not bf16_split_exact(e2m5)


def _run(kernel, fmt, shape, seed: int) -> np.ndarray:
    m, n, k = shape
    rng = np.random.default_rng(seed)
    packed = pack(fmt, sample_weights(fmt, k, n, rng))
    buffers, scalars = gemm_buffers(kernel, packed, rng.standard_normal((m, k)))
    return read_output(run_kernel(kernel, buffers, scalars), m, n)


def _schedules(fmt: md.Format) -> list[Schedule]:
    wg = Schedule("wg_small", tile_m=32, tile_n=64, tile_k=stream_layout(fmt, CUDA).dense_chunk, warps_m=1,
                  warps_n=4, pipeline=Warpgroup(stages=3, depth=1))
    return [tuned_schedule(fmt, 1, CUDA, 512, 64), multistage_schedule(fmt, 64), wg]


def _split_and_scalar(monkeypatch: pytest.MonkeyPatch, fmt: md.Format, sched: Schedule):
    """The bf16 kernel on the pair path (as the lowering builds it) and on the scalar path."""
    split = compile_gemm(Gemm("split", fmt, sched, "bf16"), CUDA).kernel
    with monkeypatch.context() as patch:
        patch.setattr(pair_decode, "bf16_split_exact", lambda f: False)
        scalar = compile_gemm(Gemm("scalar", fmt, sched, "bf16"), CUDA).kernel
    return split, scalar


@pytest.mark.parametrize("fmt_name", ["fp4", "fp4_2of4", "int4", "int4_2of4"])
@pytest.mark.parametrize("pipeline", [0, 1, 2], ids=["weight_stream", "multistage", "warpgroup"])
def test_kernels_give_the_scalar_paths_bits(monkeypatch: pytest.MonkeyPatch, fmt_name: str, pipeline: int) -> None:
    fmt = md.builtin_format(fmt_name)
    sched = _schedules(fmt)[pipeline]
    shape = (3, 72, 512)
    split, scalar = _split_and_scalar(monkeypatch, fmt, sched)
    # the bits first, whatever ops either kernel holds: a changed decode shows as numbers
    y_split, y_scalar = _run(split, fmt, shape, 7), _run(scalar, fmt, shape, 7)
    assert not np.isnan(y_split.astype(np.float64)).any()
    assert np.array_equal(y_split.view(np.uint16), y_scalar.view(np.uint16))
    # then that the two paths are two programs (the pair path's fma)
    assert "fma" in {op.name for op in split.walk()}
    assert print_cuda(split).body != print_cuda(scalar).body


def _scale_rounded_to_bf16(b, t, scale, lanes):
    """A broken `mul_rounded_once`: the split scale's low half dropped, so the scale is rounded
    to bf16 before the product (two roundings instead of one)."""
    hi = b.cast(scale, md.ir.BF16, hint="sh")
    return b.binary("mul", t, scheme.splat(b, hi, lanes), hint="w2")


@pytest.mark.parametrize("fmt_name", ["fp4", "int4"])
def test_a_dropped_low_half_is_caught_by_bits_not_by_the_error_model(monkeypatch: pytest.MonkeyPatch,
                                                                    fmt_name: str) -> None:
    """Why the pair path is pinned bit for bit. Dropping the low half of the split scale adds
    one rounding of the scale to bf16 (relative error up to 2^-9, like the rounding of each
    product the error model predicts). The error model bounds a kernel's error statistically at
    1.5x what one rounding of the products to the activation type gives (checks/error_model.py,
    with a sampling allowance), and such a broken kernel measures 1.1-1.3x the correct one's
    error: inside the bound, and no bias (the scale errors change sign from group to group).
    The bit comparison with the scalar path sees it at once."""
    fmt = md.builtin_format(fmt_name)
    sched = _schedules(fmt)[0]
    correct, scalar = _split_and_scalar(monkeypatch, fmt, sched)
    monkeypatch.setattr(scheme, "mul_rounded_once", _scale_rounded_to_bf16)
    broken = compile_gemm(Gemm("broken", fmt, sched, "bf16"), CUDA).kernel
    shape = (65, 136, 1024)
    y_broken, y_scalar = _run(broken, fmt, shape, 7), _run(scalar, fmt, shape, 7)
    assert not np.array_equal(y_broken.view(np.uint16), y_scalar.view(np.uint16))  # the bits test fails
    gemm = Gemm("g", fmt, sched, "bf16")
    good = check_kernel(gemm, correct, shape, np.random.default_rng(3))
    bad = check_kernel(gemm, broken, shape, np.random.default_rng(3))
    assert good.ok and bad.ok  # the error model passes both: the statistical bound cannot tell them apart
    assert 1.05 < bad.rel_error / good.rel_error < 1.5 and bad.rel_error < bad.tolerance


def test_the_epilogue_branches_by_default() -> None:
    fmt = md.builtin_format("fp4")
    sched = warpgroup_schedule(fmt, 2048)
    assert sched.pipeline.epilogue == "branch"

    def unpredicated_stores(act: str, epilogue: str) -> int:
        s = Schedule(sched.name, tile_m=sched.tile_m, tile_n=sched.tile_n, tile_k=sched.tile_k, warps_m=1,
                     warps_n=sched.warps_n, pipeline=Warpgroup(stages=4, depth=2, epilogue=epilogue))
        body = print_cuda(compile_gemm(Gemm("e", fmt, s, act), CUDA).kernel).body
        return len(re.findall(r"^\s*y\[v_\w+\] = ", body, re.M))

    for act in ("f16", "bf16"):
        assert unpredicated_stores(act, "branch") == 128 and unpredicated_stores(act, "predicated") == 0
    with pytest.raises(ScheduleError, match="epilogue must be"):
        Schedule("bad", tile_m=256, tile_n=128, tile_k=64, warps_m=1, warps_n=8,
                 pipeline=Warpgroup(epilogue="sometimes")).check(fmt, CUDA)


@pytest.mark.sweep
@pytest.mark.skipif(find_nvcc() is None, reason="needs nvcc (CUDA toolkit) to compile the printed text")
@pytest.mark.parametrize("fmt_name", ["fp4", "int4", "uint4_zp", "nf4", "fp4_2of4"])
@pytest.mark.parametrize("act", ["f16", "bf16"])
def test_ptxas_keeps_the_tuned_wgmmas_pipelined(tmp_path, fmt_name: str, act: str) -> None:
    """The tuned warpgroup kernels: with the stores in the final wait's block ptxas
    serialised every wgmma of fp4 bf16's and uint4_zp f16's (C7514, nvcc 13.0); the branch
    keeps every one pipelined."""
    fmt = md.builtin_format(fmt_name)
    kernel = compile_gemm(Gemm("k", fmt, warpgroup_schedule(fmt, 2048), act), CUDA).kernel
    assert "serialized" not in _ptxas_report(kernel, tmp_path)
