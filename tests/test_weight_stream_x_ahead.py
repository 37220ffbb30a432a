"""`WeightStream(x_ahead=1)`: each step's B fragments (the activations) are loaded a step ahead
and carried through the K loop (lowering/weight_stream.py, `load_b_fragments`). Checked
against the float64 reference through the interpreter with every format the stream reads,
clamped (K whole vectors) and predicated (group 32, K tail) loads, unrolled loops and their
remainders, two vectors a step, several N tiles a warp, M = 1, 3, 65 with N tails; the IR
shape (loads issued in the step before the MMAs that read them); errors; the tuned 2:4
schedules that use it; nvcc."""
from __future__ import annotations

import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl import CUDA, METAL, Gemm, Schedule, WeightStream
from marlin_dsl.checks.kernel_check import check_kernel
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.errors import ScheduleError
from marlin_dsl.ir.text import assert_round_trip
from marlin_dsl.layouts.weight_stream import stream_layout
from marlin_dsl.targets.cuda.tuning import tuned_schedule

STREAM_FORMATS = ("fp4", "int4", "uint4_zp", "nf4", "fp4_2of4", "int4_2of4")


def ahead_schedule(fmt, tile_m: int = 8, warps_n: int = 2, n_tiles: int = 1, k_warps: int = 4,
                   depth: int = 1, unroll: int = 1, vectors: int = 1, x_ahead: int = 1, target=CUDA) -> Schedule:
    chunk = stream_layout(fmt, target).dense_chunk
    return Schedule("ws_ahead", tile_m=tile_m, tile_n=16 * warps_n * n_tiles, tile_k=vectors * chunk, warps_m=1,
                    warps_n=warps_n, pipeline=WeightStream(k_warps=k_warps, depth=depth, unroll=unroll,
                                                           x_ahead=x_ahead))


def x_loads_in_loops(kernel) -> tuple[int, int]:
    """(activation loads outside any loop, inside loops) of a lowered kernel."""
    outside = inside = 0
    for op in kernel.body.ops:
        if op.name in ("load", "vload") and op.attrs.get("buffer") == "x":
            outside += 1
        for region in op.regions:
            inside += sum(1 for o in region.walk() if o.name in ("load", "vload") and o.attrs.get("buffer") == "x")
    return outside, inside


@pytest.mark.parametrize("fmt_name", STREAM_FORMATS)
@pytest.mark.parametrize("act", ["f16", "bf16"])
def test_ahead_kernel_matches_reference(fmt_name: str, act: str) -> None:
    fmt = md.builtin_format(fmt_name)
    gemm = Gemm(f"ahead_{fmt_name}", fmt, ahead_schedule(fmt, depth=2), act)
    kernel = compile_gemm(gemm, CUDA).kernel
    rng = np.random.default_rng(33)
    k = 7 * 256  # 7 or 14 vectors over 4 K warps: warps with 1 to 4 steps
    for shape in [(1, 33, k), (3, 40, k), (65, 49, k)]:  # M = 1, 3, 65; N tails
        result = check_kernel(gemm, kernel, shape, rng)
        assert result.untouched_poison == 0, shape
        assert result.rel_error <= result.tolerance, (shape, result.rel_error)


@pytest.mark.parametrize("unroll,depth,vectors,n_tiles,tile_m", [
    (1, 1, 1, 1, 8), (2, 1, 1, 1, 16), (3, 2, 1, 2, 8), (1, 2, 2, 1, 16), (2, 1, 2, 2, 8)])
