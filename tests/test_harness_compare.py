"""The six comparisons, printed for CUDA and Metal and executed on both CPU harnesses (issue 32).

No GEMM kernel outside the warpgroup pipeline (which the CUDA harness does not run) compares
with `le`, so until this probe no harness ran either printer's `le`
(tests/test_harness_coverage.py checks that every op of a printer's table runs on its
harness). The probe compares pairs of u32, i32, f32, f16 and bf16 values (equal ones, signed
zeros, infinities, NaN, the extremes of the integers) with lt, le, gt, ge, eq and ne; each
harness must give the interpreter's bits, and those must be numpy's (every comparison with a
NaN false, but `ne`; -0 == +0).
"""
from __future__ import annotations

import numpy as np
import pytest

from marlin_dsl.ir import BF16, F16, F32, I32, U32, BufferParam, Builder, GridDim, Kernel, ScalarParam, verify
from marlin_dsl.ir.interpret import run_kernel
from marlin_dsl.targets.cuda.cpu_harness import find_compiler, run_cuda_cpu
from marlin_dsl.targets.metal.cpu_harness import compile_metal
from marlin_dsl.targets.metal.printer import print_metal

pytestmark = pytest.mark.skipif(
    find_compiler() is None,
    reason="no C++ compiler (g++ / $CXX): the CPU harnesses compile the printed text as C++20")

COMPARISONS = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
               "eq": np.equal, "ne": np.not_equal}
TYPES = {"u32": U32, "i32": I32, "f32": F32, "f16": F16, "bf16": BF16}
THREADS = 64


def compare_kernel(target: str) -> Kernel:
    """Thread t: for each type T, y[5 t + T] has bit j set where comparison j of a_T[t] and
    b_T[t] holds (threads at or past N write nothing)."""
    b = Builder()
    tid = b.index("tid")
    inside = b.binary("lt", tid, b.scalar("N"))
    for i, (tname, t) in enumerate(TYPES.items()):
        x, y = b.load(f"a_{tname}", tid, t), b.load(f"b_{tname}", tid, t)
        bits = b.const(0)
        for j, name in enumerate(COMPARISONS):
            bits = b.binary("or", bits, b.binary("shl", b.cast(b.binary(name, x, y), U32), j))
        b.store("y", b.binary("add", b.binary("mul", tid, len(TYPES)), i), bits, pred=inside)
    buffers = [BufferParam(f"{s}_{tname}", t, "read") for tname, t in TYPES.items() for s in "ab"]
    kernel = Kernel(f"compare_{target}", THREADS, (GridDim(None),) * 3, b.block,
                    buffers=[*buffers, BufferParam("y", U32, "write")], scalars=[ScalarParam("N")],
                    attrs={"target": target})
    verify(kernel)
    return kernel


def _values(tname: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """THREADS pairs: special pairs first, then random ones (many equal)."""
    if tname in ("u32", "i32"):
        info = np.iinfo(np.uint32 if tname == "u32" else np.int32)
        special = [(0, 0), (1, 0), (0, 1), (info.max, info.min), (info.min, info.max), (info.max, info.max),
                   (info.min, info.min), (7, 7)]
        pool = np.array([info.min, info.min + 1, 0, 1, 2, 3, info.max - 1, info.max], np.int64)
        dtype = np.uint32 if tname == "u32" else np.int32
    else:
        inf, nan = np.inf, np.nan
        special = [(0.0, -0.0), (-0.0, 0.0), (nan, nan), (nan, 1.0), (1.0, nan), (inf, inf), (-inf, inf),
                   (inf, nan), (-1.5, -1.5), (2.0, 1.0), (1.0, 2.0), (-inf, -1.0)]
        pool = np.array([-inf, -2.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 1.5, 2.0, inf, nan])
        dtype = np.float16 if tname == "f16" else np.float32  # bf16: values exact in bf16, held in f32
    rest = rng.choice(pool, size=(THREADS - len(special), 2))
    pairs = np.concatenate([np.array(special, dtype=pool.dtype), rest]).astype(dtype)
    return pairs[:, 0].copy(), pairs[:, 1].copy()


def _problem(seed: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    buffers: dict[str, np.ndarray] = {}
    want = np.zeros((THREADS, len(TYPES)), np.uint32)
    for i, tname in enumerate(TYPES):
        a, b = _values(tname, rng)
        buffers[f"a_{tname}"], buffers[f"b_{tname}"] = a, b
        for j, cmp in enumerate(COMPARISONS.values()):
            with np.errstate(invalid="ignore"):
                want[:, i] |= cmp(a, b).astype(np.uint32) << j
    buffers["y"] = np.zeros(THREADS * len(TYPES), np.uint32)
    return buffers, want.ravel()


@pytest.mark.parametrize("target", ["cuda", "metal"])
def test_comparisons_on_the_harness_are_the_interpreters_and_numpys(target: str) -> None:
    kernel = compare_kernel(target)
    names = {op.name for op in kernel.walk()}
    assert set(COMPARISONS) <= names
    run = (lambda bufs, s, seed: run_cuda_cpu(kernel, bufs, s, seed=seed)) if target == "cuda" else \
        (lambda bufs, s, seed, compiled=compile_metal(print_metal(kernel)): compiled.run(bufs, s, seed=seed))
    for seed in range(2):
        buffers, want = _problem(seed)
        theirs = run_kernel(kernel, buffers, {"N": THREADS})["y"]
        np.testing.assert_array_equal(theirs, want, err_msg="the interpreter against numpy")
        ours = run(buffers, {"N": THREADS}, seed)["y"]
        np.testing.assert_array_equal(ours, want, err_msg=f"the {target} harness against numpy")
