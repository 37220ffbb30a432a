"""The exact semantics of run-time 2:4 activation sparsification, in vectorised numpy.

Every kernel (interpreter, Metal CPU harness, GPU) must reproduce these results bit for bit:
the selection and rescaling are done in float32 with the same operations, in the same order,
as the kernels, and only the stored results are rounded to the activation type. A group that
runs past the end of the sparsified axis is padded with zeros (the padding rule of
`SparsifySpec`), so every length is accepted.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.numerics import round_to_activation
from .activation_spec import SparsifyError, SparsifySpec

#: 2^-24: the MVUE uniform is the top 24 bits of a 32-bit hash, exact in float32.
_U24 = np.float32(2.0 ** -24)
#: lowbias32's multipliers (C. Wellons' integer hash: full avalanche, a bijection on u32).
_HASH_MUL = (np.uint32(0x7FEB352D), np.uint32(0x846CA68B))


def lowbias32(x: np.ndarray | int) -> np.ndarray:
    """The 32-bit integer hash the MVUE draws from (element-wise, wraps modulo 2^32)."""
    x = np.asarray(x, dtype=np.uint32)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint32(16))
        x = x * _HASH_MUL[0]
        x = x ^ (x >> np.uint32(15))
        x = x * _HASH_MUL[1]
        x = x ^ (x >> np.uint32(16))
    return x


def mvue_key(seed: int) -> np.uint32:
    """The per-draw key: the seed, hashed once (so consecutive seeds give unrelated streams)."""
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or not 0 <= seed < 2 ** 32:
        raise SparsifyError(f"seed must be an integer in [0, 2^32), got {seed!r}")
    return lowbias32(np.uint32(seed))[()]


def mvue_uniform(seed: int, pair_index: np.ndarray) -> np.ndarray:
    """u in [0, 1) for each pair: (lowbias32(pair_index ^ key(seed)) >> 8) * 2^-24, float32."""
    h = lowbias32(np.asarray(pair_index, dtype=np.uint32) ^ mvue_key(seed))
    return (h >> np.uint32(8)).astype(np.float32) * _U24


def operand_shape(shape: tuple[int, int], axis: int) -> tuple[int, int]:
    """(P, L): the sparse operand's rows and its sparsified length, for a matrix [R, C]."""
    r, c = shape
    return (r, c) if axis == 1 else (c, r)


