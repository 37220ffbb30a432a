"""Warp roles and mbarriers in the interpreter (ir/interpret/roles.py, clocks.py): roles run as
cooperative tasks, mbarrier phases and parities, deadlocks, and the happens-before race check
(an arrive releases, a wait acquires) on shared writes, reads, async copies and wgmma tiles."""
from __future__ import annotations

import threading
from typing import Callable

import numpy as np
import pytest

from marlin_dsl.ir import F16, F32, U32, Builder, BufferParam, FragmentType, GridDim, Kernel, SharedArray, Value, \
    VectorType
from marlin_dsl.ir.interpret import InterpreterError, run_kernel

SLOT = 32  # elements of a ring slot: one per lane of the producer warp


# ----- helpers ------------------------------------------------------------------------------

def _kernel(b: Builder, threads: int, groups: int, buffers: list[BufferParam], shared: list[SharedArray],
            attrs: dict | None = None) -> Kernel:
    return Kernel("roles", threads, (GridDim(None, 1, groups), GridDim(None), GridDim(None)), b.block,
                  buffers=buffers, shared=shared, attrs=dict(attrs or {}))


def _if(b: Builder, cond: Value, then: Callable[[], None]) -> None:
    with b.region() as t:
        then()
        b.yield_()
    with b.region() as e:
        b.yield_()
    b.op("if", [cond], [], regions=[t, e])


def _loop(b: Builder, n: int, body: Callable[[Value], None]) -> None:
    i = b.fresh("step", U32)
    with b.region([i]) as block:
        body(i)
        b.yield_()
    b.op("for", [b.const(0), b.const(n), b.const(1)], [], regions=[block])


def _roles(b: Builder, warps: tuple[int, ...], *bodies: Callable[[], None]) -> None:
    regions = []
    for body in bodies:
        with b.region() as r:
            body()
            b.yield_()
        regions.append(r)
    b.op("warp_roles", [], attrs={"warps": warps}, regions=regions)


def _init(b: Builder, name: str, index: Value, count: int) -> None:
    b.op("mbarrier_init", [index], attrs={"barriers": name, "count": count})


def _arrive(b: Builder, name: str, index: Value) -> None:
    b.op("mbarrier_arrive", [index], attrs={"barriers": name})


def _wait(b: Builder, name: str, index: Value, parity: Value) -> None:
    b.op("mbarrier_wait", [index, parity], attrs={"barriers": name})


def _raises(kernel: Kernel, buffers: dict, kind: str) -> InterpreterError:
    with pytest.raises(InterpreterError) as e:
        run_kernel(kernel, buffers, {})
    assert e.value.kind == kind, e.value
    return e.value


# ----- the producer / consumer ring -----------------------------------------------------------

