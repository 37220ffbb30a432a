"""Issue 16: run-time 2:4 activation sparsity on the Metal path, launched as kernels. No Apple
GPU here, so `mx.fast.metal_kernel` is a stand-in (tests/metal_standin.py) that checks what MLX
would receive (the exact printed header and body of the kernel, input and output names, the
grid in threads, the threadgroup, the inputs, the output shapes, dtypes and fill value) and runs
that text on the Metal CPU harness (`targets/metal/cpu_harness.py`). The "metal" backend's
sparsify results must equal the float64 reference and the MLX-ops backend bit for bit (top2,
seeded mvue, soft_threshold; both axes; odd shapes); "auto" picks it when the Metal probe finds
an Apple GPU. The product S @ B launches the scatter GEMM (`lowering/sparse_gemm_scatter.py`;
tested on its own, and the SparseFFN on the metal backend, in tests/test_metal_sparse_gemm.py)."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

import marlin_dsl.nn as mnn  # noqa: E402
from marlin_dsl.activation import kernels, ops  # noqa: E402
from marlin_dsl.formats.activation_reference import mvue_key, operand_shape, sparsify_reference  # noqa: E402
from marlin_dsl.formats.activation_spec import METHODS, SparsifySpec  # noqa: E402
from marlin_dsl.ir.numerics import round_to_activation  # noqa: E402
from marlin_dsl.layouts.sparse_activation import ActivationLayout  # noqa: E402
from marlin_dsl.lowering.sparse_gemm import lower_sparse_gemm  # noqa: E402
from marlin_dsl.lowering.sparsify import THREADS, launch_scalars, lower_sparsify  # noqa: E402
from marlin_dsl.targets.metal.cpu_harness import compile_many, find_compiler  # noqa: E402
from marlin_dsl.targets.metal.printer import print_metal  # noqa: E402
from metal_standin import MetalStandIn  # noqa: E402

pytestmark = pytest.mark.skipif(
    find_compiler() is None,
    reason="g++ is not installed: the Metal CPU harness compiles the emitted Metal as C++20 with it")

#: every method on both axes, with and without the fused ReLU^2 and the column statistics
SPECS = [SparsifySpec("top2", 1, "f16"), SparsifySpec("top2", 0, "bf16", True, True),
         SparsifySpec("mvue", 1, "f16", True, True), SparsifySpec("mvue", 0, "f16"),
         SparsifySpec("soft_threshold", 1, "bf16", False, True), SparsifySpec("soft_threshold", 0, "f16", True, False)]
#: rows and columns that are not multiples of 4, 16 or 32
SHAPES = [(5, 7), (33, 70), (67, 9)]
_MX = {"f16": mx.float16, "bf16": mx.bfloat16}
#: every spec a launch may name (the sparse FFN's too), by kernel name
_BY_NAME = {s.name: s for s in (SparsifySpec(m, a, d, r, st) for m in METHODS for a in (0, 1)
                                for d in ("f16", "bf16") for r in (False, True) for st in (False, True))}


def _x(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """float32 normals with ties (small integers) and exact zeros of both signs."""
    x = rng.normal(size=shape).astype(np.float32) * 3
    x = np.where(rng.random(shape) < 0.3, np.round(x), x)
    x[rng.random(shape) < 0.15] = 0.0
    x[rng.random(shape) < 0.1] = -0.0
    return x


def _f32(a: Any) -> np.ndarray:
    return np.array(a.astype(mx.float32))


@pytest.fixture(scope="module")
def compiled() -> dict[str, Any]:
    """The printed Metal of every spec's sparsify kernel, compiled for the CPU harness."""
    sources = [print_metal(lower_sparsify(s, "metal")) for s in SPECS]
    return {src.name: cpu for src, cpu in zip(sources, compile_many(sources))}


def _expected(name: str) -> Any:
    """The printed kernel a launch of `name` must pass to MLX (sparsify or sparse GEMM)."""
    if name.startswith("sparse_act_gemm_"):
        return print_metal(lower_sparse_gemm(name.rsplit("_", 1)[1], "metal"))
    return print_metal(lower_sparsify(_BY_NAME[name], "metal"))


