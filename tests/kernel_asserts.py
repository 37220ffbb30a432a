"""Assertions the kernel tests share (imported by the test modules, as kernel_corpus.py is)."""
from __future__ import annotations

import numpy as np

from marlin_dsl.checks.kernel_check import check_kernel
from marlin_dsl.ir import Kernel
from marlin_dsl.schedule import Gemm


def assert_matches(gemm: Gemm, kernel: Kernel, shapes, seed: int = 0) -> None:
    """The kernel, run by the interpreter on fresh random inputs of each (M, N, K) shape,
    writes every output and matches the float64 reference within the tolerance."""
    rng = np.random.default_rng(seed)
    for shape in shapes:
        result = check_kernel(gemm, kernel, shape, rng)
        assert result.untouched_poison == 0, (shape, result)
        assert result.ok, (shape, result)
