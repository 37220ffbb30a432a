"""The scalar semantics of the ALU ops, written once and read by the interpreter and the folder.

Each op's `OpDef.evaluate` (ir/ops.py) is one of the functions here: given the op's
`Signature` (name, attributes, operand and result types) it returns an `Evaluator`, a numpy
function from operand arrays (holding dtypes, `ScalarType.holding_dtype`; any shape, a trailing
axis for vectors) to the result array and the `Fault`s found on the way: lanes where the IR
calls the op an error (division by zero, an over-wide shift, a float->int cast out of range, a
table index out of bounds). The rounding rules are numerics.py's, as docs/IR.md states them.

Two callers, one semantics:
- the interpreter (ir/interpret) evaluates every lane and raises for a fault on an active lane;
- the folder (passes/fold.py) evaluates one lane of constants with `Signature.strict`, which
  adds `open` faults where docs/IR.md leaves the result open or undefined (min/max of zeros of
  opposite sign, int->int casts out of range, arithmetic on bool other than and/or/xor, bool
  <-> float casts); it folds only when no fault is raised and the result is finite.
Preparing once per op and evaluating per launch keeps the interpreter's per-op cost at a few
numpy calls.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from .numerics import _INT_RANGE, _U32, _bitcast, _cast, _fma_odd64, _round_f64, round_bf16
from .types import BF16, BOOL, I32, ScalarType, Type, VectorType


@dataclass(frozen=True)
class Signature:
    """What an op's semantics depend on besides its operand values."""

    name: str
    attrs: Mapping[str, object]
    operand_types: tuple[Type, ...]
    result_type: Type
    #: also fault (kind "open") where docs/IR.md leaves the result open: the folder's reading
    strict: bool = False
    #: constant tables by name, as arrays of their element type's holding dtype (for `table`)
    tables: Mapping[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class Fault:
    """Lanes where an op is an error (or, strict, where its result is open)."""

    kind: str  # the InterpreterError kind: division, shift, cast, bounds; or open
    what: str  # the message; "{value!r}" in it is replaced by `values` at the failing lane
    lanes: np.ndarray  # bool, the operands' shape
    values: np.ndarray | None = None  # the operand the message is about
    as_index: bool = True  # report `values` at the failing lane as the error's index


Evaluator = Callable[..., tuple[np.ndarray, list[Fault]]]
Semantics = Callable[[Signature], Evaluator]

_CMP = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
        "eq": np.equal, "ne": np.not_equal}
#: bool arithmetic as the interpreter has always read it (docs/IR.md defines and/or/xor only)
_BOOL = {"add": np.logical_xor, "sub": np.logical_xor, "mul": np.logical_and,
         "min": np.logical_and, "max": np.logical_or, "and": np.logical_and,
         "or": np.logical_or, "xor": np.logical_xor}
_ARITH = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "min": np.minimum,
          "max": np.maximum, "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}


def _elem(t: Type) -> ScalarType:
    return getattr(t, "elem", t)  # type: ignore[return-value]


def _open(lanes: np.ndarray, why: str) -> Fault:
    return Fault("open", why, lanes)


def binary(sig: Signature) -> Evaluator:
    """add sub mul min max and or xor and the comparisons: element-wise, in the operands' type."""
    name, elem = sig.name, _elem(sig.operand_types[0])
    if name in _CMP:
        f = _CMP[name]
        return lambda a, b: (f(a, b), [])
    if elem == BOOL:
        g = _BOOL[name]
        if sig.strict and name not in ("and", "or", "xor"):
            return lambda a, b: (g(a, b), [_open(np.ones(np.shape(a), bool), f"{name} on bool")])
        return lambda a, b: (g(a, b), [])
    if name in ("min", "max") and elem.is_float:  # IEEE minNum/maxNum: a NaN operand loses
        h = np.fmin if name == "min" else np.fmax
        if sig.strict:
            def minmax(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, list[Fault]]:
                zeros = (a == b) & (np.signbit(a) != np.signbit(b))  # min(-0, +0): either zero
                return h(a, b), [_open(zeros, f"{name} of zeros of opposite sign")]
            return minmax
        return lambda a, b: (h(a, b), [])
    f = _ARITH[name]
    if elem == BF16 and name in ("add", "sub", "mul"):  # f32, then rounded to bf16
        return lambda a, b: (round_bf16(f(a, b)), [])
    return lambda a, b: (f(a, b), [])


def div_rem(sig: Signature) -> Evaluator:
    """Unsigned division and remainder; b = 0 is an error (so is a negative i32 operand:
    floor and truncating division differ there)."""
    t = sig.operand_types[0]
    f = np.floor_divide if sig.name == "div" else np.remainder
    signed = t == I32
    one = np.ones((), t.holding_dtype)  # type: ignore[union-attr]

    def run(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, list[Fault]]:
        faults = []
        zero = y == 0
        if zero.any():
            faults.append(Fault("division", f"{sig.name} by zero", zero, x))
            y = np.where(zero, one, y)
        if signed:
            faults.append(Fault("division", f"i32 {sig.name} of a negative operand (floor vs "
                                "truncation is unspecified)", (x < 0) | (y < 0), x))
        return f(x, y), faults
    return run


