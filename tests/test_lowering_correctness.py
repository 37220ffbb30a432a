"""End-to-end correctness of lowered GEMM kernels: the IR interpreter's output equals the
float64 reference `reference_matmul(x, packed)` on fresh random data.

Every check runs a kernel on poisoned (NaN) outputs and asserts that no element is left
unwritten and that the output passes the error model's checks (`kernel_check.check_output`). The matrix:
every built-in format x every pipeline kind, on both targets' IR (METAL 8x8x8 and CUDA
16x8x16 MMA shapes), with M = 1, 3, 65 (tail in M), N = 64 + 17 (tail in N), an odd number
of K steps; one K = 4096, group 128 problem per format x pipeline; bf16 activations;
per-column scales with K not a multiple of tile_k; block patterns with clustered zeros so that
every pattern count 0..8 occurs; the striped pipeline with parallel 1, 3, 5 and more / fewer
threadgroups than work units. Kernels run after the default pass pipeline (`compile_gemm`)
and, for a subset, straight after lowering (`stop_after='lower'`).
"""
from __future__ import annotations

import zlib
from math import lcm

import numpy as np
import pytest

import marlin_dsl as m
from marlin_dsl.formats.pack_weights import pack
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.formats import reference_matmul
from marlin_dsl.ir import Kernel
from marlin_dsl.ir.interpret import run_kernel
from marlin_dsl.checks.kernel_check import REL_TOL, check_output
from marlin_dsl.passes import DEFAULT_PIPELINE
from marlin_dsl.kernel_args import gemm_buffers, read_output
from marlin_dsl.checks.format_check import sample_weights

FORMATS = sorted(m.BUILTIN_FORMATS)
PIPELINES = {
    "double_buffered": m.DoubleBuffered(),
    "fused_dequant": m.FusedDequant(),
    "striped": m.StripedKParallel(parallel=2, groups=3),
}
TARGETS = {"metal": m.METAL, "cuda": m.CUDA}
N_TAIL = 64 + 17  # one full 64-column tile and a ragged one

_KERNELS: dict[tuple, Kernel] = {}


