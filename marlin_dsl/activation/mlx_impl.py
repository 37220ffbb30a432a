"""The "mlx" backend of run-time 2:4 sparsification: `reference.sparsify_reference` in MLX ops.

Runs wherever MLX does (the CPU included), so the sparse FFN trains without a kernel. It is the
reference's algorithm transcribed op for op: the hash in uint32 (MLX's unsigned multiply wraps
modulo 2^32 like numpy's), selection and rescaling in float32 with the same operations in the
same order, and only the stored results rounded to the activation type (MLX's float32 ->
float16 / bfloat16 casts round to nearest even, as `ir.numerics.round_to_activation` does). So
every result equals the numpy reference bit for bit (tests/test_activation_mlx.py checks it).
"""
from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx
import numpy as np

from ..formats.activation_reference import groups_length, mvue_key
from ..formats.activation_spec import SparsifySpec

#: spec.dtype -> the MLX type the results are stored in.
MX_DTYPES = {"f16": mx.float16, "bf16": mx.bfloat16}
_MUL0 = 0x7FEB352D
_MUL1 = 0x846CA68B


class MxSparse(NamedTuple):
    """`SparseResult` in MLX arrays (results in the activation type, not float32).

    dense [P, L], mask [P, L] bool (kept positions; a kept value may be 0), values [P, L4/2],
    indices [P, L4/4, 2] uint8, col_zeros [C] uint32 or None, activation [R, C].
    """

    dense: mx.array
    mask: mx.array
    values: mx.array
    indices: mx.array
    col_zeros: mx.array | None
    activation: mx.array


def _u32(v: int) -> mx.array:
    # An explicit uint32 scalar: a Python int above 2^31 must not pass through int32.
    return mx.array(v, dtype=mx.uint32)


def lowbias32_mx(x: mx.array) -> mx.array:
    """`reference.lowbias32` on a uint32 MLX array."""
    x = x ^ (x >> _u32(16))
    x = x * _u32(_MUL0)
    x = x ^ (x >> _u32(15))
    x = x * _u32(_MUL1)
    return x ^ (x >> _u32(16))


def mvue_uniform_mx(seed: int, pair_index: mx.array) -> mx.array:
    """`reference.mvue_uniform`: (lowbias32(pair_index ^ key(seed)) >> 8) * 2^-24, float32."""
    key = _u32(int(mvue_key(seed)))  # validates the seed; one scalar hash on the host
    h = lowbias32_mx(pair_index.astype(mx.uint32) ^ key)
    return (h >> _u32(8)).astype(mx.float32) * mx.array(2.0 ** -24, dtype=mx.float32)


def _relu2(a: mx.array, dt: mx.Dtype) -> mx.array:
    r = mx.maximum(a, mx.array(0.0, dtype=mx.float32))
    return (r * r).astype(dt).astype(mx.float32)


def _keep_top2(mag: mx.array) -> mx.array:
    """[..., 4] bool: the two largest magnitudes of each group, ties to the lower index."""
    mi, mj = mag[..., :, None], mag[..., None, :]
    lower = mx.array(np.tril(np.ones((4, 4), dtype=bool), k=-1))  # [i, j]: j < i
    rank = (mj > mi).astype(mx.int32).sum(-1) + ((mj == mi) & lower).astype(mx.int32).sum(-1)
    return rank < 2


def _mvue(g: mx.array, mag: mx.array, seed: int, l4: int) -> tuple[mx.array, mx.array]:
    p = g.shape[0]
    pairs = g.reshape(p, l4 // 2, 2)
    pmag = mag.reshape(p, l4 // 2, 2)
    s = pmag[..., 0] + pmag[..., 1]
    pair_index = (mx.arange(p, dtype=mx.uint32)[:, None] * _u32(l4 // 2)
                  + mx.arange(l4 // 2, dtype=mx.uint32)[None, :])
    u = mvue_uniform_mx(seed, pair_index)
    first = (u * s < pmag[..., 0]) | (pmag[..., 1] == 0)
    chosen = mx.where(first, pairs[..., 0], pairs[..., 1])
    values = mx.where(chosen < 0, -s, s)
    in_pair = mx.where(first, 0, 1).astype(mx.int32).reshape(p, l4 // 4, 2)
    idx = in_pair + mx.array([0, 2], dtype=mx.int32)
    return values.reshape(p, l4 // 4, 2), idx


def sparsify_mx(x: mx.array, spec: SparsifySpec, seed: int = 0) -> MxSparse:
    """`sparsify_reference(x, spec, seed)` in MLX ops; x [R, C] is already in spec.dtype
    (callers check it: `ops.sparsify`), so reading it as float32 is exact."""
    dt = MX_DTYPES[spec.dtype]
    a = x.astype(dt).astype(mx.float32)
    if spec.relu2:
        a = _relu2(a, dt)
    col_zeros = (a == 0).astype(mx.uint32).sum(axis=0) if spec.stats else None
    s = a if spec.axis == 1 else a.T
    p, length = s.shape
    l4 = groups_length(length)
    if l4 != length:
        s = mx.pad(s, [(0, 0), (0, l4 - length)])
    g = s.reshape(p, l4 // 4, 4)
    mag = mx.abs(g)
    if spec.method == "mvue":
        values, idx = _mvue(g, mag, seed, l4)
    else:
        keep = _keep_top2(mag)
        k8 = keep.astype(mx.uint8)
        idx0 = mx.argmax(k8, axis=-1)  # first True (MLX's argmax takes the first maximum)
        idx1 = 3 - mx.argmax(k8[..., ::-1], axis=-1)  # last True
        idx = mx.stack([idx0, idx1], axis=-1).astype(mx.int32)
        values = mx.take_along_axis(g, idx, axis=-1)
        if spec.method == "soft_threshold":
            t = mx.where(keep, mx.array(0.0, dtype=mx.float32), mag).max(axis=-1, keepdims=True)
            values = mx.where(values >= 0, values - t, values + t)
    values = values.astype(dt)
    pos = mx.arange(4, dtype=mx.int32)
    at0 = idx[..., 0:1] == pos  # [P, G, 4]
    at1 = idx[..., 1:2] == pos
    zero = mx.array(0.0, dtype=dt)
    dense = mx.where(at1, values[..., 1:2], mx.where(at0, values[..., 0:1], zero))
    mask = (at0 | at1).reshape(p, l4)[:, :length]
    return MxSparse(dense=dense.reshape(p, l4)[:, :length], mask=mask,
                    values=values.reshape(p, l4 // 2), indices=idx.astype(mx.uint8),
                    col_zeros=col_zeros, activation=a.astype(dt))
