"""CUDA spelling of the IR's types and constants (the CUDA printer's vocabulary): `cuda_type`
for every IR type (scalars, vectors as `mdsl::vec<T, n>` or the native 16-bit pairs, fragments
as the m16n8k16 operands of codegen/cuda_prelude.cuh and the sparse m16n8k32's B) and exact
literals of every scalar type (f16/bf16 through their bits, f32 non-finite values through
`__uint_as_float`)."""
from __future__ import annotations

import math

import numpy as np

from ...errors import CompileError
from ...ir.numerics import f64_to_f32_odd, round_bf16
from ...ir.core import ConstTable
from ...ir.types import BF16, BOOL, F16, F32, FragmentType, ScalarType, Type, VectorType
from ...machine.cuda import CUDA
from .source import CUDA_SCALAR as _SCALAR

__all__ = ["PAIR", "bits_table", "comment_value", "cuda_type", "f32_bits", "is_pair", "literal", "zero"]

#: pairs of 16-bit floats are CUDA's native vector types (half2 arithmetic).
PAIR = {"f16": "__half2", "bf16": "__nv_bfloat162"}


def is_pair(t: Type) -> bool:
    """A vector printed as CUDA's native pair type (`__half2`, `__nv_bfloat162`)."""
    return isinstance(t, VectorType) and t.size == 2 and t.elem.name in PAIR


def cuda_type(t: Type) -> str:
    """The CUDA C++ spelling of an IR type."""
    if isinstance(t, ScalarType):
        return _SCALAR[t.name]
    if isinstance(t, VectorType):
        if t.size == 2 and t.elem.name in PAIR:
            return PAIR[t.elem.name]
        return f"mdsl::vec<{_SCALAR[t.elem.name]}, {t.size}>"
    if isinstance(t, FragmentType):
        mm, mn, mk = CUDA.mma
        shapes = {"a": (mm, mk), "b": (mk, mn), "c": (mm, mn)}
        ok_elem = t.elem.name in ("f16", "bf16") if t.role != "c" else t.elem == F32
        if CUDA.sparse_mma is not None and t.role == "b" and ok_elem \
                and (t.rows, t.cols) == (CUDA.sparse_mma[2], CUDA.sparse_mma[1]):
            return f"mdsl::frag_b32<{_SCALAR[t.elem.name]}>"  # B of the sparse m16n8k32
        wg = CUDA.warpgroup_mma
        if t.role == "c" and ok_elem and wg is not None and t.rows == mm and 8 < t.cols <= wg[1] \
                and t.cols % 8 == 0:
            return f"mdsl::frag_cw<{t.cols}>"  # a warp's accumulator of the warpgroup MMA
        if (t.rows, t.cols) != shapes[t.role] or not ok_elem:
            raise CompileError(f"cuda: fragments are the m16n8k16 operands frag<a, f16|bf16, 16x16>, "
                               f"frag<b, f16|bf16, 16x8> and frag<c, f32, 16x8> and the sparse "
                               f"m16n8k32's frag<b, f16|bf16, 32x8>, and the warpgroup MMA's "
                               f"frag<c, f32, 16xN>, not {t}")
        return "mdsl::frag_c" if t.role == "c" else f"mdsl::frag_{t.role}<{_SCALAR[t.elem.name]}>"
    raise CompileError(f"cuda: no spelling for type {t}")


# ----- literals ------------------------------------------------------------------------------

def _f32_literal(v: float) -> str:
    v = float(np.float32(v))
    if math.isnan(v) or math.isinf(v):
        bits = int(np.array([v], np.float32).view(np.uint32)[0])
        return f"__uint_as_float({bits:#010x}u)"
    return repr(v) + "f"  # v is a float32 value: the shortest double repr parses back exactly


def bits_table(t: ConstTable) -> bool:
    """An f32 table with NaN or infinite entries is printed as its uint32 bits and read with
    __uint_as_float: a `static __device__ const` table needs constant initialisers, and
    neither NVRTC nor nvcc takes a call (__uint_as_float) there; NVRTC has no __builtin_nanf."""
    return t.elem == F32 and not all(math.isfinite(float(np.float32(v))) for v in t.values)


def f32_bits(value: float) -> str:
    """The uint32 bits of `value` as f32, as a CUDA literal (entries of a bits table)."""
    return f"{int(np.array([value], np.float32).view(np.uint32)[0]):#010x}u"


def _half_bits(value: float, t: ScalarType) -> int:
    if t == F16:
        return int(np.array([value], np.float16).view(np.uint16)[0])
    f = round_bf16(f64_to_f32_odd(np.array([value], dtype=np.float64)))
    return int(f.view(np.uint32)[0]) >> 16


def literal(value: float | int | bool, t: ScalarType) -> str:
    """An exact CUDA expression of type t for `value` (rounded to t as the interpreter does)."""
    if t == BOOL:
        return "true" if value else "false"
    if t == F32:
        return _f32_literal(float(value))
    if t in (F16, BF16):
        bits = _half_bits(float(value), t)
        fn = "__ushort_as_half" if t == F16 else "__ushort_as_bfloat16"
        return f"{fn}((unsigned short){bits:#06x}u)"
    value = int(value)
    if t.name == "u32":
        return f"{value}u"
    if t.name == "i32":
        return "(-2147483647 - 1)" if value == -2 ** 31 else (f"{value}" if value >= 0 else f"({value})")
    return f"(({_SCALAR[t.name]}){value}u)"


def zero(t: ScalarType) -> str:
    """The zero of t (what a predicated-off load reads)."""
    return literal(False if t == BOOL else 0, t)


def comment_value(value: float, t: ScalarType) -> str:
    """A trailing comment with the value of a 16-bit float literal (printed as bits)."""
    return f"  // {float(value)!r}" if t in (F16, BF16) else ""
