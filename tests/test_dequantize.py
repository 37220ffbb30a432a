"""The dequantize kernel (lowering/dequantize.py): the CUDA stream layout decoded to W^T [N, K]
for the fp16/bf16 GEMM at many rows. Checked against the float64 reference dequantisation
rounded once to the activation type, in the interpreter and as printed text (CUDA CPU
harness); outputs poisoned with NaN first."""
from __future__ import annotations

import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl import CUDA, METAL
from marlin_dsl.checks.format_check import sample_weights
from marlin_dsl.compiler import compile_dequantize
from marlin_dsl.errors import ScheduleError
from marlin_dsl.ir.interpret import run_kernel
from marlin_dsl.ir.numerics import round_bf16
from marlin_dsl.kernel_args import physical_arrays
from marlin_dsl.lowering.dequantize import dequantize_supported
from marlin_dsl.targets.cuda import tuning
from marlin_dsl.targets.cuda.cpu_harness import compile_cuda_cpu, find_compiler
from marlin_dsl.targets.cuda.nvcc import find_nvcc, nvcc_check
from marlin_dsl.targets.cuda.printer import print_cuda


def buffers(kernel, fmt, k: int, n: int, act: str, seed: int) -> tuple[dict, np.ndarray]:
    """The kernel's inputs for a fresh random weight, w poisoned with NaN, and W^T [N, K] of the
    reference rounded once to the activation type."""
    packed = md.pack(fmt, sample_weights(fmt, k, n, np.random.default_rng(seed)))
    arrays = physical_arrays(kernel.attrs, packed)
    bufs = {b.name: np.ascontiguousarray(arrays[b.name]).ravel() for b in kernel.buffers if b.access == "read"}
    bufs["w"] = np.full(n * k, np.nan, np.float32 if act == "bf16" else np.float16)
    ref = md.dequantize(packed).T
    rounded = round_bf16(ref) if act == "bf16" else ref.astype(np.float16)
    return bufs, np.asarray(rounded, np.float64)


def decoded(out: dict, k: int, n: int) -> np.ndarray:
    return np.asarray(out["w"], np.float64).reshape(n, k)


@pytest.mark.parametrize("fmt_name", ["fp4", "int4", "uint4_zp"])
@pytest.mark.parametrize("act", ["f16", "bf16"])
def test_decoded_weights_are_the_reference_rounded_once(fmt_name: str, act: str) -> None:
    # N tails (72, 40: rows past N not stored), K of 6 and of 10 vectors (two K blocks of up to
    # DEQUANT_VECTORS, the second partial)
    fmt = md.builtin_format(fmt_name)
    kernel = compile_dequantize(fmt, act, CUDA).kernel
    for i, (k, n) in enumerate([(384, 72), (10 * 64, 40)]):
        bufs, ref = buffers(kernel, fmt, k, n, act, seed=i)
        got = decoded(run_kernel(kernel, bufs, {"M": 1, "N": n, "K": k}), k, n)
        assert not np.isnan(got).any()
        assert np.array_equal(got, ref), np.argwhere(got != ref)[:5]


def test_table_codes_round_twice_by_at_most_one_ulp() -> None:
    # nf4's table values are rounded to f16 before the scale multiplies them (the GEMMs' A
    # values are the same): within one f16 ulp of the reference rounded once
    fmt = md.builtin_format("nf4")
    kernel = compile_dequantize(fmt, "f16", CUDA).kernel
    bufs, ref = buffers(kernel, fmt, 256, 48, "f16", seed=3)
    got = decoded(run_kernel(kernel, bufs, {"M": 1, "N": 48, "K": 256}), 256, 48)
    ulp = np.spacing(np.abs(ref).astype(np.float16)).astype(np.float64)
    assert not np.isnan(got).any() and (np.abs(got - ref) <= ulp).all()


@pytest.mark.skipif(find_compiler() is None, reason="needs a C++ compiler (g++) for the CUDA CPU harness")
@pytest.mark.parametrize("fmt_name, act", [("fp4", "f16"), ("uint4_zp", "bf16")])
def test_the_printed_text_decodes_as_the_interpreter(fmt_name: str, act: str) -> None:
    fmt = md.builtin_format(fmt_name)
    kernel = compile_dequantize(fmt, act, CUDA).kernel
    k, n = 9 * 64 + 64, 56
    bufs, ref = buffers(kernel, fmt, k, n, act, seed=7)
    got = decoded(compile_cuda_cpu(print_cuda(kernel)).run(dict(bufs), {"M": 1, "N": n, "K": k}), k, n)
    assert np.array_equal(got, ref)


