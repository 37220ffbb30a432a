"""Happens-before bookkeeping for warp specialisation (docs/IR.md, "Warp roles and mbarriers").

Outside warp roles, warps of a threadgroup only order their shared-memory accesses with
threadgroup barriers, which the race check models by clearing its records. Warp roles run
apart and order memory through mbarriers instead: an arrive *releases* what its warp did
before, a completed wait *acquires* what the arrivals of the phase it waited for released.
That is a happens-before relation, kept here with vector clocks, per threadgroup g:

- `rc[g, w]`: warp w's release clock, the number of arrives it executed;
- `vc[g, r, w]`: the latest release clock of warp w that warp r has synchronised with.

Every shared access is stamped with its warp's release clock at the time (`wr_clock` of the
shared array for writes, `_ReadStamps` per reading warp for reads). An access by warp r to an
element last accessed by warp w != r at stamp s (one of the two a write) is ordered iff
vc[g, r, w] > s, i.e. w arrived after that access and r waited, directly or through other
warps, for a phase that arrival completed. A threadgroup barrier orders everything: it clears
the records and sets every warp's clock to every warp's release clock.

The state exists only for kernels using the warp-role ops (`SYNC_OPS`); other kernels keep
the plain barrier-epoch race check of machine.py unchanged. This module holds data and numpy
updates only; the handlers are in roles.py, the checks that use the clocks in machine.py.
"""
from __future__ import annotations

from typing import Any, Protocol

import numpy as np

#: the ops that switch the happens-before bookkeeping on for a kernel
SYNC_OPS = frozenset({"warp_roles", "mbarrier_init", "mbarrier_arrive", "mbarrier_wait"})


class _Blocking(Protocol):
    """The scheduler of the running warp roles (roles.py): a role's wait that cannot return
    yet hands the baton on through it."""

    def block(self, wait: Any) -> None: ...


class _ReadStamps:
    """Per shared element and warp, the warp's latest read since the element's last write (or
    threadgroup barrier): the reader (a thread, T + w for the warp's collective read, -2 for
    several lanes, -1 for none), the warp's barrier epoch and release clock at the read, and
    the op (for messages). Arrays [elements, W], allocated at a kernel's first shared read."""

    __slots__ = ("W", "tid", "epoch", "clock", "op", "_tid", "_epoch", "_clock", "_op")

    def __init__(self, n: int, W: int) -> None:
        self.W = W
        # int32 (16 bytes an element and warp): epochs and clocks count barriers and arrives
        self.tid = np.full((n, W), -1, np.int32)
        self.epoch = np.zeros((n, W), np.int32)
        self.clock = np.zeros((n, W), np.int32)
        self.op = np.zeros((n, W), np.int32)
        # flat views, indexed by element * W + warp
        self._tid, self._epoch = self.tid.reshape(-1), self.epoch.reshape(-1)
        self._clock, self._op = self.clock.reshape(-1), self.op.reshape(-1)

    def note(self, flat: np.ndarray, warp: np.ndarray, tid: np.ndarray, multi: np.ndarray | None,
             epoch: np.ndarray, clock: np.ndarray, op_id: int) -> None:
        """Record reads at positions (element flat, warp, thread tid). `multi` marks positions
        whose element more than one thread reads in this access (None: none does); there, lanes
        of one warp reading the same element make the warp's reader 'several'."""
        k = flat * self.W + warp
        new = tid.astype(np.int32)
        if multi is not None and multi.any():
            ks, ts = k[multi], new[multi]
            keys, inv = np.unique(ks, return_inverse=True)
            lo = np.full(len(keys), np.iinfo(np.int32).max, np.int32)
            hi = np.full(len(keys), -1, np.int32)
            np.minimum.at(lo, inv, ts)
            np.maximum.at(hi, inv, ts)
            new[multi] = np.where((lo != hi)[inv], -2, ts)
        old = self._tid[k]
        same_epoch = (old != -1) & (self._epoch[k] == epoch)
        # the same warp read it before in this epoch: one reader stays, another makes 'several'
        self._tid[k] = np.where(same_epoch & (old != new), -2, new)
        self._epoch[k] = epoch
        self._clock[k] = clock
        self._op[k] = op_id

    def restamp(self, flat: np.ndarray, warp: np.ndarray, tid: np.ndarray, epoch: np.ndarray,
                clock: np.ndarray, op_id: int) -> None:
        """A read that lasted until now (a wgmma's operand tile, until its wgmma_wait): the
        warp's record is stamped with its clock now, so only a later arrive releases it."""
        k = flat * self.W + warp
        gone = self._tid[k] == -1  # cleared by a threadgroup barrier while the wgmma was in flight
        self._tid[k] = np.where(gone, tid, self._tid[k])
        self._epoch[k] = np.where(gone, epoch, self._epoch[k])
        self._op[k] = np.where(gone, op_id, self._op[k])
        self._clock[k] = clock

    def racing(self, flat: np.ndarray, warp: np.ndarray, tid: np.ndarray, epoch: np.ndarray,
               known: np.ndarray, collective: bool) -> tuple[int, int] | None:
        """The first (position, reader warp) whose recorded read a write at (flat, warp, tid)
        is not ordered after, or None. `known` [positions, W] is the writer's vector clock:
        another warp's read at clock s is ordered iff known > s; the writer's own warp's read
        needs a simdgroup barrier between (a newer epoch) unless it was by the writing lane."""
        rows = self.tid[flat]
        present = rows != -1
        if not present.any():
            return None
        own = np.arange(self.W)[None, :] == warp[:, None]
        race = present & ~own & (known <= self.clock[flat])
        mine = present & own & (self.epoch[flat] == epoch[:, None])
        if not collective:
            mine &= rows != tid[:, None]
        race |= mine
        if not race.any():
            return None
        p, r = divmod(int(np.argmax(race.reshape(-1))), self.W)
        return p, r

    def clear(self, flat: np.ndarray) -> None:
        self.tid[flat] = -1

    def clear_groups(self, groups: np.ndarray, G: int) -> None:
        self.tid.reshape(G, -1)[groups] = -1


