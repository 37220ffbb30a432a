"""The activation kernels' printed CUDA executed on the CPU (`targets/cuda/cpu_harness.py`):
the 2:4 sparsify kernels (layout "cuda_mma_sp": what mma.sp reads) equal their reference bit
for bit, and the sparse GEMM, whose mma.sp reads that layout through the shim's PTX rules,
matches the float64 product. The GEMM kernels are in test_cuda_cpu_harness.py."""
from __future__ import annotations

import numpy as np
import pytest

from marlin_dsl.activation.host import check_sparsify, run_sparse_gemm, run_sparsify
from marlin_dsl.formats.activation_reference import sparsify_reference
from marlin_dsl.formats.activation_spec import METHODS, SparsifySpec
from marlin_dsl.ir.numerics import round_to_activation
from marlin_dsl.lowering.sparse_gemm import lower_sparse_gemm
from marlin_dsl.lowering.sparse_gemm_staged import LARGE, SMALL
from marlin_dsl.lowering.sparsify import lower_sparsify
from marlin_dsl.targets.cuda.cpu_harness import compile_many, cuda_cpu_executor, find_compiler

pytestmark = pytest.mark.skipif(
    find_compiler() is None,
    reason="no C++ compiler (g++ / $CXX): the CUDA CPU harness compiles the printed CUDA as C++20")

SPECS = [SparsifySpec(m, a, d, True, True) for m in METHODS for a in (0, 1) for d in ("f16", "bf16")] + [
    SparsifySpec("top2", 1, "f16", True, True, dense=True), SparsifySpec("soft_threshold", 0, "bf16", True, True, dense=True)]
#: (rows, length, N): rows and lengths that are not multiples of 4 or 32, N tails
GEMM_SHAPES = [(1, 37, 9), (3, 64, 130), (65, 45, 9), (65, 130, 130)]


def activations(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """float32: normals, ~30% rounded to small integers (ties inside groups), ~25% exact zeros,
    a row and a column of equal values; never all zeros."""
    x = rng.normal(size=shape).astype(np.float32) * 2
    x = np.where(rng.random(shape) < 0.3, np.round(x), x).astype(np.float32)
    x[0, :] = -1.25
    x[:, 0] = 0.75
    x[rng.random(shape) < 0.25] = 0.0
    x[-1, -1] = 3.0
    return x


@pytest.fixture(scope="module")
def executor():
    """The sparsify kernels (relu2 + stats) and both sparse GEMMs, printed and compiled."""
    kernels = [lower_sparsify(s, "cuda") for s in SPECS]
    gemms = {(d, t): lower_sparse_gemm(d, "cuda", t) for d in ("f16", "bf16") for t in (LARGE, SMALL)}
    every = kernels + list(gemms.values())
    builds = compile_many(every)
    return cuda_cpu_executor(seed=2, compiled={id(k): b for k, b in zip(every, builds)}), dict(zip(SPECS, kernels)), gemms


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_sparsify_is_bit_exact(executor, spec: SparsifySpec) -> None:
    execute, kernels, _ = executor
    rng = np.random.default_rng(list(spec.name.encode()))
    for shape in [(3, 5), (65, 130), (300, 9), (48, 32)]:  # (300, 9): several threads count one column
        check_sparsify(spec, "cuda", activations(rng, shape), seed=11, execute=execute, kernel=kernels[spec])


@pytest.mark.parametrize("axis", [0, 1])
def test_gathering_sparsify_is_bit_exact(axis: int) -> None:
    """The printed gathering kernel (X = H[:, cols] read in place) on the CPU harness."""
    spec = SparsifySpec("mvue" if axis == 0 else "top2", axis, "bf16", True, True)
    kernel = lower_sparsify(spec, "cuda", gather=True)
    execute = cuda_cpu_executor(seed=3, compiled={id(kernel): compile_many([kernel])[0]})
    rng = np.random.default_rng(41 + axis)
    for shape in [(65, 130), (300, 9)]:
        cols = rng.permutation(shape[1])[: 2 * shape[1] // 3]
        check_sparsify(spec, "cuda", activations(rng, shape), 5, execute, kernel=kernel, columns=cols)


@pytest.mark.parametrize("tiles", [LARGE, SMALL], ids=lambda t: t.name)
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("axis", [0, 1])
def test_sparse_gemm_matches_float64(executor, dtype: str, axis: int, tiles) -> None:
    """Both block sizes of the staged kernel, on one block and on several (the last shape: 3
    x 3 small or 2 x 3 large blocks, row and column tails in the last ones)."""
    execute, kernels, gemms = executor
    spec = SparsifySpec("top2", axis, dtype, True, True)
    rng = np.random.default_rng(7 + axis)
    for p, length, n in GEMM_SHAPES + [(150, 96, 300)]:
        x = activations(rng, (p, length) if axis == 1 else (length, p))
        b = rng.normal(size=(length, n)).astype(np.float32)
        out = run_sparsify(kernels[spec], spec, x, 9, execute)
        y = run_sparse_gemm(gemms[dtype, tiles], out, b, dtype, execute)
        assert y.shape == (p, n) and np.isfinite(y).all(), (p, length, n)
        bh = np.asarray(round_to_activation(b, dtype), np.float64)
        dense = sparsify_reference(x, spec, 9).dense.astype(np.float64)
        want = np.asarray(round_to_activation((dense @ bh).astype(np.float32), dtype), np.float64)
        err = np.abs(y - want).max() / np.abs(want).max()
        assert err < {"f16": 2e-3, "bf16": 1.6e-2}[dtype], ((p, length, n), err)
