"""Schedules: seed 002's 64x64x32 tile with 4 simdgroups (erratum 4), and schedule errors that
point at the line of the Schedule declaration."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import marlin_dsl as m
from marlin_dsl.formats.pack_weights import pack
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.errors import CompileError, ScheduleError
from marlin_dsl.formats import reference_matmul
from marlin_dsl.ir.interpret import run_kernel
from marlin_dsl.checks.kernel_check import REL_TOL
from marlin_dsl.kernel_args import gemm_buffers, read_output
from marlin_dsl.checks.format_check import sample_weights


def declared_here() -> int:
    """The caller's current line: `s, line = Schedule(...), declared_here()` on one line."""
    return sys._getframe(1).f_lineno


SEED002, SEED002_LINE = m.Schedule("seed002_64x64x32", tile_m=64, tile_n=64, tile_k=32, warps_m=2, warps_n=2), declared_here()

PIPELINES = [m.DoubleBuffered(), m.FusedDequant(), m.StripedKParallel(parallel=2, groups=3)]


# ----- seed 002 / erratum 4 ------------------------------------------------------------------


def test_seed002_schedule_declaration():
    assert (SEED002.tile_m, SEED002.tile_n, SEED002.tile_k) == (64, 64, 32)
    assert SEED002.warps == 4 and SEED002.threads(m.METAL) == 128
    assert SEED002.location.line == SEED002_LINE
    assert Path(SEED002.location.file).resolve() == Path(__file__).resolve()


def test_seed002_each_simdgroup_owns_4x4_mma_tiles_on_metal():
    """Erratum 4: a 64x64 tile over 2x2 simdgroups gives each a 32x32 warp tile, i.e. a 4x4
    grid of 8x8 MMA tiles (seed 002's 2x4 would cover only 32x64 outputs)."""
    assert SEED002.warp_tile == (32, 32)
    assert SEED002.mma_grid(m.METAL) == (4, 4) != (2, 4)
    assert SEED002.k_substeps(m.METAL) == 4
    rows, cols = SEED002.mma_grid(m.METAL)
    covered = SEED002.warps * rows * cols * m.METAL.mma_m * m.METAL.mma_n
    assert covered == SEED002.tile_m * SEED002.tile_n
    # CUDA's m16n8k16 covers the same warp tile with 2x4 tiles.
    assert SEED002.mma_grid(m.CUDA) == (2, 4)


@pytest.mark.parametrize("pipeline", PIPELINES, ids=lambda p: p.kind)
def test_seed002_kernel_has_16_accumulators_per_simdgroup(pipeline):
    """The lowered kernel (before any pass) keeps 16 8x8 f32 accumulators per simdgroup in its
    K loop and runs 16 MMAs per K sub-step."""
    sched = m.Schedule("seed002", tile_m=64, tile_n=64, tile_k=32, warps_m=2, warps_n=2, pipeline=pipeline)
    gemm = m.Gemm("seed002_fp4", m.builtin_format("fp4"), sched)
    kernel = compile_gemm(gemm, m.METAL, stop_after="lower").kernel
    assert kernel.threads == 128 and kernel.attrs["mma"] == (8, 8, 8)
    carrying = [op for op in kernel.walk() if op.name == "for" and op.results]
    assert len(carrying) == 2, "the K loop and its MMA sub-step loop carry the accumulators"
    for loop in carrying:
        assert len(loop.results) == 16
        assert all(str(r.type) == "frag<c, f32, 8x8>" for r in loop.results), loop.results[0].type
    mmas = [op for op in kernel.walk() if op.name == "mma"]
    assert len(mmas) == 16


