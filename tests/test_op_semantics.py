"""One scalar semantics per op, in the op table (`OpDef.evaluate`, ir/semantics.py): for every op
that has one, folding a constant expression and interpreting it agree bit for bit, on random
operands and the edge values (0, the largest integer, negative floats and zeros, NaN and
infinities where the type has them, shift amounts at the width, out-of-range casts and table
indices). Where the interpreter raises, the folder must have left the op alone."""
from __future__ import annotations

import copy
import itertools
import re

import numpy as np
import pytest

from marlin_dsl.ir import (
    BF16, BOOL, F16, F32, I32, U8, U16, U32, Builder, BufferParam, ConstTable, GridDim, Kernel,
    ScalarType, verify,
)
from marlin_dsl.ir.interpret import InterpreterError, round_bf16, run_kernel
from marlin_dsl.ir.ops import OPS
from marlin_dsl.passes import FoldPass
from marlin_dsl.ir.semantics import Signature, lop3
from marlin_dsl.targets.c_printer import lop3_expression

TYPES = [BOOL, U8, U16, U32, I32, F16, BF16, F32]
INTS = [U8, U16, U32, I32]
FLOATS = [F16, BF16, F32]
CASES = 10  # random operand tuples per (op, types), on top of the edge values


def _held(x: float, t: ScalarType) -> float:
    """x as a value of the float type t (NaN and infinities pass through)."""
    with np.errstate(over="ignore"):
        if t == F16:
            return float(np.float16(x))
        if t == BF16:
            return float(round_bf16(np.float32(x)))
        return float(np.float32(x))


def _values(t: ScalarType, rng: np.random.Generator, n: int) -> list:
    if t == BOOL:
        return [False, True] + [bool(b) for b in rng.integers(0, 2, n)]
    if t.is_int:
        lo, hi = (-(2**31), 2**31 - 1) if t == I32 else (0, 2**t.bits - 1)
        edges = [0, 1, 2, hi, hi - 1, lo, t.bits - 1, t.bits, 7]
        return [e for e in edges if lo <= e <= hi] + [int(v) for v in rng.integers(lo, hi, n, endpoint=True)]
    big = {F16: 65504.0, BF16: 3.3895313892515355e38, F32: 3.4028234663852886e38}[t]
    tiny = {F16: 2.0 ** -24, BF16: 2.0 ** -133, F32: 2.0 ** -149}[t]
    edges = [0.0, -0.0, 1.0, -1.0, -2.5, big, -big, tiny, -tiny, 0.5, float("nan"), float("inf"), -float("inf")]
    scale = 10.0 ** rng.integers(-6, 6, n)
    return edges + [_held(v, t) for v in rng.normal(size=n) * scale]


def _tuples(types: list[ScalarType], rng: np.random.Generator) -> list[tuple]:
    """Edge values of the first operand against a few of the others, then random tuples."""
    pools = [_values(t, rng, CASES) for t in types]
    edges = list(itertools.islice(itertools.product(*[p[:6] for p in pools]), 40))
    rand = [tuple(p[int(rng.integers(len(p)))] for p in pools) for _ in range(CASES)]
    return edges + rand


def _kernel(name: str, operand_types: list[ScalarType], result_type: ScalarType, args: tuple,
            attrs: dict | None = None, tables: list[ConstTable] = ()) -> Kernel:
    b = Builder()
    tid = b.index("tid")
    operands = [b.const(a, t) for a, t in zip(args, operand_types)]
    v = b.value(name, operands, result_type, attrs)
    b.store("y", tid, v)
    k = Kernel("k", 32, (GridDim(None), GridDim(None), GridDim(None)), b.block,
               buffers=[BufferParam("y", result_type, "write")], tables=list(tables))
    verify(k)
    return k


