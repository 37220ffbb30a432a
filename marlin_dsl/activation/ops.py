"""The runtime API of 2:4 activation sparsity: `sparsify`, `sparse_matmul`, `split_matmul`.

A sparse operand is only ever a `SparseActivation`, the result of `sparsify`: `sparse_matmul`
refuses anything else. That is the type-level guard against the seed's second bug, where a
matrix mixing 2:4 columns and dense columns was fed to a sparse matmul as one operand. A mixed
product is `split_matmul`: the sparse columns and the dense columns are gathered into two
homogeneous operands, multiplied by `sparse_matmul` and `mx.matmul`, and the rows scattered back.

Backends: "mlx" (MLX ops, `mlx_impl`; every device), "cuda" and "metal" (compiled kernels in
`marlin_dsl.activation.kernels`, imported on first use), "auto" (the kernel backend of this
machine when there is one, its module imports and lists the target in its optional
`SUPPORTED_TARGETS`, else "mlx").
"""
from __future__ import annotations

from typing import Any, Literal

import mlx.core as mx
import numpy as np

from ..errors import ShapeError
from . import mlx_impl
from .reference import operand_shape
from .operand import SparseActivation
from .spec import METHODS, SparsifyError, SparsifySpec

__all__ = ["KERNEL_BACKENDS", "SparseActivation", "resolve_backend", "sparse_matmul",
           "sparsify", "split_matmul"]

Backend = Literal["auto", "metal", "cuda", "mlx"]
_BACKENDS = ("auto", "metal", "cuda", "mlx")


# ----- backends ---------------------------------------------------------------------------

class _MLXBackend:
    """The "mlx" entry of KERNEL_BACKENDS: the same interface as the kernels module."""

    @staticmethod
    def sparsify(x: mx.array, spec: SparsifySpec, seed: int, target: str) -> SparseActivation:
        r = mlx_impl.sparsify_mx(x, spec, seed)
        shape = (int(x.shape[0]), int(x.shape[1]))
        return SparseActivation(spec, seed, shape, operand_shape(shape, spec.axis), r.activation,
                                r.col_zeros, backend=target, dense=r.dense, mask=r.mask)

    @staticmethod
    def sparse_matmul(s: SparseActivation, b: mx.array) -> mx.array:
        return mx.matmul(s.dense_operand(), b)


#: Implemented backends by name; "cuda" / "metal" are added when the kernels module imports.
KERNEL_BACKENDS: dict[str, object] = {"mlx": _MLXBackend}


def resolve_backend(backend: str = "auto") -> str:
    """The concrete backend name for `backend` (see the module docstring)."""
    from .. import nn as _nn  # the machine probes live with the other MLX-facing code

    if backend not in _BACKENDS:
        raise SparsifyError(f"backend: expected one of {list(_BACKENDS)}, got {backend!r}")
    if backend != "auto":
        return backend
    for name, probe in (("cuda", _nn._cuda_available), ("metal", _nn._metal_available)):
        if probe():
            try:
                impl = _backend_impl(name)
            except SparsifyError:
                return "mlx"  # no kernel module yet: "auto" still runs, on MLX ops
            # A kernel module may launch on some targets only: it lists them in SUPPORTED_TARGETS.
            return name if name in getattr(impl, "SUPPORTED_TARGETS", (name,)) else "mlx"
    return "mlx"


def _backend_impl(name: str) -> Any:
    """The implementation of concrete backend `name`, importing the kernels on first use."""
    if name in KERNEL_BACKENDS:
        return KERNEL_BACKENDS[name]
    from .. import nn as _nn

    if not {"cuda": _nn._cuda_available, "metal": _nn._metal_available}[name]():
        hardware = {"cuda": "NVIDIA GPU with MLX CUDA", "metal": "Apple GPU with Metal"}[name]
        raise SparsifyError(f"backend {name!r} not available: this machine has no {hardware}"
                            f" ({_nn._machine()}); use backend='mlx' or 'auto'")
    try:
        from . import kernels
    except ImportError as e:
        raise SparsifyError(f"backend {name!r} not available: the activation kernels "
                            f"(marlin_dsl.activation.kernels) do not import: {e}") from e
    KERNEL_BACKENDS[name] = kernels
    return kernels


# ----- argument checks ----------------------------------------------------------------------

def _check_matrix(name: str, a: object, dtype: mx.Dtype | None = None) -> mx.array:
    if not isinstance(a, mx.array):
        raise ShapeError(f"{name}: expected an mlx.core.array matrix, got {type(a).__name__}")
    if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < 1:
        raise ShapeError(f"{name}: expected a non-empty matrix (rank 2), got shape {tuple(a.shape)}")
    if dtype is not None and a.dtype != dtype:
        raise ShapeError(f"{name}: expected dtype {dtype}, got {a.dtype}")
    return a


