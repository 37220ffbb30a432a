"""fold: constant folding with the IR's exact semantics, algebraic identities, and `if`/`switch`
on a constant inlined. Where the interpreter exists, every folded kernel computes the same bits."""
from __future__ import annotations

import copy
import math
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marlin_dsl.ir import (
    BF16, BOOL, F16, F32, I32, U8, U16, U32, Builder, BufferParam, ConstTable, GridDim,
    Kernel, Op, ScalarParam, ScalarType, verify,
)
from marlin_dsl.passes import FoldPass

try:
    from marlin_dsl.ir.interpret import InterpreterError, round_bf16, run_kernel
except ImportError:  # the interpreter is optional for these tests
    run_kernel = None


def make_kernel(b: Builder, buffers=(), scalars=(), tables=()) -> Kernel:
    return Kernel("k", 32, (GridDim(None), GridDim(None), GridDim(None)), b.block,
                  buffers=list(buffers), scalars=[ScalarParam(s) for s in scalars], tables=list(tables))


def fold(kernel: Kernel) -> list[str]:
    log: list[str] = []
    FoldPass().run(kernel, log)
    verify(kernel)
    return log


def body_names(kernel: Kernel) -> list[str]:
    return [op.name for op in kernel.body.ops]


def single(t: ScalarType, build) -> tuple[Kernel, Op]:
    """A kernel that stores build(b) to @y[tid]; returns it and the op defining the value."""
    b = Builder()
    tid = b.index("tid")
    v = build(b)
    b.store("y", tid, v)
    k = make_kernel(b, [BufferParam("y", t, "write")])
    verify(k)
    return k, next(op for op in k.body.ops if v in op.results)


def folded_value(t: ScalarType, build):
    k, op = single(t, build)
    fold(k)
    return op.attrs["value"] if op.name == "const" else None


def bits(x: float, t: ScalarType) -> int:
    if t == F16:
        return struct.unpack("<H", struct.pack("<e", x))[0]
    return struct.unpack("<I", struct.pack("<f", x))[0] >> (16 if t == BF16 else 0)


# ----- integers --------------------------------------------------------------------------------

def test_u32_wraps():
    assert folded_value(U32, lambda b: b.binary("add", b.const(0xFFFFFFFF), b.const(2))) == 1
    assert folded_value(U32, lambda b: b.binary("sub", b.const(1), b.const(3))) == 0xFFFFFFFE
    assert folded_value(U32, lambda b: b.binary("mul", b.const(0x10000), b.const(0x10001))) == 0x10000
    assert folded_value(U32, lambda b: b.binary("shl", b.const(0x80000001), b.const(1))) == 2
    assert folded_value(U8, lambda b: b.binary("add", b.const(250, U8), b.const(10, U8))) == 4
    assert folded_value(I32, lambda b: b.binary("add", b.const(2**31 - 1, I32), b.const(1, I32))) == -2**31


def test_bit_ops_and_division():
    assert folded_value(U32, lambda b: b.binary("and", b.binary("shr", b.const(0xABCD), b.const(4)),
                                                 b.const(0xF))) == 0xC
    assert folded_value(U32, lambda b: b.binary("div", b.const(17), b.const(5))) == 3
    assert folded_value(U32, lambda b: b.binary("rem", b.const(17), b.const(5))) == 2
    assert folded_value(I32, lambda b: b.binary("shr", b.const(-8, I32), b.const(1, I32))) == -4


def test_errors_are_left_to_run_time():
    assert folded_value(U32, lambda b: b.binary("div", b.const(1), b.const(0))) is None
    assert folded_value(U32, lambda b: b.binary("shl", b.const(1), b.const(32))) is None
    assert folded_value(U32, lambda b: b.cast(b.const(1e10, F32), U32)) is None
    assert folded_value(U32, lambda b: b.cast(b.const(-1.0, F32), U32)) is None
    # overflow to infinity stays an op
    assert folded_value(F16, lambda b: b.binary("mul", b.const(256.0, F16), b.const(256.0, F16))) is None


# ----- floats ----------------------------------------------------------------------------------

def test_f16_rounds_to_nearest_even():
    one_ulp = 2.0 ** -10
    # 1 + ulp/2 is a tie: rounds to even (1.0); 1 + 3ulp/2 rounds up to 1 + 2ulp
    assert folded_value(F16, lambda b: b.binary("add", b.const(1.0, F16), b.const(one_ulp / 2, F16))) == 1.0
    assert folded_value(F16, lambda b: b.binary("add", b.const(1.0 + one_ulp, F16),
                                                 b.const(one_ulp / 2, F16))) == 1.0 + 2 * one_ulp
    assert folded_value(F16, lambda b: b.binary("mul", b.const(3.0, F16), b.const(0.5, F16))) == 1.5
    # 2049 * 1 is no f16 value: rounds to the even neighbour 2048
    assert folded_value(F16, lambda b: b.binary("add", b.const(2048.0, F16), b.const(1.0, F16))) == 2048.0