def ring_kernel(slots: int = 2, steps: int = 5, consumers: int = 2, groups: int = 2, *, consumer_waits: bool = True,
                producer_waits: bool = True, release_before_read: bool = False, flip_parity: bool = False,
                full_count: int = SLOT, init_empty: bool = True, barrier_after_init: bool = True,
                bad_load: bool = False, idle_role: bool = False, init_extra: bool = False) -> Kernel:
    """Warp 0 streams `steps` slots of x through a ring of `slots` shared slots; each consumer
    warp c (the last `consumers` warps) writes slot + c to y. full[s]: the producer's 32 lanes
    arrive once the slot is written; empty[s]: every consumer lane arrives once it read it.
    With `idle_role` a role of one warp between them writes z without touching mbarriers."""
    b = Builder()
    tid, lane, warp, gx = b.index("tid"), b.index("lane"), b.index("warp"), b.index("group_x")

    def init() -> None:
        _init(b, "full", tid, full_count)
        if init_empty:
            _init(b, "empty", tid, SLOT * consumers)
    _if(b, b.binary("lt", tid, b.const(slots + int(init_extra))), init)
    if barrier_after_init:
        b.barrier()
    one = b.const(1)
    first_consumer = 1 + int(idle_role)

    def produce() -> None:
        def step(i: Value) -> None:
            slot, use = b.binary("rem", i, slots), b.binary("div", i, slots)
            if producer_waits:  # the consumers freed the slot's previous use
                _if(b, b.binary("ge", i, b.const(slots)),
                    lambda: _wait(b, "empty", slot, b.binary("and", b.binary("sub", use, one), one)))
            src = b.binary("add", b.binary("mul", b.binary("add", b.binary("mul", gx, steps), i), SLOT), lane)
            if bad_load:
                src = b.binary("add", src, 1 << 20)
            b.store("buf", b.binary("add", b.binary("mul", slot, SLOT), lane), b.load("x", src, F32))
            _arrive(b, "full", slot)
        _loop(b, steps, step)

    def idle() -> None:
        def step(i: Value) -> None:
            at = b.binary("add", b.binary("mul", b.binary("add", b.binary("mul", gx, steps), i), SLOT), lane)
            b.store("z", at, b.cast(b.binary("mul", i, lane), F32))
        _loop(b, steps, step)

    def consume() -> None:
        c = b.binary("sub", warp, first_consumer)

        def step(i: Value) -> None:
            slot, use = b.binary("rem", i, slots), b.binary("div", i, slots)
            parity = b.binary("and", use, one)
            if flip_parity:
                parity = b.binary("xor", parity, one)
            if consumer_waits:
                _wait(b, "full", slot, parity)
            if release_before_read:
                _arrive(b, "empty", slot)
            v = b.load("buf", b.binary("add", b.binary("mul", slot, SLOT), lane), F32)
            row = b.binary("add", b.binary("mul", b.binary("add", b.binary("mul", gx, steps), i), consumers), c)
            b.store("y", b.binary("add", b.binary("mul", row, SLOT), lane), b.binary("add", v, b.cast(c, F32)))
            if not release_before_read:
                _arrive(b, "empty", slot)
        _loop(b, steps, step)

    bodies = [produce, idle, consume] if idle_role else [produce, consume]
    warps = (1, 1, consumers) if idle_role else (1, consumers)
    buffers = [BufferParam("x", F32, "read"), BufferParam("y", F32, "write")]
    if idle_role:
        buffers.append(BufferParam("z", F32, "write"))
    _roles(b, warps, *bodies)
    return _kernel(b, SLOT * sum(warps), groups, buffers,
                   [SharedArray("buf", F32, slots * SLOT), SharedArray("full", U32, 2 * slots, align=16),
                    SharedArray("empty", U32, 2 * slots, align=16)])


def ring_buffers(steps: int = 5, consumers: int = 2, groups: int = 2, idle_role: bool = False) -> dict:
    x = np.random.default_rng(1).standard_normal(groups * steps * SLOT).astype(np.float32)
    bufs = {"x": x, "y": np.full(groups * steps * consumers * SLOT, np.nan, np.float32)}
    if idle_role:
        bufs["z"] = np.full(groups * steps * SLOT, np.nan, np.float32)
    return bufs


def ring_expected(x: np.ndarray, steps: int, consumers: int, groups: int) -> np.ndarray:
    per = x.reshape(groups, steps, 1, SLOT) + np.arange(consumers, dtype=np.float32)[None, None, :, None]
    return per.reshape(-1)


@pytest.mark.parametrize("slots, steps, consumers, groups", [(2, 5, 2, 2), (3, 7, 1, 3), (1, 4, 2, 1), (4, 4, 3, 2)])
def test_ring_streams_every_slot(slots: int, steps: int, consumers: int, groups: int) -> None:
    kernel = ring_kernel(slots, steps, consumers, groups)
    bufs = ring_buffers(steps, consumers, groups)
    out = run_kernel(kernel, bufs, {})["y"]
    np.testing.assert_array_equal(out, ring_expected(bufs["x"], steps, consumers, groups))


def test_runs_are_deterministic() -> None:
    kernel, bufs = ring_kernel(), ring_buffers()
    a, b = run_kernel(kernel, bufs, {})["y"], run_kernel(kernel, bufs, {})["y"]
    assert np.array_equal(a, b)
    bad = ring_kernel(flip_parity=True)
    messages = {str(_raises(bad, bufs, "deadlock")) for _ in range(3)}
    assert len(messages) == 1


def test_a_role_without_mbarriers_finishes_while_others_loop() -> None:
    steps = 6
    kernel = ring_kernel(2, steps, 1, 2, idle_role=True)
    bufs = ring_buffers(steps, 1, 2, idle_role=True)
    out = run_kernel(kernel, bufs, {})
    np.testing.assert_array_equal(out["y"], ring_expected(bufs["x"], steps, 1, 2))
    z = np.arange(steps)[:, None] * np.arange(SLOT)[None, :]
    np.testing.assert_array_equal(out["z"].reshape(2, steps, SLOT), np.broadcast_to(z, (2, steps, SLOT)))


