"""The runtime API of 2:4 activation sparsity: `sparsify`, `sparse_matmul`, `split_matmul`.

A sparse operand is only ever a `SparseActivation`, the result of `sparsify`: `sparse_matmul`
refuses anything else. That is the type-level guard against the seed's second bug, where a
matrix mixing 2:4 columns and dense columns was fed to a sparse matmul as one operand. A mixed
product is `split_matmul`: the sparse columns and the dense columns are gathered into two
homogeneous operands, multiplied by `sparse_matmul` and `mx.matmul`, and the rows scattered back.

`split_matmul` takes the column mask as a host value; `split_matmul_by_rank` chooses the
columns on the device (a static count of the most-sparse columns by their zero counts), so a
training step's weight gradient never reads an array back on the host (no sync, no
data-dependent shape). Nothing here evaluates an array except `split_matmul` given an MLX mask
and `sparse_matmul(check_structure=True)` (`SparseActivation.validate`), both documented syncs.

Backends: "mlx" (MLX ops, `mlx_impl`; every device), "cuda" and "metal" (compiled kernels in
`marlin_dsl.activation.kernels`, imported on first use), "auto" (the kernel backend of this
machine when there is one, its module imports and lists the target in its optional
`SUPPORTED_TARGETS`, else "mlx").
"""
from __future__ import annotations

import math
from typing import Any, Literal

import mlx.core as mx
import numpy as np

from ..errors import ShapeError
from ..layouts.sparse_activation import ROW_TILE
from . import mlx_impl
from ..formats.activation_reference import operand_shape
from .operand import SparseActivation
from ..formats.activation_spec import METHODS, SparsifyError, SparsifySpec

__all__ = ["KERNEL_BACKENDS", "SPLIT_GRANULE", "SparseActivation", "most_sparse_columns",
           "resolve_backend", "sparse_column_count", "sparse_matmul", "sparsify", "split_matmul",
           "split_matmul_by_rank"]

Backend = Literal["auto", "metal", "cuda", "mlx"]
_BACKENDS = ("auto", "metal", "cuda", "mlx")


# ----- backends ---------------------------------------------------------------------------

class _MLXBackend:
    """The "mlx" entry of KERNEL_BACKENDS: the same interface as the kernels module."""

    @staticmethod
    def sparsify(x: mx.array, spec: SparsifySpec, seed: int, target: str,
                 columns: mx.array | None = None) -> SparseActivation:
        if columns is not None:
            x = mx.take(x, columns, axis=1)
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


def _describe(a: object) -> str:
    """'shape (3,) of float32' for an array, else the type's name."""
    if isinstance(a, mx.array):
        return f"shape {tuple(a.shape)} of {str(a.dtype).removeprefix('mlx.core.')}"
    return type(a).__name__


def _check_seed(seed: object) -> int:
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or not 0 <= seed < 2 ** 32:
        raise SparsifyError(f"seed: expected an integer in [0, 2^32), got {seed!r}")
    return int(seed)


# ----- the API ------------------------------------------------------------------------------

def sparsify(x: mx.array, spec: SparsifySpec, seed: int = 0,
             backend: Backend = "auto", *, columns: mx.array | None = None) -> SparseActivation:
    """2:4-sparsify x [R, C] (dtype spec.dtype) as `spec` says; bit-exact with the reference.
    `columns` (an integer mx.array [C']): sparsify x[:, columns] instead, which the kernels
    read where it lies (no gathered copy). Indices are not checked against C on the device
    (that would need a sync): an index past the end is the caller's error."""
    if not isinstance(spec, SparsifySpec):
        raise SparsifyError(f"spec: expected a SparsifySpec, got {type(spec).__name__}")
    x = _check_matrix("x", x, mlx_impl.MX_DTYPES[spec.dtype])
    seed = _check_seed(seed)
    name = resolve_backend(backend)
    if columns is None:
        return _backend_impl(name).sparsify(x, spec, seed, name)
    if not isinstance(columns, mx.array) or columns.ndim != 1 or columns.shape[0] < 1 \
            or not mx.issubdtype(columns.dtype, mx.integer):
        raise ShapeError(f"columns: expected a non-empty integer mlx.core.array [C'] of column "
                         f"indices into x, got {_describe(columns)}")
    return _backend_impl(name).sparsify(x, spec, seed, name, columns=columns)


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
        column_mask = np.array(column_mask)  # a sync: the host needs the mask to count columns
    m = np.asarray(column_mask)
    if m.dtype != np.bool_:
        raise SparsifyError(f"column_mask: expected a bool array [F={f}], got dtype {m.dtype}")
    if m.shape != (f,):
        raise ShapeError(f"column_mask: expected shape ({f},) (one flag per column of a), "
                         f"got {m.shape}")
    return m


