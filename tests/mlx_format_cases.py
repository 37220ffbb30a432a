"""The formats MLX's quantised layers load, as cases of the CPU harnesses' sweeps (issue 32).

`marlin_dsl.layers.interop.mlx_format` gives the format of every `mx.quantize` mode a layer
loads: affine (`w = s * q + b`, what mlx-community checkpoints use) at 2, 3, 4, 5, 6 and 8 bits,
groups of 32, 64 and 128, scales and biases in the model's float type (f16, bf16, f32), and
mxfp4, nvfp4 and mxfp8. The harness modules (tests/test_cuda_cpu_mlx_formats.py,
tests/test_metal_mlx_formats.py) run each of them through every pipeline that takes it on
their target with f16 and bf16 activations; this module names the formats, their sweep axes,
the tuned-for-M variant each format's tuned schedules use and the problem shapes.

The order matters: the covering subset (tests/conftest.py) takes cases in collection order,
so the first format is the mlx-community default, affine 4-bit, groups of 64, f16 scales
(its f16 kernels are the ones whose decode uses the half2 `add`, `__hadd2`).
"""
from __future__ import annotations

from math import lcm
from typing import Callable, NamedTuple

import mlx.core as mx
import numpy as np

from marlin_dsl.checks.kernel_check import check_kernel
from marlin_dsl.formats import Format
from marlin_dsl.ir import Kernel
from marlin_dsl.ir.interpret import run_kernel
from marlin_dsl.layers.interop import mlx_format
from marlin_dsl.schedule import Gemm

AFFINE_BITS = (4, 2, 3, 5, 6, 8)
GROUPS = (64, 32, 128)
SCALE_DTYPES = {"f16": mx.float16, "bf16": mx.bfloat16, "f32": mx.float32}
#: mode -> (bits, group): the only ones `mlx_format` takes for them
MODES = {"mxfp4": (4, 32), "nvfp4": (4, 16), "mxfp8": (8, 32)}
MODE_SCALES = {"mxfp4": "e8m0", "nvfp4": "e4m3", "mxfp8": "e8m0"}
ACTS = ("f16", "bf16")


class MLXFormat(NamedTuple):
    label: str  # affine4_g64_f16, mxfp4, ...
    fmt: Format
    kind: str  # affine4, ..., mxfp4
    group: int
    scales: str  # the scales' type: f16, bf16, f32, e8m0, e4m3
    turn: int  # picks the tuned-for-M variant (a Latin square over bits x group x scales)


def _formats() -> dict[str, MLXFormat]:
    out: dict[str, MLXFormat] = {}
    for b, bits in enumerate(AFFINE_BITS):
        for g, group in enumerate(GROUPS):
            for d, (dname, dtype) in enumerate(SCALE_DTYPES.items()):
                label = f"affine{bits}_g{group}_{dname}"
                out[label] = MLXFormat(label, mlx_format("affine", bits, group, dtype), f"affine{bits}", group,
                                       dname, b + g + d)
    for i, (mode, (bits, group)) in enumerate(MODES.items()):
        out[mode] = MLXFormat(mode, mlx_format(mode, bits, group), mode, group, MODE_SCALES[mode], i)
    return out


#: label -> the format and its axes, in sweep order (54 affine formats, then the 3 modes)
MLX_FORMATS = _formats()


def variant(f: MLXFormat, choices: tuple):
    """The tuned-for-M variant this format runs (each format one, every variant over many
    formats, every scale type and group under every variant)."""
    return choices[f.turn % len(choices)]


def case_axes(f: MLXFormat, pipeline: str, tuned: str, act: str) -> tuple:
    """A case's sweep axes: the pipeline, its tuned variant, the code kind (affine bits or
    the mode), the group, the scales' type, the activation."""
    return (pipeline, f"{pipeline}:{tuned}", f.kind, f.group, f.scales, act)


def shapes(gemm: Gemm) -> list[tuple[int, int, int]]:
    """(M, N, K): M = 1, 3, 65; N one tile plus 17 (at M = 65 at least 128 + 17: the error
    model's bias check needs many columns); K at least two steps and two groups (the
    multistage pipeline: stages + 1 steps, through its steady state), at M = 3 plus one group
    more where that ends inside a step (a K tail)."""
    fmt, s = gemm.format, gemm.schedule
    group = lcm(fmt.k_granule, int(fmt.scale.group_size))
    unit = lcm(group, s.tile_k)
    steps = s.pipeline.stages + 1 if s.pipeline.kind == "multistage" else 2
    k = unit * max(2, -(-steps * s.tile_k // unit))
    k_tail = k + group if (k + group) % s.tile_k else k
    n, wide = s.tile_n + 17, -(-128 // s.tile_n) * s.tile_n + 17
    return [(1, n, k), (3, n, k_tail), (65, wide, k)]


def build_cases(pipelines: dict[str, tuple[tuple, Callable]], refused: dict[tuple[str, str], str]
                ) -> tuple[dict[str, tuple[Gemm, list]], dict[str, tuple], dict[str, tuple[str, str, str, str]]]:
    """A target's harness cases: every MLX format x pipeline it takes (`pipelines`: name ->
    (variants, schedule(fmt, variant)); `refused`: the (format label, pipeline) pairs left out)
    x activation. Returns name -> (Gemm, shapes), name -> its sweep axes, and name -> (format
    label, pipeline, variant, activation)."""
    cases: dict[str, tuple[Gemm, list]] = {}
    axes: dict[str, tuple] = {}
    keys: dict[str, tuple[str, str, str, str]] = {}
    for f in MLX_FORMATS.values():
        for pipeline, (variants, schedule) in pipelines.items():
            if (f.label, pipeline) in refused:
                continue
            v = variant(f, variants)
            for act in ACTS:
                name = f"{f.label}-{pipeline}{'' if v == '-' else '_' + v}-{act}"
                gemm = Gemm(f"mlx_{f.label}_{pipeline}_{v.strip('-')}_{act}".replace("__", "_"), f.fmt,
                            schedule(f.fmt, v), act)
                cases[name] = (gemm, shapes(gemm))
                axes[name] = case_axes(f, pipeline, v, act)
                keys[name] = (f.label, pipeline, v, act)
    return cases, axes, keys


def check_on_harness(gemm: Gemm, kernel: Kernel, shapes: list[tuple[int, int, int]],
                     run: Callable[[dict, dict, int], dict], seed: int) -> None:
    """Each shape on fresh random weights and activations (`check_kernel`): `run(buffers,
    scalars, i)` executes the printed kernel on a harness (outputs poisoned); every output
    written and within the error model of the float64 reference; at M <= 3 the very bits of
    the interpreter running the same IR; the striped pipeline's arrival counters left as
    they were found."""
    rng = np.random.default_rng(seed)
    runs: list[tuple[dict, dict, dict]] = []

    def execute(k: Kernel, buffers: dict, scalars: dict) -> dict:
        runs.append((buffers, scalars, run(buffers, scalars, len(runs))))
        return runs[-1][2]

    for shape in shapes:
        result = check_kernel(gemm, kernel, shape, rng, execute=execute)
        assert result.untouched_poison == 0, (gemm.name, shape, result.summary())
        assert result.ok, (gemm.name, shape, result.summary())
    for buffers, scalars, out in runs:
        assert "counters" not in out or not np.asarray(out["counters"]).any(), gemm.name
        if scalars["M"] <= 3:
            theirs = run_kernel(kernel, buffers, scalars)["y"]
            np.testing.assert_array_equal(out["y"], theirs, err_msg=f"{gemm.name} M={scalars['M']}: the interpreter")
