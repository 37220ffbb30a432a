from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from ...errors import MarlinDSLError
from ..core import Block, BufferParam, ConstTable, Kernel, Op, SharedArray, Value
from ..types import BF16, BOOL, FragmentType, Type, VectorType
from ..numerics import _INT_RANGE, _U32, _round_f64, round_bf16
from .clocks import SYNC_OPS, _Clocks, _ReadStamps, check_readers, read_stamps


class InterpreterError(MarlinDSLError):
    """An execution-model rule was broken at run time.

    `kind` is one of: bounds, uninitialised, race, shift, division, cast, divergent_barrier,
    collective, misaligned, access, loop, input, unsupported, metadata (sparse MMA metadata
    the hardware leaves undefined), async (shared memory accessed while an async_copy to it
    is still in flight), deadlock (every unfinished warp role waits at an mbarrier whose phase
    cannot complete). `op` is the offending op,
    `result` the name of its first result (or None), `group` the (x, y, z) threadgroup,
    `thread` the thread index in its group (None for warp-level problems), `warp` its warp and
    `index` the memory index or offending operand value where there is one."""

    def __init__(self, message: str, *, kind: str, op: Op | None = None,
                 group: tuple[int, int, int] | None = None, thread: int | None = None,
                 warp: int | None = None, index: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.op = op
        self.result = op.results[0].name if op is not None and op.results else None
        self.group = group
        self.thread = thread
        self.warp = warp
        self.index = index


# ----- public API ---------------------------------------------------------------------------

def launch_size(kernel: Kernel, scalars: dict[str, int]) -> tuple[tuple[int, int, int], int]:
    """((grid_x, grid_y, grid_z), threads per threadgroup) for the launch scalars."""
    sizes = {k: int(v) for k, v in scalars.items()}
    for dim in kernel.grid:
        if dim.symbol is not None and dim.symbol not in sizes:
            raise InterpreterError(f"kernel {kernel.name}: grid dimension {dim} needs the launch "
                                   f"scalar {dim.symbol}, not given (have {sorted(sizes)})",
                                   kind="input")
    grid = tuple(dim.evaluate(sizes) for dim in kernel.grid)
    return grid, kernel.threads  # type: ignore[return-value]



# ----- masks and state ----------------------------------------------------------------------

class _Mask:
    """The active threads [G, T]; `full`/`any` are computed once per region execution."""

    __slots__ = ("arr", "full", "any")

    def __init__(self, arr: np.ndarray, full: bool | None = None) -> None:
        self.arr = arr
        self.full = bool(arr.all()) if full is None else full
        self.any = self.full or bool(arr.any())


class _Shared:
    """One shared array for all G threadgroups (flat, group-major) with race bookkeeping."""

    def __init__(self, decl: SharedArray, groups: int) -> None:
        n = groups * decl.size
        self.decl = decl
        self.size = decl.size
        self.data = np.zeros(n, decl.elem.holding_dtype)
        self.written = np.zeros(n, bool)
        self.wr_tid = np.full(n, -1, np.int64)  # last writer (T + w: warp w collectively)
        self.wr_stamp = np.zeros(n, np.int64)  # epoch of the writer's warp at the write
        self.wr_op = np.zeros(n, np.int64)
        self.rd_warp = np.full(n, -1, np.int64)  # -1 none, w, -2 several warps
        self.rd_tid = np.full(n, -1, np.int64)  # reader thread, -2 several (same warp)
        self.rd_stamp = np.zeros(n, np.int64)
        self.rd_last = np.zeros(n, np.int64)  # last reader (for messages)
        self.rd_op = np.zeros(n, np.int64)
        self.scratch = np.zeros(n, np.int64)
        self.scratch2 = np.zeros(n, np.int8)
        self.in_flight = np.zeros(n, bool)  # destination of an async_copy not yet waited for
        #: the thread whose ordinary write of the element is not yet fenced for the async proxy
        #: (fence async_proxy), -1 none: a wgmma must not read it (barriers do not clear it)
        self.gen_writer = np.full(n, -1, np.int64)
        #: wgmmas in flight reading the element (writes must wait for their wgmma_wait)
        self.wg_reading = np.zeros(n, np.int32)
        #: kernels with warp roles (clocks.py): the writer's release clock at the write, and
        #: per reading warp its latest read (allocated at the first read)
        self.wr_clock: np.ndarray | None = None
        self.reads: _ReadStamps | None = None


Fn = Callable[[_Mask], None]


class _AsyncCopies:
    """The copies one async_copy op issued in one execution, until async_waits retire them:
    per copying thread (group gi, thread ti) its destination elements, the values read from
    device memory at issue, and the index of the thread's group the copy belongs to."""

    __slots__ = ("op", "op_id", "sh", "gi", "ti", "flat", "values", "group")

    def __init__(self, op: Op, op_id: int, sh: _Shared, gi: np.ndarray, ti: np.ndarray,
                 flat: np.ndarray, values: np.ndarray, group: np.ndarray) -> None:
        self.op, self.op_id, self.sh = op, op_id, sh
        self.gi, self.ti, self.flat, self.values, self.group = gi, ti, flat, values, group


class _Machine:
    def __init__(self, kernel: Kernel, buffers: dict[str, np.ndarray], scalars: dict[str, int],
                 handlers: Mapping[str, Callable[["_Machine", Op], Fn]]) -> None:
        self.kernel = kernel
        self.handlers = handlers  # op name -> handler (interpret/__init__.py: HANDLERS)
        (gx, gy, gz), T = launch_size(kernel, scalars)
        self.gdims = (gx, gy, gz)
        self.G = G = gx * gy * gz
        self.T = T
        self.ws = ws = kernel.warp_size
        self.W = W = T // ws
        self.scalars = {}
        for s in kernel.scalars:
            if s.name not in scalars:
                raise InterpreterError(f"kernel {kernel.name}: launch scalar @{s.name} not given",
                                       kind="input")
            v = int(scalars[s.name])
            if not 0 <= v < 2**32:
                raise InterpreterError(f"kernel {kernel.name}: launch scalar @{s.name} = {v} is "
                                       "not a u32", kind="input")
            self.scalars[s.name] = v
        self.device: dict[str, np.ndarray] = {}
        self.access: dict[str, str] = {}
        for b in kernel.buffers:
            if b.name not in buffers:
                raise InterpreterError(f"kernel {kernel.name}: buffer @{b.name} not given "
                                       f"(have {sorted(buffers)})", kind="input")
            self.device[b.name] = self._to_holding(b, buffers[b.name])
            self.access[b.name] = b.access
        self.shared = {s.name: _Shared(s, G) for s in kernel.shared}
        # happens-before bookkeeping, only for kernels with warp roles or mbarriers (clocks.py)
        self.sync: _Clocks | None = None
        self.unordered = "with no barrier between"
        if any(op.name in SYNC_OPS for op in kernel.walk()):
            self.sync = _Clocks(G, W)
            self.unordered = "with no barrier or mbarrier arrive -> wait ordering them"
            for sh in self.shared.values():
                sh.wr_clock = np.zeros(len(sh.data), np.int64)
        self.tables = {t.name: self._table(t) for t in kernel.tables}
        self.warp_epoch = np.zeros((G, W), np.int64)
        # async copies: per thread, the groups committed so far; per issued copy a record
        self.async_commits = np.zeros((G, T), np.int64)
        self.async_pending: list[_AsyncCopies] = []
        # warpgroup MMAs: per warp the groups committed so far, whether a wgmma_fence opened
        # the current batch, and the wgmmas in flight (interpret/warpgroup.py)
        self.wg_commits = np.zeros((G, T // kernel.warp_size), np.int64)
        self.wg_fenced = np.zeros((G, T // kernel.warp_size), bool)
        self.wg_pending: list = []
        # thread coordinates
        tid = np.broadcast_to(np.arange(T, dtype=np.uint32), (G, T))
        g = np.arange(G)
        self.index_values = {
            "tid": np.ascontiguousarray(tid),
            "lane": np.ascontiguousarray(tid % _U32(ws)),
            "warp": np.ascontiguousarray(tid // _U32(ws)),
            "group_x": np.repeat((g % gx).astype(np.uint32)[:, None], T, 1),
            "group_y": np.repeat((g // gx % gy).astype(np.uint32)[:, None], T, 1),
            "group_z": np.repeat((g // (gx * gy)).astype(np.uint32)[:, None], T, 1),
        }
        self.all_g = np.repeat(np.arange(G, dtype=np.int64), T)
        self.all_t = np.tile(np.arange(T, dtype=np.int64), G)
        self.regs: list = []
        self.slots: dict[int, int] = {}
        self.ops: list[Op] = []

    # ----- setup --------------------------------------------------------------------------

    def _to_holding(self, decl: BufferParam, arr: np.ndarray) -> np.ndarray:
        a = np.asarray(arr).reshape(-1)
        hd = decl.elem.holding_dtype
        if decl.elem == BF16:
            out = round_bf16(a.astype(np.float32))
        elif a.dtype == hd or decl.elem.is_float:
            out = a.astype(hd, copy=False)
        else:
            out = a.astype(hd)
            if not np.array_equal(out, a):
                raise InterpreterError(f"kernel {self.kernel.name}: buffer @{decl.name} ({decl.elem}) "
                                       f"given {a.dtype} values that {decl.elem} cannot hold", kind="input")
        if decl.access != "read":
            return np.array(out, copy=True)
        out = out.view()
        out.flags.writeable = False  # guards against the interpreter writing an input
        return out

    def _table(self, t: ConstTable) -> np.ndarray:
        if t.elem.is_float:
            return _round_f64(np.asarray(t.values, dtype=np.float64).reshape(-1), t.elem)
        if t.elem == BOOL:
            return np.asarray(t.values, dtype=bool).reshape(-1)
        arr = np.asarray(t.values, dtype=np.int64).reshape(-1)
        lo, hi = _INT_RANGE[t.elem.name]
        if arr.size and (arr.min() < lo or arr.max() > hi):
            raise InterpreterError(f"kernel {self.kernel.name}: table @{t.name} holds values outside "
                                   f"{t.elem}", kind="input")
        return arr.astype(t.elem.holding_dtype)

    def slot(self, v: Value) -> int:
        s = self.slots.get(id(v))
        if s is None:
            s = self.slots[id(v)] = len(self.regs)
            self.regs.append(None)
        return s

    def run(self) -> None:
        fns, _ = self.compile_block(self.kernel.body)
        if self.G == 0:
            return
        mask = _Mask(np.ones((self.G, self.T), bool), full=True)
        with np.errstate(all="ignore"):
            for fn in fns:
                fn(mask)

    def compile_block(self, block: Block) -> tuple[list[Fn], list[int]]:
        for a in block.args:
            self.slot(a)
        fns: list[Fn] = []
        yields: list[int] = []
        for op in block.ops:
            if op.name == "yield":
                yields = [self.slot(v) for v in op.operands]
                continue
            make = self.handlers.get(op.name)
            if make is None:
                raise InterpreterError(f"kernel {self.kernel.name}: op {op.name} is not interpretable",
                                       kind="unsupported", op=op)
            fns.append(make(self, op))
            for r in op.results:
                self.slot(r)
        return fns, yields

    # ----- errors -------------------------------------------------------------------------

    def coords(self, g: int) -> tuple[int, int, int]:
        gx, gy, _ = self.gdims
        return (g % gx, g // gx % gy, g // (gx * gy))

    def who(self, tid: int) -> str:
        if tid >= self.T:
            return f"warp {tid - self.T} (collective, all lanes)"
        return f"thread {tid} (warp {tid // self.ws}, lane {tid % self.ws})"

    def desc(self, op: Op) -> str:
        attrs = ", ".join(f"{k}=@{v}" if k in ("buffer", "name", "barriers") and op.name != "scalar" else f"{k}={v}"
                          for k, v in op.attrs.items())
        head = f"{op.name}[{attrs}]" if attrs else op.name
        if op.results:
            head = ", ".join(f"%{r.name}" for r in op.results) + " = " + head
        return f"`{head}`"

    def fail(self, kind: str, op: Op, what: str, g: int, tid: int | None = None,
             warp: int | None = None, index: int | None = None) -> None:
        where = f"group {self.coords(g)}"
        if tid is not None:
            where += f", {self.who(tid)}"
            warp = tid // self.ws if tid < self.T else tid - self.T
        elif warp is not None:
            where += f", warp {warp}"
        if index is not None:
            where += f", index {index}"
        raise InterpreterError(f"kernel {self.kernel.name}: {self.desc(op)}: {what} ({where})",
                               kind=kind, op=op, group=self.coords(g),
                               thread=tid if tid is not None and tid < self.T else None,
                               warp=warp, index=index)

    def fail_lanes(self, kind: str, op: Op, what: str, bad: np.ndarray,
                   values: np.ndarray | None = None) -> None:
        """Raise for the first (group, thread) where `bad` [G, T] holds."""
        flat = int(np.argmax(bad.reshape(-1)))
        g, t = divmod(flat, self.T)
        index = None if values is None else int(np.asarray(values).reshape(-1)[flat])
        self.fail(kind, op, what, g, t, index=index)

    # ----- shared-memory bookkeeping --------------------------------------------------------

    def shared_positions(self, op: Op, sh: _Shared, sel: np.ndarray, idx: np.ndarray, full: bool,
                         span: int = 1):
        """Active (group, thread, element index) triples of a per-thread shared access."""
        if full:
            gi, ti, ii = self.all_g, self.all_t, idx.reshape(-1).astype(np.int64)
        else:
            gi, ti = np.nonzero(sel)
            ii = idx[gi, ti].astype(np.int64)
        bad = ii + span > sh.size
        if bad.any():
            p = int(np.argmax(bad))
            self.fail("bounds", op, f"shared @{sh.decl.name} index out of bounds (size {sh.size})",
                      int(gi[p]), int(ti[p]), index=int(ii[p]))
        return gi, ti, ii

    def check_in_flight(self, op: Op, sh: _Shared, flat: np.ndarray, gi: np.ndarray, tid: np.ndarray,
                        what: str) -> None:
        busy = sh.in_flight[flat]
        if busy.any():
            p = int(np.argmax(busy))
            self.fail("async", op, f"{what} shared @{sh.decl.name} element whose async_copy has not "
                      "been retired by an async_wait", int(gi[p]), int(tid[p]),
                      index=int(flat[p] - gi[p] * sh.size))

    def check_read(self, op: Op, op_id: int, sh: _Shared, flat: np.ndarray, gi: np.ndarray,
                   tid: np.ndarray, warp: np.ndarray, collective: bool) -> None:
        self.check_in_flight(op, sh, flat, gi, tid, "reads")
        written = sh.written[flat]
        if not written.all():
            p = int(np.argmax(~written))
            self.fail("uninitialised", op, f"reads shared @{sh.decl.name} element never written",
                      int(gi[p]), int(tid[p]), index=int(flat[p] - gi[p] * sh.size))
        epoch = self.warp_epoch[gi, warp]
        self._check_writer(op, sh, flat, gi, tid, warp, epoch, collective, "read")
        # update the read state, element by element (several readers in this op -> 'several')
        n = len(flat)
        if collective:
            new_tid = np.full(n, -2, np.int64)
        else:
            new_tid = tid
        new_warp = warp
        multi_t = None
        if n > 1:
            multi_t = self._multi(sh, flat, tid) if not collective else None
            multi_w = self._multi(sh, flat, warp)
            if multi_t is not None:
                new_tid = np.where(multi_t, -2, tid)
            new_warp = np.where(multi_w, -2, warp)
        if self.sync is not None:  # warp roles: every reading warp's read, with its clock
            read_stamps(sh, self.W).note(flat, warp, tid, multi_t, epoch, self.sync.rc[gi, warp], op_id)
        old_w = sh.rd_warp[flat]
        old_t = sh.rd_tid[flat]
        none = old_w == -1
        same = (old_w == new_warp) & (new_warp >= 0)
        keep = same & (sh.rd_stamp[flat] == epoch)
        sh.rd_warp[flat] = np.where(none | same, new_warp, -2)
        sh.rd_tid[flat] = np.where(keep, np.where(old_t == new_tid, old_t, -2), new_tid)
        sh.rd_stamp[flat] = epoch
        sh.rd_last[flat] = tid
        sh.rd_op[flat] = op_id

    def _multi(self, sh: _Shared, flat: np.ndarray, key: np.ndarray) -> np.ndarray:
        """Per position: does its element get two different `key`s in this access?"""
        sh.scratch[flat] = key
        diff = sh.scratch[flat] != key
        if not diff.any():
            return diff
        sh.scratch2[flat] = 0
        sh.scratch2[flat[diff]] = 1
        return sh.scratch2[flat] == 1

    def _check_writer(self, op: Op, sh: _Shared, flat: np.ndarray, gi: np.ndarray, tid: np.ndarray,
                      warp: np.ndarray, epoch: np.ndarray, collective: bool, what: str) -> None:
        T = self.T
        wt = sh.wr_tid[flat]
        cand = (wt >= 0) & (wt != tid) if not collective else (wt >= 0)
        if not cand.any():
            return
        wwarp = np.where(wt >= T, wt - T, wt // self.ws)
        race = cand & ~((wwarp == warp) & (epoch > sh.wr_stamp[flat]))
        if self.sync is not None and race.any():  # another warp's write, ordered by mbarriers?
            race &= ~((wwarp != warp) & (self.sync.vc[gi, warp, wwarp] > sh.wr_clock[flat]))
        if race.any():
            p = int(np.argmax(race))
            e = int(flat[p])
            other = self.ops[int(sh.wr_op[e])]
            self.fail("race", op, f"data race on shared @{sh.decl.name}[{e - int(gi[p]) * sh.size}]: "
                      f"{what} by {self.who(int(tid[p]))} after a write by {self.who(int(wt[p]))} in "
                      f"{self.desc(other)} {self.unordered}", int(gi[p]), int(tid[p]),
                      index=e - int(gi[p]) * sh.size)

    def check_write(self, op: Op, op_id: int, sh: _Shared, flat: np.ndarray, gi: np.ndarray,
                    tid: np.ndarray, warp: np.ndarray, collective: bool) -> None:
        self.check_in_flight(op, sh, flat, gi, tid, "writes")
        busy = sh.wg_reading[flat] > 0
        if busy.any():
            p = int(np.argmax(busy))
            self.fail("async", op, f"writes shared @{sh.decl.name} element that a wgmma in flight "
                      "reads (no wgmma_wait retired it)", int(gi[p]), int(tid[p]),
                      index=int(flat[p] - gi[p] * sh.size))
        sh.gen_writer[flat] = tid
        n = len(flat)
        if n > 1:  # two writes of one element within this op
            pos = np.arange(n)
            sh.scratch[flat] = pos
            dup = sh.scratch[flat] != pos
            if dup.any():
                p = int(np.argmax(dup))
                q = int(sh.scratch[flat[p]])
                e = int(flat[p]) - int(gi[p]) * sh.size
                self.fail("race", op, f"data race on shared @{sh.decl.name}[{e}]: written by "
                          f"{self.who(int(tid[p]))} and {self.who(int(tid[q]))} in the same op",
                          int(gi[p]), int(tid[p]), index=e)
        epoch = self.warp_epoch[gi, warp]
        self._check_writer(op, sh, flat, gi, tid, warp, epoch, collective, "write")
        rw = sh.rd_warp[flat]
        if sh.reads is not None:
            check_readers(self, op, sh, flat, gi, tid, warp, epoch, collective)
        elif (rw != -1).any():
            rt = sh.rd_tid[flat]
            other_lane = (rt != tid) if not collective else True
            race = (rw == -2) | ((rw >= 0) & (rw != warp)) | \
                ((rw == warp) & (sh.rd_stamp[flat] == epoch) & other_lane)
            if np.any(race):
                p = int(np.argmax(race))
                e = int(flat[p])
                last = int(sh.rd_last[e])
                if int(rt[p]) == -2 or int(rw[p]) == -2:
                    reader = "several threads" + (f" including {self.who(last)}"
                                                  if last != int(tid[p]) or collective else "")
                else:
                    reader = self.who(last)
                self.fail("race", op, f"data race on shared @{sh.decl.name}[{e - int(gi[p]) * sh.size}]: "
                          f"write by {self.who(int(tid[p]))} after a read by {reader} in "
                          f"{self.desc(self.ops[int(sh.rd_op[e])])} {self.unordered}",
                          int(gi[p]), int(tid[p]), index=e - int(gi[p]) * sh.size)
        sh.wr_tid[flat] = tid
        sh.wr_stamp[flat] = epoch
        sh.wr_op[flat] = op_id
        sh.written[flat] = True
        sh.rd_warp[flat] = -1
        if sh.wr_clock is not None:
            sh.wr_clock[flat] = self.sync.rc[gi, warp]  # type: ignore[union-attr]
            if sh.reads is not None:
                sh.reads.clear(flat)

    def register_op(self, op: Op) -> int:
        self.ops.append(op)
        return len(self.ops) - 1


# ----- op handlers: each takes (machine, op) and returns a closure over register slots ------

def _merge(t: Type, sel: np.ndarray, new: np.ndarray, old: np.ndarray, m: "_Machine", op: Op,
           what: str) -> np.ndarray:
    """new where sel [G, T] else old, for any value type."""
    if isinstance(t, FragmentType):
        G, W, ws = m.G, m.W, m.ws
        s = sel.reshape(G, W, ws)
        anyw = s.any(-1)
        partial = anyw & ~s.all(-1)
        if partial.any():
            differ = partial & (new != old).any((-1, -2))
            if differ.any():
                flat = int(np.argmax(differ.reshape(-1)))
                g, w = divmod(flat, W)
                m.fail("collective", op, f"fragment {what} differs across the lanes of a divergent warp",
                       g, warp=w)
        return np.where(anyw[:, :, None, None], new, old)
    if isinstance(t, VectorType):
        return np.where(sel[..., None], new, old)
    return np.where(sel, new, old)


def _shape(m: _Machine, t: Type) -> tuple[int, ...]:
    if isinstance(t, FragmentType):
        return (m.G, m.W, t.rows, t.cols)
    if isinstance(t, VectorType):
        return (m.G, m.T, t.size)
    return (m.G, m.T)


# ----- shared by the op handlers ---------------------------------------------------------

def _access_error(m: _Machine, op: Op, name: str, writes: bool) -> None:
    access = m.access.get(name)
    if access is None:
        return
    if writes and access == "read":
        raise InterpreterError(f"kernel {m.kernel.name}: {m.desc(op)}: writes the read-only buffer "
                               f"@{name}", kind="access", op=op)


def _warps(m: _Machine, op: Op, mask: _Mask) -> np.ndarray:
    """[G, W] warps that execute a collective op; a partially active warp is an error."""
    s = mask.arr.reshape(m.G, m.W, m.ws)
    f = s.all(-1)
    if not mask.full:
        partial = s.any(-1) & ~f
        if partial.any():
            flat = int(np.argmax(partial.reshape(-1)))
            g, w = divmod(flat, m.W)
            lane = int(np.argmax(~s[g, w]))
            m.fail("collective", op, f"collective op executed by a partially active warp "
                   f"({int(s[g, w].sum())} of {m.ws} lanes); this lane is inactive", g, w * m.ws + lane)
    return f


def _warp_uniform(m: _Machine, op: Op, x: np.ndarray, warps: np.ndarray, what: str) -> np.ndarray:
    """The per-warp value [G, W] of a per-thread operand that must agree across each warp."""
    s = x.reshape(m.G, m.W, m.ws)
    first = s[..., 0]
    differ = (s != first[..., None]).any(-1) & warps
    if differ.any():
        flat = int(np.argmax(differ.reshape(-1)))
        g, w = divmod(flat, m.W)
        lane = int(np.argmax(s[g, w] != first[g, w]))
        m.fail("collective", op, f"{what} differs across the warp: lane 0 has {int(first[g, w])}, "
               f"lane {lane} has {int(s[g, w, lane])}", g, w * m.ws + lane, index=int(s[g, w, lane]))
    return first