def _check_split(a: object, g: object, method: str, backend: str) -> tuple[mx.array, mx.array]:
    a = _check_matrix("a", a)
    if a.dtype not in (mx.float16, mx.bfloat16):
        raise ShapeError(f"a: expected dtype float16 or bfloat16, got {a.dtype}")
    g = _check_matrix("g", g, a.dtype)
    if g.shape[0] != a.shape[0]:
        raise ShapeError(f"g: has {g.shape[0]} rows (shape {tuple(g.shape)}) but a has "
                         f"T={a.shape[0]} rows: A^T @ G needs the same T")
    if method not in METHODS:
        raise SparsifyError(f"method: expected one of {METHODS}, got {method!r}")
    resolve_backend(backend)  # a bad name fails even when no column is sparse
    return a, g


def _split_products(a: mx.array, g: mx.array, order: mx.array | None, n_sparse: int,
                    method: str, seed: int, backend: Backend) -> mx.array:
    """A'^T @ G with the columns order[:n_sparse] (gathered in that order) 2:4 along T and the
    others dense. `order` is a permutation of the F columns as a device array; it is not read
    where n_sparse is 0 or F (None there). Shapes depend on n_sparse only, never on data."""
    f = a.shape[1]
    spec = SparsifySpec(method, axis=0, dtype="f16" if a.dtype == mx.float16 else "bf16")
    if n_sparse == 0:
        return mx.matmul(a.T, g)
    if n_sparse == f:
        return sparse_matmul(sparsify(a, spec, seed, backend), g)
    if order is None:
        raise SparsifyError(f"split: {n_sparse} of {f} columns are sparse but no column order given")
    s = sparsify(a, spec, seed, backend, columns=order[:n_sparse])  # read in place, not gathered
    parts = [sparse_matmul(s, g), mx.matmul(mx.take(a, order[n_sparse:], axis=1).T, g)]
    # Scatter the rows back: row i of the concatenation is column order[i], so column j is
    # row argsort(order)[j] (the inverse permutation, computed on the device).
    return mx.take(mx.concatenate(parts, axis=0), mx.argsort(order), axis=0)


def split_matmul(a: mx.array, g: mx.array, column_mask: mx.array | np.ndarray,
                 method: str = "mvue", seed: int = 0, backend: Backend = "auto") -> mx.array:
    """C = A'^T @ G [F, N] for A [T, F], G [T, N]: A' is A with the columns in `column_mask`
    2:4-sparsified along T (groups of 4 consecutive rows, zero-padded past T).

    Each GEMM gets one homogeneous operand: the masked columns, gathered, form the sparse
    operand S = A_s^T [F_s, T] (its MVUE pair indices are those of the gathered operand: row r
    is the r-th masked column, in ascending column order); the others go through a dense
    `mx.matmul`; the result rows are scattered back to their columns' places.

    The mask is a host value (the operand shapes are its counts): an `mx.array` mask is read
    on the host, a sync. A training step uses `split_matmul_by_rank`, which needs none.
    """
    a, g = _check_split(a, g, method, backend)
    f = a.shape[1]
    mask = _column_mask(column_mask, f)
    n_sparse = int(mask.sum())
    order = None
    if 0 < n_sparse < f:
        order = mx.array(np.concatenate([np.flatnonzero(mask), np.flatnonzero(~mask)]).astype(np.uint32))
    return _split_products(a, g, order, n_sparse, method, seed, backend)


# ----- the split by rank: no host value -----------------------------------------------------

#: F_s, the number of sparse columns of a split by fraction, is a multiple of this unless it is
#: all F: the CUDA layout pads S's rows to 32 (`ActivationLayout.row_pad`: one metadata register
#: serves a pair of 16-row tiles of mma.sp m16n8k32, PTX ISA 9.7.14.6.2.2), so a count that is
#: not a multiple of 32 computes padding rows.
SPLIT_GRANULE = 2 * ROW_TILE