def _cases() -> dict[str, list[tuple[list[ScalarType], ScalarType, dict, list[ConstTable]]]]:
    """op name -> (operand types, result type, attrs, tables) to try."""
    cases: dict[str, list] = {}
    for n in ("add", "sub", "mul", "min", "max"):
        cases[n] = [([t, t], t, {}, []) for t in TYPES]
    for n in ("div", "rem"):
        cases[n] = [([t, t], t, {}, []) for t in (U8, U16, U32)]
    for n in ("and", "or", "xor", "shl", "shr"):
        cases[n] = [([t, t], t, {}, []) for t in [BOOL, *INTS]]
    cases["fma"] = [([t, t, t], t, {}, []) for t in FLOATS]
    cases["lop3"] = [([U32, U32, U32], U32, {"lut": lut}, []) for lut in (0xEA, 0x96, 0x1B, 0x00, 0xFF)]
    for n in ("lt", "le", "gt", "ge", "eq", "ne"):
        cases[n] = [([t, t], BOOL, {}, []) for t in TYPES]
    cases["select"] = [([BOOL, t, t], t, {}, []) for t in TYPES]
    cases["cast"] = [([s], d, {"to": str(d)}, []) for s in TYPES for d in TYPES]
    cases["bitcast"] = [([s], d, {"to": str(d)}, []) for s in TYPES for d in TYPES if s.bits == d.bits]
    tables = [ConstTable("t", F16, (0.5, -1.0, 3.0, 65504.0)), ConstTable("t", U8, (7, 0, 255)),
              ConstTable("t", F32, (0.1, 2.0))]  # 0.1 is no f32: that table is not folded
    cases["table"] = [([U32], t.elem, {"name": "t"}, [t]) for t in tables]
    for n in NEVER_FOLDED:
        cases[n] = [([F32], F32, {}, [])]
    return cases


#: Ops whose device results may differ from the interpreter's by an ulp or two (docs/IR.md):
#: the folder leaves them to the device.
NEVER_FOLDED = ("exp2", "recip")


def test_every_op_with_evaluate_has_cases() -> None:
    assert set(_cases()) == {n for n, d in OPS.items() if d.evaluate is not None}


def _run(k: Kernel) -> bytes | type:
    try:
        return run_kernel(k, {"y": np.zeros(32, k.buffers[0].elem.holding_dtype)}, {})["y"].tobytes()
    except InterpreterError as e:
        return type(e)


@pytest.mark.parametrize("name", sorted(_cases()))
def test_folding_equals_interpreting(name: str) -> None:
    rng = np.random.default_rng(sum(map(ord, name)))
    folded = 0
    for operand_types, result_type, attrs, tables in _cases()[name]:
        for args in _tuples(operand_types, rng) if name != "table" else [(i,) for i in range(6)]:
            before = _kernel(name, operand_types, result_type, args, attrs, tables)
            after = copy.deepcopy(before)
            FoldPass().run(after, [])
            verify(after)
            op = after.body.ops[1 + len(operand_types)]
            want, got = _run(before), _run(after)
            where = f"{name}{tuple(map(str, operand_types))} -> {result_type} on {args}"
            assert got == want, where
            if op.name == "const":
                folded += 1
                assert want is not InterpreterError, f"{where}: folded an op the interpreter refuses"
    if name in NEVER_FOLDED:
        assert not folded, f"{name}: folded"
    else:
        assert folded, f"{name}: no case folded"


def test_lop3_semantics_and_c_spelling_agree_on_every_truth_table() -> None:
    """lop3's truth table read bit by bit, its numpy semantics and the C expression the Metal
    printer spells (`lop3_expression`) agree for all 256 tables."""
    rng = np.random.default_rng(0)
    a, b, c = (rng.integers(0, 2**32, size=16, dtype=np.uint64).astype(np.uint32) for _ in range(3))
    for lut in range(256):
        run = lop3(Signature("lop3", {"lut": lut}, (U32, U32, U32), U32))
        got, _ = run(a, b, c)
        want = [sum(((lut >> (4 * (int(x) >> i & 1) + 2 * (int(y) >> i & 1) + (int(z) >> i & 1))) & 1) << i
                    for i in range(32)) for x, y, z in zip(a, b, c)]
        np.testing.assert_array_equal(got, np.array(want, np.uint32), err_msg=f"lut {lut:#x}")
        expr = lop3_expression(lut, "x", "y", "z")
        for x, y, z, w in itertools.islice(zip(a, b, c, want), 4):
            python = re.sub(r"~(\w)", r"(0xFFFFFFFF ^ \1)", expr).replace("0u", "0")
            value = eval(python, {"x": int(x), "y": int(y), "z": int(z)})
            assert value & 0xFFFFFFFF == w, (hex(lut), expr)