def test_bf16_keeps_8_significant_bits():
    # 1 + 2^-8 is a tie between 1 and 1 + 2^-7: to even
    assert folded_value(BF16, lambda b: b.binary("add", b.const(1.0, BF16), b.const(2.0 ** -8, BF16))) == 1.0
    assert folded_value(BF16, lambda b: b.binary("add", b.const(1.0 + 2.0 ** -7, BF16),
                                                  b.const(2.0 ** -8, BF16))) == 1.0 + 2.0 ** -6
    # 3 * 1.0078125 = 3.0234375 needs 9 bits: rounds to 3.03125 (even)
    assert folded_value(BF16, lambda b: b.binary("mul", b.const(3.0, BF16), b.const(1.0078125, BF16))) == 3.03125


def test_fma_rounds_once():
    e = 2.0 ** -12
    # in f32: (1 + e) * (1 - e) - 1 = -e^2 exactly representable; two roundings would give 0
    v = folded_value(F32, lambda b: b.value("fma", [b.const(1 + e, F32), b.const(1 - e, F32),
                                                     b.const(-1.0, F32)], F32))
    assert v == -(e * e)


def test_signed_zeros():
    v = folded_value(F32, lambda b: b.binary("mul", b.const(-0.0, F32), b.const(5.0, F32)))
    assert v == 0 and math.copysign(1, v) == -1
    v = folded_value(F32, lambda b: b.binary("add", b.const(-0.0, F32), b.const(0.0, F32)))
    assert v == 0 and math.copysign(1, v) == 1


def test_compare_select_cast_bitcast_table():
    assert folded_value(BOOL, lambda b: b.binary("lt", b.const(2), b.const(3))) is True
    assert folded_value(BOOL, lambda b: b.binary("ge", b.const(-0.0, F32), b.const(0.0, F32))) is True
    assert folded_value(U32, lambda b: b.select(b.binary("eq", b.const(1), b.const(2)),
                                                b.const(7), b.const(9))) == 9
    assert folded_value(F16, lambda b: b.cast(b.const(2049), F16)) == 2048.0  # tie to even
    assert folded_value(I32, lambda b: b.cast(b.const(-2.75, F32), I32)) == -2
    h = float(np.float16(0.1))
    assert folded_value(F32, lambda b: b.cast(b.const(h, F16), F32)) == h  # widening is exact
    assert folded_value(F16, lambda b: b.cast(b.const(float(np.float32(0.1)), F32), F16)) == h
    assert folded_value(U16, lambda b: b.bitcast(b.const(1.0, F16), U16)) == 0x3C00
    assert folded_value(U16, lambda b: b.bitcast(b.const(1.0, BF16), U16)) == 0x3F80
    assert folded_value(F32, lambda b: b.bitcast(b.const(0x40490FDB), F32)) == float(np.float32(np.pi))
    assert folded_value(U32, lambda b: b.bitcast(b.const(-1, I32), U32)) == 0xFFFFFFFF

    b = Builder()
    tid = b.index("tid")
    v = b.value("table", [b.const(2)], F16, {"name": "lut"})
    b.store("y", tid, v)
    k = make_kernel(b, [BufferParam("y", F16, "write")], tables=[ConstTable("lut", F16, (0.0, 0.5, 1.5, 6.0))])
    fold(k)
    assert [(op.name, op.attrs.get("value")) for op in k.body.ops if op.results and op.results[0] is v] == [("const", 1.5)]


def test_non_canonical_constants_are_not_folded():
    # 0.1 is no f16 value: what the constant means is the reader's business, not fold's
    assert folded_value(F16, lambda b: b.binary("add", b.const(0.1, F16), b.const(0.0, F16))) is None


# ----- identities ------------------------------------------------------------------------------

@pytest.mark.parametrize("name, rhs", [("add", 0), ("sub", 0), ("mul", 1), ("or", 0), ("xor", 0),
                                       ("and", 0xFFFFFFFF), ("shl", 0), ("shr", 0), ("div", 1)])
def test_identities_return_the_operand(name, rhs):
    b = Builder()
    tid = b.index("tid")
    v = b.binary(name, tid, rhs)
    b.store("y", tid, v)
    k = make_kernel(b, [BufferParam("y", U32, "write")])
    fold(k)
    store = k.body.ops[-1]
    assert store.name == "store" and store.operands[1] is tid
    assert name not in body_names(k)


