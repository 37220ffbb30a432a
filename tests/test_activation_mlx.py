"""The "mlx" backend of run-time 2:4 activation sparsity and the runtime API (issue 6).

- `mlx_impl.sparsify_mx` equals `reference.sparsify_reference` bit for bit (dense operand,
  compressed values, indices, activation, column statistics) on random inputs with ties,
  zeros, negative values, subnormals and odd lengths, both axes, all methods, f16 and bf16.
- `sparsify` / `SparseActivation` / `sparse_matmul` / `split_matmul` against float64
  references, T not a multiple of 4 (1, 3, 65) and F tails.
- Dispatch ("auto", the kernel registry, the kernel form of SparseActivation) and errors.

Matmul tolerances are relative to sum_k |a_k| |b_k| (float64), as in test_mlx_api.py: the
only rounding is the output's (accumulation is float32 on MLX's CPU), 2^-11 for f16 and 2^-8
for bf16, so RTOL is that with margin, plus ATOL for results in the type's subnormal range
(one unit of its smallest subnormal).
"""
from __future__ import annotations

import itertools
import sys

import mlx.core as mx
import numpy as np
import pytest

from marlin_dsl import nn as md_nn
from marlin_dsl.activation import ops
from marlin_dsl.activation.mlx_impl import (MX_DTYPES, lowbias32_mx, mvue_uniform_mx,
                                            sparsify_mx)
from marlin_dsl.activation.ops import (SparseActivation, sparse_matmul, sparsify,
                                       split_matmul)
from marlin_dsl.formats.activation_reference import (lowbias32, mvue_uniform, sparsify_reference)
from marlin_dsl.formats.activation_spec import METHODS, SparsifyError, SparsifySpec
from marlin_dsl.errors import MarlinDSLError, ShapeError
from marlin_dsl.ir.numerics import round_to_activation

DTYPES = ("f16", "bf16")
RTOL = {"f16": 2e-3, "bf16": 1.6e-2}
ATOL = {"f16": 2.0 ** -24, "bf16": 2.0 ** -133}
SHAPES = [(1, 1), (1, 6), (5, 7), (8, 12), (13, 3), (9, 17)]


def activation_input(rng: np.random.Generator, shape: tuple[int, int], dtype: str) -> np.ndarray:
    """float32 values exact in `dtype`: normals, 30% zeros (+0 and -0), 30% small integers
    (ties within groups), a few subnormals and large values."""
    x = rng.normal(size=shape).astype(np.float32) * 3
    x = np.where(rng.random(shape) < 0.3, np.round(x), x)
    x[rng.random(shape) < 0.15] = 0.0
    x[rng.random(shape) < 0.15] = -0.0
    tiny = np.float32(2.0 ** -20 if dtype == "f16" else 2.0 ** -130)  # subnormal in the type
    x = np.where(rng.random(shape) < 0.05, tiny * rng.integers(-3, 4, shape), x)
    x = np.where(rng.random(shape) < 0.03, np.float32(300.0) * np.sign(x), x)  # relu2 overflow in f16
    return np.asarray(round_to_activation(x.astype(np.float32), dtype), dtype=np.float32)


def to_mx(x: np.ndarray, dtype: str) -> mx.array:
    return mx.array(x).astype(MX_DTYPES[dtype])


def bits(a: np.ndarray | mx.array) -> np.ndarray:
    """float32 bit patterns (so -0.0 != +0.0 and NaN == NaN by pattern)."""
    if isinstance(a, mx.array):
        a = np.array(a.astype(mx.float32))
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def f64(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32)).astype(np.float64)


# ----- mlx_impl == reference ---------------------------------------------------------------

