"""The result of sparsifying an activation: `SparseActivation`, shared by the MLX-ops backend
(ops.py, mlx_impl.py) and the kernels (kernels.py), so that neither imports the other for it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from ..errors import ShapeError
from . import mlx_impl
from ..formats.activation_spec import SparsifyError, SparsifySpec


@dataclass(eq=False)
class SparseActivation:
    """A 2:4-sparsified activation: the sparse operand S [P, L] of X [R, C] (S = X for axis 1,
    X^T for axis 0), plus what a backward pass needs from the same pass over X.

    The "mlx" backend carries `dense` (S with dropped entries 0, in the activation type) and
    `mask` (bool, the kept positions: a kept value can be 0). Kernel backends carry the
    physical `values` and `metadata` and the `layout` that wrote them; `dense_operand()` and
    `kept_mask()` give the logical form for either.
    """

    spec: SparsifySpec
    seed: int
    input_shape: tuple[int, int]    # (R, C) of X
    operand_shape: tuple[int, int]  # (P, L) of S
    activation: mx.array            # X [R, C] after the fused ReLU^2, in the activation type
    col_zeros: mx.array | None      # uint32 [C]: zeros per column of X (spec.stats)
    backend: str = "mlx"
    dense: mx.array | None = None
    mask: mx.array | None = None
    values: mx.array | None = None
    metadata: mx.array | None = None
    layout: Any = None

    def __post_init__(self) -> None:
        if (self.dense is None) != (self.mask is None):
            raise SparsifyError("SparseActivation: give both dense and mask, or neither")
        if self.dense is None and (self.values is None or self.metadata is None or self.layout is None):
            raise SparsifyError("SparseActivation: needs dense and mask (the 'mlx' form) or "
                                "values, metadata and layout (a kernel backend's form)")
        if self.dense is not None:
            for name in ("dense", "mask"):
                got = tuple(getattr(self, name).shape)
                if got != tuple(self.operand_shape):
                    raise ShapeError(f"SparseActivation: {name} has shape {got}, expected the "
                                     f"operand shape {tuple(self.operand_shape)}")

    @property
    def dtype(self) -> mx.Dtype:
        return mlx_impl.MX_DTYPES[self.spec.dtype]

    def dense_operand(self) -> mx.array:
        """S [P, L] with dropped entries 0, in the activation type."""
        if self.dense is not None:
            return self.dense
        return self.layout.decode_mx(self.values, self.metadata)[0]

    def kept_mask(self) -> mx.array:
        """bool [P, L]: the positions S keeps."""
        if self.mask is not None:
            return self.mask
        return self.layout.decode_mx(self.values, self.metadata)[1]

    def validate(self) -> None:
        """Check the 2:4 structure (a sync): at most 2 kept per group of 4 along L, and dropped
        entries 0. Operands from `sparsify` hold it by construction; this is for ones built
        by hand or read back from a kernel."""
        dense, mask = self.dense_operand(), self.kept_mask()
        p, length = self.operand_shape
        pad = -length % 4
        m = mx.pad(mask.astype(mx.int32), [(0, 0), (0, pad)]).reshape(p, -1, 4).sum(-1)
        if bool(mx.any(m > 2).item()):
            row, grp = (int(i) for i in np.argwhere(np.array(m) > 2)[0])
            raise SparsifyError(f"sparse operand: row {row}, group {grp} (elements "
                                f"{4 * grp}..{4 * grp + 3}) keeps more than 2 of 4")
        if bool(mx.any((dense != 0) & mx.logical_not(mask)).item()):
            raise SparsifyError("sparse operand: a dropped (unmasked) entry is nonzero")


__all__ = ["SparseActivation"]