def sparse_column_count(f: int, fraction: float) -> int:
    """F_s for a split of `fraction` of f columns: floor(fraction * f) rounded down to a
    multiple of SPLIT_GRANULE, except that fraction 1 keeps all f. Host arithmetic on the
    static shape only."""
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not 0 <= fraction <= 1:
        raise SparsifyError(f"split fraction: expected a number in [0, 1], got {fraction!r}")
    n = min(f, math.floor(fraction * f + 1e-9))  # 1e-9: 0.29 * 100 is 28.999... in binary
    return f if n == f else n - n % SPLIT_GRANULE


def most_sparse_columns(col_zeros: mx.array, n_sparse: int, tokens: int) -> mx.array:
    """uint32 [F], a permutation of the columns computed on the device: first the n_sparse
    columns with the most zeros (ties to the lower index), in ascending column order, then the
    others, ascending. `col_zeros` [F] counts zeros over `tokens` rows (values above `tokens`
    count as `tokens`).

    Each column gets a unique key z * F + (F - 1 - j) (more zeros first, then the lower index
    j), so the selection is exact whatever the sort's tie rule: the n_sparse largest keys are
    those >= the (F - n_sparse)-th smallest. Two sorts of F keys on the device.
    """
    f = int(col_zeros.shape[0])
    if not 0 <= n_sparse <= f:
        raise SparsifyError(f"n_sparse: expected 0..F={f}, got {n_sparse!r}")
    # The largest key is tokens * F + F - 1: uint32 holds it up to T * F ~ 4e9.
    kt = mx.uint32 if (tokens + 1) * f <= 2 ** 32 else mx.int64
    idx = mx.arange(f, dtype=kt)
    if n_sparse in (0, f):
        return idx.astype(mx.uint32)
    z = mx.minimum(col_zeros.astype(kt), mx.array(tokens, dtype=kt))
    key = z * mx.array(f, dtype=kt) + (mx.array(f - 1, dtype=kt) - idx)
    kth = mx.sort(key)[f - n_sparse]
    sparse = key >= kth
    # Sparse columns keep their index as sort key, dense ones are shifted past them: one sort
    # of unique keys gives [sparse ascending, dense ascending].
    return mx.argsort(mx.where(sparse, idx, idx + mx.array(f, dtype=kt))).astype(mx.uint32)


def split_matmul_by_rank(a: mx.array, g: mx.array, col_zeros: mx.array, n_sparse: int,
                         method: str = "mvue", seed: int = 0,
                         backend: Backend = "auto") -> mx.array:
    """`split_matmul` with the column mask chosen on the device: the n_sparse columns of A
    with the most zeros (`col_zeros` [F], e.g. the forward's statistics; ties to the lower
    index) take the 2:4 path. n_sparse is a static count (`sparse_column_count`), so the
    operands' shapes never depend on data and nothing is read back on the host: no sync, and
    the call traces under `mx.compile`. Equals `split_matmul(a, g, mask)` for that mask (same
    gathered order, so the same MVUE draw)."""
    a, g = _check_split(a, g, method, backend)
    t, f = a.shape
    if not isinstance(col_zeros, mx.array) or tuple(col_zeros.shape) != (f,):
        raise ShapeError(f"col_zeros: expected an mlx.core.array of shape ({f},) (one count per "
                         f"column of a), got {getattr(col_zeros, 'shape', type(col_zeros).__name__)}")
    if mx.issubdtype(col_zeros.dtype, mx.floating) or col_zeros.dtype == mx.bool_:
        raise SparsifyError(f"col_zeros: expected integer zero counts, got dtype {col_zeros.dtype}")
    if not isinstance(n_sparse, (int, np.integer)) or isinstance(n_sparse, bool) or not 0 <= n_sparse <= f:
        raise SparsifyError(f"n_sparse: expected an integer in 0..F={f}, got {n_sparse!r}")
    n_sparse = int(n_sparse)
    order = None if n_sparse in (0, f) else most_sparse_columns(col_zeros, n_sparse, t)
    return _split_products(a, g, order, n_sparse, method, seed, backend)
