"""Interpreter handlers of warp specialisation (docs/IR.md, "Warp roles and mbarriers"):
`warp_roles`, `mbarrier_init`, `mbarrier_arrive`, `mbarrier_wait`.

The roles of a `warp_roles` run concurrently on the hardware and meet only at mbarriers. The
interpreter runs them as cooperative tasks: one Python thread per role, of which exactly one
(the holder of the baton) runs at a time. Role 0 starts; the baton moves on only when the
running role waits at an mbarrier whose phase has not completed, or finishes its region, and
it goes round-robin to the next role that can run (not started yet, or blocked on a wait that
is now satisfied). When every unfinished role waits on a phase that cannot complete, the
kernel deadlocks (`InterpreterError` of kind `deadlock` naming each role's wait). So a run
is deterministic, and the machine's shared state (shared memory and its race records, the
async copies and wgmmas in flight, the clocks) is only ever touched by one role at a time.
Each role's values have their own register slots (they are different IR values).

Inside a role all threadgroups still run in lockstep: a wait returns once its phase has
completed in every group (and for every warp of the role executing it); if it has in some
but not others, it keeps waiting, and a deadlock message says the groups diverged.

An error in a role ends the whole run: the other roles' threads are woken and unwound (the
internal `_Aborted`), and the same exception object reaches the caller of run_kernel.

The mbarrier state and the happens-before clocks the ops update are in clocks.py; the race
checks that read the clocks in machine.py. The mbarrier ops are executed by whole warps (their
clock bookkeeping is per warp), with a warp-uniform barrier index (and parity); the init may
be executed by any threads. Using a barrier from another warp than the initialising thread's
needs a threadgroup barrier (or a happens-before chain) after the init, else it is a `race`.
"""
from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from ..core import Op
from .clocks import _Clocks, _MBarriers
from .machine import Fn, InterpreterError, _Machine, _Mask, _warp_uniform, _warps


class _Aborted(BaseException):
    """Unwinds a role's thread after another role failed (caught by the scheduler only)."""


class _Wait:
    """A role blocked in an mbarrier_wait: the op, whether its phases have completed now, and
    a description for a deadlock message ((text, group, warp) of the first unsatisfied warp)."""

    __slots__ = ("op", "ready", "describe")

    def __init__(self, op: Op, ready: Callable[[], bool],
                 describe: Callable[[], tuple[str, int, int]]) -> None:
        self.op, self.ready, self.describe = op, ready, describe


class _Role:
    __slots__ = ("index", "fns", "mask", "first", "last", "done", "wait")

    def __init__(self, index: int, fns: list[Fn], mask: _Mask, first: int, last: int) -> None:
        self.index, self.fns, self.mask, self.first, self.last = index, fns, mask, first, last
        self.done = False
        self.wait: _Wait | None = None

    def name(self) -> str:
        warps = f"warp {self.first}" if self.first == self.last else f"warps {self.first}-{self.last}"
        return f"role {self.index} ({warps})"


