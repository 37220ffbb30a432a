"""Run-time N:M sparsity of activations: sparsify, the sparse GEMMs, the split-GEMM and
`SparseFFN`, on the kernels of each target or on MLX ops.

The declaration of the operation (`SparsifySpec`: which values a group keeps, along which
axis, with or without the fused ReLU^2 and column statistics) and its numpy semantics (the
oracle every kernel is checked against) sit with the formats, in
`formats/activation_spec.py` and `formats/activation_reference.py`: like a format, the
lowering and the layouts read them. Where each target wants the compressed values and
metadata is `layouts/sparse_activation.py`, beside the weight layouts.
"""
from ..formats.activation_spec import METHODS, SparsifySpec

__all__ = ["METHODS", "SparsifySpec"]
