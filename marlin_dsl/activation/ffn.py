"""A feed-forward block with run-time 2:4 activation sparsity: x -> W1 -> ReLU^2 -> 2:4 -> W2.

Forward: h = x W1^T + b1; S = sparsify(h) with the ReLU^2 and the column statistics fused
(axis 1: groups of 4 hidden features of a token); y = S W2^T + b2 through `sparse_matmul`.

Backward (a custom VJP, since the sparsification has no useful derivative):
  ds = dy W2; da = ds * mask (top2, soft_threshold: straight-through on the kept entries; the
  soft threshold's dependence on its shrink t is not differentiated) or da = ds (mvue: E[S] = a,
  so the straight-through estimator is unbiased); dh = da * 2 relu(h); dx = dh W1;
  dW1 = dh^T x; db1 = sum(dh); db2 = sum(dy);
  dW2 = (S^T dy)^T, the exact gradient of the sparse forward. With dw2="split" S^T dy is a
  `split_matmul_by_rank`: the F_s hidden columns with the most zeros in the FORWARD's
  statistics (col_zeros; ties to the lower index) are MVUE-sparsified along the tokens (an
  unbiased estimate of S^T dy), the rest stay dense. F_s = `ops.sparse_column_count(hidden,
  split_fraction)` is static (seed 004 sparsifies "the 95% most sparse columns": a count,
  hence the default 0.95); which columns is decided on the device. Using the forward's cached
  statistics is the fix of the seed's first bug (it fetched them and then did a dense matmul).

What the backward needs (h, S, its kept mask, col_zeros) leaves the forward as extra outputs of
the `mx.custom_function`, not recomputed: the backward then provably uses the forward's own
selection and statistics (an MVUE draw is reproducible from its seed, but recomputing would
pay a second GEMM and sparsify per step), and nothing is cached outside MLX's graph, so
batched calls and several calls per step stay independent.

Randomness: the forward's MVUE draw uses the call's `seed` (SparseFFN derives it from its seed
and training step, `step_seed`); the backward's split draw uses step_seed(seed, 0, 1), a
different stream.

No host sync: nothing on the forward or backward path reads an array's value on the host
(the split's column selection, gather and scatter are device ops on static shapes; seeds and
counts are host integers from the call's arguments and shapes), so a training step is queued
without waiting for the device and traces under `mx.compile` (tests/test_ffn_no_sync.py on
MLX ops; bench/probes/ffn_no_sync_gpu.py with the CUDA kernels).
Under `mx.compile` the seeds are trace-time constants (they are hashed on the host into the
graph), so a compiled step repeats its MVUE draws until it is traced again for a new seed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..errors import ShapeError
from . import ops
from ..formats.activation_reference import lowbias32
from ..formats.activation_spec import METHODS, SparsifyError, SparsifySpec

__all__ = ["FFNCache", "FFNConfig", "FFNGrads", "SparseFFN", "dense_ffn", "ffn_backward",
           "ffn_forward", "sparse_ffn", "step_seed"]

_DW2 = ("split", "dense")
_DTYPES = {mx.float16: "f16", mx.bfloat16: "bf16"}


def step_seed(seed: int, step: int, stream: int = 0) -> int:
    """A 32-bit seed from (layer seed, training step, stream): hashed so that neighbouring
    steps and the forward (stream 0) / backward (stream 1) draws are unrelated."""
    with np.errstate(over="ignore"):
        mixed = lowbias32(np.uint32(step % 2 ** 32) ^ lowbias32(np.uint32(stream) + np.uint32(0x9E3779B9)))
        return int(lowbias32(np.uint32(seed % 2 ** 32) ^ mixed))


@dataclass(frozen=True)
class FFNConfig:
    """The non-array arguments of one sparse FFN call (`seed` is this call's forward seed)."""

    method: str = "top2"
    dw2: str = "split"
    split_fraction: float = 0.95
    seed: int = 0
    backend: str = "auto"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise SparsifyError(f"method: expected one of {METHODS}, got {self.method!r}")
        if self.dw2 not in _DW2:
            raise SparsifyError(f"dw2: expected one of {_DW2}, got {self.dw2!r}")
        if (not isinstance(self.split_fraction, (int, float)) or isinstance(self.split_fraction, bool)
                or not 0.0 <= self.split_fraction <= 1.0):
            raise SparsifyError(f"split_fraction: expected the fraction of hidden columns on "
                                f"the 2:4 path, in [0, 1], got {self.split_fraction!r}")


@dataclass
class FFNCache:
    """What the backward reads from the forward: h [T, hidden], S [T, hidden] (dense form),
    its kept mask, and col_zeros [hidden] (zeros of relu(h)^2 per hidden feature)."""

    h: mx.array
    s: mx.array
    mask: mx.array
    col_zeros: mx.array


@dataclass
class FFNGrads:
    """The backward's results; `da` (d loss / d relu(h)^2) and `dh` are kept for tests."""

    da: mx.array
    dh: mx.array
    dx: mx.array
    dw1: mx.array
    db1: mx.array
    dw2: mx.array
    db2: mx.array


def ffn_forward(x: mx.array, w1: mx.array, b1: mx.array | None, w2: mx.array,
                b2: mx.array | None, cfg: FFNConfig) -> tuple[mx.array, FFNCache]:
    """y [T, dims] and the backward's cache, for x [T, dims]."""
    h = mx.matmul(x, w1.T)
    if b1 is not None:
        h = h + b1
    # dense: the kernel also writes S's dense form and kept mask, which the backward reads
    # (decoding them from the physical layout with MLX gathers took 5.1 ms at T = 8192,
    # hidden 14336 on the H100, more than the forward's GEMMs: bench/results/issue15_h100_2026-11-27d)
    spec = SparsifySpec(cfg.method, axis=1, dtype=_DTYPES[x.dtype], relu2=True, stats=True, dense=True)
    s = ops.sparsify(h, spec, cfg.seed, cfg.backend)
    y = ops.sparse_matmul(s, w2.T)
    if b2 is not None:
        y = y + b2
    return y, FFNCache(h, s.dense_operand(), s.kept_mask(), s.col_zeros)


def _masked_grads(ds: mx.array, mask: mx.array, h: mx.array) -> tuple[mx.array, mx.array]:
    """(da, dh) straight through the kept entries: da = ds * mask, dh = da * 2 relu(h)."""
    da = ds * mask.astype(ds.dtype)
    return da, da * (2 * mx.maximum(h, 0))


def _unmasked_grad(ds: mx.array, h: mx.array) -> mx.array:
    """dh = ds * 2 relu(h) (mvue: da = ds)."""
    return ds * (2 * mx.maximum(h, 0))


# One fused elementwise kernel each instead of three or four passes over [T, hidden] (the
# same operations and roundings: bit-identical; 1.06 ms unfused at T = 8192, hidden 14336 on
# the H100, bench/results/issue15_h100_2026-11-27d).
_MASKED_GRADS = mx.compile(_masked_grads)
_UNMASKED_GRAD = mx.compile(_unmasked_grad)


def ffn_backward(cache: FFNCache, x: mx.array, w1: mx.array, w2: mx.array, dy: mx.array,
                 cfg: FFNConfig) -> FFNGrads:
    """The custom VJP (see the module docstring) for x [T, dims] and dy [T, dims]."""
    ds = mx.matmul(dy, w2)
    if cfg.method == "mvue":
        da, dh = ds, _UNMASKED_GRAD(ds, cache.h)
    else:
        da, dh = _MASKED_GRADS(ds, cache.mask, cache.h)
    if cfg.dw2 == "split":
        n_sparse = ops.sparse_column_count(cache.s.shape[1], cfg.split_fraction)
        st_dy = ops.split_matmul_by_rank(cache.s, dy, cache.col_zeros, n_sparse, "mvue",
                                         step_seed(cfg.seed, 0, 1), cfg.backend)
        dw2 = st_dy.T
    else:
        dw2 = mx.matmul(dy.T, cache.s)
    return FFNGrads(da=da, dh=dh, dx=mx.matmul(dh, w1), dw1=mx.matmul(dh.T, x),
                    db1=dh.sum(axis=0), dw2=dw2, db2=dy.sum(axis=0))


def dense_ffn(x: mx.array, w1: mx.array, b1: mx.array | None, w2: mx.array,
              b2: mx.array | None) -> mx.array:
    """The dense layer (warm-up): relu(x W1^T + b1)^2 W2^T + b2, differentiated by MLX."""
    h = mx.matmul(x, w1.T)
    if b1 is not None:
        h = h + b1
    r = mx.maximum(h, 0)
    y = mx.matmul(r * r, w2.T)
    return y if b2 is None else y + b2


def _check(x: mx.array, w1: mx.array, b1: mx.array | None, w2: mx.array,
           b2: mx.array | None) -> None:
    for name, a in (("x", x), ("w1", w1), ("w2", w2), ("b1", b1), ("b2", b2)):
        if a is not None and not isinstance(a, mx.array):
            raise ShapeError(f"{name}: expected an mlx.core.array, got {type(a).__name__}")
    if x.dtype not in _DTYPES:
        raise ShapeError(f"x: expected dtype float16 or bfloat16, got {x.dtype}")
    if w1.ndim != 2 or w2.ndim != 2:
        raise ShapeError(f"w1, w2: expected matrices, got shapes {tuple(w1.shape)}, {tuple(w2.shape)}")
    hidden, dims = w1.shape
    if x.ndim < 1 or x.shape[-1] != dims:
        raise ShapeError(f"x: expected shape [..., dims={dims}] for w1 [hidden={hidden}, "
                         f"dims={dims}], got {tuple(x.shape)}")
    for name, a, want in (("w2", w2, (dims, hidden)), ("b1", b1, (hidden,)), ("b2", b2, (dims,))):
        if a is not None and tuple(a.shape) != want:
            raise ShapeError(f"{name}: expected shape {want} for w1 [hidden={hidden}, "
                             f"dims={dims}], got {tuple(a.shape)}")
    for name, a in (("w1", w1), ("w2", w2), ("b1", b1), ("b2", b2)):
        if a is not None and a.dtype != x.dtype:
            raise ShapeError(f"{name}: expected dtype {x.dtype} (x's), got {a.dtype}")


def sparse_ffn(x: mx.array, w1: mx.array, b1: mx.array | None, w2: mx.array,
               b2: mx.array | None, *, method: str = "top2", seed: int = 0, dense: bool = False,
               dw2: str = "split", split_fraction: float = 0.95,
               backend: str = "auto") -> mx.array:
    """y [..., dims] for x [..., dims] (float16 or bfloat16; weights in x's dtype, nn.Linear
    convention: w1 [hidden, dims], w2 [dims, hidden]). `dense` is the warm-up layer; `seed`
    is this call's forward draw (the backward's is derived from it). dw2="split": the
    `split_fraction` of hidden columns with the most zeros (`ops.sparse_column_count`) take the
    2:4 path of dW2, chosen on the device; dw2="dense": dW2 = dy^T S exactly."""
    _check(x, w1, b1, w2, b2)
    if dense:
        return dense_ffn(x, w1, b1, w2, b2)
    cfg = FFNConfig(method, dw2, split_fraction, seed, backend)
    lead, dims = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, dims)
    has_b1, has_b2 = b1 is not None, b2 is not None

    def unpack(args: tuple) -> tuple:
        x_, w1_, w2_, *rest = args
        b1_ = rest.pop(0) if has_b1 else None
        b2_ = rest.pop(0) if has_b2 else None
        return x_, w1_, b1_, w2_, b2_

    @mx.custom_function
    def fn(*args: mx.array) -> tuple[mx.array, ...]:
        y, c = ffn_forward(*unpack(args), cfg)
        return y, c.h, c.s, c.mask, c.col_zeros

    @fn.vjp
    def fn_vjp(primals: tuple, cotangents: tuple, outputs: tuple) -> tuple[mx.array, ...]:
        # Only y is differentiable: the auxiliary outputs' cotangents are ignored.
        x_, w1_, _, w2_, _ = unpack(primals)
        grads = ffn_backward(FFNCache(*outputs[1:]), x_, w1_, w2_, cotangents[0], cfg)
        out = [grads.dx, grads.dw1, grads.dw2]
        out += [grads.db1] * has_b1 + [grads.db2] * has_b2
        return tuple(out)

    args = (x2, w1, w2) + ((b1,) if has_b1 else ()) + ((b2,) if has_b2 else ())
    y = fn(*args)[0]
    return y.reshape(*lead, y.shape[-1])