def test_stores_are_16_byte_runs() -> None:
    # fp4's K shuffle gives each lane 8 consecutive K of a row: one 16-byte store per run
    body = print_cuda(compile_dequantize(md.builtin_format("fp4"), "f16", CUDA).kernel).body
    stores = [line for line in body.splitlines() if "&w[" in line]
    assert stores and all("mdsl::vec<__half, 8>" in line for line in stores)


def test_what_it_refuses() -> None:
    assert dequantize_supported(md.builtin_format("fp4"), CUDA, 4096) is None
    assert "sparse" in dequantize_supported(md.builtin_format("fp4_2of4"), CUDA)
    assert "whole number" in dequantize_supported(md.builtin_format("fp4", 32), CUDA, 7 * 64 - 32)
    with pytest.raises(ScheduleError, match="metal"):
        compile_dequantize(md.builtin_format("fp4"), "f16", METAL)
    with pytest.raises(ScheduleError, match="sparse"):
        compile_dequantize(md.builtin_format("int4_2of4"), "bf16", CUDA)


def test_layers_take_the_route_from_the_measured_rows() -> None:
    from marlin_dsl.targets.cuda.runtime import RUNTIME
    from marlin_dsl.targets.metal.runtime import RUNTIME as METAL_RUNTIME

    fmt = md.builtin_format("fp4")
    assert tuning.dequantize_min_m(4096, 14336) == tuning.DEQUANTIZE_MIN_M
    assert tuning.dequantize_min_m(1024, 1024) == tuning.DEQUANTIZE_MIN_M_SMALL
    # below the rows, or without a device of the warpgroup MMA (where it was measured): none
    assert RUNTIME.layer_dequantize(fmt, "f16", tuning.DEQUANTIZE_MIN_M - 1, 4096, 14336) is None
    assert METAL_RUNTIME.layer_dequantize(fmt, "f16", 4096, 4096, 4096) is None


@pytest.mark.skipif(find_nvcc() is None, reason="needs nvcc (CUDA toolkit) to compile the printed text")
def test_nvcc_compiles_them() -> None:
    from dataclasses import replace

    sources = [replace(print_cuda(compile_dequantize(md.builtin_format(f), act, CUDA).kernel), name=f"dq_{f}_{act}")
               for f in ("fp4", "uint4_zp", "nf4") for act in ("f16", "bf16")]
    results = nvcc_check(sources, archs=["sm_80", "sm_90"])
    assert all(r.ok for r in results), [r.log for r in results if not r.ok]


def test_the_layer_route_multiplies_the_decoded_weight() -> None:
    # the dispatch's wiring on the CPU, with a stand-in for the GPU kernel that returns the
    # reference W^T: the weight arrays and dims go in, x @ W comes out for any leading shape,
    # f32 activations in f16 and back, and parts split after the product
    mx = pytest.importorskip("mlx.core")
    from marlin_dsl.layers.dispatch import TargetDispatch
    from marlin_dsl.targets.base import LayerKernel

    fmt, k, n = md.builtin_format("fp4"), 256, 40
    packed = md.pack(fmt, sample_weights(fmt, k, n, np.random.default_rng(5)))
    w_t = md.dequantize(packed).T.astype(np.float16)
    seen = []

    def stand_in(*, inputs, output_shapes, output_dtypes, grid, threadgroup, init_value):
        seen.append((len(inputs), output_shapes, output_dtypes))
        return [mx.array(w_t).astype(output_dtypes[0])]

    for parts, dtype in (((), mx.float16), ((), mx.float32), ((16, 24), mx.bfloat16)):
        d = TargetDispatch(fmt, k, n, "cuda", parts=parts)
        d._dequantize = lambda act, m, d=d: LayerKernel(stand_in, "dq", (*d.names, "dims"), ("w",), (m, n, k),
                                                         (1, 1, 1), (32, 1, 1), d.layout)
        weights = tuple(mx.zeros((4,), mx.uint32) for _ in d.names)
        x = np.random.default_rng(6).standard_normal((3, 5, k))
        y = d(mx.array(x.astype(np.float32)).astype(dtype), weights)
        y = np.concatenate([np.array(p.astype(mx.float32)) for p in y], -1) if parts else np.array(y.astype(mx.float32))
        assert y.shape == (3, 5, n) and seen[-1][0] == len(d.names) + 1 and seen[-1][1] == [(n, k)]
        ref = x @ w_t.astype(np.float64).T
        assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < (1e-2 if dtype == mx.bfloat16 else 2e-3)
