"""Run-time N:M sparsity of activations (issue 6).

`spec` declares the operation (which values a group keeps, along which axis, with or without the
fused ReLU^2 and column statistics); `reference` is its float64/float32 numpy semantics, the
oracle every kernel is checked against. Where each target wants the compressed values and
metadata (chosen from the target's MMA lane tables) is `marlin_dsl/layouts/sparse_activation.py`,
beside the weight layouts: the sparsify lowering reads it, so it sits below the lowering.
"""
from .spec import METHODS, SparsifySpec

__all__ = ["METHODS", "SparsifySpec"]
