"""The formats MLX's layers load, printed as Metal and executed on the CPU harness (issue 32).

Every MLX format (tests/mlx_format_cases.py: affine 2, 3, 4, 5, 6, 8 bits, groups of 32, 64,
128, scales and biases in f16, bf16 and f32; mxfp4, nvfp4, mxfp8) runs through every Metal
pipeline that takes it, with f16 and bf16 activations:

- the first-generation pipelines: double-buffered, fused-dequant, striped (as
  test_metal_backend.py builds them);
- the weight stream as the runtime tunes it for small M (`RUNTIME.tuned_schedule(fmt, m)`,
  m = 1, 16 or 32: the 8-, 16- and 32-row tiles, one per format in turn);
- the multistage pipeline the runtime picks above 32 rows (`RUNTIME.tuned_schedule(fmt, 2048)`),
  except for 2-bit codes (REFUSED: their 256-position K step does not fit the pipeline's
  buffers in 32 KB, and the runtime serves large M with the stream's 32-row tile, which the
  `ws` cases run).

Each kernel's exact printed text runs on the Metal CPU harness (g++, outputs poisoned, guards)
for M = 1, 3, 65, N tails, a K tail inside a step where the group allows one, at least
stages + 1 steps of the multistage pipeline, on fresh random data, against the float64
reference under the error model (`check_kernel`), and at M <= 3 bit for bit against the
interpreter running the same IR. The product is a sweep: its covering subset
(every format kind, group, scale type, pipeline, variant and activation once; every pipeline
on the affine 4-bit f16 format) runs by default, the rest under `-m slow`.
"""
from __future__ import annotations

from functools import partial

import pytest

pytest.importorskip("mlx.core")

from marlin_dsl import METAL, DoubleBuffered, FusedDequant, Gemm, Multistage, Schedule, StripedKParallel  # noqa: E402
from marlin_dsl.compiler import compile_gemm  # noqa: E402
from marlin_dsl.errors import CompileError, ScheduleError  # noqa: E402
from marlin_dsl.layouts.weight_stream import stream_layout  # noqa: E402
from marlin_dsl.targets.metal import tuning  # noqa: E402
from marlin_dsl.targets.metal.cpu_harness import compile_metal, find_compiler  # noqa: E402
from marlin_dsl.targets.metal.printer import print_metal  # noqa: E402
from marlin_dsl.targets.metal.runtime import RUNTIME  # noqa: E402

from conftest import covering_subset  # noqa: E402
from lazy_builds import LazyBuilds  # noqa: E402
from mlx_format_cases import ACTS, MLX_FORMATS, build_cases, check_on_harness  # noqa: E402

needs_gxx = pytest.mark.skipif(
    find_compiler() is None,
    reason="g++ is not installed: the Metal CPU harness compiles the emitted Metal as C++20 with it")


def _multistage(fmt, v: str) -> Schedule:
    schedule = RUNTIME.tuned_schedule(fmt, int(v[1:]))
    if schedule.pipeline.kind != "multistage":  # what REFUSED's check compiles
        layout = stream_layout(fmt, METAL)
        return Schedule("metal_multistage", tile_m=tuning.MS_TILE_M, tile_n=tuning.MS_TILE_N,
                        tile_k=layout.dense_chunk, warps_m=1, warps_n=tuning.MS_WARPS_N,
                        pipeline=Multistage(stages=tuning.MS_STAGES))
    return schedule