# ----- races ----------------------------------------------------------------------------------

def test_reading_without_waiting_is_a_race() -> None:
    err = _raises(ring_kernel(consumer_waits=False), ring_buffers(), "race")
    assert "read by thread 32 (warp 1, lane 0) after a write by thread 0 (warp 0, lane 0)" in str(err)
    assert "mbarrier" in str(err) and err.group == (0, 0, 0)


def test_releasing_a_slot_before_reading_it_is_a_race() -> None:
    # the consumer arrives on empty before its read: the producer's wait does not order the
    # read before the overwrite (write after read)
    err = _raises(ring_kernel(release_before_read=True), ring_buffers(), "race")
    assert "write by thread 0 (warp 0, lane 0) after a read by thread 32 (warp 1, lane 0)" in str(err)
    assert "`store[buffer=@buf]" in str(err)


def _prefilled_kernel(producer_waits: bool) -> Kernel:
    """A slot filled before the roles; role 0 reads it and arrives on @empty, role 1 (which runs
    after role 0 has blocked or finished) overwrites it, waiting on @empty first or not."""
    b = Builder()
    tid, lane, warp = b.index("tid"), b.index("lane"), b.index("warp")
    zero = b.const(0)
    _if(b, b.binary("eq", tid, zero), lambda: _init(b, "empty", zero, SLOT))
    _if(b, b.binary("lt", tid, b.const(SLOT)), lambda: b.store("buf", tid, b.cast(tid, F32)))
    b.barrier()

    def reader() -> None:
        b.store("y", lane, b.load("buf", lane, F32))
        _arrive(b, "empty", zero)

    def writer() -> None:
        if producer_waits:
            _wait(b, "empty", zero, zero)
        b.store("buf", lane, b.cast(warp, F32))
    _roles(b, (1, 1), reader, writer)
    return _kernel(b, 64, 2, [BufferParam("y", F32, "write")],
                   [SharedArray("buf", F32, SLOT), SharedArray("empty", U32, 2)])


def _ordered_and_racy(ordered: Kernel, racy: Kernel, message: str) -> None:
    """`ordered` writes lane i's value i to y; `racy`, the same kernel with one ordering
    missing, is a race whose report says `message`."""
    bufs = {"y": np.zeros(SLOT, np.float32)}
    out = run_kernel(ordered, bufs, {})["y"]
    np.testing.assert_array_equal(out, np.arange(SLOT, dtype=np.float32))
    assert message in str(_raises(racy, bufs, "race"))


def test_overwriting_without_waiting_on_empty_is_a_race() -> None:
    _ordered_and_racy(_prefilled_kernel(True), _prefilled_kernel(False),
                      "write by thread 32 (warp 1, lane 0) after a read by thread 0 (warp 0, lane 0) in `%ld")


def _chain_kernel(b_arrives_first: bool) -> Kernel:
    """Warp 2 writes, arrives on @bx; warp 1 waits on @bx, arrives on @by; warp 0 waits on @by
    and reads warp 2's data: ordered through warp 1 (vector clocks are transitive) unless warp 1
    arrives on @by before its wait on @bx."""
    b = Builder()
    tid, lane = b.index("tid"), b.index("lane")
    zero = b.const(0)

    def init() -> None:
        _init(b, "bx", zero, SLOT)
        _init(b, "by", zero, SLOT)
    _if(b, b.binary("eq", tid, zero), init)
    b.barrier()

    def first() -> None:
        b.store("buf", lane, b.cast(lane, F32))
        _arrive(b, "bx", zero)

    def second() -> None:
        if b_arrives_first:
            _arrive(b, "by", zero)
        _wait(b, "bx", zero, zero)
        if not b_arrives_first:
            _arrive(b, "by", zero)

    def third() -> None:
        _wait(b, "by", zero, zero)
        b.store("y", lane, b.load("buf", lane, F32))
    _roles(b, (1, 1, 1), third, second, first)  # the reader first: it blocks, the others run
    return _kernel(b, 96, 2, [BufferParam("y", F32, "write")],
                   [SharedArray("buf", F32, SLOT), SharedArray("bx", U32, 2), SharedArray("by", U32, 2)])


def test_ordering_is_transitive_through_other_warps() -> None:
    _ordered_and_racy(_chain_kernel(False), _chain_kernel(True),
                      "read by thread 0 (warp 0, lane 0) after a write by thread 64 (warp 2, lane 0)")


