"""unroll: `for` loops with constant bounds become straight-line clones of their body."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from marlin_dsl.ir import F32, U32, Builder, BufferParam, GridDim, Kernel, ScalarParam, verify
from marlin_dsl.passes import UnrollPass
from marlin_dsl.passes.manager import iter_values

try:
    from marlin_dsl.ir.interpret import run_kernel
except ImportError:
    run_kernel = None

try:
    from marlin_dsl.ir.text import print_kernel
except ImportError:
    print_kernel = None


def make_kernel(b: Builder, buffers=(), scalars=()) -> Kernel:
    return Kernel("k", 32, (GridDim(None), GridDim(None), GridDim(None)), b.block,
                  buffers=list(buffers), scalars=[ScalarParam(s) for s in scalars])


def unroll(kernel: Kernel, **options) -> list[str]:
    log: list[str] = []
    UnrollPass(**options).run(kernel, log)
    verify(kernel)
    return log


def all_names(kernel: Kernel) -> list[str]:
    return [op.name for op in kernel.walk()]


def check_same(before: Kernel, after: Kernel, inputs: dict, scalars: dict | None = None) -> None:
    if run_kernel is None:
        return
    want = run_kernel(before, {n: a.copy() for n, a in inputs.items()}, scalars or {})
    got = run_kernel(after, {n: a.copy() for n, a in inputs.items()}, scalars or {})
    for name in want:
        assert want[name].tobytes() == got[name].tobytes(), name


def sum_kernel(lb=0, ub=4, step=1, ub_scalar=False) -> Kernel:
    """y[tid] = sum over i of x[4*tid + i] (f32), a loop carrying the accumulator."""
    b = Builder()
    tid = b.index("tid")
    i = b.fresh("i", U32)
    acc = b.fresh("acc", F32)
    with b.region([i, acc]) as body:
        x = b.load("x", b.binary("add", b.binary("mul", tid, 4), i), F32)
        b.yield_(b.binary("add", acc, x))
    ub_v = b.scalar("N") if ub_scalar else b.const(ub)
    loop = b.op("for", [b.const(lb), ub_v, b.const(step), b.const(0.0, F32)], [F32], regions=[body], hint="s")
    b.store("y", tid, loop.result)
    return make_kernel(b, [BufferParam("x", F32, "read"), BufferParam("y", F32, "write")],
                       ["N"] if ub_scalar else [])


def _inputs():
    return {"x": np.arange(160, dtype=np.float32) * 0.25, "y": np.zeros(32, np.float32)}


def test_constant_loop_is_unrolled_with_carried_values():
    k = sum_kernel()
    before = copy.deepcopy(k)
    log = unroll(k)
    names = [op.name for op in k.body.ops]
    assert "for" not in names
    assert names.count("load") == 4 and names.count("add") == 8  # index add + accumulate per iteration
    # the iteration indices are constants 0..3 named after the index argument
    idx = [op for op in k.body.ops if op.name == "const" and op.results[0].name.startswith("i")]
    assert [op.attrs["value"] for op in idx] == [0, 1, 2, 3]
    # the accumulator chains through the clones, and the store reads the last one
    adds = [op for op in k.body.ops if op.name == "add" and op.results[0].type == F32]
    for prev, nxt in zip(adds, adds[1:]):
        assert nxt.operands[0] is prev.results[0]
    assert k.body.ops[-1].operands[1] is adds[-1].results[0]
    assert log == ["unroll: 1 loops unrolled into 4 iterations, 0 loops kept (dynamic or over 64 iterations)"]
    check_same(before, k, _inputs())


@pytest.mark.parametrize("lb, ub, step, trips", [(0, 0, 1, 0), (5, 3, 1, 0), (1, 8, 3, 3), (2, 3, 7, 1)])
def test_trip_counts(lb, ub, step, trips):
    k = sum_kernel(lb, ub, step)
    before = copy.deepcopy(k)
    unroll(k)
    assert "for" not in all_names(k)
    assert all_names(k).count("load") == trips
    if trips == 0:  # the result is the init value
        init = next(op for op in k.body.ops if op.name == "const" and op.results[0].type == F32)
        assert k.body.ops[-1].operands[1] is init.results[0]
    check_same(before, k, _inputs())


def test_dynamic_and_long_loops_stay():
    k = sum_kernel(ub_scalar=True)
    assert "for" in [op.name for op in k.body.ops] and unroll(k)[0].endswith("1 loops kept (dynamic or over 64 iterations)")
    assert "for" in all_names(k)
    k = sum_kernel(ub=65)
    unroll(k)
    assert "for" in all_names(k)
    k = sum_kernel(ub=65)
    unroll(k, max_trip=65)
    assert "for" not in all_names(k) and all_names(k).count("load") == 65
    k = sum_kernel(ub=9)
    unroll(k, max_trip=8)
    assert "for" in all_names(k)


def test_wrapping_index_is_not_unrolled():
    k = sum_kernel(lb=0xFFFFFFF0, ub=0xFFFFFFFF, step=0x10)  # i += 16 wraps: a run-time error
    unroll(k)
    assert "for" in all_names(k)


def _nested_kernel() -> Kernel:
    """for i in 0..3: for j in 0..i: y[4*i + j] = i + j (the inner bound is the outer index)."""
    b = Builder()
    tid = b.index("tid")
    c0, c1 = b.const(0), b.const(1)
    i = b.fresh("i", U32)
    with b.region([i]) as outer:
        j = b.fresh("j", U32)
        with b.region([j]) as inner:
            pos = b.binary("add", b.binary("mul", i, 4), j)
            pred = b.binary("eq", tid, b.const(0))
            b.store("y", pos, b.binary("add", i, j), pred)
            b.yield_()
        b.op("for", [c0, i, c1], [], regions=[inner])
        b.yield_()
    b.op("for", [c0, b.const(3), c1], [], regions=[outer])
    return make_kernel(b, [BufferParam("y", U32, "write")])


def test_nested_loops_with_inner_bound_from_the_outer_index():
    k = _nested_kernel()
    before = copy.deepcopy(k)
    log = unroll(k)
    assert "for" not in all_names(k)
    assert all_names(k).count("store") == 0 + 1 + 2
    assert "4 loops unrolled into 6 iterations" in log[0]  # outer (3) + inner (0, 1, 2)
    check_same(before, k, {"y": np.full(16, 7, np.uint32)})


def test_dynamic_loop_body_is_still_visited():
    b = Builder()
    tid = b.index("tid")
    i = b.fresh("i", U32)
    with b.region([i]) as outer:
        j = b.fresh("j", U32)
        acc = b.fresh("acc", U32)
        with b.region([j, acc]) as inner:
            b.yield_(b.binary("add", acc, j))
        s = b.op("for", [b.const(0), b.const(3), b.const(1), i], [U32], regions=[inner]).result
        b.store("y", b.binary("add", b.binary("mul", tid, 8), i), s)
        b.yield_()
    b.op("for", [b.const(0), b.scalar("N"), b.const(1)], [], regions=[outer])
    k = make_kernel(b, [BufferParam("y", U32, "write")], ["N"])
    before = copy.deepcopy(k)
    unroll(k)
    top = [op.name for op in k.body.ops]
    assert top.count("for") == 1
    inner_names = [op.name for op in k.body.ops[-1].regions[0].ops]
    assert "for" not in inner_names and inner_names.count("add") == 3 + 1
    check_same(before, k, {"y": np.zeros(256, np.uint32)}, {"N": 5})


def test_names_are_fresh_unique_and_deterministic():
    texts = []
    for _ in range(2):
        k = _nested_kernel()
        unroll(k)
        names = [v.name for v in iter_values(k.body)]
        assert len(names) == len(set(names))
        texts.append(print_kernel(k) if print_kernel else repr([(op.name, [v.name for v in op.operands],
                                                                 [v.name for v in op.results]) for op in k.walk()]))
    assert texts[0] == texts[1]
