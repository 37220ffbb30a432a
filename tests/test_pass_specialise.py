"""specialise: a loop marked `specialise = n` dispatches on its dynamic trip count to copies with
a constant trip count (seed 003's switch on the pattern count), which unroll then flattens."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from marlin_dsl.ir import F32, U32, Builder, BufferParam, GridDim, Kernel, ScalarParam, verify
from marlin_dsl.passes import SpecialisePass, UnrollPass

try:
    from marlin_dsl.ir.interpret import run_kernel
except ImportError:
    run_kernel = None


def make_kernel(b: Builder, buffers=(), scalars=()) -> Kernel:
    return Kernel("k", 32, (GridDim(None), GridDim(None), GridDim(None)), b.block,
                  buffers=list(buffers), scalars=[ScalarParam(s) for s in scalars])


def run(p, kernel: Kernel) -> list[str]:
    log: list[str] = []
    p.run(kernel, log)
    verify(kernel)
    return log


def pattern_kernel(n: int = 4, lb: int = 0, step: int = 1) -> Kernel:
    """Like seed 003: count = (a per-thread pattern count) and a loop over the set positions,
    accumulating x[offset] where offset comes from a table-free formula."""
    b = Builder()
    tid = b.index("tid")
    count = b.binary("rem", tid, b.const(n + 1))  # 0..n, dynamic
    i = b.fresh("i", U32)
    acc = b.fresh("acc", F32)
    with b.region([i, acc]) as body:
        x = b.load("x", b.binary("add", b.binary("mul", tid, 8), i), F32)
        b.yield_(b.binary("add", acc, x))
    loop = b.op("for", [b.const(lb), count, b.const(step), b.const(0.0, F32)], [F32],
                {"specialise": n}, regions=[body], hint="sum")
    b.store("y", tid, loop.result)
    return make_kernel(b, [BufferParam("x", F32, "read"), BufferParam("y", F32, "write")])


def inputs():
    return {"x": np.linspace(-3, 5, 256, dtype=np.float32), "y": np.zeros(32, np.float32)}


def check_same(before: Kernel, after: Kernel) -> None:
    if run_kernel is None:
        return
    want = run_kernel(before, inputs(), {})["y"]
    got = run_kernel(after, inputs(), {})["y"]
    assert want.tobytes() == got.tobytes()


def test_loop_becomes_a_switch_on_its_trip_count():
    k = pattern_kernel(4)
    loop = next(op for op in k.body.ops if op.name == "for")
    result = loop.result
    before = copy.deepcopy(k)
    log = run(SpecialisePass(), k)
    assert log == ["specialise: 1 loops dispatched on their trip count"]
    switch = next(op for op in k.body.ops if op.name == "switch")
    assert "for" not in [op.name for op in k.body.ops]
    assert switch.attrs["cases"] == (0, 1, 2, 3, 4) and len(switch.regions) == 6
    assert switch.operands[0] is loop.operands[1]  # dispatch on ub
    assert switch.results == [result]  # the switch takes over the loop's result
    for t, region in enumerate(switch.regions[:-1]):
        assert [op.name for op in region.ops] == ["const", "for", "yield"]
        c, case_loop, _ = region.ops
        assert c.attrs["value"] == t and case_loop.operands[1] is c.results[0]
        assert "specialise" not in case_loop.attrs
    default = switch.regions[-1]
    assert [op.name for op in default.ops] == ["for", "yield"] and default.ops[0] is loop
    assert "specialise" not in loop.attrs and loop.result is not result
    check_same(before, k)


def test_specialise_then_unroll_gives_straight_line_cases():
    k = pattern_kernel(3)
    before = copy.deepcopy(k)
    run(SpecialisePass(), k)
    run(UnrollPass(), k)
    switch = next(op for op in k.body.ops if op.name == "switch")
    for t, region in enumerate(switch.regions[:-1]):
        names = [op.name for op in region.ops]
        assert "for" not in names and names.count("load") == t
    assert [op.name for op in switch.regions[-1].ops] == ["for", "yield"]  # the dynamic fallback
    check_same(before, k)


def test_pass_is_idempotent():
    k = pattern_kernel(2)
    run(SpecialisePass(), k)
    snapshot = [(op.name, dict(op.attrs)) for op in k.walk()]
    assert run(SpecialisePass(), k) == ["specialise: 0 loops dispatched on their trip count"]
    assert [(op.name, dict(op.attrs)) for op in k.walk()] == snapshot


@pytest.mark.parametrize("lb, step", [(1, 1), (0, 2)])
def test_other_bounds_are_left_with_a_note(lb, step):
    k = pattern_kernel(2, lb=lb, step=step)
    log = run(SpecialisePass(), k)
    assert "left dynamic" in log[0]
    assert [op.name for op in k.body.ops].count("for") == 1


def test_constant_trip_count_just_drops_the_attribute():
    b = Builder()
    i = b.fresh("i", U32)
    with b.region([i]) as body:
        b.store("y", i, i)
        b.yield_()
    loop = b.op("for", [b.const(0), b.const(3), b.const(1)], [], {"specialise": 8}, regions=[body])
    k = make_kernel(b, [BufferParam("y", U32, "write")])
    log = run(SpecialisePass(), k)
    assert "specialise" not in loop.attrs and "attribute dropped" in log[0]


def test_nested_marked_loops_are_both_dispatched():
    b = Builder()
    tid = b.index("tid")
    n_outer = b.binary("rem", tid, b.const(3))
    n_inner = b.binary("rem", b.binary("shr", tid, b.const(2)), b.const(3))
    i = b.fresh("i", U32)
    with b.region([i]) as outer:
        j = b.fresh("j", U32)
        with b.region([j]) as inner:
            pos = b.binary("add", b.binary("mul", tid, 16), b.binary("add", b.binary("mul", i, 4), j))
            b.store("y", pos, b.binary("add", i, j))
            b.yield_()
        b.op("for", [b.const(0), n_inner, b.const(1)], [], {"specialise": 2}, regions=[inner])
        b.yield_()
    b.op("for", [b.const(0), n_outer, b.const(1)], [], {"specialise": 2}, regions=[outer])
    k = make_kernel(b, [BufferParam("y", U32, "write")])
    before = copy.deepcopy(k)
    log = run(SpecialisePass(), k)
    assert log == ["specialise: 2 loops dispatched on their trip count"]
    run(UnrollPass(), k)
    if run_kernel:
        want = run_kernel(before, {"y": np.zeros(512, np.uint32)}, {})["y"]
        assert np.array_equal(want, run_kernel(k, {"y": np.zeros(512, np.uint32)}, {})["y"])
