"""Constant folding, algebraic identities, and inlining of `if`/`switch` on a constant.

Folding follows docs/IR.md exactly because it runs the op table's scalar semantics
(`OpDef.evaluate`, ir/semantics.py), the numpy functions the interpreter runs: integers wrap
modulo 2^bits; f16, bf16 and f32 results are the exact result rounded once to the type (round to
nearest even; `fma` too); comparisons are IEEE. It evaluates them strictly (`Signature.strict`),
so the readings the IR leaves open are faults here. An op is folded only when every operand is a *canonical* constant (an integer in its
type's range, a finite float exactly representable in its type, a bool) and the result is
defined and finite: divisions by zero, over-wide shifts, out-of-range float->int casts, table
lookups out of range and overflows to infinity are left to run time (where they are errors or
infinities), as are the readings the IR doc leaves open (signed div/rem, min/max of NaN or of
zeros of opposite sign, i32 div/rem of negative operands, out-of-range int->int casts).

A folded op becomes a `const` op in place (its result keeps its name); an identity (`x + 0`,
`select(true, a, b)`, ...) replaces the op's result by an existing value. An `if`/`switch`
whose condition/selector is constant is replaced by the ops of the chosen region, and the
region's yielded values replace the op's results.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from ..ir.core import Block, Kernel, Op, Value
from ..ir.numerics import _INT_RANGE, _round_f64
from ..ir.ops import OPS
from ..ir.semantics import Signature
from ..ir.types import BOOL, ScalarType
from .manager import Pass, register, resolve

Scalar = int | float | bool

#: (significand bits including the implicit one, minimum normal exponent, maximum exponent)
FLOAT_FORMATS = {"f16": (11, -14, 15), "bf16": (8, -126, 127), "f32": (24, -126, 127)}


# ----- constants and their evaluation -----------------------------------------------------------

def canonical(value: object, t: object) -> Scalar | None:
    """The value a `const` of type `t` holds, or None if the attribute is not a canonical
    value of the type (then nothing that uses it is folded)."""
    if not isinstance(t, ScalarType):
        return None
    if t == BOOL:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        return None
    if isinstance(value, bool):
        return None
    if t.is_int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            return None
        lo, hi = _INT_RANGE[t.name]
        return value if lo <= value <= hi else None
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    if f != value:  # an int that no double holds
        return None
    if float(_round_f64(np.array([f]), t)[0]) != f:  # not exactly a value of the type
        return None
    return f  # keeps the sign of a zero


def _python(x: object, t: ScalarType) -> Scalar | None:
    """A numpy result as the Python value of a `const` attribute; None if not finite."""
    if t == BOOL:
        return bool(x)
    if t.is_int:
        return int(x)  # type: ignore[call-overload]
    f = float(x)  # type: ignore[arg-type]
    return f if math.isfinite(f) else None


def constant_tables(kernel: Kernel | None) -> dict[str, np.ndarray]:
    """The kernel's tables as holding arrays, for folding `table` lookups. An entry that is not
    a canonical constant is not folded: a float one becomes NaN (a result that is not folded),
    an integer table with one is left out (so no lookup in it is folded)."""
    out: dict[str, np.ndarray] = {}
    for t in kernel.tables if kernel is not None else ():
        values = [canonical(v, t.elem) for v in t.values]
        if t.elem.is_float:
            values = [math.nan if v is None else v for v in values]
        if all(v is not None for v in values):
            out[t.name] = np.array(values, dtype=t.elem.holding_dtype).reshape(-1)
    return out


def evaluate(op: Op, args: list[Scalar], kernel: Kernel | None = None,
             tables: Mapping[str, np.ndarray] | None = None) -> Scalar | None:
    """The value of an op with scalar semantics (`OpDef.evaluate`, shared with the interpreter)
    on canonical constant operands, or None when it is not folded: the op is an error there,
    its result is open (the strict reading) or not finite."""
    d = OPS.get(op.name)
    rt = op.results[0].type if len(op.results) == 1 else None
    types = tuple(v.type for v in op.operands)
    if d is None or d.evaluate is None or not isinstance(rt, ScalarType) or \
            not all(isinstance(t, ScalarType) for t in types):
        return None
    sig = Signature(op.name, op.attrs, types, rt, strict=True,
                    tables=constant_tables(kernel) if tables is None else tables)
    operands = [np.array([a], dtype=t.holding_dtype) for a, t in zip(args, types)]  # type: ignore[union-attr]
    with np.errstate(all="ignore"):
        value, faults = d.evaluate(sig)(*operands)
    if any(f.lanes.any() for f in faults):
        return None
    return _python(np.asarray(value).reshape(-1)[0], rt)


# ----- algebraic identities -------------------------------------------------------------------

def _all_ones(t: ScalarType) -> int | bool:
    if t == BOOL:
        return True
    return -1 if t.name == "i32" else (1 << t.bits) - 1


def simplify(op: Op, consts: dict[Value, Scalar]) -> Value | Scalar | None:
    """An identity for an op with some constant operands: an existing value that equals the
    op's result (a Value), a constant result, or None."""
    name = op.name
    rt = op.results[0].type if len(op.results) == 1 else None
    if not isinstance(rt, ScalarType):
        return None
    ops = op.operands
    cv = [consts.get(v) for v in ops]
    if name == "select":
        if cv[0] is not None:
            return ops[1] if cv[0] else ops[2]
        if ops[1] is ops[2]:
            return ops[1]
        return None
    if name in ("cast", "bitcast") and ops[0].type == rt:
        return ops[0]
    if len(ops) != 2:
        return None
    a, b = ops
    ca, cb = cv
    integer = rt.is_int or rt == BOOL
    # put a constant on the right of commutative ops
    if OPS[name].commutative and ca is not None and cb is None:
        a, b, ca, cb = b, a, cb, ca
    if cb is not None:
        if integer:
            zero = False if rt == BOOL else 0
            if name in ("add", "sub", "or", "xor", "shl", "shr") and cb == 0 and rt != BOOL:
                return a
            if name in ("or", "xor") and rt == BOOL and cb is False:
                return a
            if name == "mul" and rt != BOOL and cb == 1:
                return a
            if name == "mul" and rt != BOOL and cb == 0:
                return 0
            if name == "and" and cb == _all_ones(rt):
                return a
            if name == "and" and cb == 0:
                return zero
            if name == "or" and cb == _all_ones(rt):
                return _all_ones(rt)
            if name == "div" and cb == 1 and rt.name != "i32" and rt != BOOL:
                return a
            if name == "rem" and cb == 1 and rt.name != "i32" and rt != BOOL:  # i32: x < 0 errs
                return 0
        # no float identities: x + 0.0 is not x for x = -0.0, and x * 1.0 quiets (bf16: makes
        # canonical) a NaN's payload, which a bit-exact comparison with the interpreter sees
    if a is b and integer and rt != BOOL:
        if name in ("sub", "xor"):
            return 0
        if name in ("and", "or", "min", "max"):
            return a
    if a is b and rt == BOOL and name in ("and", "or"):
        return a
    return None


