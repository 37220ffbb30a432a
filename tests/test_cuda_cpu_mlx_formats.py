"""The formats MLX's layers load, printed as CUDA and executed on the CPU harness (issue 32).

A mutation audit printed the half2 `add` as `__hsub2` and nothing failed: no kernel the CUDA
CPU harness ran (test_cuda_cpu_harness.py) emitted `__hadd2`. The MLX affine formats
(`w = s * q + b`, `marlin_dsl.layers.interop.mlx_format`) do, in f16, in every weight-stream and
multistage kernel. Here every MLX format (tests/mlx_format_cases.py: affine 2, 3, 4, 5, 6, 8
bits, groups of 32, 64, 128, scales and biases in f16, bf16 and f32; mxfp4, nvfp4, mxfp8) runs
through every CUDA pipeline that takes it, with f16 and bf16 activations:

- the first-generation pipelines: double-buffered, fused-dequant, striped (`Schedule()`);
- the weight stream as the library tunes it for small M (`md.tuned_schedule(fmt, m)`, m = 1,
  16 or 32: the 8-, 16- and 32-row stream tiles, one per format in turn);
- the multistage pipeline as the library picks it (`md.multistage_schedule(fmt, m)`, m = 256
  or 2048: its small and large tiles, one per format in turn).

Each kernel's exact printed text runs on the harness (g++, outputs poisoned, guards) for
M = 1, 3, 65, N tails, a K tail inside a step where the group allows one and at least
stages + 1 steps of the multistage pipeline, on fresh random data, against the float64
reference under the error model (`check_kernel`), and at M <= 3 bit for bit against the
interpreter running the same IR. The product is a sweep: its covering subset
(every format kind, group, scale type, pipeline, variant and activation once) runs by
default, the rest under `-m slow`. The warpgroup pipeline is not emulated by the harness
(test_cuda_cpu_harness.py::test_warpgroup_kernels_are_refused). No MLX format is refused by
a CUDA pipeline (REFUSED is empty; test_every_pair_is_a_case_or_refused keeps it so).
"""
from __future__ import annotations

from functools import partial

import pytest

pytest.importorskip("mlx.core")

import marlin_dsl as md  # noqa: E402
from marlin_dsl import CUDA, DoubleBuffered, FusedDequant, Gemm, Schedule, StripedKParallel  # noqa: E402
from marlin_dsl.compiler import compile_gemm  # noqa: E402
from marlin_dsl.errors import CompileError, ScheduleError  # noqa: E402
from marlin_dsl.targets.cuda.cpu_harness import compile_cuda_cpu, find_compiler  # noqa: E402
from marlin_dsl.targets.cuda.printer import print_cuda  # noqa: E402

from conftest import covering_subset  # noqa: E402
from lazy_builds import LazyBuilds  # noqa: E402
from mlx_format_cases import ACTS, MLX_FORMATS, build_cases, check_on_harness  # noqa: E402

needs_gxx = pytest.mark.skipif(
    find_compiler() is None,
    reason="no C++ compiler (g++ / $CXX): the CUDA CPU harness compiles the printed CUDA as C++20")

#: pipeline -> (tuned-for-M variants, the schedule of a format for one of them)
PIPELINES = {
    "ws": (("m1", "m16", "m32"), lambda fmt, v: md.tuned_schedule(fmt, int(v[1:]))),
    "ms": (("m256", "m2048"), lambda fmt, v: md.multistage_schedule(fmt, int(v[1:]))),
    "db": (("-",), lambda fmt, v: Schedule("db", pipeline=DoubleBuffered())),
    "fd": (("-",), lambda fmt, v: Schedule("fd", pipeline=FusedDequant())),
    "striped": (("-",), lambda fmt, v: Schedule("striped", pipeline=StripedKParallel())),
}
#: (format label, pipeline) -> why the pipeline refuses the format (a ScheduleError or
#: CompileError matching it). Every CUDA pipeline takes every MLX format.
REFUSED: dict[tuple[str, str], str] = {}


#: name -> (Gemm, shapes); its sweep axes; (format label, pipeline, variant, activation)
CASES, AXES, KEYS = build_cases(PIPELINES, REFUSED)


def case_kernel(name: str):
    """The case's kernel as the harness runs it (lowered for CUDA, passes run)."""
    return compile_gemm(CASES[name][0], CUDA).kernel


@pytest.fixture(scope="module")
def built() -> LazyBuilds:
    """Each case lowered for CUDA, printed and compiled for the CPU when a test first asks."""
    def make(name: str):
        kernel = case_kernel(name)
        return CASES[name][0], kernel, compile_cuda_cpu(kernel)

    return LazyBuilds({name: partial(make, name) for name in CASES})


@needs_gxx
@pytest.mark.sweep(axes=lambda params: AXES[params["name"]])
@pytest.mark.parametrize("name", list(CASES))
def test_mlx_format_on_cuda_harness_matches_reference(built, name: str) -> None:
    gemm, kernel, compiled = built[name]
    assert kernel.attrs["pipeline"] == gemm.schedule.pipeline.kind
    seed = list(CASES).index(name)  # seed % 4: the scheduling policy, the four across the cases
    check_on_harness(gemm, kernel, CASES[name][1], lambda b, s, i: compiled.run(b, s, seed=seed), seed)


# ----- what the sweep covers ------------------------------------------------------------------

def test_every_pair_is_a_case_or_refused() -> None:
    """Every MLX format x CUDA pipeline x activation is a case, or the pair is in REFUSED;
    the refused ones are refused, saying why."""
    product = {(f.label, p, act) for f in MLX_FORMATS.values() for p in PIPELINES for act in ACTS}
    have = {(label, p, act) for label, p, _, act in KEYS.values()}
    assert have | {(label, p, act) for (label, p) in REFUSED for act in ACTS} == product
    assert not have & {(label, p, act) for (label, p) in REFUSED for act in ACTS}
    for (label, pipeline), reason in REFUSED.items():
        f = MLX_FORMATS[label]
        with pytest.raises((ScheduleError, CompileError), match=reason):
            variants, schedule = PIPELINES[pipeline]
            compile_gemm(Gemm("refused", f.fmt, schedule(f.fmt, variants[0])), CUDA)


def _default_cases() -> list[str]:
    taken = covering_subset([{"name": n} for n in CASES], lambda params: AXES[params["name"]])
    return [n for n, t in zip(CASES, taken) if t]


def test_the_default_run_has_mlx_affine_f16_stream_and_multistage_kernels() -> None:
    """Issue 32: `__hadd2` must be executed without `-m slow`: the covering subset holds an
    MLX affine kernel with f16 scales and f16 activations of the weight stream and of the
    multistage pipeline (their decode adds the bias with half2 arithmetic), and every pipeline
    on an affine format."""
    default = _default_cases()
    assert len(default) < len(CASES) / 10, len(default)
    affine = [KEYS[n] for n in default if MLX_FORMATS[KEYS[n][0]].kind.startswith("affine")]
    assert {p for _, p, _, _ in affine} == set(PIPELINES)
    for pipeline in ("ws", "ms"):
        hadd = [n for n in default if KEYS[n][1] == pipeline and KEYS[n][3] == "f16"
                and MLX_FORMATS[KEYS[n][0]].scales == "f16" and MLX_FORMATS[KEYS[n][0]].kind.startswith("affine")]
        assert hadd, pipeline
        assert "__hadd2(" in print_cuda(compile_gemm(CASES[hadd[0]][0], CUDA).kernel).body, hadd[0]