class SparseFFN(nn.Module):
    """Linear -> ReLU^2 -> 2:4-sparse linear, trained with activation sparsity.

    Dense (MLX's own autodiff) while `training_step < warmup_steps`, sparse after; `step()`
    advances the step, and each step draws fresh MVUE randomness, derived from (seed, step).
    """

    def __init__(self, dims: int, hidden_dims: int, bias: bool = True, method: str = "top2",
                 warmup_steps: int = 0, dw2: str = "split", split_fraction: float = 0.95,
                 seed: int = 0, backend: str = "auto", dtype: mx.Dtype = mx.float16) -> None:
        super().__init__()
        FFNConfig(method, dw2, split_fraction, 0, backend)  # validates the settings
        if dtype not in _DTYPES:
            raise SparsifyError(f"dtype: expected mx.float16 or mx.bfloat16, got {dtype}")
        if not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise SparsifyError(f"warmup_steps: expected an integer >= 0, got {warmup_steps!r}")
        s1, s2 = math.sqrt(1 / dims), math.sqrt(1 / hidden_dims)
        self.w1 = mx.random.uniform(-s1, s1, (hidden_dims, dims)).astype(dtype)
        self.w2 = mx.random.uniform(-s2, s2, (dims, hidden_dims)).astype(dtype)
        if bias:
            self.b1 = mx.random.uniform(-s1, s1, (hidden_dims,)).astype(dtype)
            self.b2 = mx.random.uniform(-s2, s2, (dims,)).astype(dtype)
        self.method, self.dw2, self.split_fraction = method, dw2, split_fraction
        self.warmup_steps, self.seed, self.backend = warmup_steps, seed, backend
        self.dtype = dtype
        self.training_step = 0

    @property
    def is_sparse(self) -> bool:
        return self.training_step >= self.warmup_steps

    def step(self) -> None:
        """Advance one training step (call once per optimiser update)."""
        self.training_step += 1

    def __call__(self, x: mx.array) -> mx.array:
        """y [..., dims]; x is cast to the layer's dtype."""
        return sparse_ffn(x.astype(self.dtype), self["w1"], self.get("b1"), self["w2"],
                          self.get("b2"), method=self.method,
                          seed=step_seed(self.seed, self.training_step),
                          dense=not self.is_sparse, dw2=self.dw2,
                          split_fraction=self.split_fraction, backend=self.backend)

    def _extra_repr(self) -> str:
        hidden, dims = self["w1"].shape
        return (f"dims={dims}, hidden_dims={hidden}, method={self.method}, dw2={self.dw2}, "
                f"warmup_steps={self.warmup_steps}, step={self.training_step}")