class _Scheduler:
    """Runs the roles of one warp_roles execution, one at a time (see the module docstring)."""

    def __init__(self, m: _Machine, op: Op, roles: list[_Role]) -> None:
        self.m, self.op, self.roles = m, op, roles
        self.cond = threading.Condition()
        self.turn = 0  # the role holding the baton (-1: all done)
        self.error: BaseException | None = None
        self.aborted = False

    def run(self) -> None:
        clocks = self.m.sync
        assert clocks is not None
        clocks.scheduler = self
        threads = [threading.Thread(target=self._main, args=(r,), daemon=True,
                                    name=f"marlin-dsl role {r.index}") for r in self.roles]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        except BaseException:  # e.g. KeyboardInterrupt while joining: stop the roles first
            with self.cond:
                self.aborted = True
                self.cond.notify_all()
            for t in threads:
                if t.is_alive():
                    t.join()
            raise
        finally:
            clocks.scheduler = None
        if self.error is not None:
            raise self.error

    def _main(self, role: _Role) -> None:
        try:
            with self.cond:
                while self.turn != role.index and not self.aborted:
                    self.cond.wait()
                if self.aborted:
                    return
            # numpy's error state is per thread: the roles' pure ops compute inactive lanes too
            with np.errstate(all="ignore"):
                for fn in role.fns:
                    fn(role.mask)
            with self.cond:
                role.done = True
                self._pass(role)
        except _Aborted:
            return
        except BaseException as e:  # the run's error: stop everyone, the caller re-raises it
            with self.cond:
                if self.error is None:
                    self.error = e
                self.aborted = True
                self.cond.notify_all()

    def block(self, wait: _Wait) -> None:
        """The running role waits: hand the baton on and return when it comes back (the
        wait is then satisfied). Raises a deadlock error when no role can run."""
        role = self.roles[self.turn]
        with self.cond:
            role.wait = wait
            self._pass(role)
            while self.turn != role.index and not self.aborted:
                self.cond.wait()
            if self.aborted:
                raise _Aborted()
            role.wait = None

    def _pass(self, role: _Role) -> None:
        """Give the baton to the next role, round-robin after `role`, that can run (the
        caller holds the lock); role itself comes last."""
        n = len(self.roles)
        for k in range(1, n + 1):
            r = self.roles[(role.index + k) % n]
            if r.done:
                continue
            if r.wait is None or r.wait.ready():
                self.turn = r.index
                self.cond.notify_all()
                return
        if all(r.done for r in self.roles):
            self.turn = -1
            return
        raise self._deadlock(role)

    def _deadlock(self, current: _Role) -> InterpreterError:
        m = self.m
        blocked = [r for r in self.roles if not r.done]
        parts = []
        first = None
        for r in blocked:
            assert r.wait is not None
            text, g, w = r.wait.describe()
            parts.append(f"{r.name()} {text}")
            if first is None or r is current:
                first = (r.wait.op, g, w)
        assert first is not None
        op, g, w = first
        done = [r.name() for r in self.roles if r.done]
        tail = f"; finished: {', '.join(done)}" if done else ""
        return InterpreterError(f"kernel {m.kernel.name}: deadlock in {m.desc(self.op)}: every unfinished "
                                f"role waits on a phase that cannot complete: {'; '.join(parts)}{tail}",
                                kind="deadlock", op=op, group=m.coords(g), warp=w)


# ----- handlers --------------------------------------------------------------------------

def _h_warp_roles(m: _Machine, op: Op) -> Fn:
    counts = [int(w) for w in op.attrs["warps"]]  # type: ignore[union-attr]
    warp_of = np.arange(m.T) // m.ws
    roles = []
    first = 0
    for i, (region, n) in enumerate(zip(op.regions, counts)):
        fns, _ = m.compile_block(region)
        arr = np.broadcast_to((warp_of >= first) & (warp_of < first + n), (m.G, m.T)).copy()
        roles.append((fns, arr, first, first + n - 1))
        first += n

    def run(mask: _Mask) -> None:
        if not mask.full:  # the verifier keeps it in the kernel body, entered by every thread
            m.fail_lanes("collective", op, "warp_roles entered by part of the threadgroup; this "
                         "thread does not enter it", ~mask.arr)
        _Scheduler(m, op, [_Role(i, fns, _Mask(arr), a, b)
                           for i, (fns, arr, a, b) in enumerate(roles)]).run()
    return run