class _MBarriers:
    """The barriers of one mbarrier array (size/2 of them), per threadgroup g and index i:
    whether initialised, the arrivals a phase expects (`count`) and still misses, the phase
    number, who initialised it (thread, its warp and release clock: using it from another
    warp needs an ordering, `synced` by a threadgroup barrier or a happens-before chain), the
    clock all arrivals since the init released (`arrived`) and its value when the last phase
    completed (`released`: what a wait that sees that phase complete acquires).

    The released clock is cumulative, as on the hardware: arrives are read-modify-writes of the
    barrier object, so a wait that observes a phase's completion synchronises with every
    earlier arrive on the barrier (PTX's release sequences), not only with that phase's."""

    def __init__(self, name: str, G: int, n: int, W: int) -> None:
        self.name, self.n = name, n
        self.init = np.zeros((G, n), bool)
        self.count = np.zeros((G, n), np.int64)
        self.missing = np.zeros((G, n), np.int64)
        self.phase = np.zeros((G, n), np.int64)
        self.init_tid = np.full((G, n), -1, np.int64)
        self.init_warp = np.full((G, n), -1, np.int64)
        self.init_clock = np.zeros((G, n), np.int64)
        self.synced = np.zeros((G, n), bool)
        self.arrived = np.zeros((G, n, W), np.int64)
        self.released = np.zeros((G, n, W), np.int64)

    def initialise(self, gi: np.ndarray, idx: np.ndarray, tid: np.ndarray, warp: np.ndarray,
                   clock: np.ndarray, count: int) -> None:
        """Phase 0 expecting `count` arrivals (re-initialising starts over)."""
        self.init[gi, idx] = True
        self.count[gi, idx] = count
        self.missing[gi, idx] = count
        self.phase[gi, idx] = 0
        self.init_tid[gi, idx] = tid
        self.init_warp[gi, idx] = warp
        self.init_clock[gi, idx] = clock
        self.synced[gi, idx] = False
        self.arrived[gi, idx] = 0
        self.released[gi, idx] = 0

    def arrive(self, clocks: "_Clocks", warps: np.ndarray, idx: np.ndarray, lanes: int) -> None:
        """Whole warps [G, W] arrive, every lane once, warp w of group g on barrier idx[g, w].
        Arrivals count in warp order; the ones past a phase's count go to the next phases."""
        for w in range(warps.shape[1]):  # a loop over warps, vectorised over the groups
            gs = np.flatnonzero(warps[:, w])
            if not len(gs):
                continue
            b = idx[gs, w]
            # what warp w releases: all it knows, and its own accesses up to this arrive
            clock = clocks.vc[gs, w].copy()
            clock[:, w] = clocks.rc[gs, w] + 1
            self.arrived[gs, b] = np.maximum(self.arrived[gs, b], clock)
            extra = lanes - self.missing[gs, b]
            done = extra >= 0
            if done.any():  # this warp's arrivals complete the phase (and maybe more)
                dg, db, ex = gs[done], b[done], extra[done]
                cnt = self.count[dg, db]
                self.released[dg, db] = self.arrived[dg, db]
                self.phase[dg, db] += 1 + ex // cnt
                self.missing[dg, db] = cnt - ex % cnt
            self.missing[gs[~done], b[~done]] -= lanes
        clocks.rc[warps] += 1
        g, w = np.nonzero(warps)
        clocks.vc[g, w, w] = clocks.rc[g, w]

    def ready(self, gi: np.ndarray, idx: np.ndarray, parity: np.ndarray) -> np.ndarray:
        """Per waiting (group, warp): has the phase of this parity completed (the current
        phase's parity differs)?"""
        return (self.phase[gi, idx] & 1) != parity


