"""dce: ops without an effect whose results are unused go, to a fixed point; writes stay."""
from __future__ import annotations

import copy

import numpy as np

from marlin_dsl.ir import F32, U32, Builder, BufferParam, GridDim, Kernel, ScalarParam, SharedArray, verify
from marlin_dsl.passes import DCEPass

try:
    from marlin_dsl.ir.interpret import run_kernel
except ImportError:
    run_kernel = None


def make_kernel(b: Builder, buffers=(), scalars=(), shared=()) -> Kernel:
    return Kernel("k", 32, (GridDim(None), GridDim(None), GridDim(None)), b.block,
                  buffers=list(buffers), scalars=[ScalarParam(s) for s in scalars], shared=list(shared))


def dce(kernel: Kernel) -> list[str]:
    log: list[str] = []
    DCEPass().run(kernel, log)
    verify(kernel)
    return log


def names(block) -> list[str]:
    return [op.name for op in block.ops]


def test_dead_chains_go_and_live_values_stay():
    b = Builder()
    tid = b.index("tid")
    lane = b.index("lane")
    dead = b.binary("mul", b.binary("add", lane, b.const(1)), b.const(3))
    b.binary("xor", dead, dead)  # the end of the dead chain
    b.load("x", tid, F32)  # a dead read
    b.store("y", tid, b.binary("add", tid, b.const(2)))
    k = make_kernel(b, [BufferParam("x", F32, "read"), BufferParam("y", U32, "write")])
    before = copy.deepcopy(k)
    log = dce(k)
    assert names(k.body) == ["index", "const", "add", "store"]
    assert log[0].startswith("dce: 7 ops removed")
    if run_kernel:
        inputs = {"x": np.ones(32, np.float32), "y": np.zeros(32, np.uint32)}
        want = run_kernel(before, {n: a.copy() for n, a in inputs.items()}, {})["y"]
        assert np.array_equal(want, run_kernel(k, inputs, {})["y"])


def _loop(b: Builder, write: bool, carried: bool, dead: bool = False):
    i = b.fresh("i", U32)
    args = [i] + ([b.fresh("acc", U32)] if carried else [])
    with b.region(args) as body:
        if dead:
            b.binary("mul", i, i, hint="dead")
        v = b.binary("add", i, b.const(1))
        if write:
            b.store("y", i, v)
        b.yield_(*([b.binary("add", args[1], v)] if carried else []))
    inits = [b.const(0)] if carried else []
    return b.op("for", [b.const(0), b.scalar("N"), b.const(1), *inits], [U32] * len(inits), regions=[body])


def test_loops_without_writes_and_unused_results_go():
    b = Builder()
    _loop(b, write=False, carried=True)   # result unused, no writes: removed
    _loop(b, write=False, carried=False)  # no results, no writes: removed
    _loop(b, write=True, carried=True)    # writes: stays
    k = make_kernel(b, [BufferParam("y", U32, "write")], ["N"])
    dce(k)
    loops = [op for op in k.body.ops if op.name == "for"]
    assert len(loops) == 1 and "store" in names(loops[0].regions[0])


def test_used_loop_results_keep_the_loop_and_dead_code_inside_goes():
    b = Builder()
    tid = b.index("tid")
    loop = _loop(b, write=False, carried=True, dead=True)
    assert names(loop.regions[0])[0] == "mul"
    b.store("y", tid, loop.result)
    k = make_kernel(b, [BufferParam("y", U32, "write")], ["N"])
    dce(k)
    assert names(loop.regions[0]) == ["const", "add", "add", "yield"]
    assert loop in k.body.ops


def test_barriers_and_regions_with_barriers_stay():
    b = Builder()
    tid = b.index("tid")
    cond = b.binary("lt", tid, b.const(64))  # uniform for a group of 32 threads
    with b.region() as then:
        b.barrier()
        b.yield_()
    with b.region() as else_:
        b.yield_()
    b.op("if", [cond], [], regions=[then, else_])
    b.barrier()
    k = make_kernel(b, shared=[SharedArray("s", F32, 32)])
    dce(k)
    assert names(k.body) == ["index", "const", "lt", "if", "barrier"]


def test_atomics_stay_even_when_unused():
    b = Builder()
    tid = b.index("tid")
    b.value("atomic_add", [b.const(0), tid], U32, {"buffer": "counter"})
    k = make_kernel(b, [BufferParam("counter", U32, "readwrite")])
    dce(k)
    assert "atomic_add" in names(k.body)
