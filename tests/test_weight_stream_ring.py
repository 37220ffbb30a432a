"""`WeightStream(stages=S)`: the weight words through a per-warp ring of shared slots filled by
asynchronous copies (lowering/parts/ring_fetch.py). Checked in the interpreter (which models
each copy as in flight until its thread's `async_wait` retires it, and fails a read before
that) against the float64 reference, with every format the stream reads, clamped and
predicated loads, unrolled loops, several vectors a step; the schedule's errors; nvcc."""
from __future__ import annotations

import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl import CUDA, METAL, Gemm, Schedule, WeightStream
from marlin_dsl.checks.kernel_check import check_kernel
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.errors import CompileError, ScheduleError
from marlin_dsl.ir.text import assert_round_trip
from marlin_dsl.layouts.weight_stream import stream_layout

RING_FORMATS = ("fp4", "int4", "uint4_zp", "nf4", "fp4_2of4", "int4_2of4")


def ring_schedule(fmt, stages: int, tile_m: int = 8, warps_n: int = 2, k_warps: int = 4, depth: int = 1,
                  unroll: int = 1, vectors: int = 1, target=CUDA) -> Schedule:
    chunk = stream_layout(fmt, target).dense_chunk
    return Schedule("ws_ring", tile_m=tile_m, tile_n=16 * warps_n, tile_k=vectors * chunk, warps_m=1,
                    warps_n=warps_n, pipeline=WeightStream(k_warps=k_warps, depth=depth, unroll=unroll,
                                                           stages=stages))


def ops_named(kernel, name: str) -> list:
    return [op for op in kernel.walk() if op.name == name]


@pytest.mark.parametrize("fmt_name", RING_FORMATS)
@pytest.mark.parametrize("act", ["f16", "bf16"])
def test_ring_kernel_matches_reference(fmt_name: str, act: str) -> None:
    fmt = md.builtin_format(fmt_name)
    gemm = Gemm(f"ring_{fmt_name}", fmt, ring_schedule(fmt, 3), act)
    kernel = compile_gemm(gemm, CUDA).kernel
    # the weight words come only from the ring: no register load of qweight is left
    assert not [op for op in kernel.walk() if op.name in ("load", "vload") and op.attrs.get("buffer") == "qweight"]
    assert {op.attrs["src"] for op in ops_named(kernel, "async_copy")} >= {"qweight"}
    rng = np.random.default_rng(21)
    k = 7 * stream_layout(fmt, CUDA).dense_chunk if fmt.scale.group_size == "K" else 7 * 256
    for shape in [(1, 33, k), (3, 40, k), (65, 49, k)]:  # M = 1, 3, 65; N tails; 7 steps over 4 warps
        result = check_kernel(gemm, kernel, shape, rng)
        assert result.untouched_poison == 0, shape
        assert result.rel_error <= result.tolerance, (shape, result.rel_error)


@pytest.mark.parametrize("stages,unroll,depth,vectors", [
    (2, 1, 1, 1), (4, 1, 1, 1), (3, 2, 1, 1), (4, 2, 2, 1), (2, 1, 1, 2), (3, 3, 1, 2)])
@pytest.mark.parametrize("fmt_name,group", [("fp4", 128), ("fp4", 32), ("fp4_2of4", 256)])
def test_ring_depths_unroll_and_tails(fmt_name: str, group: int, stages: int, unroll: int, depth: int,
                                      vectors: int) -> None:
    """Warps with 0 to 3 steps (6 or 7 steps over 4 K warps: the ring's prologue copies
    steps a warp never computes), unrolled loops and their remainders, two vectors a step;
    group 32 predicates its loads (zero-filled copies) and has a K tail."""
    if group == 32 and vectors > 1:
        pytest.skip("group 32: one vector per step")
    fmt = md.builtin_format(fmt_name, group)
    sched = ring_schedule(fmt, stages, depth=depth, unroll=unroll, vectors=vectors)
    gemm = Gemm("ring_tail", fmt, sched, "f16")
    kernel = compile_gemm(gemm, CUDA).kernel
    chunk = stream_layout(fmt, CUDA).dense_chunk
    k = 6 * sched.tile_k if group >= 128 else 7 * chunk - 32
    k = -(-k // group) * group if group >= 128 else k
    predicated = [op for op in ops_named(kernel, "async_copy") if len(op.operands) == 3]
    assert bool(predicated) == (group < 128)  # clamped copies where K is whole vectors
    waits = [int(op.attrs["pending"]) for op in ops_named(kernel, "async_wait")]
    assert waits[-1] == 0 and set(waits[:-1]) == {stages - 1}  # nothing in flight after the loop
    result = check_kernel(gemm, kernel, (3, 40, k), np.random.default_rng(stages * 100 + unroll * 10 + depth))
    assert result.ok, result


def test_ring_is_sized_per_warp_and_stage() -> None:
    fmt = md.builtin_format("fp4_2of4", 256)  # a group covers two vectors
    sched = ring_schedule(fmt, 4, warps_n=2, k_warps=4, vectors=2)
    kernel = compile_gemm(Gemm("ring_size", fmt, sched, "f16"), CUDA).kernel
    layout = stream_layout(fmt, CUDA)
    shared = {a.name: a.size for a in kernel.shared}
    warps, per_piece = 8, 2 * 1 * 32  # 8 warps; 2 vectors x 1 N tile x 32 lanes a step
    assert shared["w_ring"] == warps * 4 * per_piece * layout.code_words
    assert shared["m_ring"] == warps * 4 * per_piece * layout.meta_words


def test_ring_kernel_text_round_trips() -> None:
    fmt = md.builtin_format("fp4_2of4")
    assert_round_trip(compile_gemm(Gemm("ring_text", fmt, ring_schedule(fmt, 3), "f16"), CUDA).kernel)


def test_ring_errors_name_the_schedule() -> None:
    fmt = md.builtin_format("fp4")
    with pytest.raises(CompileError, match=r"weight ring .* over cuda's limit"):  # 64 slots of 16 warps
        compile_gemm(Gemm("ring_big", fmt, ring_schedule(fmt, 64, tile_m=16, warps_n=1, k_warps=16), "f16"), CUDA)
    for bad in (1, -2, True, 2.0):
        with pytest.raises(ScheduleError, match=r"stages must be 0 .* or at least 2"):
            ring_schedule(fmt, bad)
    with pytest.raises(ScheduleError, match="no asynchronous copies"):  # Metal: no cp.async
        compile_gemm(Gemm("ring_metal", fmt, ring_schedule(fmt, 3, target=METAL), "f16"), METAL)


@pytest.mark.slow  # an nvcc/ptxas sweep: CI runs it (-m slow)
def test_ring_kernels_compile_with_nvcc() -> None:
    from marlin_dsl.targets.cuda.nvcc import find_nvcc, nvcc_check
    from marlin_dsl.targets.cuda.printer import print_cuda

    if find_nvcc() is None:
        pytest.skip("nvcc not found: the CUDA compile check needs the CUDA toolkit")
    sources = []
    for fmt_name in ("fp4", "uint4_zp", "fp4_2of4"):
        fmt = md.builtin_format(fmt_name)
        for act in ("f16", "bf16"):
            sched = ring_schedule(fmt, 4, tile_m=16, warps_n=1, k_warps=16)
            sources.append(print_cuda(compile_gemm(Gemm(f"ring_{fmt_name}_{act}", fmt, sched, act), CUDA).kernel))
    results = nvcc_check(sources, archs=("sm_80", "sm_90"))
    failed = [r.summary() for r in results if not r.ok]
    assert not failed, "\n".join(failed)