def test_hash_and_uniform_match_reference() -> None:
    rng = np.random.default_rng(0)
    v = np.concatenate([rng.integers(0, 2 ** 32, 4096, dtype=np.uint64).astype(np.uint32),
                        np.array([0, 1, 2 ** 31, 2 ** 32 - 1], np.uint32)])
    assert np.array_equal(np.array(lowbias32_mx(mx.array(v))), lowbias32(v))
    for seed in (0, 1, 12345, 2 ** 32 - 1):
        assert np.array_equal(bits(mvue_uniform_mx(seed, mx.array(v))), bits(mvue_uniform(seed, v)))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # relu2(300) is inf in f16
@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply")  # MVUE: 0 * inf
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method", METHODS)
def test_mlx_impl_bit_exact(dtype: str, method: str) -> None:
    rng = np.random.default_rng(hash((dtype, method)) % 2 ** 32)
    for axis, relu2, stats, shape in itertools.product((0, 1), (False, True), (False, True), SHAPES):
        x = activation_input(rng, shape, dtype)
        spec = SparsifySpec(method, axis, dtype, relu2, stats)
        for seed in ((0, 7, 2 ** 32 - 1) if method == "mvue" else (0,)):
            ref = sparsify_reference(x, spec, seed)
            got = sparsify_mx(to_mx(x, dtype), spec, seed)
            where = f"{spec} shape={shape} seed={seed}"
            assert np.array_equal(bits(got.dense), bits(ref.dense)), where
            assert np.array_equal(bits(got.values), bits(ref.values)), where
            assert np.array_equal(np.array(got.indices), ref.indices), where
            assert np.array_equal(bits(got.activation), bits(ref.activation)), where
            p, groups = ref.indices.shape[:2]
            full = np.zeros((p, groups, 4), bool)  # kept positions, from the indices
            np.put_along_axis(full, ref.indices.astype(np.int64), True, axis=-1)
            mask = full.reshape(p, groups * 4)[:, :ref.dense.shape[1]]
            assert np.array_equal(np.array(got.mask), mask), where
            if stats:
                assert np.array_equal(np.array(got.col_zeros), ref.col_zeros), where
            else:
                assert got.col_zeros is None


