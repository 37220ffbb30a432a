"""Issue 16: the multistage pipeline on Metal (large M), staged through registers because Metal
has no asynchronous copies (`parts/register_stages.py`). The exact emitted .metal text runs on
the CPU harness for every example format the stream layout takes (f16 and bf16, M = 33, 65,
129, 257, N and K tails, outputs NaN-poisoned) against the float64 reference under the error
model and bit for bit against the interpreter (which also race-checks threadgroup memory); a
removed barrier is caught; the cost model shows why `tuned_schedule` picks the pipeline above
32 rows; the stage counts register staging takes; a CUDA-like target without asynchronous
copies runs the same part (2:4 metadata included) in the interpreter."""
from __future__ import annotations

import dataclasses
from functools import partial

import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl import CUDA, METAL, DoubleBuffered, FusedDequant, Gemm, Multistage, Schedule
from marlin_dsl.checks.error_model import compare, kernel_weights
from marlin_dsl.checks.format_check import sample_weights
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.cost.model import kernel_cost
from marlin_dsl.errors import ScheduleError
from marlin_dsl.ir import Block, Kernel, verify
from marlin_dsl.ir.interpret import InterpreterError, run_kernel
from marlin_dsl.kernel_args import gemm_buffers, read_output
from marlin_dsl.layouts.weight_stream import stream_layout
from marlin_dsl.targets.metal.cpu_harness import MetalCPUError, compile_metal, find_compiler
from marlin_dsl.machine.metal import STREAM_LAYOUT
from marlin_dsl.targets.metal.printer import print_metal
from marlin_dsl.targets.metal.runtime import RUNTIME
from marlin_dsl.targets.metal.tuning import MULTISTAGE_MIN_M

from lazy_builds import LazyBuilds
from kernel_asserts import assert_matches
from test_metal_stream import EXAMPLE_FORMATS, STREAMED

needs_gxx = pytest.mark.skipif(
    find_compiler() is None,
    reason="g++ is not installed: the Metal CPU harness compiles the emitted Metal as C++20 with it")

ACTIVATIONS = ("f16", "bf16")


def _k_tail(fmt: md.Format) -> int:
    """A K that is not a whole number of 128-position steps where the scale group allows it
    (groups of 32 and 64: 96 and 192), else three steps."""
    g = fmt.scale.group_size
    unit = 128 if g == "K" else int(g)
    return 3 * unit if 128 % (3 * unit) else 5 * unit


