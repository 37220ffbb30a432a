"""The IR's rounding rules in numpy (docs/IR.md): bf16 rounding, float64 rounded to odd, one
rounding to a float type, casts and bit casts. The op table's scalar semantics (semantics.py),
hence the interpreter and the folder, and the printers' float literals use them; the host
rounds activations to f16 / bf16 with `round_to_activation` before any executor reads them."""
from __future__ import annotations

import numpy as np

from .types import BF16, BOOL, F16, F32, ScalarType, Type


# ----- numeric helpers ----------------------------------------------------------------------

_U32 = np.uint32
_INT_RANGE = {"u8": (0, 2**8 - 1), "u16": (0, 2**16 - 1), "u32": (0, 2**32 - 1),
              "i32": (-2**31, 2**31 - 1)}
_NAN32 = np.float32(np.nan)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> nearest bf16 value (ties to even), held in float32. NaN stays (a quiet) NaN."""
    x = np.asarray(x, dtype=np.float32)
    b = x.view(np.uint32)
    r = ((b + (_U32(0x7FFF) + ((b >> _U32(16)) & _U32(1)))) & _U32(0xFFFF0000)).view(np.float32)
    return np.where(np.isnan(x), _NAN32, r)


def round_to_activation(x: np.ndarray, activation: str) -> np.ndarray:
    """x rounded to the activation type as every executor feeds it to a kernel: f16, or bf16
    (held in float32, round to nearest even). Unlike `round_bf16` it has no NaN guard: it is
    what every executor and oracle has always fed kernels, bit for bit (the host checks
    activations finite on entry: `kernel_args.gemm_buffers`)."""
    if activation == "f16":
        return x.astype(np.float16)
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32)


def f64_to_f32_odd(x: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounded to odd (truncate, then set the last bit if inexact): a later
    rounding of the result to a type of at most 22 bits is then correctly rounded."""
    x = np.asarray(x, dtype=np.float64)
    r = x.astype(np.float32)
    r64 = r.astype(np.float64)
    inexact = (r64 != x) & ~np.isnan(x)
    if not inexact.any():
        return r
    bits = r.view(np.uint32).copy()
    over = inexact & (np.abs(r64) > np.abs(x))  # rounded away from zero: step back
    bits -= over.astype(np.uint32)
    bits |= inexact.astype(np.uint32)
    return bits.view(np.float32)


def _fma_odd64(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """a*b + c rounded to odd in float64 (a*b must be exact in float64: inputs of <= 26 bits)."""
    a, b, c = (np.asarray(v, dtype=np.float64) for v in (a, b, c))
    p = a * b
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)  # TwoSum: s + err == p + c exactly
    need = (err != 0) & np.isfinite(s) & ((s.view(np.uint64) & np.uint64(1)) == 0)
    if need.any():
        s = np.where(need, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s


def _round_f64(x: np.ndarray, t: ScalarType) -> np.ndarray:
    """float64 (exact or rounded to odd) -> float type t, rounded once."""
    if t == F32:
        return x.astype(np.float32)
    if t == F16:
        return x.astype(np.float16)
    if t == BF16:
        return round_bf16(f64_to_f32_odd(x))
    raise TypeError(t)


def _cast(x: np.ndarray, src: ScalarType, dst: ScalarType) -> tuple[np.ndarray, np.ndarray | None]:
    """Numeric conversion; returns (value, bad) where bad marks float->int out of range/NaN."""
    hd = dst.holding_dtype
    if src == dst:
        return x, None
    if dst == BOOL:
        return x != 0, None
    if dst.is_int:
        if src.is_float:
            t = np.trunc(x.astype(np.float64))
            lo, hi = _INT_RANGE[dst.name]
            bad = ~((t >= lo) & (t <= hi))
            return np.where(bad, 0.0, t).astype(hd), bad
        return x.astype(hd), None  # int/bool -> int wraps
    if not src.is_float:  # int/bool -> float: exact in float64, then one rounding
        return _round_f64(x.astype(np.float64), dst), None
    if dst == BF16:
        return round_bf16(x.astype(np.float32)), None
    return x.astype(hd), None  # f32->f16 is rounded once by numpy; widening is exact


def _bitcast(x: np.ndarray, src: ScalarType, dst: ScalarType) -> np.ndarray:
    if src == dst:
        return x
    if src == BF16:
        bits = (np.ascontiguousarray(x, dtype=np.float32).view(np.uint32) >> _U32(16)).astype(np.uint16)
        return bits if dst.name == "u16" else bits.view(dst.holding_dtype)
    if dst == BF16:
        u16 = np.ascontiguousarray(x).view(np.uint16)
        return (u16.astype(np.uint32) << _U32(16)).view(np.float32)
    return np.ascontiguousarray(x).view(dst.holding_dtype)


def _zeros(shape: tuple[int, ...], t: Type) -> np.ndarray:
    elem = t if isinstance(t, ScalarType) else t.elem  # type: ignore[attr-defined]
    return np.zeros(shape, elem.holding_dtype)


