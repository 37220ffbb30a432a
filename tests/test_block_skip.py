"""Block patterns that skip (issue 33, seed 003): CUDA's skipping layout (`layouts/block_skip.py`)
and the weight stream over each block's stored vectors (`WeightStream(skip_empty=True)`,
`lowering/weight_stream_skip.py`).

- The layout: stored vectors are exactly the dense stream's vectors that hold a non-zero (and
  a block with none keeps one), in block and K order; what it leaves out decodes to zeros.
- The kernel in the IR interpreter against the float64 reference: M = 1, 3, 16, 65, N tails,
  a block with no non-zero, blocks with fewer stored vectors than K warps, f16 and bf16,
  depth 1 and 2, one and two N tiles a block; clustered 50% and 75%, random 50% (nothing
  skipped) and dense weights.
- The tables matter: a kernel fed a shifted `vec_k` or `vec_start` fails the check.
- The loop's trip count is the block's count of stored vectors (read from `vec_start`).
- Errors name the schedule and what to change.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl import CUDA, METAL, BlockPatternSparsity, FloatEncoding, Format, Gemm, GroupScale, Schedule, WeightStream
from marlin_dsl.checks.format_check import clustered_mask
from marlin_dsl.checks.kernel_check import check_output, run_kernel
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.errors import ScheduleError
from marlin_dsl.formats.evaluate import dequantize
from marlin_dsl.ir.text import assert_round_trip
from marlin_dsl.kernel_args import gemm_buffers, read_output
from marlin_dsl.layouts.block_skip import skip_arrays, skip_layout, stored_fraction
from marlin_dsl.layouts.weight_stream import stream_arrays

FP4_BLOCKS = Format("fp4_blocks_g128", FloatEncoding(bits=4, exp_bits=2, man_bits=1, bias=1), GroupScale(128),
                    sparsity=BlockPatternSparsity(block_k=8, block_n=32))
FP4_BLOCKS_16 = Format("fp4_blocks16_g128", FloatEncoding(bits=4, exp_bits=2, man_bits=1, bias=1), GroupScale(128),
                       sparsity=BlockPatternSparsity(block_k=8, block_n=16))


def skip_schedule(rows: int = 32, tile_m: int = 8, warps_n: int = 1, k_warps: int = 4, depth: int = 2,
                  **pipeline) -> Schedule:
    """`rows` N rows a warp (the block's 32, or 16: two warps or threadgroups share a block)."""
    return Schedule("skip", tile_m=tile_m, tile_n=rows * warps_n, tile_k=64, warps_m=1, warps_n=warps_n,
                    pipeline=WeightStream(k_warps=k_warps, depth=depth, skip_empty=True, **pipeline))


def sparse_weights(k: int, n: int, rng: np.random.Generator, kind: str, block_n: int = 32) -> np.ndarray:
    """Normal weights with clustered zeros (runs of 64 K x block_n columns zeroed: 50% or
    75%, and the first block zero throughout), random 50% zeros, or none."""
    w = rng.standard_normal((k, n))
    if kind == "clustered50":
        w[clustered_mask(k, n, rng, 64, block_n, keep=0.5, empty_block=True)] = 0.0
    elif kind == "clustered75":
        w[clustered_mask(k, n, rng, 64, block_n, keep=0.25)] = 0.0
    elif kind == "random50":
        w[rng.random((k, n)) < 0.5] = 0.0
    return w


def run_skip(gemm: Gemm, kernel, packed, x: np.ndarray, tamper=None):
    buffers, scalars = gemm_buffers(kernel, packed, x)
    if tamper is not None:
        tamper(buffers)
    out = run_kernel(kernel, buffers, scalars)
    m, n = x.shape[0], packed.shape[1]
    y = read_output(out, m, n).astype(np.float64)
    return check_output(gemm, y, buffers["x"].astype(np.float64).reshape(m, -1), packed)


# ----- the layout -------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", [FP4_BLOCKS, FP4_BLOCKS_16])
@pytest.mark.parametrize("k,n", [(512, 64), (768, 70), (1024, 33)])
def test_stored_vectors_are_the_nonempty_dense_ones(fmt: Format, k: int, n: int) -> None:
    rng = np.random.default_rng(k + n)
    block_n = fmt.sparsity.block_n
    packed = md.pack(fmt, sparse_weights(k, n, rng, "clustered50", block_n))
    layout = skip_layout(fmt, CUDA)
    st = layout.stream
    dense = stream_arrays(fmt, CUDA, packed)["qweight"]
    arrays = skip_arrays(fmt, CUDA, packed)
    start, vec_k = arrays["vec_start"], arrays["vec_k"]
    nb, kv, bt = layout.blocks(n), layout.vectors(k), layout.block_tiles
    assert start.dtype == np.uint32 and vec_k.dtype == np.uint32 and start.shape == (nb + 1,)
    counts = np.diff(start.astype(np.int64))
    assert (counts >= 1).all() and start[-1] == vec_k.size  # every block keeps a vector
    words = dense.reshape(-1, kv, st.lanes, st.code_words)
    stored = arrays["qweight"].reshape(-1, bt, st.lanes, st.code_words)
    assert stored.shape[0] == vec_k.size
    # the weights' zeros, per (block, K vector): what may be left out
    w = dequantize(packed)
    padded = np.zeros((kv * st.chunk, nb * layout.block_rows))
    padded[:k, :n] = w
    nonzero = (padded.reshape(kv, st.chunk, nb, layout.block_rows) != 0).any(axis=(1, 3)).T  # [nb, kv]
    for b in range(nb):
        ks = vec_k[start[b]:start[b + 1]]
        assert (np.diff(ks.astype(np.int64)) > 0).all()  # K order
        expect = np.flatnonzero(nonzero[b])
        assert list(ks) == (list(expect) if expect.size else [0])
        for i, kv_ in enumerate(ks):  # the stored vector is the dense stream's, tile by tile
            for t in range(bt):
                tile = b * bt + t
                want = words[tile, kv_] if tile < words.shape[0] else 0
                np.testing.assert_array_equal(stored[start[b] + i, t], want)
    assert stored_fraction(fmt, CUDA, packed) == pytest.approx(vec_k.size / (nb * kv))


def test_random_sparsity_stores_everything_and_dense_weights_too() -> None:
    rng = np.random.default_rng(5)
    for kind in ("random50", "dense"):
        packed = md.pack(FP4_BLOCKS, sparse_weights(1024, 96, rng, kind))
        assert stored_fraction(FP4_BLOCKS, CUDA, packed) == 1.0, kind


# ----- the kernel -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["clustered50", "clustered75", "random50", "dense"])
@pytest.mark.parametrize("act", ["f16", "bf16"])
def test_skip_kernel_matches_reference(kind: str, act: str) -> None:
    gemm = Gemm("skip_fp4", FP4_BLOCKS, skip_schedule(k_warps=4, depth=2), act)
    kernel = compile_gemm(gemm, CUDA).kernel
    rng = np.random.default_rng(hash(kind) % 1000)
    for m, n, k in [(1, 70, 1024), (3, 96, 512), (16, 33, 768), (65, 40, 256)]:
        packed = md.pack(FP4_BLOCKS, sparse_weights(k, n, rng, kind))
        res = run_skip(gemm, kernel, packed, rng.standard_normal((m, k)))
        assert res.untouched == 0 and res.ok, (kind, m, n, k, res)


@pytest.mark.parametrize("fmt,rows,tile_m,warps_n,k_warps,depth", [
    (FP4_BLOCKS, 32, 16, 1, 8, 1), (FP4_BLOCKS, 32, 8, 2, 2, 3), (FP4_BLOCKS_16, 16, 8, 2, 4, 2),
    (FP4_BLOCKS_16, 16, 16, 4, 1, 1), (FP4_BLOCKS, 16, 8, 1, 8, 2), (FP4_BLOCKS, 16, 16, 3, 4, 2)])
def test_skip_kernel_schedules(fmt: Format, rows: int, tile_m: int, warps_n: int, k_warps: int, depth: int) -> None:
    """16-row M tiles, several warps (blocks) a threadgroup, 1 to 8 K warps (more K warps than
    a block has stored vectors), prefetch depth 1 to 3, blocks of one N tile, warps that own
    half a block (the block's two halves in two threadgroups, or in two warps of one, or a
    threadgroup of three warps straddling blocks)."""
    sched = skip_schedule(rows, tile_m=tile_m, warps_n=warps_n, k_warps=k_warps, depth=depth)
    gemm = Gemm("skip_sched", fmt, sched, "f16")
    kernel = compile_gemm(gemm, CUDA).kernel
    rng = np.random.default_rng(tile_m * 100 + k_warps * 10 + depth)
    for m, n, k in [(1, 100, 640), (tile_m + 3, 47, 384)]:
        packed = md.pack(fmt, sparse_weights(k, n, rng, "clustered75", fmt.sparsity.block_n))
        res = run_skip(gemm, kernel, packed, rng.standard_normal((m, k)))
        assert res.untouched == 0 and res.ok, (m, n, k, res)


@pytest.mark.parametrize("unroll,depth,k_warps", [(2, 2, 4), (2, 1, 8), (3, 2, 2), (4, 4, 2)])
def test_unrolled_skip_kernel(unroll: int, depth: int, k_warps: int) -> None:
    """`unroll` steps an iteration, then the block's remaining stored vectors in a second loop:
    blocks whose counts are below, at and above unroll x k_warps (clustered 75%: 0-16 of 16
    vectors; an empty block keeps one), and dense blocks."""
    gemm = Gemm("skip_unrolled", FP4_BLOCKS, skip_schedule(16, tile_m=16, k_warps=k_warps, depth=depth,
                                                           unroll=unroll), "f16")
    kernel = compile_gemm(gemm, CUDA).kernel
    assert len([op for op in kernel.walk() if op.name == "for"]) == 2  # unrolled, then the rest
    rng = np.random.default_rng(unroll * 100 + depth * 10 + k_warps)
    for kind, (m, n, k) in [("clustered75", (1, 100, 1024)), ("clustered50", (19, 47, 640)), ("dense", (3, 64, 384))]:
        packed = md.pack(FP4_BLOCKS, sparse_weights(k, n, rng, kind))
        res = run_skip(gemm, kernel, packed, rng.standard_normal((m, k)))
        assert res.untouched == 0 and res.ok, (kind, m, n, k, res)


@pytest.mark.parametrize("table", ["vec_k", "vec_start"])
def test_kernel_reads_the_tables(table: str) -> None:
    """A shifted table (each stored vector's K off by one vector, or the blocks' starts moved)
    gives a wrong product: the check sees the tables, so the passes above mean something."""
    gemm = Gemm("skip_fp4", FP4_BLOCKS, skip_schedule(), "f16")
    kernel = compile_gemm(gemm, CUDA).kernel
    rng = np.random.default_rng(7)
    k, n = 1024, 96
    packed = md.pack(FP4_BLOCKS, sparse_weights(k, n, rng, "clustered50"))
    x = rng.standard_normal((3, k))
    assert run_skip(gemm, kernel, packed, x).ok

    def tamper(buffers: dict) -> None:
        if table == "vec_k":
            buffers["vec_k"] = (buffers["vec_k"] + 1) % (k // 64)
        else:
            buffers["vec_start"][1:-1] += 1

    assert not run_skip(gemm, kernel, packed, x, tamper).ok


def test_loop_runs_over_the_blocks_stored_vectors() -> None:
    """The K loop's bounds are loads of vec_start (the block's count, not K), the kernel reads
    the skipping layout, and its text round-trips."""
    kernel = compile_gemm(Gemm("skip_fp4", FP4_BLOCKS, skip_schedule(), "f16"), CUDA).kernel
    assert kernel.attrs["weight_layout"] == CUDA.skip_layout
    assert [b.name for b in kernel.buffers][:6] == ["x", "qweight", "scales", "patterns", "vec_start", "vec_k"]
    loads = {op.results[0]: op for op in kernel.walk() if op.name == "load"}
    loops = [op for op in kernel.walk() if op.name == "for"]
    assert len(loops) == 1
    begin, end = loops[0].operands[:2]
    assert loads[end].attrs["buffer"] == "vec_start"
    assert any(op.name == "load" and op.attrs["buffer"] == "vec_k" for op in loops[0].regions[0].walk())
    assert_round_trip(kernel)


# ----- errors -----------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt,sched,target,message", [
    (md.builtin_format("fp4"), skip_schedule(), CUDA, r"format 'fp4' has no block patterns"),
    (FP4_BLOCKS, skip_schedule(), METAL, r"target 'metal' has no block-skipping weight layout"),
    (FP4_BLOCKS, dataclasses.replace(skip_schedule(), tile_n=64), CUDA,
     r"N rows of one block of format 'fp4_blocks_g128' \(32 N rows\): tile_n / warps_n is 64, which does "
     r"not divide 32"),
    (FP4_BLOCKS, dataclasses.replace(skip_schedule(), tile_k=128), CUDA, r"set tile_k=64, not 128"),
    (FP4_BLOCKS, skip_schedule(x_ahead=1), CUDA, r"does not take x_ahead=1"),
    (FP4_BLOCKS, skip_schedule(stages=2), CUDA, r"does not take stages=2"),
    (dataclasses.replace(FP4_BLOCKS, name="fp4_blocks_g32", scale=GroupScale(32)), skip_schedule(), CUDA,
     r"scale groups of whole vectors \(64 K\); format 'fp4_blocks_g32' has group_size 32"),
])
def test_skip_errors_name_the_schedule(fmt, sched, target, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        compile_gemm(Gemm("bad_skip", fmt, sched, "f16"), target)


def test_skip_empty_must_be_a_bool() -> None:
    with pytest.raises(ScheduleError, match=r"schedule 'skip': weight_stream skip_empty must be True or False, got 1"):
        skip_schedule(skip_empty=1) if False else Schedule(
            "skip", tile_m=8, tile_n=32, tile_k=64, warps_m=1, warps_n=1,
            pipeline=WeightStream(skip_empty=1))  # type: ignore[arg-type]


def test_error_model_takes_zero_columns() -> None:
    """A block-sparse weight with whole zero columns gives outputs that are exactly 0: the
    error model weighs them 0 (they say nothing about the slope) instead of 1e300, which
    overflowed to NaN bounds that failed correct kernels (found by the clustered weights)."""
    import warnings

    from marlin_dsl.checks.error_model import compare

    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 256)).astype(np.float16).astype(np.float64)
    w = rng.standard_normal((256, 40))
    w[:, :32] = 0.0
    ref = x @ w
    y = ref.astype(np.float16).astype(np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow or invalid-value warnings
        good = compare(y, ref, x, w, "f16")
    assert good.ok and np.isfinite(good.bias_range).all()
    bad = y.copy()
    bad[:, 32:] *= 1.01  # a 1% slope on the columns that are not zero
    assert not compare(bad, ref, x, w, "f16").ok


def test_blocks_of_512_threads_or_more_are_register_bounded() -> None:
    """A 1024-thread stream (32 K warps) compiled to 70 registers a thread and did not launch
    on the H200 (run 5b: MLX left the poisoned output); so did a 512-thread one at 132 (issue
    35). From 512 threads the kernel is printed with `__launch_bounds__(threads, 1)` and
    launched precompiled (MLX's cuda_kernel writes its own signature, without it); ptxas then
    keeps it to 64 registers. A 256-thread block is not bounded. The CPU harness runs the
    bounded text."""
    import re
    import tempfile

    from marlin_dsl.targets.cuda.cpu_harness import cuda_cpu_executor, find_compiler
    from marlin_dsl.targets.cuda.launch import gemm_inout_inputs
    from marlin_dsl.targets.cuda.launch_precompiled import launch_path
    from marlin_dsl.targets.cuda.nvcc import NVCC_FLAGS, find_nvcc, nvcc_check
    from marlin_dsl.targets.cuda.printer import print_cuda

    gemm = Gemm("skip_kw32", FP4_BLOCKS, skip_schedule(k_warps=32), "f16")
    kernel = compile_gemm(gemm, CUDA).kernel
    src = print_cuda(kernel, inout_inputs=gemm_inout_inputs(kernel))
    assert kernel.threads == 1024 and "__launch_bounds__(1024, 1)" in src.full_source()
    assert launch_path(src) == "precompiled"
    half = compile_gemm(Gemm("skip_kw16", FP4_BLOCKS, skip_schedule(k_warps=16), "f16"), CUDA).kernel
    half_src = print_cuda(half, inout_inputs=gemm_inout_inputs(half))
    assert half.threads == 512 and "__launch_bounds__(512, 1)" in half_src.full_source()
    small = compile_gemm(Gemm("skip_kw8", FP4_BLOCKS, skip_schedule(k_warps=8), "f16"), CUDA).kernel
    small_src = print_cuda(small, inout_inputs=gemm_inout_inputs(small))
    assert small.threads == 256 and "__launch_bounds__" not in small_src.full_source()
    assert launch_path(small_src) == "cuda_kernel"
    if find_nvcc() is not None:
        res = nvcc_check([src], archs=["sm_90"], flags=NVCC_FLAGS + ("--resource-usage",),
                         cache_dir=tempfile.mkdtemp())[0]
        assert res.ok, res.log
        used = [int(n) for n in re.findall(r"Used (\d+) registers", res.log)]
        assert used and max(used) <= 64, res.log
    if find_compiler() is not None:
        rng = np.random.default_rng(32)
        packed = md.pack(FP4_BLOCKS, sparse_weights(2048, 40, rng, "clustered50"))
        x = rng.standard_normal((3, 2048))
        buffers, scalars = gemm_buffers(kernel, packed, x)
        out = cuda_cpu_executor(seed=1)(kernel, buffers, scalars)
        y = read_output(out, 3, 40).astype(np.float64)
        res = check_output(gemm, y, buffers["x"].astype(np.float64).reshape(3, -1), packed)
        assert res.untouched == 0 and res.ok, res


def test_cost_model_counts_the_stored_share() -> None:
    """The cost model reads a skipping kernel's bytes at the stored share of the stream (and
    one vec_k entry per stored vector); the same kernel at share 1 costs what the dense stream
    reads plus the table. On the H200 its bytes matched ncu's DRAM bytes within 0.1% where
    nothing was skipped (bench/results/issue33_h200_2026-11-28, run 7)."""
    from marlin_dsl.cost.model import kernel_storage

    fmt = md.builtin_format("fp4_blockpattern")
    skip = compile_gemm(Gemm("skip", fmt, skip_schedule(rows=16), "f16"), CUDA).kernel
    dense = compile_gemm(Gemm("dense", fmt, dataclasses.replace(
        skip_schedule(rows=16), pipeline=WeightStream(k_warps=4, depth=2)), "f16"), CUDA).kernel
    full, half = kernel_storage(skip, fmt, 1.0), kernel_storage(skip, fmt, 0.5)
    plain = kernel_storage(dense, fmt)
    assert "patterns" not in full and "patterns" not in plain  # neither kernel reads them
    assert full["qweight"] == plain["qweight"] and half["qweight"] == plain["qweight"] / 2
    assert full["vec_k"] == pytest.approx(4 / (64 * 32)) and half["vec_k"] == full["vec_k"] / 2
    assert half["scales"] == full["scales"] == plain["scales"]


# ----- the layers' schedules ----------------------------------------------------------------------

@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("k", [640, 8192])
def test_tuned_skip_schedules(m: int, k: int) -> None:
    """`tuning.skip_schedule` (what layers run for decode rows): 8 K warps below 128 vectors,
    16 from there (K = 8192), unrolled by 2, checked in the interpreter at M rows; beyond 16
    rows it is an error that says so."""
    from marlin_dsl.targets.cuda.tuning import SKIP_MAX_M, skip_schedule

    fmt = md.builtin_format("fp4_blockpattern")
    sched = skip_schedule(fmt, m, CUDA, k)
    assert sched.pipeline.skip_empty and sched.pipeline.unroll == 2
    assert sched.pipeline.k_warps == (16 if k >= 8192 else 8)
    gemm = Gemm(f"skip_tuned_m{m}", fmt, sched, "f16")
    kernel = compile_gemm(gemm, CUDA).kernel
    rng = np.random.default_rng(m + k)
    packed = md.pack(fmt, sparse_weights(k, 40, rng, "clustered50"))
    res = run_skip(gemm, kernel, packed, rng.standard_normal((m, k)))
    assert res.untouched == 0 and res.ok, res
    with pytest.raises(ScheduleError, match=f"serves up to {SKIP_MAX_M}"):
        skip_schedule(fmt, SKIP_MAX_M + 1, CUDA, k)