def test_a_wait_acquires_every_earlier_arrive_of_the_barrier() -> None:
    # warp 0 writes and completes phase 0, warp 1 completes phase 1, warp 2 waits for phase 1
    # only: arrives are read-modify-writes of the barrier, so the wait is ordered after warp
    # 0's arrive too (the released clock is cumulative, clocks._MBarriers)
    b = Builder()
    tid, lane = b.index("tid"), b.index("lane")
    zero, one = b.const(0), b.const(1)
    _if(b, b.binary("eq", tid, zero), lambda: _init(b, "bar", zero, SLOT))
    b.barrier()

    def writer() -> None:
        b.store("buf", lane, b.cast(lane, F32))
        _arrive(b, "bar", zero)

    def reader() -> None:
        _wait(b, "bar", zero, one)
        b.store("y", lane, b.load("buf", lane, F32))
    _roles(b, (1, 1, 1), writer, lambda: _arrive(b, "bar", zero), reader)
    kernel = _kernel(b, 96, 2, [BufferParam("y", F32, "write")], [SharedArray("buf", F32, SLOT), SharedArray("bar", U32, 2)])
    out = run_kernel(kernel, {"y": np.zeros(SLOT, np.float32)}, {})["y"]
    np.testing.assert_array_equal(out, np.arange(SLOT, dtype=np.float32))


@pytest.mark.parametrize("sync, race", [(None, True), ("simdgroup", False)])
def test_the_same_warp_rule_holds_inside_roles(sync: str | None, race: bool) -> None:
    # every lane of warp 1 reads element 0 (a broadcast), then its lane 0 writes it: another
    # lane's read needs a simdgroup barrier between, as outside roles; warp 0 then overwrites
    # it after waiting on warp 1's arrive (ordered)
    b = Builder()
    tid, lane = b.index("tid"), b.index("lane")
    zero = b.const(0)
    _if(b, b.binary("eq", tid, zero), lambda: _init(b, "bar", zero, SLOT))
    b.store("buf", tid, b.cast(tid, F32))
    b.barrier()

    def reader() -> None:
        b.store("y", lane, b.load("buf", zero, F32))
        if sync is not None:
            b.barrier(sync)
        _if(b, b.binary("eq", lane, zero), lambda: b.store("buf", zero, b.const(5.0, F32)))
        _arrive(b, "bar", zero)

    def writer() -> None:
        _wait(b, "bar", zero, zero)
        b.store("buf", lane, b.const(7.0, F32))
    _roles(b, (1, 1), writer, reader)
    kernel = _kernel(b, 64, 2, [BufferParam("y", F32, "write")], [SharedArray("buf", F32, 64), SharedArray("bar", U32, 2)])
    bufs = {"y": np.zeros(SLOT, np.float32)}
    if race:
        err = _raises(kernel, bufs, "race")
        assert "write by thread 32 (warp 1, lane 0) after a read by several threads of warp 1" in str(err)
    else:
        np.testing.assert_array_equal(run_kernel(kernel, bufs, {})["y"], np.zeros(SLOT, np.float32))


def test_using_a_barrier_before_the_threadgroup_barrier_after_its_init_is_a_race() -> None:
    err = _raises(ring_kernel(barrier_after_init=False), ring_buffers(), "race")
    assert "mbarrier @full[0] initialised by thread 0 (warp 0, lane 0)" in str(err)
    assert err.warp == 1


def _async_kernel(arrive_before_wait: bool) -> Kernel:
    """The producer fills the slot with an async_copy; the copy lands at its async_wait, as a
    write of the copying thread then: an arrive before the wait does not release it."""
    b = Builder()
    tid, lane = b.index("tid"), b.index("lane")
    zero = b.const(0)
    _if(b, b.binary("eq", tid, zero), lambda: _init(b, "full", zero, SLOT))
    b.barrier()

    def producer() -> None:
        b.op("async_copy", [lane, lane], attrs={"dst": "buf", "src": "x", "size": 1})
        b.op("async_commit")
        if arrive_before_wait:
            _arrive(b, "full", zero)
        b.op("async_wait", attrs={"pending": 0})
        if not arrive_before_wait:
            _arrive(b, "full", zero)

    def consumer() -> None:
        _wait(b, "full", zero, zero)
        b.store("y", lane, b.load("buf", lane, F32))
    _roles(b, (1, 1), producer, consumer)
    return _kernel(b, 64, 1, [BufferParam("x", F32, "read"), BufferParam("y", F32, "write")],
                   [SharedArray("buf", F32, SLOT), SharedArray("full", U32, 2)])