def groups_length(length: int) -> int:
    """The sparsified length padded with zeros to whole groups of 4."""
    return -(-length // 4) * 4


@dataclass(frozen=True)
class SparseResult:
    """What a sparsify kernel computes, in logical (layout-free) form.

    dense:   [P, L] float32, the sparse operand S with dropped entries 0 (values rounded to the
             activation type); S = X (axis 1) or X^T (axis 0).
    values:  [P, L4 / 2] float32 compressed values, two per group, lower position first.
    indices: [P, L4 / 4, 2] uint8, the in-group positions of values (idx0 < idx1).
    col_zeros: [C] uint32 zero counts per column of X (after ReLU^2), or None without stats.
    activation: [R, C] float32, X itself (after the ReLU^2, rounded), the dense operand.
    """

    dense: np.ndarray
    values: np.ndarray
    indices: np.ndarray
    col_zeros: np.ndarray | None
    activation: np.ndarray
    #: the nibble of an all-zero group (the padding's): 0b0100 (top2, soft), 0b1000 (mvue)
    pad_nibble: int = 0b0100

    def kept_mask(self) -> np.ndarray:
        """[P, L] bool: the positions S keeps (a kept value may be 0), from the indices."""
        p, groups = self.indices.shape[:2]
        kept = np.zeros((p, groups, 4), np.bool_)
        rows, cols = np.indices((p, groups))
        for slot in (0, 1):
            kept[rows, cols, self.indices[..., slot]] = True
        return kept.reshape(p, 4 * groups)[:, :self.dense.shape[1]]

    @property
    def nibbles(self) -> np.ndarray:
        """[P, L4 / 4] uint8 metadata fields idx0 | idx1 << 2 (the mma.sp ordering)."""
        return (self.indices[..., 0] | (self.indices[..., 1] << 2)).astype(np.uint8)


def relu2(h: np.ndarray, dtype: str) -> np.ndarray:
    """relu(h)^2: squared in float32 (one rounding), stored in the activation type."""
    r = np.maximum(h.astype(np.float32), np.float32(0))
    return np.asarray(round_to_activation(r * r, dtype), dtype=np.float32)


def _keep_top2(mag: np.ndarray) -> np.ndarray:
    """[..., 4] bool: the two largest magnitudes of each group, ties to the lower index."""
    mi, mj = mag[..., :, None], mag[..., None, :]
    lower = np.tril(np.ones((4, 4), dtype=bool), k=-1)  # [i, j]: j < i
    rank = (mj > mi).sum(-1) + ((mj == mi) & lower).sum(-1)
    return rank < 2


def sparsify_reference(x: np.ndarray, spec: SparsifySpec, seed: int = 0) -> SparseResult:
    """Sparsify x [R, C] as `spec` says (x is rounded to spec.dtype first, as kernels read it)."""
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise SparsifyError(f"x must be a non-empty matrix [R, C], got shape {x.shape}")
    a = np.asarray(round_to_activation(x.astype(np.float32), spec.dtype), dtype=np.float32)
    if spec.relu2:
        a = relu2(a, spec.dtype)
    col_zeros = (a == 0).sum(axis=0).astype(np.uint32) if spec.stats else None
    s = a if spec.axis == 1 else a.T
    p, length = s.shape
    l4 = groups_length(length)
    g = np.zeros((p, l4), np.float32)
    g[:, :length] = s
    g = g.reshape(p, l4 // 4, 4)
    mag = np.abs(g)
    if spec.method == "mvue":
        values, idx = _mvue(g, mag, seed, l4)
    else:
        keep = _keep_top2(mag)
        # Exactly two kept per group: the first and the last True.
        idx0 = np.argmax(keep, axis=-1)
        idx1 = 3 - np.argmax(keep[..., ::-1], axis=-1)
        idx = np.stack([idx0, idx1], axis=-1)
        values = np.take_along_axis(g, idx, axis=-1)
        if spec.method == "soft_threshold":
            t = np.where(keep, np.float32(0), mag).max(axis=-1, keepdims=True)
            values = np.where(values >= 0, values - t, values + t).astype(np.float32)
    values = np.asarray(round_to_activation(values, spec.dtype), dtype=np.float32)
    dense = np.zeros_like(g)
    np.put_along_axis(dense, idx, values, axis=-1)
    return SparseResult(dense=dense.reshape(p, l4)[:, :length], values=values.reshape(p, l4 // 2),
                        indices=idx.astype(np.uint8), col_zeros=col_zeros, activation=a,
                        pad_nibble=0b1000 if spec.method == "mvue" else 0b0100)


def _mvue(g: np.ndarray, mag: np.ndarray, seed: int, l4: int) -> tuple[np.ndarray, np.ndarray]:
    """Per pair (x0, x1): keep x0 iff u * (|x0| + |x1|) < |x0| or x1 == 0, value +-(|x0|+|x1|)."""
    p = g.shape[0]
    pairs = g.reshape(p, l4 // 2, 2)
    pmag = mag.reshape(p, l4 // 2, 2)
    s = pmag[..., 0] + pmag[..., 1]
    pair_index = (np.arange(p, dtype=np.uint32)[:, None] * np.uint32(l4 // 2)
                  + np.arange(l4 // 2, dtype=np.uint32)[None, :])
    u = mvue_uniform(seed, pair_index)
    first = (u * s < pmag[..., 0]) | (pmag[..., 1] == 0)
    chosen = np.where(first, pairs[..., 0], pairs[..., 1])
    values = np.where(chosen < 0, -s, s).astype(np.float32)
    in_pair = np.where(first, 0, 1).reshape(p, l4 // 4, 2)
    idx = in_pair + np.array([0, 2])
    return values.reshape(p, l4 // 4, 2), idx


def decompress(values: np.ndarray, indices: np.ndarray, length: int) -> np.ndarray:
    """[P, L] from compressed values [P, L4/2] and indices [P, L4/4, 2]: an independent read-back."""
    p, groups = indices.shape[:2]
    dense = np.zeros((p, groups, 4), np.float32)
    np.put_along_axis(dense, indices.astype(np.int64), values.reshape(p, groups, 2), axis=-1)
    return dense.reshape(p, groups * 4)[:, :length]


def nibbles_to_indices(nibbles: np.ndarray) -> np.ndarray:
    """[..., 2] in-group positions from metadata nibbles idx0 | idx1 << 2."""
    nib = np.asarray(nibbles, dtype=np.uint8)
    return np.stack([nib & 3, (nib >> 2) & 3], axis=-1)