#: pipeline -> (tuned-for-M variants, the schedule of a format for one of them)
PIPELINES = {
    "ws": (("m1", "m16", "m32"), lambda fmt, v: RUNTIME.tuned_schedule(fmt, int(v[1:]))),
    "ms": (("m2048",), _multistage),
    "db": (("-",), lambda fmt, v: Schedule("db", pipeline=DoubleBuffered())),
    "fd": (("-",), lambda fmt, v: Schedule("fd", pipeline=FusedDequant())),
    "striped": (("-",), lambda fmt, v: Schedule("striped", pipeline=StripedKParallel(parallel=2, groups=4))),
}
#: (format label, pipeline) -> why the pipeline refuses the format (a CompileError or
#: ScheduleError matching it). 2-bit codes fill a lane's 128-bit vector over 256 K positions:
#: the multistage buffers (a 64-row activation tile of one step and the weight vectors of 128
#: columns) would need 41 KB of threadgroup memory, over Metal's 32 KB; `tuned_schedule`
#: keeps the stream for them at every M (test_metal_multistage.py::test_two_bit_codes_keep_the_stream).
REFUSED: dict[tuple[str, str], str] = {
    (f.label, "ms"): r"needs 41984 bytes of threadgroup memory .* over metal's limit of 32768"
    for f in MLX_FORMATS.values() if f.kind == "affine2"}


#: name -> (Gemm, shapes); its sweep axes; (format label, pipeline, variant, activation)
CASES, AXES, KEYS = build_cases(PIPELINES, REFUSED)


def case_kernel(name: str):
    """The case's kernel as the harness runs it (lowered for Metal, passes run)."""
    return compile_gemm(CASES[name][0], METAL).kernel


@pytest.fixture(scope="module")
def built() -> LazyBuilds:
    """Each case lowered for Metal, printed and compiled for the CPU when a test first asks."""
    if find_compiler() is None:
        pytest.skip("g++ is not installed")

    def make(name: str):
        kernel = case_kernel(name)
        return kernel, compile_metal(print_metal(kernel))

    return LazyBuilds({name: partial(make, name) for name in CASES})


@needs_gxx
@pytest.mark.sweep(axes=lambda params: AXES[params["name"]])
@pytest.mark.parametrize("name", list(CASES))
def test_mlx_format_on_metal_harness_matches_reference(built, name: str) -> None:
    gemm = CASES[name][0]
    kernel, compiled = built[name]
    assert kernel.attrs["pipeline"] == gemm.schedule.pipeline.kind
    # seed % 4: the scheduling policy (uniform, or one simdgroup running ahead), one per shape
    check_on_harness(gemm, kernel, CASES[name][1], lambda b, s, i: compiled.run(b, s, seed=i + 1),
                     list(CASES).index(name))


# ----- what the sweep covers ------------------------------------------------------------------

def test_every_pair_is_a_case_or_refused() -> None:
    """Every MLX format x Metal pipeline x activation is a case, or the pair is in REFUSED;
    the refused ones are refused, saying why, and the runtime does not pick them."""
    product = {(f.label, p, act) for f in MLX_FORMATS.values() for p in PIPELINES for act in ACTS}
    have = {(label, p, act) for label, p, _, act in KEYS.values()}
    refused = {(label, p, act) for (label, p) in REFUSED for act in ACTS}
    assert have | refused == product and not have & refused
    for (label, pipeline), reason in REFUSED.items():
        fmt = MLX_FORMATS[label].fmt
        assert pipeline == "ms" and tuning.multistage_schedule(fmt, 2048) is None
        assert RUNTIME.tuned_schedule(fmt, 2048).pipeline.kind == "weight_stream"
        with pytest.raises((ScheduleError, CompileError), match=reason):
            compile_gemm(Gemm("refused", fmt, PIPELINES[pipeline][1](fmt, "m2048")), METAL)
    for name, (gemm, _) in CASES.items():  # the cases' multistage schedules are the runtime's
        if KEYS[name][1] == "ms":
            assert gemm.schedule == RUNTIME.tuned_schedule(gemm.format, 2048), name


def test_the_default_run_has_an_affine_kernel_of_every_pipeline() -> None:
    taken = covering_subset([{"name": n} for n in CASES], lambda params: AXES[params["name"]])
    default = [n for n, t in zip(CASES, taken) if t]
    assert len(default) < len(CASES) / 10, len(default)
    affine = {KEYS[n][1] for n in default if MLX_FORMATS[KEYS[n][0]].kind.startswith("affine")}
    assert affine == set(PIPELINES)