def test_async_copies_are_released_when_they_land() -> None:
    bufs = {"x": np.arange(SLOT, dtype=np.float32) * 3, "y": np.zeros(SLOT, np.float32)}
    np.testing.assert_array_equal(run_kernel(_async_kernel(False), bufs, {})["y"], bufs["x"])
    err = _raises(_async_kernel(True), bufs, "race")
    assert "after a write by thread 0 (warp 0, lane 0) in `async_copy" in str(err)


WIDE = FragmentType("c", F32, 16, 64)
FRAG_A = FragmentType("a", F16, 16, 16)


def _wgmma_kernel(arrive_before_retire: bool) -> Kernel:
    """Warpgroup 0 writes a B tile and arrives on @full; warpgroup 1 waits, runs a wgmma on it
    and arrives on @empty; warpgroup 0 waits on @empty and overwrites the tile. The wgmma reads
    the tile until its wgmma_wait: an arrive before that does not release the read."""
    b = Builder()
    tid = b.index("tid")
    zero = b.const(0)

    def init() -> None:
        _init(b, "full", zero, 128)
        _init(b, "empty", zero, 128)
    _if(b, b.binary("eq", tid, zero), init)
    b.barrier()

    def fill(value: float) -> None:
        for i in range(32):
            b.store("w_s", b.binary("add", tid, i * 128), b.const(value, F16))

    def producer() -> None:
        fill(1.0)
        b.op("fence", attrs={"scope": "async_proxy"})
        _arrive(b, "full", zero)
        _wait(b, "empty", zero, zero)
        fill(2.0)

    def consumer() -> None:
        _wait(b, "full", zero, zero)
        a = b.value("frag_build", [b.value("vec", [b.const(1.0, F16)] * 8, VectorType(F16, 8))], FRAG_A)
        acc = b.value("frag_zero", [], WIDE)
        b.op("wgmma_fence", [a, acc])
        out = b.value("wgmma", [a, zero, acc], WIDE, {"smem": "w_s"})
        b.op("wgmma_commit")
        if arrive_before_retire:
            _arrive(b, "empty", zero)
        done = b.value("wgmma_wait", [out, a], WIDE, {"pending": 0})
        if not arrive_before_retire:
            _arrive(b, "empty", zero)
        el = b.value("frag_elems", [done], VectorType(F32, 32))
        at = b.binary("mul", b.binary("sub", tid, 128), 32)
        for e in range(32):
            b.store("y", b.binary("add", at, e), b.value("extract", [el], F32, {"index": e}))
    _roles(b, (4, 4), producer, consumer)
    return Kernel("roles", 256, (GridDim(None), GridDim(None), GridDim(None)), b.block,
                  buffers=[BufferParam("y", F32, "write")],
                  shared=[SharedArray("w_s", F16, 4096, align=1024), SharedArray("full", U32, 2),
                          SharedArray("empty", U32, 2)], attrs={"target": "cuda"})


def test_a_wgmma_tile_is_released_only_after_its_wait() -> None:
    bufs = {"y": np.full(128 * 32, np.nan, np.float32)}
    out = run_kernel(_wgmma_kernel(False), bufs, {})["y"]
    assert np.all(out == 16.0)  # A all ones times B all ones, k = 16
    err = _raises(_wgmma_kernel(True), bufs, "race")
    assert "after a read by warp 4 (collective, all lanes) in `%" in str(err) and "wgmma" in str(err)


# ----- deadlocks and misuse -------------------------------------------------------------------

def test_a_wrong_parity_deadlocks_naming_every_wait() -> None:
    err = _raises(ring_kernel(flip_parity=True), ring_buffers(), "deadlock")
    text = str(err)
    assert "role 0 (warp 0) waits in `mbarrier_wait[barriers=@empty]`" in text
    assert "role 1 (warps 1-2) waits in `mbarrier_wait[barriers=@full]`" in text
    assert "parity 1 of @full[0], now in phase 1" in text


def test_a_wrong_count_deadlocks() -> None:
    err = _raises(ring_kernel(full_count=64), ring_buffers(), "deadlock")
    assert "@full[0], now in phase 0 with 32 of 64 arrivals missing" in str(err)


