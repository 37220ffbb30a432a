"""cse: equal pure ops are merged when the earlier definition is visible at the later one."""
from __future__ import annotations

import copy

import numpy as np

from marlin_dsl.ir import BOOL, F32, U32, Builder, BufferParam, GridDim, Kernel, ScalarParam, verify
from marlin_dsl.passes import CSEPass

try:
    from marlin_dsl.ir.interpret import run_kernel
except ImportError:
    run_kernel = None


def make_kernel(b: Builder, buffers=(), scalars=()) -> Kernel:
    return Kernel("k", 32, (GridDim(None), GridDim(None), GridDim(None)), b.block,
                  buffers=list(buffers), scalars=[ScalarParam(s) for s in scalars])


def cse(kernel: Kernel) -> list[str]:
    log: list[str] = []
    CSEPass().run(kernel, log)
    verify(kernel)
    return log


def names(block) -> list[str]:
    return [op.name for op in block.ops]


def test_equal_ops_in_one_block_are_merged():
    b = Builder()
    tid = b.index("tid")
    tid2 = b.index("tid")
    a = b.binary("add", tid, b.const(3))
    a2 = b.binary("add", tid2, b.const(3))  # same once tid2 -> tid and the constants merge
    b.store("y", a, a2)
    k = make_kernel(b, [BufferParam("y", U32, "write")])
    before = copy.deepcopy(k)
    log = cse(k)
    assert names(k.body) == ["index", "const", "add", "store"]
    store = k.body.ops[-1]
    assert store.operands[0] is store.operands[1] is a
    assert log == ["cse: 3 ops replaced by an earlier equal one"]
    if run_kernel:
        want = run_kernel(before, {"y": np.zeros(64, np.uint32)}, {})["y"]
        assert np.array_equal(want, run_kernel(k, {"y": np.zeros(64, np.uint32)}, {})["y"])


def test_commutative_operands_match_in_any_order():
    b = Builder()
    tid, lane = b.index("tid"), b.index("lane")
    x = b.binary("mul", tid, lane)
    y = b.binary("mul", lane, tid)
    s1 = b.binary("sub", tid, lane)
    s2 = b.binary("sub", lane, tid)  # not commutative: stays
    b.store("y", x, y)
    b.store("y", s1, s2)
    k = make_kernel(b, [BufferParam("y", U32, "write")])
    cse(k)
    assert names(k.body).count("mul") == 1 and names(k.body).count("sub") == 2


def test_attributes_types_and_signed_zeros_distinguish():
    b = Builder()
    tid = b.index("tid")
    lane = b.index("lane")  # another kind
    z1, z2 = b.const(0.0, F32), b.const(-0.0, F32)  # equal in Python, different constants
    o1, o2 = b.const(1), b.const(True, BOOL)
    b.store("f", tid, b.binary("add", z1, z2))
    b.store("y", lane, o1)
    b.store("p", tid, o2)
    k = make_kernel(b, [BufferParam("f", F32, "write"), BufferParam("y", U32, "write"),
                        BufferParam("p", BOOL, "write")])
    cse(k)
    assert names(k.body).count("index") == 2 and names(k.body).count("const") == 4


def test_loads_are_not_merged():
    b = Builder()
    tid = b.index("tid")
    x1 = b.load("x", tid, F32)
    b.store("x", tid, b.binary("add", x1, x1))
    x2 = b.load("x", tid, F32)  # reads the stored value
    b.store("y", tid, x2)
    k = make_kernel(b, [BufferParam("x", F32, "readwrite"), BufferParam("y", F32, "write")])
    cse(k)
    assert names(k.body).count("load") == 2


def _region_kernel():
    """outer const 5 and add(tid, 5); an if whose branches recompute them."""
    b = Builder()
    tid = b.index("tid")
    outer = b.binary("add", tid, b.const(5))
    cond = b.binary("lt", tid, b.const(8))
    with b.region() as then:
        inner = b.binary("add", tid, b.const(5))  # same as outer: reuses it
        only_inner = b.binary("mul", tid, b.const(7))
        b.yield_(b.binary("add", inner, only_inner))
    with b.region() as else_:
        again = b.binary("mul", tid, b.const(7))  # equal to then's op, but then's does not dominate
        b.yield_(again)
    r = b.op("if", [cond], [U32], regions=[then, else_]).result
    after = b.binary("mul", tid, b.const(7))  # the branches' definitions are not visible here
    b.store("y", tid, b.binary("add", r, b.binary("add", outer, after)))
    return make_kernel(b, [BufferParam("y", U32, "write")]), outer


def test_nested_regions_reuse_outer_definitions_but_not_the_reverse():
    k, outer = _region_kernel()
    before = copy.deepcopy(k)
    cse(k)
    if_op = next(op for op in k.body.ops if op.name == "if")
    then, else_ = if_op.regions
    assert names(then) == ["const", "mul", "add", "yield"]  # add(tid, 5) and const 5 reused
    assert then.ops[2].operands[0] is outer
    assert names(else_) == ["const", "mul", "yield"]  # its own copy: siblings share nothing
    assert [op.name for op in k.body.ops].count("mul") == 1  # the one after the if
    if run_kernel:
        want = run_kernel(before, {"y": np.zeros(32, np.uint32)}, {})["y"]
        assert np.array_equal(want, run_kernel(k, {"y": np.zeros(32, np.uint32)}, {})["y"])


def test_loop_bodies_see_outer_constants():
    b = Builder()
    tid = b.index("tid")
    four = b.const(4)
    i = b.fresh("i", U32)
    with b.region([i]) as body:
        b.store("y", b.binary("add", b.binary("mul", tid, b.const(4)), i), i)
        b.yield_()
    b.op("for", [b.const(0), b.scalar("N"), b.const(1)], [], regions=[body])
    b.store("y", tid, four)
    k = make_kernel(b, [BufferParam("y", U32, "write")], ["N"])
    cse(k)
    loop = next(op for op in k.body.ops if op.name == "for")
    assert names(loop.regions[0]) == ["mul", "add", "store", "yield"]
    assert loop.regions[0].ops[0].operands[1] is four
