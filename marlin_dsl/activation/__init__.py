"""Run-time N:M sparsity of activations (issue 6).

`spec` declares the operation (which values a group keeps, along which axis, with or without the
fused ReLU^2 and column statistics); `reference` is its float64/float32 numpy semantics, the
oracle every kernel is checked against; `layout` is where each target wants the compressed
values and metadata (chosen from the target's MMA lane tables, like the weight layouts).
"""
from .spec import METHODS, SparsifySpec

__all__ = ["METHODS", "SparsifySpec"]
