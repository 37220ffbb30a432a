"""Issue 15: the weight stream multiplies each group's MMA sums by the scale instead of every
weight, where the format's scale factors out, and the CUDA printer reads fragment words of a
16-bit vector as they are. The values are checked by the interpreter against the float64
reference in tests/test_weight_stream.py; here: which kernels take the path, and that the
path is really gone where it must not be taken (a bias, many M tiles)."""
from __future__ import annotations

import numpy as np
import pytest

from marlin_dsl import builtin_format
from marlin_dsl.checks.kernel_check import check_kernel, check_shapes
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.schedule import Gemm, Schedule, WeightStream
from marlin_dsl.machine import CUDA
from marlin_dsl.targets import emit
from marlin_dsl.targets.cuda.tuning import tuned_schedule


def _kernel(fmt_name: str, m: int, act: str = "f16"):
    fmt = builtin_format(fmt_name)
    return compile_gemm(Gemm("g", fmt, tuned_schedule(fmt, m, CUDA, 4096, 4096), activation=act), CUDA).kernel


def _accumulator_builds(kernel) -> int:
    return sum(1 for op in kernel.walk() if op.name == "frag_build" and op.result.type.role == "c")


@pytest.mark.parametrize("fmt_name", ["fp4", "int4", "uint4_zp", "fp4_2of4"])
@pytest.mark.parametrize("m", [1, 16])
def test_factored_scales_apply_to_sums(fmt_name, m):
    kernel = _kernel(fmt_name, m)
    assert _accumulator_builds(kernel) > 0
    # no f16 pair multiply is left in the decode: the scale and FP4's rebias moved to the sums
    pair_muls = [op for op in kernel.walk() if op.name == "mul" and getattr(op.result.type, "size", 1) == 2]
    assert pair_muls == []


@pytest.mark.parametrize("fmt_name,act", [("nf4", "f16"), ("fp4", "bf16")])
def test_scalar_decode_keeps_per_weight_scales(fmt_name, act):
    """Value tables and bf16 activations decode through the scalar path: no sums scaling."""
    assert _accumulator_builds(_kernel(fmt_name, 1, act)) == 0


def test_many_m_tiles_keep_per_weight_scales():
    fmt = builtin_format("fp4")
    s = Schedule("wide", tile_m=32, tile_n=16, tile_k=64, warps_m=1, warps_n=1, pipeline=WeightStream(k_warps=4))
    assert _accumulator_builds(compile_gemm(Gemm("g", fmt, s), CUDA).kernel) == 0


def test_mlx_affine_bias_does_not_factor():
    mx = pytest.importorskip("mlx.core")
    from marlin_dsl.layers.interop import mlx_format

    fmt = mlx_format("affine", 4, 64, mx.float16)
    assert not fmt.scaling.scale_factors_out()
    assert _accumulator_builds(compile_gemm(Gemm("g", fmt, tuned_schedule(fmt, 1, CUDA)), CUDA).kernel) == 0
    assert builtin_format("uint4_zp").scaling.scale_factors_out()


@pytest.mark.parametrize("fmt_name", ["fp4", "uint4_zp"])
def test_sums_scaling_matches_reference_on_tails(fmt_name):
    """M = 1 and 3, N and K tails, through the interpreter (fresh random data)."""
    fmt = builtin_format(fmt_name)
    gemm = Gemm("g", fmt, tuned_schedule(fmt, 1, CUDA, 4096, 4096))
    kernel = compile_gemm(gemm, CUDA).kernel
    rng = np.random.default_rng(7)
    for shape in check_shapes(gemm):
        result = check_kernel(gemm, kernel, shape, rng)
        assert result.ok, (shape, result)


def test_fragment_words_read_from_vector():
    """B fragments from a vload of halves print as words of the vector (no repacking)."""
    text = emit(_kernel("fp4", 1), CUDA).body
    assert "mdsl::vec_word<0>(" in text and "mdsl::pack2(" not in text


# ----- issue 36: groups shorter than a K vector, and a bias per group ---------------------------

def _checkpoint_kernel(type_name: str, m: int = 1, target=CUDA):
    from marlin_dsl.formats.checkpoint import gguf_format

    fmt = gguf_format(type_name).format
    gemm = Gemm("g", fmt, tuned_schedule(fmt, m, CUDA, 4096, 4096))
    return gemm, compile_gemm(gemm, target).kernel


def _ones_mmas(kernel) -> int:
    """MMAs whose A fragment is built of constant pairs (the sums of x a group bias needs)."""
    made = {r: op for op in kernel.walk() for r in op.results}

    def constant_pairs(v) -> bool:
        op = made.get(v)
        return op is not None and op.name == "vec" and all(
            made.get(o) is not None and made[o].name == "const" for o in op.operands)

    return sum(1 for op in kernel.walk() if op.name == "mma" and made.get(op.operands[0]) is not None
               and made[op.operands[0]].name == "frag_build"
               and all(constant_pairs(o) for o in made[op.operands[0]].operands))


def test_a_vector_that_splits_a_group_keeps_per_weight_scales():
    """Q5_K on CUDA: 5-bit codes make 48-position K vectors, which do not hold whole groups
    of 32, so each weight is scaled as before."""
    _, kernel = _checkpoint_kernel("Q5_K")
    assert _accumulator_builds(kernel) == 0 and _ones_mmas(kernel) == 0


@pytest.mark.parametrize("type_name,bias", [("Q4_K", True), ("Q6_K", False), ("Q4_0", False)])
def test_group_runs_and_group_biases_apply_to_sums(type_name, bias):
    """Groups of 16 or 32 inside a 64- (or 32-) position K vector are scaled run by run on
    CUDA (`Target.scale_group_runs`); SuperBlockScale's - dmin * m adds through an MMA of ones.
    No weight is scaled: the pair decode is the magic-number subtract only."""
    gemm, kernel = _checkpoint_kernel(type_name)
    assert _accumulator_builds(kernel) > 0
    assert (_ones_mmas(kernel) > 0) == bias
    pair_muls = [op for op in kernel.walk() if op.name == "mul" and getattr(op.result.type, "size", 1) == 2]
    assert pair_muls == []
    rng = np.random.default_rng(36)
    for shape in check_shapes(gemm):
        result = check_kernel(gemm, kernel, shape, rng)
        assert result.ok, (type_name, shape, result)


def test_metal_keeps_per_weight_scales_for_short_groups():
    """Metal has not measured the run-by-run scaling (`Target.scale_group_runs` off)."""
    from marlin_dsl.formats.checkpoint import gguf_format
    from marlin_dsl.machine import METAL
    from marlin_dsl.targets.metal.tuning import tuned_schedule as metal_schedule

    fmt = gguf_format("Q4_K").format
    kernel = compile_gemm(Gemm("g", fmt, metal_schedule(fmt, 1)), METAL).kernel
    assert _accumulator_builds(kernel) == 0 and _ones_mmas(kernel) == 0
