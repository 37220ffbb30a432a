"""Check a compiled GEMM kernel against the float64 reference on fresh random data."""
from __future__ import annotations

from dataclasses import dataclass
from math import lcm
from typing import Callable

import numpy as np

from ..formats.evaluate import reference_matmul
from ..formats.pack_weights import pack
from ..formats.scaling import PER_COLUMN
from ..ir import Kernel
from ..ir.interpret import run_kernel
from ..kernel_args import gemm_buffers, read_output
from ..schedule import Gemm
from .format_check import sample_weights

#: Relative error (Frobenius) allowed against the float64 reference: the kernel rounds the
#: activations and the output to 16 bits and accumulates in f32, so errors sit near 2**-11.
REL_TOL = {"f16": 2e-3, "bf16": 1.6e-2}

Executor = Callable[[Kernel, dict[str, np.ndarray], dict[str, int]], dict[str, np.ndarray]]


@dataclass
class KernelCheck:
    shape: tuple[int, int, int]  # (M, N, K)
    rel_error: float
    tolerance: float
    untouched_poison: int  # output elements the kernel never wrote

    @property
    def ok(self) -> bool:
        return self.untouched_poison == 0 and self.rel_error <= self.tolerance


def check_shapes(gemm: Gemm) -> list[tuple[int, int, int]]:
    """Small (M, N, K) problems with tails: M = 1, 3, 65 rows, N one tile plus a ragged
    part, K two steps of the smallest K the format and schedule both accept."""
    fmt, s = gemm.format, gemm.schedule
    g = fmt.scale.group_size
    k_unit = lcm(fmt.k_granule, s.tile_k) if g == PER_COLUMN else lcm(fmt.k_granule, s.tile_k, int(g))
    k = 2 * k_unit
    n = s.tile_n + 17
    return [(1, n, k), (3, n, k), (65, n, k)]


def check_kernel(gemm: Gemm, kernel: Kernel, shape: tuple[int, int, int], rng: np.random.Generator,
                 execute: Executor = run_kernel) -> KernelCheck:
    """Run `kernel` on random weights and activations of `shape`; compare to the reference."""
    m, n, k = shape
    fmt = gemm.format
    packed = pack(fmt, sample_weights(fmt, k, n, rng))
    x = rng.standard_normal((m, k))
    buffers, scalars = gemm_buffers(kernel, packed, x)
    out = execute(kernel, buffers, scalars)
    y = read_output(out, m, n).astype(np.float64)
    reference = reference_matmul(buffers["x"].astype(np.float64).reshape(m, k), packed)
    untouched = int(np.isnan(y).sum())
    finite = np.where(np.isnan(y), 0.0, y)
    rel = float(np.linalg.norm(finite - reference) / max(np.linalg.norm(reference), 1e-300))
    return KernelCheck(shape, rel, REL_TOL[gemm.activation], untouched)