class _Clocks:
    """The happens-before state of one launch: vector clocks per group and warp, the mbarrier
    arrays by name, and the scheduler of the warp roles running now (roles.py), if any."""

    def __init__(self, G: int, W: int) -> None:
        self.G, self.W = G, W
        self.rc = np.zeros((G, W), np.int64)
        self.vc = np.zeros((G, W, W), np.int64)
        self.mbarriers: dict[str, _MBarriers] = {}
        self.scheduler: _Blocking | None = None

    def barriers(self, name: str, n: int) -> _MBarriers:
        st = self.mbarriers.get(name)
        if st is None:
            st = self.mbarriers[name] = _MBarriers(name, self.G, n, self.W)
        return st

    def threadgroup_barrier(self, groups: np.ndarray | None) -> None:
        """A threadgroup barrier of all groups (None) or of the groups marked: every warp
        knows every warp's accesses so far, and initialised mbarriers may be used by all."""
        if groups is None:
            self.vc[:] = self.rc[:, None, :]
            for st in self.mbarriers.values():
                st.synced[:] = True
            return
        self.vc[groups] = self.rc[groups][:, None, :]
        for st in self.mbarriers.values():
            st.synced[groups] = True

    def join(self, gi: np.ndarray, wi: np.ndarray, clock: np.ndarray) -> None:
        """Warps (gi, wi) (distinct pairs) acquire `clock` [pairs, W]."""
        self.vc[gi, wi] = np.maximum(self.vc[gi, wi], clock)


def read_stamps(sh: Any, W: int) -> _ReadStamps:
    """The per-warp read stamps of shared array `sh` (machine.py's _Shared), allocated at its
    first read in a kernel with warp roles."""
    if sh.reads is None:
        sh.reads = _ReadStamps(len(sh.data), W)
    return sh.reads


def check_readers(m: Any, op: Any, sh: Any, flat: np.ndarray, gi: np.ndarray, tid: np.ndarray,
                  warp: np.ndarray, epoch: np.ndarray, collective: bool) -> None:
    """Warp roles: a write after reads of the element by other warps must be ordered after
    each of them by the happens-before clocks, after its own warp's by a simdgroup barrier
    (`m`: the machine, whose `fail` raises the race)."""
    assert sh.reads is not None and m.sync is not None
    hit = sh.reads.racing(flat, warp, tid, epoch, m.sync.vc[gi, warp], collective)
    if hit is None:
        return
    p, r = hit
    e, rt = int(flat[p]), int(sh.reads.tid[flat[p], r])
    i = e - int(gi[p]) * sh.size
    reader = f"several threads of warp {r}" if rt == -2 else m.who(rt)
    m.fail("race", op, f"data race on shared @{sh.decl.name}[{i}]: write by {m.who(int(tid[p]))} "
           f"after a read by {reader} in {m.desc(m.ops[int(sh.reads.op[e, r])])} "
           f"{m.unordered}", int(gi[p]), int(tid[p]), index=i)


__all__ = ["SYNC_OPS", "check_readers", "read_stamps"]