@pytest.mark.parametrize("fmt_name,group", [("fp4", 128), ("fp4", 32), ("fp4_2of4", 256), ("int4_2of4", 128)])
def test_ahead_unroll_vectors_tiles_and_tails(fmt_name: str, group: int, unroll: int, depth: int, vectors: int,
                                              n_tiles: int, tile_m: int) -> None:
    """The unrolled loop and its remainder, two vectors a step, two N tiles a warp (each B
    fragment read by both), 16-row M tiles; group 32 predicates its loads and has a K tail
    (the last step's lookahead reads zeros past K, never past the buffer)."""
    fmt = md.builtin_format(fmt_name, group)
    chunk = stream_layout(fmt, CUDA).dense_chunk
    if vectors > 1 and group < 2 * chunk:
        pytest.skip("a step of two vectors needs a group covering both")
    sched = ahead_schedule(fmt, tile_m=tile_m, warps_n=1, n_tiles=n_tiles, depth=depth, unroll=unroll,
                           vectors=vectors)
    gemm = Gemm("ahead_tail", fmt, sched, "f16")
    kernel = compile_gemm(gemm, CUDA).kernel
    k = 6 * sched.tile_k if group >= 128 else 7 * chunk - 32
    k = -(-k // group) * group if group >= 128 else k
    rng = np.random.default_rng(unroll * 100 + depth * 10 + vectors)
    for shape in [(3, 40, k), (tile_m + 1, 17, k)]:
        result = check_kernel(gemm, kernel, shape, rng)
        assert result.ok, (shape, result)


@pytest.mark.parametrize("fmt_name", ["fp4", "fp4_2of4"])
def test_ahead_loads_the_first_step_before_the_loop(fmt_name: str) -> None:
    """With x_ahead the first step's activations are loaded before the K loop and every step
    loads the next one's inside it: as many loads outside the loop as one step has."""
    fmt = md.builtin_format(fmt_name)
    now = compile_gemm(Gemm("now", fmt, ahead_schedule(fmt, x_ahead=0), "f16"), CUDA).kernel
    ahead = compile_gemm(Gemm("ahead", fmt, ahead_schedule(fmt, x_ahead=1), "f16"), CUDA).kernel
    now_out, now_in = x_loads_in_loops(now)
    ahead_out, ahead_in = x_loads_in_loops(ahead)
    assert now_out == 0 and now_in > 0
    assert ahead_out == now_in and ahead_in == now_in


def test_ahead_kernel_text_round_trips() -> None:
    fmt = md.builtin_format("fp4_2of4")
    kernel = compile_gemm(Gemm("ahead_rt", fmt, ahead_schedule(fmt, unroll=2, depth=2), "f16"), CUDA).kernel
    assert_round_trip(kernel)


@pytest.mark.parametrize("bad", [2, -1, True, 1.0, "1"])
def test_ahead_errors_name_the_schedule(bad) -> None:
    fmt = md.builtin_format("fp4")
    with pytest.raises(ScheduleError, match=r"schedule 'ws_ahead': weight_stream x_ahead must be 0 .* or 1"):
        compile_gemm(Gemm("bad", fmt, ahead_schedule(fmt, x_ahead=bad), "f16"), CUDA)


def test_ahead_runs_on_metal_too() -> None:
    """Nothing in the lookahead is CUDA's: Metal's scattered 2:4 layout takes it as well."""
    fmt = md.builtin_format("fp4_2of4")
    chunk = stream_layout(fmt, METAL).dense_chunk
    sched = Schedule("ws_ahead_metal", tile_m=8, tile_n=32, tile_k=chunk, warps_m=1, warps_n=2,
                     pipeline=WeightStream(k_warps=2, depth=1, x_ahead=1))
    gemm = Gemm("ahead_metal", fmt, sched, "f16")
    kernel = compile_gemm(gemm, METAL).kernel
    result = check_kernel(gemm, kernel, (3, 40, 5 * chunk), np.random.default_rng(4))
    assert result.ok, result


@pytest.mark.parametrize("m,k,n,tile_m,tile_n,k_warps,x_shuffle", [
    (1, 4096, 4096, 8, 16, 16, 0), (8, 4096, 14336, 8, 16, 8, 0),
    (16, 14336, 4096, 16, 32, 16, 4), (12, 4096, 4096, 16, 32, 8, 4), (16, 4096, 14336, 16, 32, 8, 4)])
def test_tuned_sparse_schedules_load_activations_ahead(m: int, k: int, n: int, tile_m: int, tile_n: int,
                                                       k_warps: int, x_shuffle: int) -> None:
    """The tuned 2:4 decode schedules (bench/results/issue33_h200_2026-11-28, and run 18 of
    issue33_h200_2026-11-29 for M = 16: activation loads shared through shuffles) carry
    x_ahead, and dense formats keep theirs (x_ahead did not pay there)."""
    sched = tuned_schedule(md.builtin_format("fp4_2of4"), m, CUDA, k, n)
    p = sched.pipeline
    assert (sched.tile_m, sched.tile_n, p.k_warps, p.x_ahead, p.x_shuffle) == (tile_m, tile_n, k_warps, 1, x_shuffle)
    assert tuned_schedule(md.builtin_format("fp4"), m, CUDA, k, n).pipeline.x_ahead == 0


@pytest.mark.slow  # an nvcc/ptxas sweep: CI runs it (-m slow)
def test_ahead_kernels_compile_with_nvcc() -> None:
    from marlin_dsl.targets.cuda.nvcc import find_nvcc, nvcc_check
    from marlin_dsl.targets.cuda.printer import print_cuda

    if find_nvcc() is None:
        pytest.skip("nvcc not found: the CUDA compile check needs the CUDA toolkit")
    sources = []
    for fmt_name in ("fp4", "fp4_2of4", "int4_2of4"):
        fmt = md.builtin_format(fmt_name)
        for m in (1, 16):
            sched = ahead_schedule(fmt, tile_m=8 * (1 + (m > 8)), warps_n=1, n_tiles=1 + (m > 8), k_warps=8, depth=2)
            for act in ("f16", "bf16"):
                sources.append(print_cuda(compile_gemm(Gemm(f"ahead_{fmt_name}_{m}_{act}", fmt, sched, act), CUDA).kernel))
    results = nvcc_check(sources, archs=("sm_80", "sm_90"))
    failed = [r.summary() for r in results if not r.ok]
    assert not failed, "\n".join(failed)