@pytest.mark.parametrize("stop_after", [None, "lower"])
@pytest.mark.parametrize("pipeline", PIPELINES, ids=lambda p: p.kind)
def test_seed002_computes_every_row_of_its_tile(pipeline, stop_after):
    """M = 64, N = 64: a single threadgroup; all 64 rows (and columns) are written and each
    row matches the float64 reference."""
    sched = m.Schedule("seed002", tile_m=64, tile_n=64, tile_k=32, warps_m=2, warps_n=2, pipeline=pipeline)
    fmt = m.builtin_format("fp4", 32)
    gemm = m.Gemm("seed002_fp4", fmt, sched)
    kernel = compile_gemm(gemm, m.METAL, stop_after=stop_after).kernel
    rows, n, k = 64, 64, 128
    rng = np.random.default_rng(2002 + len(pipeline.kind) + (stop_after is None))
    packed = pack(fmt, sample_weights(fmt, k, n, rng))
    x = rng.standard_normal((rows, k))
    buffers, scalars = gemm_buffers(kernel, packed, x)
    if pipeline.kind != "striped":
        grid = [d.evaluate(scalars) for d in kernel.grid]
        assert grid == [1, 1, 1]
    y = read_output(run_kernel(kernel, buffers, scalars), rows, n).astype(np.float64)
    reference = reference_matmul(buffers["x"].astype(np.float64).reshape(rows, k), packed)
    unwritten_rows = sorted(set(np.argwhere(np.isnan(y))[:, 0].tolist()))
    assert unwritten_rows == [], f"rows never written: {unwritten_rows}"
    row_err = np.linalg.norm(y - reference, axis=1) / np.linalg.norm(reference, axis=1)
    bad = np.flatnonzero(row_err >= 4 * REL_TOL["f16"])
    assert bad.size == 0, f"wrong rows {bad.tolist()}: errors {row_err[bad]}"
    assert np.linalg.norm(y - reference) / np.linalg.norm(reference) < REL_TOL["f16"]


# ----- schedule errors point at the Schedule's line ------------------------------------------


def assert_located(err: Exception, line: int, *phrases: str) -> None:
    """The error's message starts with this file's path and `line` (the declaration)."""
    loc = err.location
    assert loc is not None and loc.line == line
    assert Path(loc.file).resolve() == Path(__file__).resolve()
    assert str(err).startswith(f"{__file__}:{line}: "), (str(err), __file__)
    for phrase in phrases:
        assert phrase in str(err), (phrase, str(err))


def test_tile_k_not_a_multiple_of_the_format_granule():
    fmt = m.builtin_format("fp4_2of4", 32)  # K granule 32 (one metadata word)
    assert fmt.k_granule == 32
    sched, line = m.Schedule("k16", tile_k=16), declared_here()
    with pytest.raises((ScheduleError, CompileError)) as info:
        compile_gemm(m.Gemm("g", fmt, sched), m.METAL)
    assert_located(info.value, line, "tile_k=16", "granule 32")
    # The same tile_k is fine for a dense format (granule 8).
    compile_gemm(m.Gemm("g", m.builtin_format("fp4", 32), sched), m.METAL, stop_after="lower")


def test_warp_tile_not_a_multiple_of_the_mma_tile():
    fmt = m.builtin_format("int4", 32)
    sched, line = m.Schedule("m36", tile_m=36, warps_m=2), declared_here()  # warp tile 18 rows
    with pytest.raises((ScheduleError, CompileError)) as info:
        compile_gemm(m.Gemm("g", fmt, sched), m.METAL)
    assert_located(info.value, line, "18x32", "8x8")
    # 8-row warp tiles fit Metal's 8x8 MMA but not CUDA's m16n8k16.
    sched, line = m.Schedule("m8", tile_m=32, warps_m=4, warps_n=1), declared_here()
    compile_gemm(m.Gemm("g", fmt, sched), m.METAL, stop_after="lower")
    with pytest.raises((ScheduleError, CompileError)) as info:
        compile_gemm(m.Gemm("g", fmt, sched), m.CUDA)
    assert_located(info.value, line, "8x64", "16x8")