# ----- the pass -------------------------------------------------------------------------------

@register
class FoldPass(Pass):
    name = "fold"

    def run(self, kernel: Kernel, log: list[str]) -> None:
        self.kernel = kernel
        self.tables = constant_tables(kernel)
        self.mapping: dict[Value, Value] = {}
        self.consts: dict[Value, Scalar] = {}
        self.folded = self.identities = self.inlined = 0
        while True:
            before = (self.folded, self.identities, self.inlined)
            self._block(kernel.body)
            if (self.folded, self.identities, self.inlined) == before:
                break
        log.append(f"fold: {self.folded} ops folded to constants, {self.identities} identities, "
                   f"{self.inlined} if/switch inlined")

    def _block(self, block: Block) -> None:
        out: list[Op] = []
        for op in block.ops:
            op.operands = [resolve(self.mapping, v) for v in op.operands]
            for region in op.regions:
                self._block(region)
            if op.name in ("if", "switch"):
                chosen = self._chosen_region(op)
                if chosen is not None:
                    *body, terminator = chosen.ops
                    for r, v in zip(op.results, terminator.operands):
                        self.mapping[r] = resolve(self.mapping, v)
                    out.extend(body)
                    self.inlined += 1
                    continue
            if op.name == "const":
                value = canonical(op.attrs.get("value"), op.results[0].type)
                if value is not None:
                    self.consts[op.results[0]] = value
                out.append(op)
                continue
            d = OPS.get(op.name)
            if d is None or d.evaluate is None or len(op.results) != 1:
                out.append(op)
                continue
            args = [self.consts.get(v) for v in op.operands]
            value: object = None
            if op.operands and all(a is not None for a in args):
                value = evaluate(op, args, self.kernel, self.tables)  # type: ignore[arg-type]
                if value is not None:
                    self.folded += 1
            if value is None:
                value = simplify(op, self.consts)
                if value is not None:
                    self.identities += 1
            if isinstance(value, Value):
                self.mapping[op.results[0]] = value
                continue
            if value is not None:
                rt = op.results[0].type
                value = canonical(value, rt)
                assert value is not None, f"fold produced a non-canonical {rt} constant"
                op.name, op.operands, op.attrs, op.regions = "const", [], {"value": value}, []
                self.consts[op.results[0]] = value
            out.append(op)
        block.ops = out

    def _chosen_region(self, op: Op) -> Block | None:
        c = self.consts.get(op.operands[0]) if op.operands else None
        if c is None:
            return None
        if op.name == "if":
            return op.regions[0] if c else op.regions[1]
        cases = tuple(op.attrs.get("cases", ()))
        return op.regions[cases.index(c)] if c in cases else op.regions[-1]
