from __future__ import annotations

import numpy as np

from ..core import Op
from ..types import BF16, BOOL, FragmentType, ScalarType, VectorType
from .numerics import _INT_RANGE, _U32, _bitcast, _cast, _fma_odd64, _round_f64, _zeros, round_bf16
from .machine import Fn, InterpreterError, _Machine, _Mask, _merge


def _h_const(m: _Machine, op: Op) -> Fn:
    t = op.result.type
    assert isinstance(t, ScalarType)
    v = op.attrs["value"]
    if t == BOOL:
        arr = np.full((m.G, m.T), bool(v))
    elif t.is_int:
        if isinstance(v, float) and not float(v).is_integer():
            raise InterpreterError(f"kernel {m.kernel.name}: {m.desc(op)}: {v} is not an integer",
                                   kind="input", op=op)
        hi = _INT_RANGE[t.name][1]
        iv = int(v)
        if not -2**31 <= iv <= hi:
            raise InterpreterError(f"kernel {m.kernel.name}: {m.desc(op)}: {v} does not fit {t}",
                                   kind="input", op=op)
        arr = np.full((m.G, m.T), iv & (2**t.bits - 1) if t.name != "i32" else iv).astype(t.holding_dtype)
    else:
        arr = _round_f64(np.full((m.G, m.T), float(v), np.float64), t)
    r = m.slot(op.result)
    regs = m.regs

    def run(mask: _Mask) -> None:
        regs[r] = arr
    return run


def _h_index(m: _Machine, op: Op) -> Fn:
    kind = op.attrs["kind"]
    if kind not in m.index_values:
        raise InterpreterError(f"kernel {m.kernel.name}: {m.desc(op)}: unknown index kind {kind}",
                               kind="unsupported", op=op)
    arr = m.index_values[str(kind)]
    r = m.slot(op.result)
    regs = m.regs

    def run(mask: _Mask) -> None:
        regs[r] = arr
    return run


def _h_scalar(m: _Machine, op: Op) -> Fn:
    name = str(op.attrs["name"])
    if name not in m.scalars:
        raise InterpreterError(f"kernel {m.kernel.name}: {m.desc(op)}: @{name} is not a declared "
                               "launch scalar", kind="input", op=op)
    arr = np.full((m.G, m.T), m.scalars[name], np.uint32)
    r = m.slot(op.result)
    regs = m.regs

    def run(mask: _Mask) -> None:
        regs[r] = arr
    return run


def _bool_fn(name: str):
    return {"add": np.logical_xor, "sub": np.logical_xor, "mul": np.logical_and,
            "min": np.logical_and, "max": np.logical_or, "and": np.logical_and,
            "or": np.logical_or, "xor": np.logical_xor}[name]


_CMP = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
        "eq": np.equal, "ne": np.not_equal}


def _h_binary(m: _Machine, op: Op) -> Fn:
    a, b = (m.slot(v) for v in op.operands)
    r = m.slot(op.result)
    regs = m.regs
    t = op.operands[0].type
    elem = t.elem if isinstance(t, (VectorType, FragmentType)) else t
    name = op.name
    if name in _CMP:
        f = _CMP[name]
    elif elem == BOOL:
        f = _bool_fn(name)
    elif name in ("min", "max") and elem.is_float:
        f = np.fmin if name == "min" else np.fmax
    else:
        f = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "min": np.minimum,
             "max": np.maximum, "and": np.bitwise_and, "or": np.bitwise_or,
             "xor": np.bitwise_xor}[name]
    if elem == BF16 and name in ("add", "sub", "mul"):
        def run(mask: _Mask) -> None:
            regs[r] = round_bf16(f(regs[a], regs[b]))
    else:
        def run(mask: _Mask) -> None:
            regs[r] = f(regs[a], regs[b])
    return run


def _h_divrem(m: _Machine, op: Op) -> Fn:
    a, b = (m.slot(v) for v in op.operands)
    r = m.slot(op.result)
    regs = m.regs
    t = op.operands[0].type
    f = np.floor_divide if op.name == "div" else np.remainder
    signed = t == ScalarType("i32")
    one = np.ones((), t.holding_dtype)  # type: ignore[union-attr]

    def run(mask: _Mask) -> None:
        x, y = regs[a], regs[b]
        zero = y == 0
        if zero.any():
            bad = zero & mask.arr
            if bad.any():
                m.fail_lanes("division", op, f"{op.name} by zero", bad, x)
            y = np.where(zero, one, y)
        if signed:
            neg = ((x < 0) | (y < 0)) & mask.arr
            if neg.any():
                m.fail_lanes("division", op, f"i32 {op.name} of a negative operand (floor vs "
                             "truncation is unspecified)", neg, x)
        regs[r] = f(x, y)
    return run


