from __future__ import annotations

import numpy as np

from ..core import Op
from ..numerics import _zeros
from .machine import Fn, _Machine, _Mask, _merge, _shape


# ----- control flow -------------------------------------------------------------------------

def _h_for(m: _Machine, op: Op) -> Fn:
    lb, ub, st = (m.slot(v) for v in op.operands[:3])
    inits = [m.slot(v) for v in op.operands[3:]]
    body = op.regions[0]
    fns, yields = m.compile_block(body)
    arg_i = m.slot(body.args[0])
    args = [m.slot(v) for v in body.args[1:]]
    results = [m.slot(v) for v in op.results]
    types = [v.type for v in op.results]
    regs = m.regs

    def run(mask: _Mask) -> None:
        i, upper, step = regs[lb], regs[ub], regs[st]
        carried = [regs[s] for s in inits]
        active = mask.arr
        while True:
            act = active & (i < upper)
            inner = _Mask(act)
            if not inner.any:
                break
            zero = (step == 0) & act
            if zero.any():
                m.fail_lanes("loop", op, "for loop with step 0 never ends", zero)
            regs[arg_i] = i
            for s, v in zip(args, carried):
                regs[s] = v
            for fn in fns:
                fn(inner)
            new = [regs[s] for s in yields]
            nxt = i + step
            wrapped = (nxt < i) & act
            if wrapped.any():
                m.fail_lanes("loop", op, "for loop index wraps past 2^32", wrapped, i)
            if inner.full:
                carried = new
                i = nxt
            else:
                carried = [_merge(tp, act, nv, ov, m, op, "carried by the loop")
                           for tp, nv, ov in zip(types, new, carried)]
                i = np.where(act, nxt, i)
            active = act
        for s, v in zip(results, carried):
            regs[s] = v
    return run


def _run_region(fns: list[Fn], yields: list[int], regs: list, mask: _Mask) -> list:
    for fn in fns:
        fn(mask)
    return [regs[s] for s in yields]


def _h_if(m: _Machine, op: Op) -> Fn:
    cond = m.slot(op.operands[0])
    then_fns, then_y = m.compile_block(op.regions[0])
    else_fns, else_y = m.compile_block(op.regions[1])
    results = [m.slot(v) for v in op.results]
    types = [v.type for v in op.results]
    zeros = [_zeros(_shape(m, t), t) for t in types]
    regs = m.regs

    def run(mask: _Mask) -> None:
        c = regs[cond]
        tm = _Mask(mask.arr & c)
        em = _Mask(mask.arr & ~c) if not tm.full else _Mask(np.zeros_like(c), False)
        tv = _run_region(then_fns, then_y, regs, tm) if tm.any else None
        ev = _run_region(else_fns, else_y, regs, em) if em.any else None
        if tv is None and ev is None:
            out = zeros
        elif ev is None:
            out = tv
        elif tv is None:
            out = ev
        else:
            out = [_merge(t, tm.arr, a, b, m, op, "result of if") for t, a, b in zip(types, tv, ev)]
        for s, v in zip(results, out):
            regs[s] = v
    return run


def _h_switch(m: _Machine, op: Op) -> Fn:
    sel = m.slot(op.operands[0])
    cases = [int(c) for c in op.attrs["cases"]]  # type: ignore[union-attr]
    regions = [m.compile_block(reg) for reg in op.regions]
    results = [m.slot(v) for v in op.results]
    types = [v.type for v in op.results]
    zeros = [_zeros(_shape(m, t), t) for t in types]
    regs = m.regs

    def run(mask: _Mask) -> None:
        s = regs[sel]
        taken = np.zeros_like(mask.arr)
        out: list | None = None
        for k, (fns, ys) in enumerate(regions):
            if k < len(cases):
                arr = mask.arr & (s == cases[k]) & ~taken
            else:
                arr = mask.arr & ~taken
            taken = taken | arr
            rm = _Mask(arr)
            if not rm.any:
                continue
            vals = _run_region(fns, ys, regs, rm)
            out = vals if out is None else [_merge(t, arr, a, b, m, op, "result of switch")
                                            for t, a, b in zip(types, vals, out)]
        for slot, v in zip(results, out if out is not None else zeros):
            regs[slot] = v
    return run