def rng_for(*key: object) -> np.random.Generator:
    """A generator seeded from the test's parameters: distinct data per case, reproducible."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def schedule(pipeline: str | m.StripedKParallel = "double_buffered", **tiles: int) -> m.Schedule:
    p = PIPELINES[pipeline] if isinstance(pipeline, str) else pipeline
    return m.Schedule(f"s_{p.kind}", pipeline=p, **tiles)


def kernel_for(gemm: m.Gemm, target: m.Target, stop_after: str | None = None) -> Kernel:
    """compile_gemm (default pipeline) or the IR straight out of lowering, cached per case."""
    key = (gemm.format, gemm.schedule, gemm.activation, target.name, stop_after)
    if key not in _KERNELS:
        compiled = compile_gemm(gemm, target, stop_after=stop_after)
        assert compiled.stages == ["lower", *([] if stop_after == "lower" else DEFAULT_PIPELINE)]
        assert compiled.kernel.attrs["mma"] == target.mma
        _KERNELS[key] = compiled.kernel
    return _KERNELS[key]


def run_and_check(gemm: m.Gemm, kernel: Kernel, m_: int, n: int, k: int, rng: np.random.Generator,
                  weights: np.ndarray | None = None) -> m.PackedWeights:
    """Run `kernel` on fresh random X [m, k] and W [k, n]; assert every output is written and
    close to the float64 reference of the same (rounded) X and packed W."""
    fmt = gemm.format
    w = sample_weights(fmt, k, n, rng) if weights is None else weights
    packed = pack(fmt, w)
    x = rng.standard_normal((m_, k)) * rng.uniform(0.5, 2.0)
    buffers, scalars = gemm_buffers(kernel, packed, x)
    assert np.isnan(buffers["y"]).all(), "outputs must start poisoned"
    out = run_kernel(kernel, buffers, scalars)
    y = read_output(out, m_, n).astype(np.float64)
    reference = reference_matmul(buffers["x"].astype(np.float64).reshape(m_, k), packed)
    assert np.linalg.norm(reference) > 0
    unwritten = np.argwhere(np.isnan(y))
    assert unwritten.size == 0, (
        f"{len(unwritten)} of {m_ * n} outputs never written, e.g. (row, col) "
        f"{unwritten[:5].tolist()}; rows {sorted(set(unwritten[:, 0].tolist()))[:10]}")
    assert np.isfinite(y).all()
    # the error model's checks: the norm within 1.5x of what the roundings predict, no bias,
    # no element off by more than 5% of the rms (marlin_dsl/checks/error_model.py)
    check = check_output(gemm, y, buffers["x"].astype(np.float64).reshape(m_, k), packed)
    assert check.ok, f"{(m_, n, k)}: {check.summary()}"
    if "counters" in out:  # the striped reducer leaves its arrival counters zero again
        assert not out["counters"].any(), out["counters"]
    return packed


def small_k(fmt: m.Format, tile_k: int, steps: int = 3) -> int:
    return steps * lcm(fmt.k_granule, tile_k)


# ----- every format x pipeline x target, tails in M and N, small K --------------------------


@pytest.mark.sweep
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("fmt_name", FORMATS)
def test_small_shapes_after_default_pipeline(fmt_name, pipeline, target):
    """Groups of the format's K granule (several scale groups per K step for dense formats),
    three K steps (an odd count: both double-buffer stages, uneven striped slices)."""
    probe = m.builtin_format(fmt_name)
    fmt = m.builtin_format(fmt_name, probe.k_granule)
    gemm = m.Gemm(f"{fmt_name}_{pipeline}", fmt, schedule(pipeline))
    kernel = kernel_for(gemm, TARGETS[target])
    k = small_k(fmt, gemm.schedule.tile_k)
    for rows in (1, 3, 65):
        run_and_check(gemm, kernel, rows, N_TAIL, k, rng_for(fmt_name, pipeline, target, rows))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("fmt_name", FORMATS)
def test_small_shapes_straight_after_lowering(fmt_name, pipeline, target):
    """The IR out of lowering, before any pass, already computes the GEMM (no pass is
    needed for correctness). N = 17 is narrower than one tile."""
    gemm = m.Gemm(f"{fmt_name}_{pipeline}", m.builtin_format(fmt_name, 32), schedule(pipeline))
    kernel = kernel_for(gemm, TARGETS[target], stop_after="lower")
    assert not any(op.name == "switch" for op in kernel.walk())  # really unspecialised
    k = small_k(gemm.format, gemm.schedule.tile_k, steps=2)
    run_and_check(gemm, kernel, 65, N_TAIL, k, rng_for("lower", fmt_name, pipeline, target))
    run_and_check(gemm, kernel, 3, 17, k, rng_for("lower17", fmt_name, pipeline, target))


# ----- one long K per format x pipeline -------------------------------------------------------


@pytest.mark.sweep
@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("fmt_name", FORMATS)
def test_k4096_group128(fmt_name, pipeline):
    """K = 4096 (128 K steps, 32 scale groups each spanning four steps). M alternates between
    65, 17 and 1, the target between METAL and CUDA, to cover more with 21 runs."""
    i = FORMATS.index(fmt_name) * len(PIPELINES) + list(PIPELINES).index(pipeline)
    rows = (65, 17, 1)[i % 3]
    target = (m.METAL, m.CUDA)[i % 2]
    gemm = m.Gemm(f"{fmt_name}_{pipeline}_g128", m.builtin_format(fmt_name, 128), schedule(pipeline))
    kernel = kernel_for(gemm, target)
    run_and_check(gemm, kernel, rows, N_TAIL, 4096, rng_for("k4096", fmt_name, pipeline))


# ----- bf16 activations ---------------------------------------------------------------------


@pytest.mark.parametrize("fmt_name, pipeline, target", [
    ("fp4", "double_buffered", "metal"),  # float decode in f32
    ("uint4_zp", "fused_dequant", "cuda"),  # integer codes minus zero points
    ("nf4", "striped", "metal"),  # value table
    ("int4_2of4", "double_buffered", "cuda"),  # 2:4 scatter
    ("fp4_blockpattern", "fused_dequant", "metal"),  # block patterns
])
def test_bf16_activations(fmt_name, pipeline, target):
    fmt = m.builtin_format(fmt_name, 32)
    gemm = m.Gemm(f"{fmt_name}_{pipeline}_bf16", fmt, schedule(pipeline), activation="bf16")
    for stop in (None, "lower"):
        kernel = kernel_for(gemm, TARGETS[target], stop)
        assert kernel.attrs["activation"] == "bf16"
        for rows in (1, 65):
            run_and_check(gemm, kernel, rows, N_TAIL, small_k(fmt, 32, steps=2),
                          rng_for("bf16", fmt_name, pipeline, target, stop, rows))


# ----- per-column scales and K tails --------------------------------------------------------

#: Formats with a K granule of 8 take K = 8 (less than one K step), 40 and 200 with tile_k 32;
#: the 2:4 formats (granule 32) take K = 32 and 96 with tile_k 64.
_DENSE = [f for f in FORMATS if m.builtin_format(f).k_granule == 8]
_SPARSE = [f for f in FORMATS if m.builtin_format(f).k_granule == 32]


def _k_tail_cases():
    for f in _DENSE:
        for i, p in enumerate(PIPELINES):
            yield f, p, 32, (8, 40, 200)[(i + _DENSE.index(f)) % 3]
    for f in _SPARSE:
        for i, p in enumerate(PIPELINES):
            yield f, p, 64, (32, 96)[(i + _SPARSE.index(f)) % 2]


@pytest.mark.parametrize("fmt_name, pipeline, tile_k, k", list(_k_tail_cases()))
def test_per_column_scales_with_k_tail(fmt_name, pipeline, tile_k, k):
    """group_size 'K' (one scale per column) with K not a multiple of tile_k: the last K
    step is partial and its missing positions must contribute nothing."""
    fmt = m.builtin_format(fmt_name, "K")
    assert k % tile_k and k % fmt.k_granule == 0
    sched = schedule(pipeline, tile_m=32, tile_k=tile_k)
    gemm = m.Gemm(f"{fmt_name}_{pipeline}_colscale", fmt, sched)
    target = (m.METAL, m.CUDA)[(FORMATS.index(fmt_name) + list(PIPELINES).index(pipeline)) % 2]
    kernel = kernel_for(gemm, target)
    run_and_check(gemm, kernel, 65, N_TAIL, k, rng_for("ktail", fmt_name, pipeline, target.name))


@pytest.mark.parametrize("group, k", [(8, 40), (24, 120)])
def test_grouped_scales_with_k_tail(group, k):
    """tile_k = 32 with group 8, K = 40 (the partial last K step holds one whole group) and
    group 24, K = 120 (groups straddle K steps, partial last step)."""
    fmt = m.builtin_format("uint4_zp", group)
    for i, pipeline in enumerate(PIPELINES):
        gemm = m.Gemm(f"uint4_zp_{pipeline}_g{group}", fmt, schedule(pipeline))
        target = (m.METAL, m.CUDA)[i % 2]
        run_and_check(gemm, kernel_for(gemm, target), 65, N_TAIL, k, rng_for("gtail", group, pipeline))


# ----- block patterns: every pattern count 0..8 ---------------------------------------------


def clustered_block_weights(fmt: m.Format, k: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Weights whose (8 K x 32 column) blocks keep c of their 8 K positions, c cycling
    through 0..8 over the blocks; kept rows have some zero entries but at least one clearly
    nonzero value per block, so the packed pattern has exactly c bits."""
    sp = fmt.sparsity
    w = np.zeros((k, n))
    for kb in range(k // sp.block_k):
        for nb in range(-(-n // sp.block_n)):
            cols = slice(nb * sp.block_n, min((nb + 1) * sp.block_n, n))
            width = cols.stop - cols.start
            count = (kb + 4 * nb) % (sp.block_k + 1)
            for pos in rng.choice(sp.block_k, size=count, replace=False):
                row = rng.uniform(0.5, 2.0, width) * rng.choice([-1.0, 1.0], width)
                row[rng.random(width) < 0.3] = 0.0
                row[rng.integers(width)] = rng.choice([-1.0, 1.0]) * rng.uniform(1.0, 2.0)
                w[kb * sp.block_k + pos, cols] = row
    return w


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_block_pattern_counts_0_to_8(pipeline):
    fmt = m.builtin_format("fp4_blockpattern", 64)
    k = 256
    gemm = m.Gemm(f"bp_{pipeline}", fmt, schedule(pipeline))
    for t, target in enumerate(TARGETS.values()):
        for stop in (None, "lower"):
            kernel = kernel_for(gemm, target, stop)
            if stop is None:  # the specialise pass dispatched the pattern loops on count
                switches = [op for op in kernel.walk() if op.name == "switch"]
                assert switches and all(set(range(9)) <= set(op.attrs["cases"]) for op in switches)
            rng = rng_for("bp", pipeline, target.name, stop)
            w = clustered_block_weights(fmt, k, N_TAIL, rng)
            packed = run_and_check(gemm, kernel, (65, 3)[t], N_TAIL, k, rng, weights=w)
            patterns = packed["patterns"]
            counts = np.unpackbits(patterns[..., None], axis=-1).sum(axis=-1)
            assert set(np.unique(counts).tolist()) == set(range(9)), np.bincount(counts.ravel())


# ----- striped K-parallel: parallel and group counts ----------------------------------------


@pytest.mark.parametrize("parallel, groups", [
    (1, 8),  # no K split: every unit reduces alone; 8 groups > 4 tiles
    (3, 1),  # one threadgroup walks all 12 units
    (3, 5),  # 12 units over 5 groups: 3 per group, the last group gets none
    (3, 64),  # far more groups than units
    (5, 2),  # more slices than K steps (3): some slices are empty
])
@pytest.mark.parametrize("target", TARGETS)
def test_striped_parallel_and_groups(parallel, groups, target):
    fmt = m.builtin_format("int4", 32)
    gemm = m.Gemm(f"striped_p{parallel}_g{groups}", fmt,
                  schedule(m.StripedKParallel(parallel=parallel, groups=groups)))
    kernel = kernel_for(gemm, TARGETS[target])
    assert kernel.attrs["parallel"] == parallel
    assert kernel.grid[0].evaluate({"M": 65, "N": N_TAIL, "K": 96}) == groups
    rng = rng_for("striped", parallel, groups, target)
    run_and_check(gemm, kernel, 65, N_TAIL, 96, rng)  # 2 x 2 tiles, 3 K steps
    run_and_check(gemm, kernel, 1, 17, 32, rng)  # one tile, one K step


# ----- other schedules on both targets ------------------------------------------------------


_TILINGS = [
    dict(tile_m=32, tile_n=32, tile_k=32, warps_m=2, warps_n=1),
    dict(tile_m=64, tile_n=32, tile_k=64, warps_m=4, warps_n=1),
    dict(tile_m=16, tile_n=128, tile_k=32, warps_m=1, warps_n=4),
]


@pytest.mark.parametrize("tiles", range(len(_TILINGS)))
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_other_tilings(tiles, pipeline):
    """Other tile shapes and warp layouts (1x4, 2x1, 4x1), 2:4 weights, two tiles plus a tail
    in M and N, K of several steps plus a partial one."""
    t = _TILINGS[tiles]
    fmt = m.builtin_format("fp4_2of4", 32)
    gemm = m.Gemm(f"fp4_2of4_{pipeline}", fmt, schedule(pipeline, **t))
    target = (m.METAL, m.CUDA)[(tiles + list(PIPELINES).index(pipeline)) % 2]
    kernel = kernel_for(gemm, target)
    run_and_check(gemm, kernel, 2 * t["tile_m"] + 3, t["tile_n"] + 17, 3 * t["tile_k"] + 32,
                  rng_for("tiles", tiles, pipeline, target.name))


# ----- the check itself can fail ------------------------------------------------------------


def test_check_detects_a_wrong_group_scale_and_unwritten_rows():
    """One scale group off by 2x pushes the error over REL_TOL; launching with a smaller M
    than the data leaves rows unwritten (NaN)."""
    fmt = m.builtin_format("fp4", 32)
    gemm = m.Gemm("fp4_db", fmt, schedule("double_buffered"))
    kernel = kernel_for(gemm, m.METAL)
    rng = rng_for("mutant")
    k, n, rows = 128, N_TAIL, 65
    packed = pack(fmt, sample_weights(fmt, k, n, rng))
    x = rng.standard_normal((rows, k))
    reference = reference_matmul(x.astype(np.float16).astype(np.float64), packed)
    buffers, scalars = gemm_buffers(kernel, packed, x)
    buffers["scales"] = buffers["scales"].copy()
    buffers["scales"][n:2 * n] *= 2  # group 1 of every column
    y = read_output(run_kernel(kernel, buffers, scalars), rows, n).astype(np.float64)
    assert np.linalg.norm(y - reference) / np.linalg.norm(reference) > 10 * REL_TOL["f16"]

    buffers, scalars = gemm_buffers(kernel, packed, x)
    y = read_output(run_kernel(kernel, buffers, dict(scalars, M=64)), rows, n)
    assert np.isnan(y[64]).all() and not np.isnan(y[:64]).any()