@pytest.mark.parametrize("target", [m.METAL, m.CUDA], ids=lambda t: t.name)
def test_more_than_1024_threads(target):
    fmt = m.builtin_format("fp4", 32)
    sched, line = m.Schedule("t2048", tile_m=128, tile_n=64, warps_m=8, warps_n=8), declared_here()
    assert sched.threads(target) == 2048
    with pytest.raises((ScheduleError, CompileError)) as info:
        compile_gemm(m.Gemm("g", fmt, sched), target)
    assert_located(info.value, line, "2048 threads", "1024")


def test_threadgroup_memory_over_32kb_on_metal():
    """Double-buffered 64x64x64 needs 2*64*64 (A) + 2*64*64 (B) + 64*64 (C) halves = 40 KB:
    over Metal's 32 KB, within CUDA's 48 KB."""
    fmt = m.builtin_format("fp4", 64)
    sched, line = m.Schedule("k64", tile_k=64), declared_here()
    with pytest.raises((ScheduleError, CompileError)) as info:
        compile_gemm(m.Gemm("g", fmt, sched), m.METAL)
    assert_located(info.value, line, "40960 bytes", "32768")
    kernel = compile_gemm(m.Gemm("g", fmt, sched), m.CUDA, stop_after="lower").kernel
    assert kernel.shared_bytes == 40960


# ----- Y's columns as several outputs (Gemm.outputs) ---------------------------------------------


def test_outputs_errors_name_the_gemm_and_line():
    fmt = m.builtin_format("fp4")
    stream = m.tuned_schedule(fmt, 1)
    for bad in ((64,), (32, 0), (32, True), [32, 32], (32, 2.0)):
        line = declared_here() + 2
        with pytest.raises(ScheduleError, match=r"gemm 'g': outputs must be a tuple of two or more") as err:
            m.Gemm("g", fmt, stream, outputs=bad)
        assert err.value.location.line == line
    with pytest.raises(ScheduleError, match=r"outputs \(32, 32\): the multistage pipeline .* writes one "
                                            r"output; only weight_stream writes parts"):
        m.Gemm("g", fmt, m.multistage_schedule(fmt, 256), outputs=(32, 32))


@pytest.mark.parametrize("fname, act, widths", [("fp4", "f16", (40, 9, 15)), ("int4", "bf16", (17, 16)),
                                                ("uint4_zp", "f16", (8, 8, 8, 8)), ("fp4_2of4", "bf16", (33, 16))])
def test_outputs_hold_their_columns_of_y(fname, act, widths):
    """The interpreter runs a weight-stream kernel whose Y comes out as parts (NaN-poisoned,
    every part's own buffer) against the float64 reference of the whole Y, at M = 1, 3, 65."""
    from marlin_dsl.checks.kernel_check import check_kernel, check_shapes

    fmt = m.builtin_format(fname)
    for rows in (1, 16):
        gemm = m.Gemm(f"parts_{fname}", fmt, m.tuned_schedule(fmt, rows), act, outputs=widths)
        kernel = compile_gemm(gemm, m.CUDA).kernel
        assert [b.name for b in kernel.buffers if b.access == "write"] == [f"y{i}" for i in range(len(widths))]
        rng = np.random.default_rng(rows)
        for shape in check_shapes(gemm):
            result = check_kernel(gemm, kernel, shape, rng)
            assert result.untouched_poison == 0 and result.ok, (shape, result.summary())


def test_outputs_must_add_up_to_n():
    fmt = m.builtin_format("fp4")
    gemm = m.Gemm("parts", fmt, m.tuned_schedule(fmt, 1), outputs=(32, 32))
    kernel = compile_gemm(gemm, m.CUDA).kernel
    packed = pack(fmt, sample_weights(fmt, 256, 48, np.random.default_rng(0)))
    with pytest.raises(m.ShapeError, match=r"N=48, but kernel 'parts' writes outputs of \[32, 32\] columns \(N=64\)"):
        gemm_buffers(kernel, packed, np.ones((1, 256)))