def _state(m: _Machine, op: Op) -> tuple[_Clocks, _MBarriers]:
    name = str(op.attrs["barriers"])
    assert m.sync is not None  # the machine keeps clocks for kernels with mbarrier ops
    return m.sync, m.sync.barriers(name, m.shared[name].size // 2)


def _check_use(m: _Machine, op: Op, clocks: _Clocks, st: _MBarriers, warps: np.ndarray,
               idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(groups, warps, barrier indices) of the executing warps; each index in range, its
    barrier initialised, and the initialisation ordered before this use."""
    gi, wi = np.nonzero(warps)
    b = idx[gi, wi]
    bad = b >= st.n
    if bad.any():
        p = int(np.argmax(bad))
        m.fail("bounds", op, f"mbarrier index out of range: @{st.name} holds {st.n} barriers",
               int(gi[p]), warp=int(wi[p]), index=int(b[p]))
    bad = ~st.init[gi, b]
    if bad.any():
        p = int(np.argmax(bad))
        m.fail("uninitialised", op, f"uses mbarrier @{st.name}[{int(b[p])}] before any mbarrier_init of it",
               int(gi[p]), warp=int(wi[p]), index=int(b[p]))
    iw = st.init_warp[gi, b]
    bad = ~st.synced[gi, b] & (iw != wi) & ~(clocks.vc[gi, wi, iw] > st.init_clock[gi, b])
    if bad.any():
        p = int(np.argmax(bad))
        g, i = int(gi[p]), int(b[p])
        m.fail("race", op, f"uses mbarrier @{st.name}[{i}] initialised by {m.who(int(st.init_tid[g, i]))} "
               "with no threadgroup barrier after the mbarrier_init", g, warp=int(wi[p]), index=i)
    return gi, wi, b


def _h_mbarrier_init(m: _Machine, op: Op) -> Fn:
    clocks, st = _state(m, op)
    ia = m.slot(op.operands[0])
    count = int(op.attrs["count"])  # type: ignore[arg-type]
    regs = m.regs

    def run(mask: _Mask) -> None:
        if not mask.any:
            return
        gi, ti = np.nonzero(mask.arr)
        idx = regs[ia][gi, ti].astype(np.int64)
        bad = idx >= st.n
        if bad.any():
            p = int(np.argmax(bad))
            m.fail("bounds", op, f"mbarrier index out of range: @{st.name} holds {st.n} barriers",
                   int(gi[p]), int(ti[p]), index=int(idx[p]))
        wi = ti // m.ws
        st.initialise(gi, idx, ti, wi, clocks.rc[gi, wi], count)
    return run


def _uniform(m: _Machine, op: Op, slot: int, warps: np.ndarray, what: str) -> np.ndarray:
    """A warp-uniform operand per warp [G, W] (0 for warps not executing)."""
    v = _warp_uniform(m, op, m.regs[slot], warps, what).astype(np.int64)
    return np.where(warps, v, 0)


def _h_mbarrier_arrive(m: _Machine, op: Op) -> Fn:
    clocks, st = _state(m, op)
    ia = m.slot(op.operands[0])

    def run(mask: _Mask) -> None:
        warps = _warps(m, op, mask)
        if not warps.any():
            return
        idx = _uniform(m, op, ia, warps, "mbarrier index")
        _check_use(m, op, clocks, st, warps, idx)
        st.arrive(clocks, warps, idx, m.ws)
    return run


def _h_mbarrier_wait(m: _Machine, op: Op) -> Fn:
    clocks, st = _state(m, op)
    ia, pa = m.slot(op.operands[0]), m.slot(op.operands[1])

    def run(mask: _Mask) -> None:
        warps = _warps(m, op, mask)
        if not warps.any():
            return
        idx = _uniform(m, op, ia, warps, "mbarrier index")
        parity = _uniform(m, op, pa, warps, "mbarrier parity")
        bad = warps & (parity > 1)
        if bad.any():
            g, w = (int(v) for v in np.argwhere(bad)[0])
            m.fail("input", op, f"mbarrier_wait parity must be 0 or 1, got {int(parity[g, w])}", g,
                   warp=w, index=int(parity[g, w]))
        gi, wi, b = _check_use(m, op, clocks, st, warps, idx)
        par = parity[gi, wi]

        def ready() -> bool:
            return bool(st.ready(gi, b, par).all())

        def describe() -> tuple[str, int, int]:
            ok = st.ready(gi, b, par)
            p = int(np.argmax(~ok))
            g, w, i = int(gi[p]), int(wi[p]), int(b[p])
            text = (f"waits in {m.desc(op)} for the phase of parity {int(par[p])} of @{st.name}[{i}], "
                    f"now in phase {int(st.phase[g, i])} with {int(st.missing[g, i])} of "
                    f"{int(st.count[g, i])} arrivals missing (group {m.coords(g)}, warp {w})")
            if ok.any():
                groups_ok = set(gi[ok].tolist())
                groups_not = set(gi[~ok].tolist())
                if groups_ok - groups_not:
                    text += (f"; the threadgroups diverged: complete in group "
                             f"{m.coords(min(groups_ok - groups_not))}, not in group {m.coords(g)}")
                else:
                    text += "; the role's warps diverged: some of them see the phase complete"
            return text, g, w

        if not ready():
            sched = clocks.scheduler
            if sched is None:  # outside warp_roles nobody else can arrive
                text, g, w = describe()
                raise InterpreterError(f"kernel {m.kernel.name}: deadlock: the threadgroup {text}, "
                                       "outside warp_roles (no other role can arrive)",
                                       kind="deadlock", op=op, group=m.coords(g), warp=w)
            sched.block(_Wait(op, ready, describe))
        # acquire what the arrivals of the completed phase released
        clocks.join(gi, wi, st.released[gi, b])
        # A warp that arrived itself (every lane) acquires its own lanes' accesses before that
        # arrive too: for them the wait is a simdgroup barrier (e.g. each lane's copies, then
        # arrive and wait, then the warp's wgmma reading them). Counted from the wait, so a lane's
        # access between its arrive and the wait also passes as ordered: the model is coarser
        # than the hardware there.
        own = st.released[gi, b, wi] > 0
        if own.any():
            m.warp_epoch[gi[own], wi[own]] += 1
    return run


__all__ = ["_h_mbarrier_arrive", "_h_mbarrier_init", "_h_mbarrier_wait", "_h_warp_roles"]