def test_identities_with_constant_on_the_left_and_absorbing_values():
    b = Builder()
    tid = b.index("tid")
    x = b.binary("mul", b.const(0), tid)  # 0 * x
    y = b.binary("add", b.const(0), tid)  # 0 + x
    z = b.binary("and", tid, 0)
    b.store("y", x, y)
    b.store("y", z, tid)
    k = make_kernel(b, [BufferParam("y", U32, "write")])
    fold(k)
    s1, s2 = k.body.ops[-2:]
    assert s1.operands[1] is tid
    defs = {r: op for op in k.body.ops for r in op.results}
    assert defs[s1.operands[0]].name == "const" and defs[s1.operands[0]].attrs["value"] == 0
    assert defs[s2.operands[0]].name == "const" and defs[s2.operands[0]].attrs["value"] == 0


def test_float_add_zero_is_not_an_identity():
    b = Builder()
    tid = b.index("tid")
    x = b.load("x", tid, F32)
    v = b.binary("add", x, b.const(0.0, F32))  # -0.0 + 0.0 = +0.0: not x
    w = b.binary("mul", v, b.const(1.0, F32))  # x * 1.0 changes a NaN's payload: kept too
    b.store("y", tid, w)
    k = make_kernel(b, [BufferParam("x", F32, "read"), BufferParam("y", F32, "write")])
    fold(k)
    assert body_names(k).count("add") == 1 and body_names(k).count("mul") == 1
    assert k.body.ops[-1].operands[1] is w


def test_select_with_constant_condition():
    b = Builder()
    tid = b.index("tid")
    lane = b.index("lane")
    v = b.select(b.binary("lt", b.const(1), b.const(2)), tid, lane)
    b.store("y", tid, v)
    k = make_kernel(b, [BufferParam("y", U32, "write")])
    fold(k)
    assert "select" not in body_names(k)
    assert k.body.ops[-1].operands[1] is tid


# ----- if / switch -----------------------------------------------------------------------------

def _if_kernel(cond: bool | None) -> Kernel:
    b = Builder()
    tid = b.index("tid")
    c = b.const(cond, BOOL) if cond is not None else b.binary("lt", tid, b.const(16))
    with b.region() as then:
        t = b.binary("add", tid, 100)
        b.store("z", tid, t)
        b.yield_(t)
    with b.region() as else_:
        e = b.binary("mul", tid, 3)
        b.yield_(e)
    r = b.op("if", [c], [U32], regions=[then, else_], hint="r").result
    b.store("y", tid, r)
    return make_kernel(b, [BufferParam("y", U32, "write"), BufferParam("z", U32, "readwrite")])


def test_if_with_constant_condition_is_inlined():
    for cond, kept in ((True, ["add", "store"]), (False, ["mul"])):
        k = _if_kernel(cond)
        before = copy.deepcopy(k)
        log = fold(k)
        names = body_names(k)
        assert "if" not in names and all(n in names for n in kept), names
        assert "1 if/switch inlined" in log[0]
        check_same(before, k)
    k = _if_kernel(None)
    fold(k)
    assert "if" in body_names(k)


def test_switch_with_constant_selector_takes_its_case_or_the_default():
    for sel, expect in ((1, 11), (7, 99)):
        b = Builder()
        tid = b.index("tid")
        s = b.binary("add", b.const(sel - 1), b.const(1))  # folds to sel first
        regions = []
        for value in (10, 11, 12, 99):
            with b.region() as r:
                b.yield_(b.const(value))
            regions.append(r)
        res = b.op("switch", [s], [U32], {"cases": (0, 1, 2)}, regions, hint="sw").result
        b.store("y", tid, res)
        k = make_kernel(b, [BufferParam("y", U32, "write")])
        fold(k)
        assert "switch" not in body_names(k)
        defs = {r: op for op in k.body.ops for r in op.results}
        assert defs[k.body.ops[-1].operands[1]].attrs["value"] == expect


def test_folding_reaches_nested_regions_and_uses_outer_constants():
    b = Builder()
    tid = b.index("tid")
    four = b.const(4)
    i = b.fresh("i", U32)
    with b.region([i]) as body:
        v = b.binary("mul", four, b.const(2))
        b.store("y", b.binary("add", i, v), tid)
        b.yield_()
    b.op("for", [b.const(0), b.scalar("N"), b.const(1)], [], regions=[body])
    k = make_kernel(b, [BufferParam("y", U32, "write")], scalars=["N"])
    fold(k)
    inner = k.body.ops[-1].regions[0].ops
    assert [op.name for op in inner][:2] == ["const", "const"] and inner[1].attrs["value"] == 8


# ----- semantics against the interpreter -------------------------------------------------------

