"""Check a compiled GEMM kernel against the float64 reference on fresh random data."""
from __future__ import annotations

from dataclasses import dataclass
from math import lcm
from typing import Callable

import numpy as np

from ..formats.evaluate import dequantize
from ..formats.pack_weights import pack
from ..formats.tensors import PackedWeights
from ..ir import Kernel
from ..ir.interpret import run_kernel
from ..kernel_args import gemm_buffers, read_output
from ..schedule import Gemm
from ..machine.outputs import epilogue_inputs, out_columns
from .epilogue_check import compare_epilogue
from .error_model import OutputCheck, compare, kernel_weights
from .format_check import sample_weights

#: An outer bound on the relative Frobenius error, kept for callers that have no inputs to
#: run the error model on (benchmarks that time MLX's own kernels). Kernel checks use
#: `error_model.compare`, whose tolerance is about 7x tighter for f16 and adds a bias and a
#: worst-element check.
REL_TOL = {"f16": 2e-3, "bf16": 1.6e-2}

Executor = Callable[[Kernel, dict[str, np.ndarray], dict[str, int]], dict[str, np.ndarray]]


@dataclass
class KernelCheck:
    shape: tuple[int, int, int]  # (M, N, K)
    rel_error: float
    tolerance: float
    untouched_poison: int  # output elements the kernel never wrote
    output: OutputCheck | None = None  # the error model's checks (bias, worst element)

    @property
    def ok(self) -> bool:
        if self.output is not None:
            return self.output.ok
        return self.untouched_poison == 0 and self.rel_error <= self.tolerance

    def summary(self) -> str:
        if self.output is not None:
            return self.output.summary()
        return f"rel {self.rel_error:.2e} > {self.tolerance:g}, {self.untouched_poison} unwritten"


def check_shapes(gemm: Gemm) -> list[tuple[int, int, int]]:
    """Small (M, N, K) problems with tails: M = 1, 3, 65 rows, N one tile plus a ragged
    part (at M = 65 at least 128 columns plus a ragged part: the bias check needs many
    (scale group, code) pairs, as every weight of one pair rounds alike, to resolve a 0.05%
    decode error in bf16), K two steps of the smallest K the format and schedule both accept."""
    fmt, s = gemm.format, gemm.schedule
    k_unit = lcm(fmt.k_multiple, s.tile_k)
    k = 2 * k_unit
    if gemm.outputs:  # N is the parts' widths together
        n = sum(gemm.outputs)
        return [(1, n, k), (3, n, k), (65, n, k)]
    if gemm.epilogue is not None and gemm.epilogue.gate is not None:  # whole (gate, up) runs
        n, wide = s.tile_n + 16, -(-128 // s.tile_n) * s.tile_n + 48
        return [(1, n, k), (3, n, k), (65, wide, k)]
    n = s.tile_n + 17
    wide = -(-128 // s.tile_n) * s.tile_n + 17
    return [(1, n, k), (3, n, k), (65, wide, k)]


def check_output(gemm: Gemm, y: np.ndarray, x: np.ndarray, packed: PackedWeights) -> OutputCheck:
    """`y` [M, N] against the float64 reference x @ W under the error model of `gemm`'s format
    and activation; `x` as the kernel read it (already rounded)."""
    w = dequantize(packed)
    return compare(y, x @ w, x, w, gemm.activation, kernel_weights(packed, gemm.activation))


def check_kernel(gemm: Gemm, kernel: Kernel, shape: tuple[int, int, int], rng: np.random.Generator,
                 execute: Executor = run_kernel) -> KernelCheck:
    """Run `kernel` on random weights and activations of `shape`; compare to the reference."""
    m, n, k = shape
    fmt = gemm.format
    packed = pack(fmt, sample_weights(fmt, k, n, rng))
    x = rng.standard_normal((m, k))
    if gemm.epilogue is not None:
        return _check_epilogue(gemm, kernel, packed, x, rng, execute)
    buffers, scalars = gemm_buffers(kernel, packed, x)
    out = execute(kernel, buffers, scalars)
    y = read_output(out, m, n).astype(np.float64)
    res = check_output(gemm, y, buffers["x"].astype(np.float64).reshape(m, k), packed)
    return KernelCheck(shape, res.rel_error, res.tolerance, res.untouched, res)


def _check_epilogue(gemm: Gemm, kernel: Kernel, packed: PackedWeights, x: np.ndarray, rng: np.random.Generator,
                    execute: Executor) -> KernelCheck:
    """check_kernel for a Gemm with an epilogue: a bias and a residual of the product's scale
    (fresh random), the output against the float64 composition (`checks/epilogue_check.py`)."""
    steps = gemm.epilogue.steps  # type: ignore[union-attr]
    (k, n), m = packed.shape, x.shape[0]
    w = dequantize(packed)
    scale = float(np.sqrt(np.mean(np.square(x @ w)))) or 1.0
    n_out = out_columns(steps, n)
    arrays = {"bias": 0.5 * scale * rng.standard_normal(n), "residual": scale * rng.standard_normal((m, n_out))}
    buffers, scalars = gemm_buffers(kernel, packed, x, {a: arrays[a] for a in epilogue_inputs(steps)})
    out = execute(kernel, buffers, scalars)
    y = read_output(out, m, n_out).astype(np.float64)
    read = {a: buffers[a].astype(np.float64) for a in epilogue_inputs(steps)}
    res = compare_epilogue(y, steps, buffers["x"].astype(np.float64).reshape(m, k), w, gemm.activation,
                           kernel_weights(packed, gemm.activation), read.get("bias"),
                           read["residual"].reshape(m, n_out) if "residual" in read else None)
    return KernelCheck((m, n, k), res.rel_error, res.tolerance, res.untouched, res)
