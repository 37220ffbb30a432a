"""The declaration of a run-time 2:4 sparsification of an activation matrix.

An activation matrix X [R, C] is cut into groups of `m` = 4 consecutive elements along `axis`
(axis 1: along a row, the contraction axis of X @ W; axis 0: down a column, the contraction axis
of X^T @ G, as in a weight gradient). Each group keeps `n` = 2 values, chosen by `method`:

- "top2": the two of largest magnitude, ties to the lower index; values unchanged.
- "mvue": stochastic and unbiased (E[sparse(X)] = X): the group is two pairs (x0, x1), (x2, x3)
  and each pair keeps one element, x_i with probability |x_i| / (|x0| + |x1|), rescaled to
  sign(x_i) * (|x0| + |x1|) (the 1:2 minimum-variance unbiased estimator of Chmiel et al., 2023,
  applied per pair). Random numbers come from a counter hash of (seed, pair index), so a seed
  gives the same result on every target and in the reference.
- "soft_threshold": the top-2 positions, each kept value shrunk towards zero by the largest
  dropped magnitude t: sign(x) * (|x| - t) (S-STE's soft threshold). The result is continuous
  in X, unlike top-2.

The sparse operand is S = X (axis 1) or X^T (axis 0), [P, L] with L the sparsified length.
`relu2` fuses X = relu(H)^2 in front (H is what the kernel reads); `stats` counts, per column
of the matrix read, the zeros of X (the per-feature sparsity the split-GEMM chooses columns by);
`dense` also writes S's logical form, S [P, L] with the dropped entries 0 and its kept mask
(what a backward pass reads), so that nobody decodes the physical layout for it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import MarlinDSLError, SourceLocation
from ..source import caller_location

#: The selection rules a spec may name.
METHODS = ("top2", "mvue", "soft_threshold")
#: Activation element types the kernels read and write.
DTYPES = ("f16", "bf16")


class SparsifyError(MarlinDSLError):
    """A sparsify declaration or its arguments are inconsistent."""


@dataclass(frozen=True)
class SparsifySpec:
    """Run-time 2:4 sparsification of an activation matrix (see the module docstring)."""

    method: str = "top2"
    axis: int = 1
    dtype: str = "f16"
    relu2: bool = False
    stats: bool = False
    n: int = 2
    m: int = 4
    dense: bool = field(default=False, kw_only=True)
    location: SourceLocation | None = field(default=None, compare=False, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        if self.location is None:
            object.__setattr__(self, "location", caller_location())
        if self.method not in METHODS:
            raise SparsifyError(f"SparsifySpec: method must be one of {METHODS}, got {self.method!r}",
                                self.location)
        if self.axis not in (0, 1) or isinstance(self.axis, bool):
            raise SparsifyError(f"SparsifySpec: axis must be 0 (down columns) or 1 (along rows), "
                                f"got {self.axis!r}", self.location)
        if self.dtype not in DTYPES:
            raise SparsifyError(f"SparsifySpec: dtype must be one of {DTYPES}, got {self.dtype!r}",
                                self.location)
        if (self.n, self.m) != (2, 4):
            # The MVUE pairing, the metadata nibble and both targets' sparse MMA are 2:4.
            raise SparsifyError(f"SparsifySpec: only 2:4 is supported (the targets' sparse MMA "
                                f"is 2:4), got {self.n}:{self.m}", self.location)
        for name in ("relu2", "stats", "dense"):
            if not isinstance(getattr(self, name), bool):
                raise SparsifyError(f"SparsifySpec: {name} must be True or False, got "
                                    f"{getattr(self, name)!r}", self.location)

    @property
    def name(self) -> str:
        """A kernel name that says what the kernel does."""
        parts = ["relu2" if self.relu2 else "", "stats" if self.stats else "", "dense" if self.dense else "",
                 f"sparsify_{self.method}_axis{self.axis}_{self.dtype}"]
        return "_".join(p for p in parts if p)
