"""Constant folding, algebraic identities, and inlining of `if`/`switch` on a constant.

Folding follows docs/IR.md exactly: integers wrap modulo 2^bits; f16, bf16 and f32 results are
the exact result rounded once to the type (round to nearest even; `fma` too); comparisons are
IEEE. An op is folded only when every operand is a *canonical* constant (an integer in its
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
import struct
from fractions import Fraction

from ..ir.core import Block, Kernel, Op, Value
from ..ir.ops import OPS
from ..ir.types import BOOL, ScalarType
from .manager import Pass, register, resolve

Scalar = int | float | bool

#: (significand bits including the implicit one, minimum normal exponent, maximum exponent)
FLOAT_FORMATS = {"f16": (11, -14, 15), "bf16": (8, -126, 127), "f32": (24, -126, 127)}


# ----- scalar semantics ------------------------------------------------------------------------

def round_to_float(q: Fraction, type_name: str) -> float | None:
    """`q` rounded to nearest even in the float type (a Python float holding it exactly), or
    None when it overflows to infinity. A zero result carries the sign of `q`'s rounding only
    for non-zero `q`; callers handle exact zeros (their sign follows IEEE rules)."""
    p, emin, emax = FLOAT_FORMATS[type_name]
    if q == 0:
        return 0.0
    neg = q < 0
    a = -q if neg else q
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    # now 2**e <= a < 2**(e+1); below the normal range the quantum stays fixed (subnormals)
    quantum = Fraction(2) ** (max(e, emin) - p + 1)
    n = a / quantum
    whole = n.numerator // n.denominator
    rest = n - whole
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and whole % 2 == 1):
        whole += 1
    r = whole * quantum
    if r >= Fraction(2) ** (emax + 1):
        return None
    f = float(r)
    return -f if neg else f


def int_range(t: ScalarType) -> tuple[int, int]:
    if t.name == "i32":
        return -(1 << 31), (1 << 31) - 1
    return 0, (1 << t.bits) - 1


def wrap(x: int, t: ScalarType) -> int:
    x &= (1 << t.bits) - 1
    if t.name == "i32" and x >= 1 << 31:
        x -= 1 << 32
    return x


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
        lo, hi = int_range(t)
        return value if lo <= value <= hi else None
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    if f != value:  # an int that no double holds
        return None
    r = round_to_float(Fraction(f), t.name)
    if r is None or r != f:
        return None
    return f  # keeps the sign of a zero


def to_bits(value: Scalar, t: ScalarType) -> int:
    if t.name == "f32":
        return struct.unpack("<I", struct.pack("<f", value))[0]
    if t.name == "f16":
        return struct.unpack("<H", struct.pack("<e", value))[0]
    if t.name == "bf16":
        return struct.unpack("<I", struct.pack("<f", value))[0] >> 16
    if t == BOOL:
        return int(bool(value))
    return int(value) & ((1 << t.bits) - 1)


def from_bits(bits: int, t: ScalarType) -> Scalar | None:
    if t.name == "f32":
        f = struct.unpack("<f", struct.pack("<I", bits))[0]
    elif t.name == "f16":
        f = struct.unpack("<e", struct.pack("<H", bits))[0]
    elif t.name == "bf16":
        f = struct.unpack("<f", struct.pack("<I", bits << 16))[0]
    elif t == BOOL:
        return bool(bits)
    else:
        return wrap(bits, t)
    return f if math.isfinite(f) else None


def _float_result(exact: Fraction, ieee_zero: float, t: ScalarType) -> float | None:
    if exact == 0:
        return ieee_zero  # the IEEE sign of an exact zero, computed in binary64
    return round_to_float(exact, t.name)


def evaluate(op: Op, args: list[Scalar], kernel: Kernel | None = None) -> Scalar | None:
    """The value of a pure op on canonical constant operands, or None when it is not folded."""
    name = op.name
    rt = op.results[0].type if op.results else None
    at = op.operands[0].type if op.operands else None
    if not isinstance(rt, ScalarType):
        return None

    if name in ("lt", "le", "gt", "ge", "eq", "ne"):
        a, b = args
        return {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": a == b, "ne": a != b}[name]
    if name == "select":
        return args[1] if args[0] else args[2]
    if name == "cast":
        return _cast(args[0], at, rt)
    if name == "bitcast":
        if not isinstance(at, ScalarType) or at.bits != rt.bits:
            return None
        return from_bits(to_bits(args[0], at), rt)
    if name == "table":
        if kernel is None:
            return None
        try:
            decl = kernel.symbol(str(op.attrs["name"]))
        except KeyError:
            return None
        values = getattr(decl, "values", None)
        i = args[0]
        if values is None or not 0 <= i < len(values):
            return None
        return canonical(values[i], rt)

    if rt == BOOL:
        if name in ("and", "or", "xor"):
            a, b = args
            return {"and": a and b, "or": a or b, "xor": a != b}[name]
        return None  # bool arithmetic is not defined by the IR doc

    if len(args) != 2 and name != "fma":
        return None
    if rt.is_int:
        if name == "fma":
            return None
        a, b = args
        if name in ("add", "sub", "mul"):
            return wrap({"add": a + b, "sub": a - b, "mul": a * b}[name], rt)
        if name in ("min", "max"):
            return min(a, b) if name == "min" else max(a, b)
        if name in ("div", "rem"):
            if b == 0 or a < 0 or b < 0:  # i32 with a negative operand: floor or truncation?
                return None
            return a // b if name == "div" else a % b
        if name in ("and", "or", "xor"):
            bits = (1 << rt.bits) - 1
            ua, ub = a & bits, b & bits
            return wrap({"and": ua & ub, "or": ua | ub, "xor": ua ^ ub}[name], rt)
        if name in ("shl", "shr"):
            if not 0 <= b < rt.bits:
                return None
            # shr is logical on unsigned types and arithmetic on i32 (C, Metal, CUDA, numpy)
            return wrap(a << b, rt) if name == "shl" else a >> b
        return None

    # floats
    if name in ("add", "sub", "mul"):
        a, b = args
        fa, fb = Fraction(a), Fraction(b)
        exact = {"add": fa + fb, "sub": fa - fb, "mul": fa * fb}[name]
        ieee = {"add": a + b, "sub": a - b, "mul": a * b}[name]
        return _float_result(exact, ieee, rt)
    if name == "fma":
        a, b, c = args
        exact = Fraction(a) * Fraction(b) + Fraction(c)
        return _float_result(exact, a * b + c, rt)  # products of these types are exact in binary64
    if name in ("min", "max"):
        a, b = args
        if a == b and math.copysign(1, a) != math.copysign(1, b):
            return None  # min(-0, +0) is not pinned down
        return min(a, b) if name == "min" else max(a, b)
    return None


def _cast(x: Scalar, src: object, dst: ScalarType) -> Scalar | None:
    if not isinstance(src, ScalarType):
        return None
    if dst == BOOL:
        return bool(x) if src.is_int or src == BOOL else None
    if src == BOOL:
        return int(x) if dst.is_int else None
    if dst.is_int:
        if src.is_float:
            if not math.isfinite(x):
                return None
            x = int(x)  # truncates toward zero
        lo, hi = int_range(dst)
        return int(x) if lo <= x <= hi else None
    # to a float type: one rounding from the exact source value
    if src.is_float and x == 0:
        return float(x)  # keeps the sign of zero
    return round_to_float(Fraction(x), dst.name)


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
            if d is None or not d.pure or len(op.results) != 1 or op.name in ("index", "scalar"):
                out.append(op)
                continue
            args = [self.consts.get(v) for v in op.operands]
            value: object = None
            if op.operands and all(a is not None for a in args):
                value = evaluate(op, args, self.kernel)  # type: ignore[arg-type]
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