def test_diverged_groups_are_named_in_a_deadlock() -> None:
    # group 1's producer arrives one time fewer: its consumer never sees the phase complete
    b = Builder()
    tid, gx = b.index("tid"), b.index("group_x")
    zero = b.const(0)
    _if(b, b.binary("eq", tid, zero), lambda: _init(b, "bar", zero, SLOT))
    b.barrier()
    _roles(b, (1, 1), lambda: _if(b, b.binary("eq", gx, zero), lambda: _arrive(b, "bar", zero)),
           lambda: _wait(b, "bar", zero, zero))
    kernel = _kernel(b, 64, 2, [], [SharedArray("bar", U32, 2)])
    err = _raises(kernel, {}, "deadlock")
    assert "the threadgroups diverged: complete in group (0, 0, 0), not in group (1, 0, 0)" in str(err)
    assert "finished: role 0 (warp 0)" in str(err) and err.group == (1, 0, 0)


def test_a_wait_outside_the_roles_that_cannot_complete_deadlocks() -> None:
    b = Builder()
    tid = b.index("tid")
    zero = b.const(0)
    _if(b, b.binary("eq", tid, zero), lambda: _init(b, "bar", zero, 1))
    b.barrier()
    _wait(b, "bar", zero, zero)
    err = _raises(_kernel(b, 32, 1, [], [SharedArray("bar", U32, 2)]), {}, "deadlock")
    assert "outside warp_roles" in str(err)


def test_an_uninitialised_barrier_is_refused() -> None:
    err = _raises(ring_kernel(init_empty=False), ring_buffers(), "uninitialised")
    assert "@empty[0]" in str(err)


def test_barrier_indices_are_bounds_checked() -> None:
    err = _raises(ring_kernel(init_extra=True), ring_buffers(), "bounds")
    assert err.index == 2 and err.thread == 2 and "holds 2 barriers" in str(err)
    # an arrive past the end (slot 2 of 2 barriers)
    b = Builder()
    tid = b.index("tid")
    _if(b, b.binary("eq", tid, b.const(0)), lambda: _init(b, "bar", b.const(0), SLOT))
    b.barrier()
    _roles(b, (1, 1), lambda: _arrive(b, "bar", b.const(1)), lambda: None)
    err = _raises(_kernel(b, 64, 1, [], [SharedArray("bar", U32, 2)]), {}, "bounds")
    assert err.index == 1 and err.warp == 0


def test_parity_and_whole_warps_are_checked() -> None:
    def kernel(parity: int, lanes: int) -> Kernel:
        b = Builder()
        tid, lane = b.index("tid"), b.index("lane")
        zero = b.const(0)
        _if(b, b.binary("eq", tid, zero), lambda: _init(b, "bar", zero, SLOT))
        b.barrier()
        _roles(b, (1, 1), lambda: _arrive(b, "bar", zero),
               lambda: _if(b, b.binary("lt", lane, b.const(lanes)), lambda: _wait(b, "bar", zero, b.const(parity))))
        return _kernel(b, 64, 1, [], [SharedArray("bar", U32, 2)])
    run_kernel(kernel(0, SLOT), {}, {})
    assert _raises(kernel(2, SLOT), {}, "input").index == 2
    assert "partially active warp" in str(_raises(kernel(0, 5), {}, "collective"))


def test_an_error_in_a_role_ends_every_role() -> None:
    before = threading.active_count()
    # the consumer is blocked on @full when the producer's load fails
    err = _raises(ring_kernel(bad_load=True), ring_buffers(), "bounds")
    assert "@x index out of bounds" in str(err)
    # an error raised while the other roles have not started, and a deadlock
    _raises(ring_kernel(init_empty=False), ring_buffers(), "uninitialised")
    _raises(ring_kernel(flip_parity=True), ring_buffers(), "deadlock")
    assert threading.active_count() == before
    assert not [t for t in threading.enumerate() if t.name.startswith("marlin-dsl role")]


def test_an_error_keeps_its_identity() -> None:
    # the exception a role raises is the one the caller sees (not a copy, not wrapped)
    from marlin_dsl.ir.interpret import machine

    seen: list[BaseException] = []
    fail = machine._Machine.fail

    def spy(self, *args, **kw):
        try:
            fail(self, *args, **kw)
        except InterpreterError as e:
            seen.append(e)
            raise
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(machine._Machine, "fail", spy)
        with pytest.raises(InterpreterError) as e:
            run_kernel(ring_kernel(bad_load=True), ring_buffers(), {})
    assert seen and e.value is seen[-1]