def _check_seed(seed: object) -> int:
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or not 0 <= seed < 2 ** 32:
        raise SparsifyError(f"seed: expected an integer in [0, 2^32), got {seed!r}")
    return int(seed)


# ----- the API ------------------------------------------------------------------------------

def sparsify(x: mx.array, spec: SparsifySpec, seed: int = 0,
             backend: Backend = "auto") -> SparseActivation:
    """2:4-sparsify x [R, C] (dtype spec.dtype) as `spec` says; bit-exact with the reference."""
    if not isinstance(spec, SparsifySpec):
        raise SparsifyError(f"spec: expected a SparsifySpec, got {type(spec).__name__}")
    x = _check_matrix("x", x, mlx_impl.MX_DTYPES[spec.dtype])
    seed = _check_seed(seed)
    name = resolve_backend(backend)
    return _backend_impl(name).sparsify(x, spec, seed, name)


def sparse_matmul(s: SparseActivation, b: mx.array, *, check_structure: bool = False) -> mx.array:
    """S @ B: [P, L] @ [L, N] -> [P, N] in the activation type, on the backend that made `s`.

    Only a `SparseActivation` is a sparse operand: a plain array (dense, or mixing sparse and
    dense columns) is refused, so it cannot reach a 2:4 MMA. `check_structure` also verifies
    the 2:4 structure of `s` (a sync), for operands not made by `sparsify`.
    """
    if not isinstance(s, SparseActivation):
        raise SparsifyError(
            f"s: expected a SparseActivation (made by sparsify), got {type(s).__name__}; a plain "
            f"matrix is not a 2:4 operand (for a matrix of sparse and dense columns use "
            f"split_matmul, which multiplies each kind separately)")
    p, length = s.operand_shape
    b = _check_matrix("b", b, s.dtype)
    if b.shape[0] != length:
        raise ShapeError(f"b: has {b.shape[0]} rows (shape {tuple(b.shape)}) but the sparse "
                         f"operand is [P={p}, L={length}]: S @ B needs B [L={length}, N]")
    if check_structure:
        s.validate()
    return _backend_impl(s.backend).sparse_matmul(s, b)


def _column_mask(column_mask: object, f: int) -> np.ndarray:
    if isinstance(column_mask, mx.array):
        column_mask = np.array(column_mask)
    m = np.asarray(column_mask)
    if m.dtype != np.bool_:
        raise SparsifyError(f"column_mask: expected a bool array [F={f}], got dtype {m.dtype}")
    if m.shape != (f,):
        raise ShapeError(f"column_mask: expected shape ({f},) (one flag per column of a), "
                         f"got {m.shape}")
    return m


def split_matmul(a: mx.array, g: mx.array, column_mask: mx.array | np.ndarray,
                 method: str = "mvue", seed: int = 0, backend: Backend = "auto") -> mx.array:
    """C = A'^T @ G [F, N] for A [T, F], G [T, N]: A' is A with the columns in `column_mask`
    2:4-sparsified along T (groups of 4 consecutive rows, zero-padded past T).

    Each GEMM gets one homogeneous operand: the masked columns, gathered, form the sparse
    operand S = A_s^T [F_s, T] (its MVUE pair indices are those of the gathered operand: row r
    is the r-th masked column); the others go through a dense `mx.matmul`; the result rows are
    scattered back to their columns' places.
    """
    a = _check_matrix("a", a)
    if a.dtype not in (mx.float16, mx.bfloat16):
        raise ShapeError(f"a: expected dtype float16 or bfloat16, got {a.dtype}")
    g = _check_matrix("g", g, a.dtype)
    t, f = a.shape
    if g.shape[0] != t:
        raise ShapeError(f"g: has {g.shape[0]} rows (shape {tuple(g.shape)}) but a has T={t} "
                         f"rows: A^T @ G needs the same T")
    if method not in METHODS:
        raise SparsifyError(f"method: expected one of {METHODS}, got {method!r}")
    mask = _column_mask(column_mask, f)
    resolve_backend(backend)  # a bad name fails even when no column is sparse
    sparse_cols, dense_cols = np.flatnonzero(mask), np.flatnonzero(~mask)
    parts = []
    if sparse_cols.size:
        spec = SparsifySpec(method, axis=0, dtype="f16" if a.dtype == mx.float16 else "bf16")
        s = sparsify(mx.take(a, mx.array(sparse_cols), axis=1), spec, seed, backend)
        parts.append(sparse_matmul(s, g))
    if dense_cols.size:
        parts.append(mx.matmul(mx.take(a, mx.array(dense_cols), axis=1).T, g))
    if not sparse_cols.size or not dense_cols.size:
        return parts[0]
    order = np.concatenate([sparse_cols, dense_cols])
    return mx.take(mx.concatenate(parts, axis=0), mx.array(np.argsort(order)), axis=0)
