"""The kernel IR: types, ops, kernels, a builder and the verifier."""
from .builder import Builder
from .core import Block, BufferParam, ConstTable, GridDim, Kernel, Op, ScalarParam, SharedArray, Value
from .ops import OPS, OpDef
from .types import BF16, BOOL, F16, F32, I32, U8, U16, U32, FragmentType, ScalarType, Type, VectorType, parse_type
from .verify import VerifyError, verify

__all__ = [
    "BF16", "BOOL", "Block", "BufferParam", "Builder", "ConstTable", "F16", "F32", "FragmentType",
    "GridDim", "I32", "Kernel", "OPS", "Op", "OpDef", "ScalarParam", "ScalarType", "SharedArray",
    "Type", "U16", "U32", "U8", "Value", "VectorType", "VerifyError", "parse_type", "verify",
]