def _shapes(fmt: md.Format) -> list[tuple[int, int, int]]:
    """(M, N, K): M = 33 (one 64-row tile, mostly rows past M), 65, 129, 257 (a row past
    whole tiles); N tails (not multiples of 128); K tails where the group allows."""
    k_tail = _k_tail(fmt)
    step = fmt.k_multiple  # a super-block (GGUF k-quants: 256) allows no shorter K
    return [(m, n, -(-k // step) * step) for m, n, k in ((33, 200, k_tail), (65, 136, 256), (129, 72, k_tail),
                                                         (257, 40, 384))]


def _problem(kernel: Kernel, fmt: md.Format, m: int, n: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    packed = md.pack(fmt, sample_weights(fmt, k, n, rng))
    bufs, scalars = gemm_buffers(kernel, packed, rng.standard_normal((m, k)))  # y: NaN-poisoned
    return packed, bufs, scalars


def _model_check(y: np.ndarray, bufs: dict, packed, act: str, m: int, k: int):
    x = bufs["x"].reshape(m, k).astype(np.float64)
    w = md.dequantize(packed)
    return compare(y.astype(np.float64), x @ w, x, w, act, kernel_weights(packed, act))


#: The kernels on the harness: the tuned schedule (one buffer) for every streamed example
#: format and activation, and two buffers (stages = 3, one barrier a step) on a tile that fits.
DOUBLE = Schedule("ms_double", tile_m=32, tile_n=64, tile_k=128, warps_m=1, warps_n=4, pipeline=Multistage(3))
CASES = [(name, act, "tuned") for name in STREAMED for act in ACTIVATIONS] + \
    [("fp4_g128", "f16", "double"), ("int4_g64", "bf16", "double")]


def _schedule(fmt: md.Format, which: str) -> Schedule:
    return RUNTIME.tuned_schedule(fmt, 2 * MULTISTAGE_MIN_M) if which == "tuned" else DOUBLE


def _drop_barrier(kernel: Kernel, last: bool) -> None:
    """Delete the K loop's first (one buffer: before the store) or last (after the store)
    threadgroup barrier."""
    for op in kernel.walk():
        if op.name == "for" and any(inner.name == "mma" for inner in op.regions[0].ops):
            body: Block = op.regions[0]
            at = [i for i, inner in enumerate(body.ops) if inner.name == "barrier"]
            del body.ops[at[-1] if last else at[0]]
            return
    raise LookupError("no K loop")


def case_kernel(name: str, act: str, which: str):
    """A case's kernel as the harness runs it (tests/test_harness_coverage.py reads its ops)."""
    fmt = EXAMPLE_FORMATS[name]
    return compile_gemm(Gemm(f"mms_{name}_{act}_{which}", fmt, _schedule(fmt, which), act), METAL).kernel


@pytest.fixture(scope="module")
def built():
    if find_compiler() is None:
        pytest.skip("g++ is not installed")
    case = case_kernel

    def broken(last: bool):  # the mutations: one barrier removed
        fmt = EXAMPLE_FORMATS["fp4_g128"]
        kernel = compile_gemm(Gemm(f"mms_broken_{int(last)}", fmt, _schedule(fmt, "tuned")), METAL).kernel
        _drop_barrier(kernel, last)
        verify(kernel)  # still valid IR: the bug is a race
        return kernel

    def built_one(make) -> tuple:
        kernel = make()
        return kernel, compile_metal(print_metal(kernel))

    recipes = {c: partial(built_one, partial(case, *c)) for c in CASES}
    recipes.update({("broken", last): partial(built_one, partial(broken, last)) for last in (False, True)})
    return LazyBuilds(recipes)  # each case lowered and compiled when a test first asks for it


# ----- kernels on the CPU harness and in the interpreter ----------------------------------------

@needs_gxx
@pytest.mark.sweep
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(c))
def test_multistage_on_harness_matches_reference_and_interpreter(built, case) -> None:
    name, act, which = case
    kernel, compiled = built[case]
    fmt = EXAMPLE_FORMATS[name]
    assert kernel.attrs["pipeline"] == "multistage" and kernel.attrs["weight_layout"] == STREAM_LAYOUT
    assert not {"async_copy", "async_commit", "async_wait"} & {op.name for op in kernel.walk()}
    assert kernel.shared_bytes <= METAL.max_shared_bytes
    for seed, (m, n, k) in enumerate(_shapes(fmt)):
        packed, bufs, scalars = _problem(kernel, fmt, m, n, k, seed)
        out = compiled.run(bufs, scalars, seed=seed + 1)  # seed % 4: the scheduling policy
        y = read_output(out, m, n)
        assert not np.isnan(y).any(), f"{case} M={m} N={n} K={k}: unwritten outputs"
        check = _model_check(y, bufs, packed, act, m, k)
        assert check.ok, f"{case} M={m} N={n} K={k}: {check.summary()}"
        theirs = run_kernel(kernel, bufs, scalars)  # races in threadgroup memory raise here
        np.testing.assert_array_equal(out["y"], theirs["y"], err_msg=f"{case} M={m} N={n} K={k}")


@needs_gxx
@pytest.mark.parametrize("last", [False, True], ids=["before-store", "after-store"])
def test_removed_barrier_is_caught(built, last: bool) -> None:
    """Without the barrier before the store, a simdgroup overwrites the buffer others still
    read; without the one after it, it reads pieces others have not stored yet. The
    interpreter reports the race; the harness computes a wrong product (or reports the race)
    under some of its schedules (those where one simdgroup runs ahead), while the intact
    kernel is right under all of them."""
    kernel, compiled = built["broken", last]
    good_kernel, good = built["fp4_g128", "f16", "tuned"]
    fmt = EXAMPLE_FORMATS["fp4_g128"]
    m, n, k = 65, 136, 512
    packed, bufs, scalars = _problem(kernel, fmt, m, n, k, seed=5)
    with pytest.raises(InterpreterError) as e:
        run_kernel(kernel, bufs, scalars)
    assert e.value.kind == "race"
    caught, seeds = 0, range(1, 11)
    for seed in seeds:
        assert _model_check(read_output(good.run(bufs, scalars, seed=seed), m, n), bufs, packed, "f16", m, k).ok
        try:
            y = read_output(compiled.run(bufs, scalars, seed=seed), m, n)
        except MetalCPUError:
            caught += 1
            continue
        caught += not _model_check(y, bufs, packed, "f16", m, k).ok
    assert caught >= len(seeds) // 4, f"the harness caught the removed barrier under {caught} of {len(seeds)} schedules"


# ----- the schedule: picked by M, and why (the cost model) --------------------------------------

def test_tuned_schedule_picks_multistage_above_32_rows() -> None:
    fmt = EXAMPLE_FORMATS["fp4_g128"]
    picks = {m: RUNTIME.tuned_schedule(fmt, m) for m in (1, 32, 33, 64, 65, 2048)}
    assert {m: s.pipeline.kind for m, s in picks.items()} == {
        1: "weight_stream", 32: "weight_stream", 33: "multistage", 64: "multistage", 65: "multistage",
        2048: "multistage"}
    s = picks[2048]
    assert (s.tile_m, s.tile_n, s.tile_k, s.warps_m, s.warps_n, s.pipeline.stages) == (64, 128, 128, 1, 8, 2)
    for name in STREAMED:  # every format the stream takes
        assert RUNTIME.tuned_schedule(EXAMPLE_FORMATS[name], 33).pipeline.kind == "multistage"
    for name in set(EXAMPLE_FORMATS) - set(STREAMED):  # N:M: the lanes scatter; the stream at every M
        for m in (33, 2048):
            schedule = RUNTIME.tuned_schedule(EXAMPLE_FORMATS[name], m)
            assert (schedule.pipeline.kind, schedule.tile_m) == ("weight_stream", 32), (name, m)
            compile_gemm(Gemm(f"nm_{m}", EXAMPLE_FORMATS[name], schedule), METAL)  # the pipeline takes it


def test_two_bit_codes_keep_the_stream() -> None:
    """2-bit codes fill a lane's vector over 256 K positions: a 64-row activation buffer of
    that step does not fit 32 KB, so large M keeps the stream's 32-row tiles."""
    int2 = md.Format("int2_g256", md.IntEncoding(bits=2, offset=2), md.GroupScale(256))
    assert RUNTIME.tuned_schedule(int2, 2048).pipeline.kind == "weight_stream"


def _cost(fmt: md.Format, schedule: Schedule, act: str = "f16"):
    gemm = Gemm(f"c_{schedule.name}", fmt, schedule, act)
    return kernel_cost(compile_gemm(gemm, METAL).kernel, gemm)


FIRST_GENERATION = {"double_buffered": Schedule("db_64x64x32", pipeline=DoubleBuffered()),
                    "fused_dequant": Schedule("fused_64x64x32", pipeline=FusedDequant())}


@pytest.mark.parametrize("name", STREAMED)
def test_cost_justifies_the_threshold(name: str) -> None:
    """Per pass over the weights: above 32 rows the stream needs two 32-row tiles where one
    64-row multistage tile does, and the multistage tile costs fewer lane instructions than
    the two (and asks for fewer bytes); per row it also beats the first-generation 64-row
    kernels in instructions and bytes. Threadgroup memory within 32 KB, 2 barriers a step.
    Up to 32 rows one stream tile costs less than a multistage tile where the layout has the
    K shuffle (without it the stream builds B element by element from device memory, and the
    model would already take the multistage tile: left to a measurement, docs/notes)."""
    fmt = EXAMPLE_FORMATS[name]
    ms = _cost(fmt, RUNTIME.tuned_schedule(fmt, 2048))
    stream = _cost(fmt, RUNTIME.tuned_schedule(fmt, MULTISTAGE_MIN_M))
    assert (ms.m, stream.m) == (64, 32)
    assert ms.instructions_per_weight < 2 * stream.instructions_per_weight
    assert ms.requested_bytes_per_weight < 2 * stream.requested_bytes_per_weight
    assert ms.unique_bytes_per_weight < 2 * stream.unique_bytes_per_weight
    if stream_layout(fmt, METAL).k_perm is not None:
        assert stream.instructions_per_weight < ms.instructions_per_weight
    assert ms.shared_bytes <= METAL.max_shared_bytes and ms.barriers_per_step == {"threadgroup": 2.0}
    for kind, schedule in FIRST_GENERATION.items():
        old = _cost(fmt, schedule)
        assert old.m == ms.m == 64
        assert ms.instructions_per_weight < 0.75 * old.instructions_per_weight, (kind, ms.per_weight, old.per_weight)
        assert ms.requested_bytes_per_weight < old.requested_bytes_per_weight, kind
        assert ms.unique_bytes_per_weight < old.unique_bytes_per_weight, kind


# ----- stage counts, and the part on another target -------------------------------------------

def test_register_staging_takes_two_or_three_stages() -> None:
    """stages - 1 threadgroup buffers: one (two barriers a step) or two (one barrier)."""
    fmt = md.builtin_format("fp4")
    barriers = {}
    for stages in (2, 3):
        kernel = compile_gemm(Gemm("ms_stages", fmt, dataclasses.replace(DOUBLE, pipeline=Multistage(stages))),
                              METAL).kernel
        loop = next(op for op in kernel.walk() if op.name == "for"
                    and any(inner.name == "mma" for inner in op.regions[0].ops))
        barriers[stages] = sum(op.name == "barrier" for op in loop.regions[0].ops)
        assert kernel.shared_bytes == (stages - 1) * (32 * (128 + 8) * 2 + 64 * 64)
    assert barriers == {2: 2, 3: 1}
    for stages in (4, 8):
        with pytest.raises(ScheduleError, match="no asynchronous copies.*stages must be 2 .* or 3"):
            compile_gemm(Gemm("ms_bad", fmt, dataclasses.replace(DOUBLE, pipeline=Multistage(stages))), METAL)


#: CUDA's description without asynchronous copies: the register-staged part on 16x8x16 MMAs,
#: (row, adjacent K) B pairs and the 2:4 sparse MMA with its metadata.
CUDA_NO_ASYNC = dataclasses.replace(CUDA, async_copy_bytes=0)


@pytest.mark.parametrize("fmt_name,group,vectors", [
    ("fp4", 128, 1), ("uint4_zp", 128, 1), ("fp4_2of4", 128, 1), ("int4_2of4", 128, 1),
    ("fp4", 128, 2), ("fp4_2of4", 256, 2),  # two K vectors a step (one scale group)
])
@pytest.mark.parametrize("stages", [2, 3])
def test_register_staging_on_a_target_without_async_copies(fmt_name: str, group: int, vectors: int,
                                                           stages: int) -> None:
    fmt = md.builtin_format(fmt_name, group)
    step = vectors * md.multistage_schedule(fmt, 2048).tile_k
    sched = Schedule("ms_regs", tile_m=32, tile_n=64, tile_k=step, warps_m=2, warps_n=2, pipeline=Multistage(stages))
    gemm = Gemm(f"ms_regs_{fmt_name}", fmt, sched, "f16")
    kernel = compile_gemm(gemm, CUDA_NO_ASYNC).kernel
    names = {op.name for op in kernel.walk()}
    assert "vstore" in names and not names & {"async_copy", "async_wait"}
    assert ("mma_sp" in names) == (fmt.sparsity is not None)
    k = max(step, group)
    assert_matches(gemm, kernel, [(3, 40, 4 * k), (65, 72, 2 * k)], seed=stages)
