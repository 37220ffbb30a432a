"""Interpreter handlers of the value ops: constants, thread coordinates, launch scalars, the
short-vector ops, and every op with scalar semantics in the op table (`_h_evaluate`)."""
from __future__ import annotations

import numpy as np

from ..core import Op
from ..numerics import _INT_RANGE, _round_f64
from ..ops import OPS
from ..semantics import Fault, Signature
from ..types import BOOL, FragmentType, ScalarType, VectorType
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


def _h_evaluate(m: _Machine, op: Op) -> Fn:
    """An op with scalar semantics in the op table (OpDef.evaluate, ir/semantics.py): evaluate
    every lane, raise for the first fault on an active lane."""
    sig = Signature(op.name, op.attrs, tuple(v.type for v in op.operands), op.result.type,
                    tables=m.tables)
    evaluate = OPS[op.name].evaluate(sig)  # type: ignore[misc]
    xs = [m.slot(v) for v in op.operands]
    r = m.slot(op.result)
    regs = m.regs

    def check(faults: list[Fault], mask: _Mask) -> None:
        for f in faults:
            bad = f.lanes & mask.arr
            if bad.any():
                _fail(m, op, f, bad)

    if len(xs) == 1:
        (x,) = xs

        def run1(mask: _Mask) -> None:
            value, faults = evaluate(regs[x])
            if faults:
                check(faults, mask)
            regs[r] = value
        return run1
    if len(xs) == 2:
        a, b = xs

        def run2(mask: _Mask) -> None:
            value, faults = evaluate(regs[a], regs[b])
            if faults:
                check(faults, mask)
            regs[r] = value
        return run2

    def run(mask: _Mask) -> None:
        value, faults = evaluate(*[regs[x] for x in xs])
        if faults:
            check(faults, mask)
        regs[r] = value
    return run


def _fail(m: _Machine, op: Op, f: Fault, bad: np.ndarray) -> None:
    flat = int(np.argmax(bad.reshape(-1)))
    g, t = divmod(flat, m.T)
    value = None if f.values is None else np.asarray(f.values).reshape(-1)[flat]
    if f.as_index:
        m.fail(f.kind, op, f.what, g, t, index=None if value is None else int(value))
    else:  # the value goes into the message (a float: a cast's operand)
        m.fail(f.kind, op, f.what.format(value=float(value)), g, t)  # type: ignore[arg-type]


def _h_select(m: _Machine, op: Op) -> Fn:
    t = op.result.type
    if not isinstance(t, FragmentType):
        return _h_evaluate(m, op)
    c, a, b = (m.slot(v) for v in op.operands)
    r = m.slot(op.result)
    regs = m.regs

    def run_frag(mask: _Mask) -> None:  # a warp's fragment: merged lane-consistently
        regs[r] = _merge(t, regs[c] & mask.arr, regs[a], regs[b], m, op, "select")
    return run_frag


def _h_vec(m: _Machine, op: Op) -> Fn:
    xs = [m.slot(v) for v in op.operands]
    r = m.slot(op.result)
    regs = m.regs

    concat = isinstance(op.operands[0].type, VectorType)

    def run(mask: _Mask) -> None:
        parts = [regs[x] for x in xs]
        regs[r] = np.concatenate(parts, axis=-1) if concat else np.stack(parts, axis=-1)
    return run


def _h_extract(m: _Machine, op: Op) -> Fn:
    x = m.slot(op.operands[0])
    r = m.slot(op.result)
    regs = m.regs
    k = int(op.attrs["index"])

    def run(mask: _Mask) -> None:
        regs[r] = np.ascontiguousarray(regs[x][..., k])
    return run