def shift(sig: Signature) -> Evaluator:
    """shl, shr (arithmetic on i32); an amount >= the type's bits is an error."""
    t = sig.operand_types[0]
    bits = t.bits  # type: ignore[union-attr]
    f = np.left_shift if sig.name == "shl" else np.right_shift
    hd = t.holding_dtype  # type: ignore[union-attr]
    signed = t == I32
    what = f"{sig.name} by an amount >= {bits} bits of {t}"

    def run(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, list[Fault]]:
        faults = []
        over = (y >= bits) | (y < 0) if signed else y >= bits
        if over.any():
            faults.append(Fault("shift", what, over, y))
            y = np.where(over, np.zeros((), hd), y)
        if sig.strict and t == BOOL:
            faults.append(_open(np.ones(np.shape(x), bool), f"{sig.name} on bool"))
        return f(x, y).astype(hd, copy=False), faults
    return run


def fma(sig: Signature) -> Evaluator:
    """a*b + c rounded once: exact product, TwoSum rounded to odd, one rounding to the type."""
    elem = _elem(sig.result_type)
    return lambda a, b, c: (_round_f64(_fma_odd64(a, b, c), elem), [])


#: The f32 functions the epilogues compute (exp2, recip), in float64, rounded once to f32.
_TRANSCENDENTAL = {"exp2": np.exp2, "recip": np.reciprocal}


def transcendental(sig: Signature) -> Evaluator:
    """exp2 and recip: the interpreter rounds the float64 result once to f32 (correct rounding
    but for double rounding). A device's `exp2f` / Metal's fast-math reciprocal may differ by an
    ulp or two, so the folder (strict) leaves them alone: folding would bake the interpreter's
    rounding into a kernel whose other lanes get the device's."""
    f = _TRANSCENDENTAL[sig.name]

    def run(a: np.ndarray) -> tuple[np.ndarray, list[Fault]]:
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            out = f(a.astype(np.float64)).astype(np.float32)
        faults = [_open(np.ones(np.shape(a), bool), f"{sig.name} is not folded (device rounding)")] \
            if sig.strict else []
        return out, faults
    return run


def lop3(sig: Signature) -> Evaluator:
    """A bitwise function of three operands by its truth table: bit i of the result is bit
    (4 a_i + 2 b_i + c_i) of `lut` (the OR of the minterms lut selects)."""
    lut = int(sig.attrs["lut"])  # type: ignore[call-overload]

    def run(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, list[Fault]]:
        out = np.zeros(np.broadcast(a, b, c).shape, _U32)
        for i in range(8):
            if lut >> i & 1:
                out |= (a if i & 4 else ~a) & (b if i & 2 else ~b) & (c if i & 1 else ~c)
        return out, []
    return run


def select(sig: Signature) -> Evaluator:
    """c ? a : b, per lane (per vector for a vector result)."""
    if isinstance(sig.result_type, VectorType):
        return lambda c, a, b: (np.where(c[..., None], a, b), [])
    return lambda c, a, b: (np.where(c, a, b), [])


def cast(sig: Signature) -> Evaluator:
    """Numeric conversion (numerics._cast): float->int truncates, NaN or out of range is an
    error; int->int wraps (strict: open); to float rounds to nearest even."""
    src, dst = sig.operand_types[0], sig.result_type
    assert isinstance(src, ScalarType) and isinstance(dst, ScalarType)
    what = f"cast of {{value!r}} from {src} to {dst} is out of range"
    open_why = None
    if sig.strict and src != dst:
        if (dst == BOOL and src.is_float) or (src == BOOL and dst.is_float):
            open_why = f"cast from {src} to {dst}"
    int_range = _INT_RANGE.get(dst.name) if sig.strict and src.is_int and dst.is_int else None

    def run(x: np.ndarray) -> tuple[np.ndarray, list[Fault]]:
        v, bad = _cast(x, src, dst)
        faults = [] if bad is None else [Fault("cast", what, bad, x, as_index=False)]
        if open_why is not None:
            faults.append(_open(np.ones(np.shape(x), bool), open_why))
        if int_range is not None:
            wide = x.astype(np.int64)
            faults.append(_open((wide < int_range[0]) | (wide > int_range[1]), "int->int cast out of range"))
        return v, faults
    return run


def bitcast(sig: Signature) -> Evaluator:
    """Same-width reinterpretation; u32 <-> vec<f16|bf16, 2> puts element 0 in the low half."""
    src, dst = sig.operand_types[0], sig.result_type
    if isinstance(dst, VectorType):
        def split(w: np.ndarray) -> tuple[np.ndarray, list[Fault]]:
            halves = np.stack([w & _U32(0xFFFF), w >> _U32(16)], axis=-1).astype(np.uint16)
            return _bitcast(halves, ScalarType("u16"), dst.elem), []
        return split
    if isinstance(src, VectorType):
        def join(x: np.ndarray) -> tuple[np.ndarray, list[Fault]]:
            bits = _bitcast(x, src.elem, ScalarType("u16")).astype(np.uint32)
            return bits[..., 0] | (bits[..., 1] << _U32(16)), []
        return join
    return lambda x: (_bitcast(x, src, dst), [])  # type: ignore[arg-type]


def table(sig: Signature) -> Evaluator:
    """Constant table lookup; an index past the end is an error."""
    name = str(sig.attrs["name"])
    values = sig.tables.get(name)
    if values is None:  # the folder passes only tables of canonical constants
        zero = np.zeros((), _elem(sig.result_type).holding_dtype)
        return lambda i: (np.broadcast_to(zero, np.shape(i)),
                          [_open(np.ones(np.shape(i), bool), f"table @{name} not constant")])
    n = len(values)
    what = f"table @{name} index out of bounds (size {n})"

    def run(i: np.ndarray) -> tuple[np.ndarray, list[Fault]]:
        over = i >= n
        if not over.any():
            return values[i], []
        faults = [Fault("bounds", what, over, i)]
        if n == 0:
            return np.zeros(np.shape(i), values.dtype), faults
        return values[np.where(over, 0, i)], faults
    return run