def _h_shift(m: _Machine, op: Op) -> Fn:
    a, b = (m.slot(v) for v in op.operands)
    r = m.slot(op.result)
    regs = m.regs
    t = op.operands[0].type
    bits = t.bits  # type: ignore[union-attr]
    f = np.left_shift if op.name == "shl" else np.right_shift
    hd = t.holding_dtype  # type: ignore[union-attr]

    def run(mask: _Mask) -> None:
        x, y = regs[a], regs[b]
        over = (y >= bits) | (y < 0) if t.name == "i32" else y >= bits  # type: ignore[union-attr]
        if over.any():
            bad = over & mask.arr
            if bad.any():
                m.fail_lanes("shift", op, f"{op.name} by an amount >= {bits} bits of {t}", bad, y)
            y = np.where(over, np.zeros((), hd), y)
        regs[r] = f(x, y).astype(hd, copy=False)
    return run


def _h_fma(m: _Machine, op: Op) -> Fn:
    a, b, c = (m.slot(v) for v in op.operands)
    r = m.slot(op.result)
    regs = m.regs
    t = op.result.type
    elem = t.elem if isinstance(t, VectorType) else t

    def run(mask: _Mask) -> None:
        regs[r] = _round_f64(_fma_odd64(regs[a], regs[b], regs[c]), elem)  # type: ignore[arg-type]
    return run


def _h_select(m: _Machine, op: Op) -> Fn:
    c, a, b = (m.slot(v) for v in op.operands)
    r = m.slot(op.result)
    regs = m.regs
    t = op.result.type
    if isinstance(t, FragmentType):
        def run_frag(mask: _Mask) -> None:
            regs[r] = _merge(t, regs[c] & mask.arr, regs[a], regs[b], m, op, "select")
        return run_frag
    if isinstance(t, VectorType):
        def run_vec(mask: _Mask) -> None:
            regs[r] = np.where(regs[c][..., None], regs[a], regs[b])
        return run_vec

    def run(mask: _Mask) -> None:
        regs[r] = np.where(regs[c], regs[a], regs[b])
    return run


def _h_cast(m: _Machine, op: Op) -> Fn:
    x = m.slot(op.operands[0])
    r = m.slot(op.result)
    regs = m.regs
    src, dst = op.operands[0].type, op.result.type

    def run(mask: _Mask) -> None:
        v, bad = _cast(regs[x], src, dst)  # type: ignore[arg-type]
        if bad is not None and bad.any():
            bad = bad & mask.arr
            if bad.any():
                flat = int(np.argmax(bad.reshape(-1)))
                g, t = divmod(flat, m.T)
                value = float(regs[x].reshape(-1)[flat])
                m.fail("cast", op, f"cast of {value!r} from {src} to {dst} is out of range", g, t)
        regs[r] = v
    return run


def _h_bitcast(m: _Machine, op: Op) -> Fn:
    x = m.slot(op.operands[0])
    r = m.slot(op.result)
    regs = m.regs
    src, dst = op.operands[0].type, op.result.type

    if isinstance(dst, VectorType):  # u32 -> vec<f16|bf16, 2>: element 0 is the low half
        def run_split(mask: _Mask) -> None:
            w = regs[x]
            halves = np.stack([w & _U32(0xFFFF), w >> _U32(16)], axis=-1).astype(np.uint16)
            regs[r] = _bitcast(halves, ScalarType("u16"), dst.elem)
        return run_split
    if isinstance(src, VectorType):  # vec<f16|bf16, 2> -> u32
        def run_join(mask: _Mask) -> None:
            bits = _bitcast(regs[x], src.elem, ScalarType("u16")).astype(np.uint32)
            regs[r] = bits[..., 0] | (bits[..., 1] << _U32(16))
        return run_join

    def run(mask: _Mask) -> None:
        regs[r] = _bitcast(regs[x], src, dst)  # type: ignore[arg-type]
    return run


def _h_vec(m: _Machine, op: Op) -> Fn:
    xs = [m.slot(v) for v in op.operands]
    r = m.slot(op.result)
    regs = m.regs

    def run(mask: _Mask) -> None:
        regs[r] = np.stack([regs[x] for x in xs], axis=-1)
    return run


def _h_extract(m: _Machine, op: Op) -> Fn:
    x = m.slot(op.operands[0])
    r = m.slot(op.result)
    regs = m.regs
    k = int(op.attrs["index"])

    def run(mask: _Mask) -> None:
        regs[r] = np.ascontiguousarray(regs[x][..., k])
    return run


def _h_table(m: _Machine, op: Op) -> Fn:
    x = m.slot(op.operands[0])
    r = m.slot(op.result)
    regs = m.regs
    name = str(op.attrs["name"])
    table = m.tables[name]
    n = len(table)
    zero = _zeros((m.G, m.T), op.result.type)

    def run(mask: _Mask) -> None:
        idx = regs[x]
        over = idx >= n
        if over.any():
            bad = over & mask.arr
            if bad.any():
                m.fail_lanes("bounds", op, f"table @{name} index out of bounds (size {n})", bad, idx)
            if n == 0:
                regs[r] = zero
                return
            idx = np.where(over, 0, idx)
        regs[r] = table[idx]
    return run