@pytest.fixture
def metal(monkeypatch: pytest.MonkeyPatch, compiled: dict[str, Any]) -> list[dict]:
    """An Apple GPU as far as the activation API can tell: the Metal probe says yes (CUDA's
    no), and `mx.fast.metal_kernel` is the stand-in; returns the launches it recorded."""
    standin = MetalStandIn(_expected, compiled)
    monkeypatch.setattr(mnn, "_metal_available", lambda: True)
    monkeypatch.setattr(mnn, "_cuda_available", lambda: False)
    monkeypatch.setattr(mx.fast, "metal_kernel", standin)
    had = "metal" in ops.KERNEL_BACKENDS
    kernels._sparsify_launch.cache_clear()  # launchers made before hold another metal_kernel
    kernels._gemm_launch.cache_clear()
    yield standin.launches
    kernels._sparsify_launch.cache_clear()
    kernels._gemm_launch.cache_clear()
    if not had:
        ops.KERNEL_BACKENDS.pop("metal", None)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_metal_backend_launches_the_printed_kernel(metal: list[dict], spec: SparsifySpec) -> None:
    """Bit-exact with the reference and with the MLX-ops backend; the launch is exactly what
    the printed kernel asks for."""
    rng = np.random.default_rng(list(spec.name.encode()))
    seeds = (3, 12345) if spec.method == "mvue" else (0,)
    for shape in SHAPES:
        x = _x(rng, shape)
        xm = mx.array(x).astype(_MX[spec.dtype])
        for seed in seeds:
            s = ops.sparsify(xm, spec, seed, backend="metal")
            got = metal[-1]
            ref = sparsify_reference(x, spec, seed)
            mine = ops.sparsify(xm, spec, seed, backend="mlx")
            assert s.backend == "metal" and s.values is not None and s.dense is None
            # the result: the float64 reference and the MLX-ops backend, bit for bit
            dense = _f32(s.dense_operand())
            assert np.array_equal(dense.view(np.uint32), ref.dense.astype(np.float32).view(np.uint32)), (shape, seed)
            assert np.array_equal(dense.view(np.uint32), _f32(mine.dense_operand()).view(np.uint32))
            assert np.array_equal(np.array(s.kept_mask()), np.array(mine.kept_mask()))
            if spec.stats:
                assert np.array_equal(np.array(s.col_zeros), ref.col_zeros)
            else:
                assert s.col_zeros is None
            assert np.array_equal(_f32(s.activation), _f32(mine.activation))
            # the launch: grid, threadgroup, inputs, dims, outputs
            layout = ActivationLayout("metal", *operand_shape(shape, spec.axis))
            scalars = launch_scalars(spec, layout, shape, int(mvue_key(seed)))
            src = print_metal(lower_sparsify(spec, "metal"))
            assert got["name"] == spec.name
            assert got["dims"] == [scalars[n] for n in src.scalar_names]
            assert got["grid"] == (-(-scalars["TASKS"] // THREADS) * THREADS, 1, 1)
            assert got["threadgroup"] == (THREADS, 1, 1)
            held = np.asarray(round_to_activation(x, spec.dtype), np.float32).ravel()
            assert np.array_equal(got["inputs"]["x"].astype(np.float32).view(np.uint32), held.view(np.uint32))
            sizes = {"values": layout.value_words, "meta": layout.meta_words, "colz": shape[1]}
            assert got["shapes"] == [(sizes[n],) for n in src.output_names]
            assert got["dtypes"] == [mx.uint32] * len(src.output_names) and got["init_value"] == 0.0
            # S @ B: the scatter GEMM kernel, on the sparsify kernel's own output
            n = 5
            b = mx.array(rng.normal(size=(s.operand_shape[1], n)).astype(np.float32)).astype(_MX[spec.dtype])
            launched = len(metal)
            y = ops.sparse_matmul(s, b)
            assert len(metal) == launched + 1 and metal[-1]["name"] == f"sparse_act_gemm_{spec.dtype}"
            assert np.array_equal(metal[-1]["inputs"]["values"], np.array(s.values))
            want = ref.dense.astype(np.float64) @ _f32(b).astype(np.float64)
            tol = {"f16": 2e-3, "bf16": 1.6e-2}[spec.dtype]
            assert np.abs(_f32(y) - want).max() <= tol * max(1.0, np.abs(want).max())
            assert np.abs(_f32(y) - _f32(ops.sparse_matmul(mine, b))).max() <= tol * max(1.0, np.abs(want).max())


def test_init_value_fills_and_is_corrected(metal: list[dict]) -> None:
    """A nonzero fill reaches MLX as init_value and the column counts are corrected for it."""
    spec = SPECS[2]
    x = _x(np.random.default_rng(9), (33, 70))
    s = kernels.sparsify(mx.array(x).astype(mx.float16), spec, 3, "metal", init_value=7)
    assert metal[-1]["init_value"] == 7.0
    assert np.array_equal(np.array(s.col_zeros), sparsify_reference(x, spec, 3).col_zeros)


def test_auto_resolves_to_metal_on_an_apple_gpu(metal: list[dict]) -> None:
    spec = SPECS[0]
    x = _x(np.random.default_rng(1), (5, 7))
    assert ops.resolve_backend("auto") == "metal"
    s = ops.sparsify(mx.array(x).astype(mx.float16), spec)
    assert s.backend == "metal" and metal and metal[-1]["name"] == spec.name
    y = ops.sparse_matmul(s, mx.ones((7, 3), dtype=mx.float16))
    assert tuple(y.shape) == (5, 3) and metal[-1]["name"] == "sparse_act_gemm_f16"


def test_metal_launch_refuses_inout_inputs() -> None:
    from marlin_dsl.errors import ShapeError
    from marlin_dsl.targets.runtimes import runtime_for

    with pytest.raises(ShapeError, match="outputs on Metal"):
        runtime_for("metal").kernel_launcher(lower_sparsify(SPECS[1], "metal"), ("colz",))