def check_same(before: Kernel, after: Kernel, buffers=None, scalars=None) -> None:
    """The interpreter gives bit-identical outputs (or the same error) before and after."""
    if run_kernel is None:
        return
    buffers = buffers or {}
    inputs = {}
    for decl in before.buffers:
        arr = buffers.get(decl.name)
        if arr is None:
            arr = np.zeros(64, decl.elem.holding_dtype)
        inputs[decl.name] = arr
    try:
        want = run_kernel(before, {n: a.copy() for n, a in inputs.items()}, scalars or {})
    except InterpreterError:
        with pytest.raises(InterpreterError):
            run_kernel(after, {n: a.copy() for n, a in inputs.items()}, scalars or {})
        return
    got = run_kernel(after, {n: a.copy() for n, a in inputs.items()}, scalars or {})
    for name in want:
        assert want[name].tobytes() == got[name].tobytes(), name


_TYPES = [U8, U16, U32, I32, F16, BF16, F32, BOOL]


def _value(t: ScalarType):
    if t == BOOL:
        return st.booleans()
    if t.is_int:
        lo, hi = (-(2**31), 2**31 - 1) if t == I32 else (0, 2**t.bits - 1)
        edges = [lo, hi, 0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 33, 64]
        return st.one_of(st.sampled_from([e for e in edges if lo <= e <= hi]), st.integers(lo, hi))
    special = [0.0, -0.0, 1.0, -1.0, 0.5, 1.5, 2.0 ** -14, 2.0 ** -24, 65504.0, 3.0, 2.0 ** -126, 2.0 ** -133]
    raw = st.one_of(st.sampled_from(special), st.floats(-1e5, 1e5, allow_nan=False),
                    st.floats(-1e-3, 1e-3, allow_nan=False), st.integers(-70000, 70000).map(float))

    def to_type(x: float):
        with np.errstate(over="ignore"):
            return _held(x)

    def _held(x: float):
        if t == F16:
            v = float(np.float16(x))
        elif t == F32:
            v = float(np.float32(x))
        else:
            v = float(round_bf16(np.float32(x))) if run_kernel is not None else float(np.float32(x))
        return v if math.isfinite(v) else 1.0
    return raw.map(to_type)


_BINARY = ["add", "sub", "mul", "min", "max", "div", "rem", "and", "or", "xor", "shl", "shr",
           "lt", "le", "gt", "ge", "eq", "ne"]


@st.composite
def _expression(draw):
    kind = draw(st.sampled_from(["binary", "fma", "select", "cast", "bitcast"]))
    if kind == "binary":
        name = draw(st.sampled_from(_BINARY))
        ok = {"div": "int", "rem": "int", "and": "intbool", "or": "intbool", "xor": "intbool",
              "shl": "int", "shr": "int"}.get(name, "any" if name in ("lt", "le", "gt", "ge", "eq", "ne") else "num")
        types = [t for t in _TYPES if ok == "any" or (ok == "num" and t != BOOL)
                 or (ok == "int" and t.is_int) or (ok == "intbool" and (t.is_int or t == BOOL))]
        if name in ("div", "rem"):
            types = [U8, U16, U32]  # unsigned only (verifier)
        t = draw(st.sampled_from(types))
        a, b_ = draw(_value(t)), draw(_value(t))
        if name in ("shl", "shr") and draw(st.booleans()):
            b_ = draw(st.integers(0, t.bits - 1))
        rt = BOOL if name in ("lt", "le", "gt", "ge", "eq", "ne") else t
        return rt, lambda b: b.binary(name, b.const(a, t), b.const(b_, t))
    if kind == "fma":
        t = draw(st.sampled_from([F16, BF16, F32]))
        a, b_, c = draw(_value(t)), draw(_value(t)), draw(_value(t))
        return t, lambda b: b.value("fma", [b.const(a, t), b.const(b_, t), b.const(c, t)], t)
    if kind == "select":
        t = draw(st.sampled_from(_TYPES))
        c, a, b_ = draw(st.booleans()), draw(_value(t)), draw(_value(t))
        return t, lambda b: b.select(b.const(c, BOOL), b.const(a, t), b.const(b_, t))
    if kind == "cast":
        src, dst = draw(st.sampled_from(_TYPES)), draw(st.sampled_from(_TYPES))
        x = draw(_value(src))
        return dst, lambda b: b.cast(b.const(x, src), dst)
    pairs = [(U16, F16), (F16, U16), (U16, BF16), (BF16, U16), (F16, BF16), (U32, F32), (F32, U32),
             (I32, F32), (F32, I32), (U32, I32), (I32, U32)]
    src, dst = draw(st.sampled_from(pairs))
    x = draw(_value(src))
    return dst, lambda b: b.bitcast(b.const(x, src), dst)


@pytest.mark.skipif(run_kernel is None, reason="needs marlin_dsl.ir.interpret")
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_expression())
def test_folding_matches_the_interpreter_bit_for_bit(expr):
    t, build = expr
    k, op = single(t, build)
    before = copy.deepcopy(k)
    fold(k)
    check_same(before, k)