def test_sparsify_activation_fields() -> None:
    rng = np.random.default_rng(1)
    x = activation_input(rng, (10, 7), "f16")
    for axis in (0, 1):
        spec = SparsifySpec("top2", axis, "f16", relu2=True, stats=True)
        s = sparsify(to_mx(x, "f16"), spec, backend="mlx")
        ref = sparsify_reference(x, spec)
        assert s.input_shape == (10, 7) and s.operand_shape == ((10, 7) if axis else (7, 10))
        assert s.backend == "mlx" and s.dtype == mx.float16 and s.seed == 0
        assert np.array_equal(bits(s.dense_operand()), bits(ref.dense))
        assert np.array_equal(bits(s.activation), bits(ref.activation))
        assert np.array_equal(np.array(s.col_zeros), ref.col_zeros)
        kept = np.array(s.kept_mask())
        assert kept.dtype == np.bool_ and kept.shape == s.operand_shape
        assert not np.any(f64(s.dense_operand())[~kept])  # dropped entries are 0
        full = kept[:, : kept.shape[1] // 4 * 4].reshape(kept.shape[0], -1, 4)
        assert np.all(full.sum(-1) == 2)  # whole groups keep exactly two
        s.validate()


# ----- sparse_matmul and split_matmul --------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_sparse_matmul_matches_float64(dtype: str) -> None:
    rng = np.random.default_rng(2)
    for (r, c), axis, method in itertools.product([(1, 3), (3, 5), (65, 13), (16, 9)], (0, 1), METHODS):
        x = activation_input(rng, (r, c), dtype)
        spec = SparsifySpec(method, axis, dtype)
        s = sparsify(to_mx(x, dtype), spec, seed=3, backend="mlx")
        p, length = s.operand_shape
        b = to_mx(rng.normal(size=(length, 11)).astype(np.float32), dtype)
        got = f64(sparse_matmul(s, b))
        dense = sparsify_reference(x, spec, 3).dense.astype(np.float64)
        ref = dense @ f64(b)
        scale = np.abs(dense) @ np.abs(f64(b)) + 1e-30
        assert got.shape == (p, 11)
        assert np.all(np.abs(got - ref) <= RTOL[dtype] * scale + ATOL[dtype]), (spec, r, c)


def split_reference(a: np.ndarray, g: np.ndarray, mask: np.ndarray, method: str, seed: int,
                    dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(A'^T G, sum |A'|^T |G|) in float64: A' = A with the masked columns replaced by their
    2:4 sparsification along T (the gathered operand, as split_matmul defines the MVUE draw)."""
    ap = a.astype(np.float64).copy()
    cols = np.flatnonzero(mask)
    if cols.size:
        ap[:, cols] = sparsify_reference(a[:, cols], SparsifySpec(method, 0, dtype), seed).dense.T
    return ap.T @ g.astype(np.float64), np.abs(ap).T @ np.abs(g.astype(np.float64))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 3, 65])
def test_split_matmul_matches_float64(dtype: str, t: int) -> None:
    rng = np.random.default_rng(t)
    for f, method in itertools.product((1, 7, 13), METHODS):
        a = activation_input(rng, (t, f), dtype)
        g = np.asarray(round_to_activation(rng.normal(size=(t, 6)).astype(np.float32), dtype))
        for mask in (rng.random(f) < 0.5, np.ones(f, bool), np.zeros(f, bool)):
            got = f64(split_matmul(to_mx(a, dtype), to_mx(g, dtype), mx.array(mask), method, 9, "mlx"))
            ref, scale = split_reference(a, g, mask, method, 9, dtype)
            assert got.shape == (f, 6)
            assert np.all(np.abs(got - ref) <= RTOL[dtype] * scale + ATOL[dtype]), (f, method, mask)


# ----- dispatch --------------------------------------------------------------------------------

class FakeLayout:
    """A kernel layout stand-in: decode_mx returns a fixed (dense, mask)."""

    def __init__(self, dense: mx.array, mask: mx.array) -> None:
        self.dense, self.mask, self.calls = dense, mask, 0

    def decode_mx(self, values: mx.array, metadata: mx.array) -> tuple[mx.array, mx.array]:
        self.calls += 1
        return self.dense, self.mask


def test_kernel_form_decodes_through_layout() -> None:
    x = to_mx(activation_input(np.random.default_rng(4), (8, 8), "f16"), "f16")
    ref = sparsify(x, SparsifySpec("top2"), backend="mlx")
    layout = FakeLayout(ref.dense, ref.mask)
    s = SparseActivation(ref.spec, 0, (8, 8), (8, 8), ref.activation, None, backend="mlx",
                         values=mx.zeros((8, 4)), metadata=mx.zeros((8, 2)), layout=layout)
    b = mx.ones((8, 3), dtype=mx.float16)
    assert np.array_equal(bits(sparse_matmul(s, b)), bits(sparse_matmul(ref, b)))
    assert s.kept_mask() is ref.mask and layout.calls == 2


def test_auto_picks_registered_kernel_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    class FakeKernels:
        @staticmethod
        def sparsify(x, spec, seed, target):  # noqa: ANN001, ANN205
            calls.append(("sparsify", target))
            return ops._MLXBackend.sparsify(x, spec, seed, target)

        @staticmethod
        def sparse_matmul(s, b):  # noqa: ANN001, ANN205
            calls.append(("sparse_matmul", s.backend))
            return mx.matmul(s.dense_operand(), b)

    monkeypatch.setattr(md_nn, "_cuda_available", lambda: True)
    monkeypatch.setitem(ops.KERNEL_BACKENDS, "cuda", FakeKernels)
    x = mx.ones((4, 8), dtype=mx.float16)
    s = sparsify(x, SparsifySpec("top2"))
    sparse_matmul(s, mx.ones((8, 2), dtype=mx.float16))
    assert calls == [("sparsify", "cuda"), ("sparse_matmul", "cuda")]


def test_auto_falls_back_to_mlx_without_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(md_nn, "_cuda_available", lambda: True)
    monkeypatch.delitem(ops.KERNEL_BACKENDS, "cuda", raising=False)
    monkeypatch.setitem(sys.modules, "marlin_dsl.activation.kernels", None)  # import fails
    monkeypatch.delattr(sys.modules["marlin_dsl.activation"], "kernels", raising=False)  # even if imported before
    assert ops.resolve_backend("auto") == "mlx"
    with pytest.raises(SparsifyError, match="backend 'cuda' not available: the activation kernels"):
        sparsify(mx.ones((4, 8), dtype=mx.float16), SparsifySpec("top2"), backend="cuda")


def test_auto_skips_targets_the_kernels_do_not_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    class CudaOnly:
        SUPPORTED_TARGETS = ("cuda",)

    monkeypatch.setattr(md_nn, "_cuda_available", lambda: False)
    monkeypatch.setattr(md_nn, "_metal_available", lambda: True)
    monkeypatch.setitem(ops.KERNEL_BACKENDS, "metal", CudaOnly)
    assert ops.resolve_backend("auto") == "mlx"
    monkeypatch.setitem(ops.KERNEL_BACKENDS, "metal", object())  # no list: any target
    assert ops.resolve_backend("auto") == "metal"


def test_explicit_kernel_backend_without_device() -> None:
    if md_nn._cuda_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SparsifyError, match="backend 'cuda' not available: this machine"):
        sparsify(mx.ones((4, 8), dtype=mx.float16), SparsifySpec("top2"), backend="cuda")


# ----- errors -----------------------------------------------------------------------------------

def test_errors() -> None:
    x = mx.ones((4, 8), dtype=mx.float16)
    spec = SparsifySpec("top2")
    s = sparsify(x, spec, backend="mlx")
    cases = [
        (lambda: sparsify(np.ones((4, 8)), spec), ShapeError, "x: expected an mlx.core.array"),
        (lambda: sparsify(mx.ones((4,), dtype=mx.float16), spec), ShapeError, "x: expected a non-empty matrix"),
        (lambda: sparsify(x.astype(mx.float32), spec), ShapeError, "x: expected dtype mlx.core.float16"),
        (lambda: sparsify(x, SparsifySpec("top2", dtype="bf16")), ShapeError, "x: expected dtype mlx.core.bfloat16"),
        (lambda: sparsify(x, "top2"), SparsifyError, "spec: expected a SparsifySpec"),
        (lambda: sparsify(x, spec, seed=-1), SparsifyError, r"seed: expected an integer in \[0, 2\^32\)"),
        (lambda: sparsify(x, spec, backend="tpu"), SparsifyError, "backend: expected one of"),
        (lambda: sparse_matmul(x, mx.ones((8, 2), dtype=mx.float16)), SparsifyError,
         "s: expected a SparseActivation .* got array; a plain matrix is not a 2:4 operand"),
        (lambda: sparse_matmul(s, mx.ones((4, 2), dtype=mx.float16)), ShapeError,
         r"b: has 4 rows .* needs B \[L=8, N\]"),
        (lambda: sparse_matmul(s, mx.ones((8, 2), dtype=mx.bfloat16)), ShapeError, "b: expected dtype"),
        (lambda: sparse_matmul(s, mx.ones((8,), dtype=mx.float16)), ShapeError, "b: expected a non-empty matrix"),
        (lambda: split_matmul(x, x, mx.ones((7,), dtype=mx.bool_)), ShapeError, r"column_mask: expected shape \(8,\)"),
        (lambda: split_matmul(x, x, mx.ones((8,))), SparsifyError, "column_mask: expected a bool array"),
        (lambda: split_matmul(x, x[:3], mx.ones((8,), dtype=mx.bool_)), ShapeError, "g: has 3 rows .* T=4"),
        (lambda: split_matmul(x.astype(mx.float32), x, mx.ones((8,), dtype=mx.bool_)), ShapeError,
         "a: expected dtype float16 or bfloat16"),
        (lambda: split_matmul(x, x, mx.ones((8,), dtype=mx.bool_), method="random"), SparsifyError,
         "method: expected one of"),
        (lambda: split_matmul(x, x, mx.zeros((8,), dtype=mx.bool_), backend="tpu"), SparsifyError,
         "backend: expected one of"),
        (lambda: SparseActivation(spec, 0, (4, 8), (4, 8), x, None), SparsifyError, "needs dense and mask"),
        (lambda: SparseActivation(spec, 0, (4, 8), (8, 4), x, None, dense=x, mask=x > 0), ShapeError,
         r"dense has shape \(4, 8\), expected the operand shape \(8, 4\)"),
    ]
    for call, cls, pattern in cases:
        with pytest.raises(cls, match=pattern):
            call()
        assert issubclass(cls, MarlinDSLError)


def test_mixed_operand_refused() -> None:
    """A hand-built 'sparse' operand that keeps more than 2 of 4 is refused when checked."""
    x = mx.array(np.arange(1, 33, dtype=np.float32).reshape(4, 8)).astype(mx.float16)
    spec = SparsifySpec("top2")
    mixed = SparseActivation(spec, 0, (4, 8), (4, 8), x, None, dense=x, mask=mx.ones((4, 8), dtype=mx.bool_))
    with pytest.raises(SparsifyError, match="row 0, group 0 .* keeps more than 2 of 4"):
        sparse_matmul(mixed, mx.ones((8, 2), dtype=mx.float16), check_structure=True)
    leaky = SparseActivation(spec, 0, (4, 8), (4, 8), x, None, dense=x, mask=mx.zeros((4, 8), dtype=mx.bool_))
    with pytest.raises(SparsifyError, match="dropped .* entry is nonzero"):
        leaky.validate()


def test_sparsify_columns_is_sparsify_of_the_gathered_copy() -> None:
    """`columns` sparsifies x[:, columns] (the MLX backend gathers; the kernels read in place:
    test_sparsify_kernels.py), with the same selection, counts and MVUE draws as the copy."""
    rng = np.random.default_rng(12)
    x = mx.array(rng.normal(size=(40, 30)).astype(np.float32)).astype(mx.float16)
    cols = mx.array(rng.permutation(30)[:17].astype(np.uint32))
    for spec in (SparsifySpec("mvue", 0, "f16"), SparsifySpec("top2", 1, "f16", True, True)):
        got = sparsify(x, spec, 9, "mlx", columns=cols)
        want = sparsify(mx.take(x, cols, axis=1), spec, 9, "mlx")
        assert got.operand_shape == want.operand_shape
        assert mx.array_equal(got.dense_operand(), want.dense_operand()).item()
        assert mx.array_equal(got.kept_mask(), want.kept_mask()).item()
        if spec.stats:
            assert mx.array_equal(got.col_zeros, want.col_zeros).item()


@pytest.mark.parametrize("columns, match", [
    (np.arange(3), "columns: expected a non-empty integer mlx.core.array .* got ndarray"),
    (mx.zeros((2, 2), mx.uint32), r"columns: expected .* got shape \(2, 2\) of uint32"),
    (mx.zeros((0,), mx.uint32), r"columns: expected a non-empty .* got shape \(0,\)"),
    (mx.zeros((3,), mx.float32), r"columns: expected .* got shape \(3,\) of float32"),
])
def test_sparsify_columns_errors(columns, match: str) -> None:
    x = mx.ones((8, 8), mx.float16)
    with pytest.raises(ShapeError, match=match):
        sparsify(x, SparsifySpec("top2", 0, "f16"), 0, "mlx", columns=columns)
