"""A numpy interpreter for the kernel IR, with real threadgroup semantics (see docs/IR.md).

`run_kernel(kernel, buffers, scalars)` executes a `Kernel` for a whole launch grid at small
sizes and checks the rules of the execution model as it goes. It is the oracle the passes and
the printers are tested against, so it is strict: anything the spec calls an error raises
`InterpreterError` naming the op, its result, the threadgroup, the thread and the index.

Execution is vectorised over every thread of every threadgroup at once:

- a per-thread value is a numpy array of shape [G, T] (G threadgroups of the grid, T threads
  per group), plus a trailing dimension for vectors; a fragment is a per-warp array
  [G, W, rows, cols];
- control flow is predicated with an active mask [G, T]: `if`/`switch` run each region under
  its mask (a region no thread takes is skipped) and merge results with `np.where`; `for`
  iterates while any thread is active, threads whose index reached `ub` drop out;
- pure ops compute every lane (inactive lanes hold don't-care values, their floating point
  warnings are silenced); their checks (division by zero, shift widths, float->int range)
  look at active lanes only; memory ops touch memory only where the mask and the predicate
  hold, and a masked-off load gives 0.

Each op is resolved once, before execution, to a closure over register slots (`_Machine`
compiles the kernel per launch), so the per-op cost is a handful of numpy calls on G*T
elements.

Arithmetic follows docs/IR.md exactly: integers wrap in their holding dtype; f16 and f32 ops
are computed by numpy in that type (numpy's f16 ops go through f32, which is exact for
+ - * because 24 >= 2*11+2); bf16 ops are computed in f32 and rounded to bf16 (round to
nearest even on the bits) after every op. `fma` is rounded once: the product is exact in
float64, the sum is computed with TwoSum and rounded to odd, which makes the final rounding
to f32/f16/bf16 correct. `mma` computes a @ b in float64, adds c in float64 and rounds once
to c's element type (exact for the products, the float64 sum of the k products may round);
`mma_sp` does the same with the dense A rebuilt from the compressed one and the metadata.
float `min`/`max` are IEEE minNum/maxNum (`fmin`/`fmax`: a NaN operand loses), like Metal
and CUDA. float->int casts truncate toward zero; NaN or out of range is an error.
int->int casts wrap. `i32` div/rem with a negative operand raises: the spec says floor
division while C truncates, so a kernel relying on either is rejected.

Threadgroup memory is checked for reads of never-written elements and for data races:
between two threadgroup barriers, an element accessed by two different threads where at least
one access writes is a race, unless both threads are in one warp and a `simdgroup` barrier of
that warp lies between the accesses. Bookkeeping is per element (last writer thread and
the barrier epoch of its warp at the write; the reader thread, or 'several', and its warp,
or 'several warps', with the epoch of the latest read), updated with vectorised scatters.
A threadgroup barrier clears the bookkeeping of its group; each barrier bumps the epoch of
every warp it covers. Collective fragment loads/stores count as accesses by every lane of
the warp (a pseudo-thread T + warp), so even a fragment store followed by a fragment load of
the same warp needs a barrier between them. Device memory is not race-checked; ops run in
lockstep, so device memory is coherent across the launch.

`atomic_add` is serialised in (group, thread) order, the group index running x fastest:
g = x + gx * (y + gy * z).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import MarlinDSLError
from .core import Block, BufferParam, ConstTable, Kernel, Op, SharedArray, Value
from .types import BF16, BOOL, F16, F32, FragmentType, ScalarType, Type, VectorType
from .verify import verify

__all__ = ["InterpreterError", "launch_size", "run_kernel"]


class InterpreterError(MarlinDSLError):
    """An execution-model rule was broken at run time.

    `kind` is one of: bounds, uninitialised, race, shift, division, cast, divergent_barrier,
    collective, misaligned, access, loop, input, unsupported, metadata (sparse MMA metadata
    the hardware leaves undefined), async (shared memory accessed while an async_copy to it
    is still in flight). `op` is the offending op,
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


def run_kernel(kernel: Kernel, buffers: dict[str, np.ndarray],
               scalars: dict[str, int]) -> dict[str, np.ndarray]:
    """Execute `kernel` over its whole grid; return the writable buffers (copies).

    `buffers` maps every declared buffer to a flat numpy array of its element type (bf16 held
    as float32). Outputs are returned in the same holding dtypes; poison them beforehand to
    see which elements the kernel wrote."""
    verify(kernel)
    machine = _Machine(kernel, buffers, scalars)
    machine.run()
    return {b.name: machine.device[b.name] for b in kernel.buffers if b.access != "read"}


# ----- numeric helpers ----------------------------------------------------------------------

_U32 = np.uint32
_INT_RANGE = {"u8": (0, 2**8 - 1), "u16": (0, 2**16 - 1), "u32": (0, 2**32 - 1),
              "i32": (-2**31, 2**31 - 1)}
_NAN32 = np.float32(np.nan)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> nearest bf16 value (ties to even), held in float32. NaN stays (a quiet) NaN."""
    x = np.asarray(x, dtype=np.float32)
    b = x.view(np.uint32)
    r = ((b + (_U32(0x7FFF) + ((b >> _U32(16)) & _U32(1)))) & _U32(0xFFFF0000)).view(np.float32)
    return np.where(np.isnan(x), _NAN32, r)


def _f64_to_f32_odd(x: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounded to odd (truncate, then set the last bit if inexact): a later
    rounding of the result to a type of at most 22 bits is then correctly rounded."""
    r = x.astype(np.float32)
    r64 = r.astype(np.float64)
    inexact = (r64 != x) & ~np.isnan(x)
    if not inexact.any():
        return r
    bits = r.view(np.uint32).copy()
    over = inexact & (np.abs(r64) > np.abs(x))  # rounded away from zero: step back
    bits -= over.astype(np.uint32)
    bits |= inexact.astype(np.uint32)
    return bits.view(np.float32)


def _fma_odd64(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """a*b + c rounded to odd in float64 (a*b must be exact in float64: inputs of <= 26 bits)."""
    a, b, c = (np.asarray(v, dtype=np.float64) for v in (a, b, c))
    p = a * b
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)  # TwoSum: s + err == p + c exactly
    need = (err != 0) & np.isfinite(s) & ((s.view(np.uint64) & np.uint64(1)) == 0)
    if need.any():
        s = np.where(need, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s


def _round_f64(x: np.ndarray, t: ScalarType) -> np.ndarray:
    """float64 (exact or rounded to odd) -> float type t, rounded once."""
    if t == F32:
        return x.astype(np.float32)
    if t == F16:
        return x.astype(np.float16)
    if t == BF16:
        return round_bf16(_f64_to_f32_odd(x))
    raise TypeError(t)


def _cast(x: np.ndarray, src: ScalarType, dst: ScalarType) -> tuple[np.ndarray, np.ndarray | None]:
    """Numeric conversion; returns (value, bad) where bad marks float->int out of range/NaN."""
    hd = dst.holding_dtype
    if src == dst:
        return x, None
    if dst == BOOL:
        return x != 0, None
    if dst.is_int:
        if src.is_float:
            t = np.trunc(x.astype(np.float64))
            lo, hi = _INT_RANGE[dst.name]
            bad = ~((t >= lo) & (t <= hi))
            return np.where(bad, 0.0, t).astype(hd), bad
        return x.astype(hd), None  # int/bool -> int wraps
    if not src.is_float:  # int/bool -> float: exact in float64, then one rounding
        return _round_f64(x.astype(np.float64), dst), None
    if dst == BF16:
        return round_bf16(x.astype(np.float32)), None
    return x.astype(hd), None  # f32->f16 is rounded once by numpy; widening is exact


def _bitcast(x: np.ndarray, src: ScalarType, dst: ScalarType) -> np.ndarray:
    if src == dst:
        return x
    if src == BF16:
        bits = (np.ascontiguousarray(x, dtype=np.float32).view(np.uint32) >> _U32(16)).astype(np.uint16)
        return bits if dst.name == "u16" else bits.view(dst.holding_dtype)
    if dst == BF16:
        u16 = np.ascontiguousarray(x).view(np.uint16)
        return (u16.astype(np.uint32) << _U32(16)).view(np.float32)
    return np.ascontiguousarray(x).view(dst.holding_dtype)


def _zeros(shape: tuple[int, ...], t: Type) -> np.ndarray:
    elem = t if isinstance(t, ScalarType) else t.elem  # type: ignore[attr-defined]
    return np.zeros(shape, elem.holding_dtype)


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
    def __init__(self, kernel: Kernel, buffers: dict[str, np.ndarray], scalars: dict[str, int]) -> None:
        self.kernel = kernel
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
        self.tables = {t.name: self._table(t) for t in kernel.tables}
        self.warp_epoch = np.zeros((G, W), np.int64)
        # async copies: per thread, the groups committed so far; per issued copy a record
        self.async_commits = np.zeros((G, T), np.int64)
        self.async_pending: list[_AsyncCopies] = []
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
            make = _HANDLERS.get(op.name)
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
        attrs = ", ".join(f"{k}=@{v}" if k in ("buffer", "name") and op.name != "scalar" else f"{k}={v}"
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
        if n > 1:
            multi_t = self._multi(sh, flat, tid) if not collective else None
            multi_w = self._multi(sh, flat, warp)
            if multi_t is not None:
                new_tid = np.where(multi_t, -2, tid)
            new_warp = np.where(multi_w, -2, warp)
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
        if race.any():
            p = int(np.argmax(race))
            e = int(flat[p])
            other = self.ops[int(sh.wr_op[e])]
            self.fail("race", op, f"data race on shared @{sh.decl.name}[{e - int(gi[p]) * sh.size}]: "
                      f"{what} by {self.who(int(tid[p]))} after a write by {self.who(int(wt[p]))} in "
                      f"{self.desc(other)} with no barrier between", int(gi[p]), int(tid[p]),
                      index=e - int(gi[p]) * sh.size)

    def check_write(self, op: Op, op_id: int, sh: _Shared, flat: np.ndarray, gi: np.ndarray,
                    tid: np.ndarray, warp: np.ndarray, collective: bool) -> None:
        self.check_in_flight(op, sh, flat, gi, tid, "writes")
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
        if (rw != -1).any():
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
                          f"{self.desc(self.ops[int(sh.rd_op[e])])} with no barrier between",
                          int(gi[p]), int(tid[p]), index=e - int(gi[p]) * sh.size)
        sh.wr_tid[flat] = tid
        sh.wr_stamp[flat] = epoch
        sh.wr_op[flat] = op_id
        sh.written[flat] = True
        sh.rd_warp[flat] = -1

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


def _h_const(m: _Machine, op: Op) -> Fn:
    t = op.result.type
    assert isinstance(t, ScalarType)
    v = op.attrs["value"]
    if t == BOOL:
        arr = np.full((m.G, m.T), bool(v))
    elif t.is_int:
        if isinstance(v, float) and not float(v).is_integer():
            raise InterpreterError(f"kernel {m.kernel.name}: {m.desc(op)}: {v} is not an integer",
                                   kind="input", op=op)
        hi = _INT_RANGE[t.name][1]
        iv = int(v)
        if not -2**31 <= iv <= hi:
            raise InterpreterError(f"kernel {m.kernel.name}: {m.desc(op)}: {v} does not fit {t}",
                                   kind="input", op=op)
        arr = np.full((m.G, m.T), iv & (2**t.bits - 1) if t.name != "i32" else iv).astype(t.holding_dtype)
    else:
        arr = _round_f64(np.full((m.G, m.T), float(v), np.float64), t)
    r = m.slot(op.result)
    regs = m.regs

    def run(mask: _Mask) -> None:
        regs[r] = arr
    return run


def _h_index(m: _Machine, op: Op) -> Fn:
    kind = op.attrs["kind"]
    if kind not in m.index_values:
        raise InterpreterError(f"kernel {m.kernel.name}: {m.desc(op)}: unknown index kind {kind}",
                               kind="unsupported", op=op)
    arr = m.index_values[str(kind)]
    r = m.slot(op.result)
    regs = m.regs

    def run(mask: _Mask) -> None:
        regs[r] = arr
    return run


def _h_scalar(m: _Machine, op: Op) -> Fn:
    name = str(op.attrs["name"])
    if name not in m.scalars:
        raise InterpreterError(f"kernel {m.kernel.name}: {m.desc(op)}: @{name} is not a declared "
                               "launch scalar", kind="input", op=op)
    arr = np.full((m.G, m.T), m.scalars[name], np.uint32)
    r = m.slot(op.result)
    regs = m.regs

    def run(mask: _Mask) -> None:
        regs[r] = arr
    return run


def _bool_fn(name: str):
    return {"add": np.logical_xor, "sub": np.logical_xor, "mul": np.logical_and,
            "min": np.logical_and, "max": np.logical_or, "and": np.logical_and,
            "or": np.logical_or, "xor": np.logical_xor}[name]


_CMP = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
        "eq": np.equal, "ne": np.not_equal}


def _h_binary(m: _Machine, op: Op) -> Fn:
    a, b = (m.slot(v) for v in op.operands)
    r = m.slot(op.result)
    regs = m.regs
    t = op.operands[0].type
    elem = t.elem if isinstance(t, (VectorType, FragmentType)) else t
    name = op.name
    if name in _CMP:
        f = _CMP[name]
    elif elem == BOOL:
        f = _bool_fn(name)
    elif name in ("min", "max") and elem.is_float:
        f = np.fmin if name == "min" else np.fmax
    else:
        f = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "min": np.minimum,
             "max": np.maximum, "and": np.bitwise_and, "or": np.bitwise_or,
             "xor": np.bitwise_xor}[name]
    if elem == BF16 and name in ("add", "sub", "mul"):
        def run(mask: _Mask) -> None:
            regs[r] = round_bf16(f(regs[a], regs[b]))
    else:
        def run(mask: _Mask) -> None:
            regs[r] = f(regs[a], regs[b])
    return run


def _h_divrem(m: _Machine, op: Op) -> Fn:
    a, b = (m.slot(v) for v in op.operands)
    r = m.slot(op.result)
    regs = m.regs
    t = op.operands[0].type
    f = np.floor_divide if op.name == "div" else np.remainder
    signed = t == ScalarType("i32")
    one = np.ones((), t.holding_dtype)  # type: ignore[union-attr]

    def run(mask: _Mask) -> None:
        x, y = regs[a], regs[b]
        zero = y == 0
        if zero.any():
            bad = zero & mask.arr
            if bad.any():
                m.fail_lanes("division", op, f"{op.name} by zero", bad, x)
            y = np.where(zero, one, y)
        if signed:
            neg = ((x < 0) | (y < 0)) & mask.arr
            if neg.any():
                m.fail_lanes("division", op, f"i32 {op.name} of a negative operand (floor vs "
                             "truncation is unspecified)", neg, x)
        regs[r] = f(x, y)
    return run


def _h_shift(m: _Machine, op: Op) -> Fn:
    a, b = (m.slot(v) for v in op.operands)
    r = m.slot(op.result)
    regs = m.regs
    t = op.operands[0].type
    bits = t.bits  # type: ignore[union-attr]
    f = np.left_shift if op.name == "shl" else np.right_shift
    hd = t.holding_dtype  # type: ignore[union-attr]

    def run(mask: _Mask) -> None:
        x, y = regs[a], regs[b]
        over = (y >= bits) | (y < 0) if t.name == "i32" else y >= bits  # type: ignore[union-attr]
        if over.any():
            bad = over & mask.arr
            if bad.any():
                m.fail_lanes("shift", op, f"{op.name} by an amount >= {bits} bits of {t}", bad, y)
            y = np.where(over, np.zeros((), hd), y)
        regs[r] = f(x, y).astype(hd, copy=False)
    return run


def _h_fma(m: _Machine, op: Op) -> Fn:
    a, b, c = (m.slot(v) for v in op.operands)
    r = m.slot(op.result)
    regs = m.regs
    t = op.result.type
    elem = t.elem if isinstance(t, VectorType) else t

    def run(mask: _Mask) -> None:
        regs[r] = _round_f64(_fma_odd64(regs[a], regs[b], regs[c]), elem)  # type: ignore[arg-type]
    return run


def _h_select(m: _Machine, op: Op) -> Fn:
    c, a, b = (m.slot(v) for v in op.operands)
    r = m.slot(op.result)
    regs = m.regs
    t = op.result.type
    if isinstance(t, FragmentType):
        def run_frag(mask: _Mask) -> None:
            regs[r] = _merge(t, regs[c] & mask.arr, regs[a], regs[b], m, op, "select")
        return run_frag
    if isinstance(t, VectorType):
        def run_vec(mask: _Mask) -> None:
            regs[r] = np.where(regs[c][..., None], regs[a], regs[b])
        return run_vec

    def run(mask: _Mask) -> None:
        regs[r] = np.where(regs[c], regs[a], regs[b])
    return run


def _h_cast(m: _Machine, op: Op) -> Fn:
    x = m.slot(op.operands[0])
    r = m.slot(op.result)
    regs = m.regs
    src, dst = op.operands[0].type, op.result.type

    def run(mask: _Mask) -> None:
        v, bad = _cast(regs[x], src, dst)  # type: ignore[arg-type]
        if bad is not None and bad.any():
            bad = bad & mask.arr
            if bad.any():
                flat = int(np.argmax(bad.reshape(-1)))
                g, t = divmod(flat, m.T)
                value = float(regs[x].reshape(-1)[flat])
                m.fail("cast", op, f"cast of {value!r} from {src} to {dst} is out of range", g, t)
        regs[r] = v
    return run


def _h_bitcast(m: _Machine, op: Op) -> Fn:
    x = m.slot(op.operands[0])
    r = m.slot(op.result)
    regs = m.regs
    src, dst = op.operands[0].type, op.result.type

    if isinstance(dst, VectorType):  # u32 -> vec<f16|bf16, 2>: element 0 is the low half
        def run_split(mask: _Mask) -> None:
            w = regs[x]
            halves = np.stack([w & _U32(0xFFFF), w >> _U32(16)], axis=-1).astype(np.uint16)
            regs[r] = _bitcast(halves, ScalarType("u16"), dst.elem)
        return run_split
    if isinstance(src, VectorType):  # vec<f16|bf16, 2> -> u32
        def run_join(mask: _Mask) -> None:
            bits = _bitcast(regs[x], src.elem, ScalarType("u16")).astype(np.uint32)
            regs[r] = bits[..., 0] | (bits[..., 1] << _U32(16))
        return run_join

    def run(mask: _Mask) -> None:
        regs[r] = _bitcast(regs[x], src, dst)  # type: ignore[arg-type]
    return run


def _h_vec(m: _Machine, op: Op) -> Fn:
    xs = [m.slot(v) for v in op.operands]
    r = m.slot(op.result)
    regs = m.regs

    def run(mask: _Mask) -> None:
        regs[r] = np.stack([regs[x] for x in xs], axis=-1)
    return run


def _h_extract(m: _Machine, op: Op) -> Fn:
    x = m.slot(op.operands[0])
    r = m.slot(op.result)
    regs = m.regs
    k = int(op.attrs["index"])

    def run(mask: _Mask) -> None:
        regs[r] = np.ascontiguousarray(regs[x][..., k])
    return run


def _h_table(m: _Machine, op: Op) -> Fn:
    x = m.slot(op.operands[0])
    r = m.slot(op.result)
    regs = m.regs
    name = str(op.attrs["name"])
    table = m.tables[name]
    n = len(table)
    zero = _zeros((m.G, m.T), op.result.type)

    def run(mask: _Mask) -> None:
        idx = regs[x]
        over = idx >= n
        if over.any():
            bad = over & mask.arr
            if bad.any():
                m.fail_lanes("bounds", op, f"table @{name} index out of bounds (size {n})", bad, idx)
            if n == 0:
                regs[r] = zero
                return
            idx = np.where(over, 0, idx)
        regs[r] = table[idx]
    return run


def _access_error(m: _Machine, op: Op, name: str, writes: bool) -> None:
    access = m.access.get(name)
    if access is None:
        return
    if writes and access == "read":
        raise InterpreterError(f"kernel {m.kernel.name}: {m.desc(op)}: writes the read-only buffer "
                               f"@{name}", kind="access", op=op)


def _h_load(m: _Machine, op: Op) -> Fn:
    """load and vload, device or shared."""
    name = str(op.attrs["buffer"])
    ia = m.slot(op.operands[0])
    pa = m.slot(op.operands[1]) if len(op.operands) > 1 else None
    r = m.slot(op.result)
    regs = m.regs
    op_id = m.register_op(op)
    vec = op.name == "vload"
    size = int(op.attrs["size"]) if vec else 1
    lanes = np.arange(size, dtype=np.int64)
    G, T, ws = m.G, m.T, m.ws
    zero = _zeros(_shape(m, op.result.type), op.result.type)

    def selection(mask: _Mask) -> tuple[np.ndarray, bool]:
        if pa is None:
            return mask.arr, mask.full
        sel = mask.arr & regs[pa]
        return sel, bool(sel.all())

    def check_align(idx: np.ndarray, sel: np.ndarray) -> None:
        if size > 1:
            mis = (idx % _U32(size) != 0) & sel
            if mis.any():
                m.fail_lanes("misaligned", op, f"vload index not a multiple of {size}", mis, idx)

    if name in m.shared:
        sh = m.shared[name]
        S = sh.size

        def run_shared(mask: _Mask) -> None:
            sel, full = selection(mask)
            if not full and not sel.any():
                regs[r] = zero
                return
            idx = regs[ia]
            check_align(idx, sel)
            gi, ti, ii = m.shared_positions(op, sh, sel, idx, full, size)
            warp = ti // ws
            if vec:
                flat = (gi * S + ii)[:, None] + lanes
                m.check_read(op, op_id, sh, flat.reshape(-1), np.repeat(gi, size), np.repeat(ti, size),
                             np.repeat(warp, size), False)
                vals = sh.data[flat]
                if full:
                    regs[r] = vals.reshape(G, T, size)
                else:
                    out = zero.copy()
                    out[gi, ti] = vals
                    regs[r] = out
                return
            flat = gi * S + ii
            m.check_read(op, op_id, sh, flat, gi, ti, warp, False)
            vals = sh.data[flat]
            if full:
                regs[r] = vals.reshape(G, T)
            else:
                out = zero.copy()
                out[gi, ti] = vals
                regs[r] = out
        return run_shared

    buf = m.device[name]
    n = len(buf)

    def run_device(mask: _Mask) -> None:
        sel, full = selection(mask)
        idx = regs[ia]
        if full:
            check_align(idx, sel)
            if n == 0 or int(idx.max()) + size > n:
                m.fail_lanes("bounds", op, f"@{name} index out of bounds (size {n})",
                             idx.astype(np.int64) + size > n, idx)
            regs[r] = buf[idx[..., None] + lanes] if vec else buf[idx]
            return
        if not sel.any():
            regs[r] = zero
            return
        check_align(idx, sel)
        bad = sel & (idx.astype(np.int64) + size > n)
        if bad.any():
            m.fail_lanes("bounds", op, f"@{name} index out of bounds (size {n})", bad, idx)
        safe = np.where(sel, idx, _U32(0))
        if vec:
            regs[r] = np.where(sel[..., None], buf[safe[..., None] + lanes], zero)
        else:
            regs[r] = np.where(sel, buf[safe], zero)
    return run_device


def _h_store(m: _Machine, op: Op) -> Fn:
    name = str(op.attrs["buffer"])
    _access_error(m, op, name, True)
    ia, va = m.slot(op.operands[0]), m.slot(op.operands[1])
    pa = m.slot(op.operands[2]) if len(op.operands) > 2 else None
    regs = m.regs
    op_id = m.register_op(op)
    ws = m.ws

    if name in m.shared:
        sh = m.shared[name]
        S = sh.size

        def run_shared(mask: _Mask) -> None:
            if pa is None:
                sel, full = mask.arr, mask.full
            else:
                sel = mask.arr & regs[pa]
                full = bool(sel.all())
                if not full and not sel.any():
                    return
            gi, ti, ii = m.shared_positions(op, sh, sel, regs[ia], full)
            flat = gi * S + ii
            m.check_write(op, op_id, sh, flat, gi, ti, ti // ws, False)
            v = regs[va]
            sh.data[flat] = v.reshape(-1) if full else v[gi, ti]
        return run_shared

    buf = m.device[name]
    n = len(buf)

    def run_device(mask: _Mask) -> None:
        if pa is None:
            sel, full = mask.arr, mask.full
        else:
            sel = mask.arr & regs[pa]
            full = bool(sel.all())
        idx = regs[ia]
        if full:
            if n == 0 or int(idx.max()) >= n:
                m.fail_lanes("bounds", op, f"@{name} index out of bounds (size {n})", idx >= n, idx)
            buf[idx.reshape(-1)] = regs[va].reshape(-1)
            return
        if not sel.any():
            return
        bad = sel & (idx >= n)
        if bad.any():
            m.fail_lanes("bounds", op, f"@{name} index out of bounds (size {n})", bad, idx)
        buf[idx[sel]] = regs[va][sel]
    return run_device


def _h_atomic_add(m: _Machine, op: Op) -> Fn:
    name = str(op.attrs["buffer"])
    if name in m.shared:
        raise InterpreterError(f"kernel {m.kernel.name}: {m.desc(op)}: atomic_add works on device "
                               "buffers, not on shared memory", kind="unsupported", op=op)
    _access_error(m, op, name, True)
    ia, va = m.slot(op.operands[0]), m.slot(op.operands[1])
    r = m.slot(op.result)
    regs = m.regs
    buf = m.device[name]
    n = len(buf)
    zero = np.zeros((m.G, m.T), np.uint32)
    low = np.uint64(0xFFFFFFFF)

    def run(mask: _Mask) -> None:
        sel = mask.arr
        if not mask.any:
            regs[r] = zero
            return
        idx = regs[ia]
        bad = sel & (idx >= n)
        if bad.any():
            m.fail_lanes("bounds", op, f"@{name} index out of bounds (size {n})", bad, idx)
        ii = idx[sel]  # (group, thread) order
        vv = regs[va][sel].astype(np.uint64)
        order = np.argsort(ii, kind="stable")
        si, sv = ii[order], vv[order]
        incl = np.cumsum(sv)
        excl = incl - sv
        start = np.empty(len(si), bool)
        start[0] = True
        np.not_equal(si[1:], si[:-1], out=start[1:])
        starts = np.flatnonzero(start)
        seg = np.cumsum(start) - 1
        prior = excl - excl[starts][seg]
        base = buf[si].astype(np.uint64)
        old_sorted = ((base + prior) & low).astype(np.uint32)
        old = np.empty_like(old_sorted)
        old[order] = old_sorted
        totals = np.add.reduceat(sv, starts)
        heads = si[starts]
        buf[heads] = ((buf[heads].astype(np.uint64) + totals) & low).astype(np.uint32)
        out = zero.copy()
        out[sel] = old
        regs[r] = out
    return run


def _h_barrier(m: _Machine, op: Op) -> Fn:
    scope = str(op.attrs["scope"])
    G, T, W, ws = m.G, m.T, m.W, m.ws
    if scope not in ("threadgroup", "simdgroup"):
        raise InterpreterError(f"kernel {m.kernel.name}: {m.desc(op)}: unknown barrier scope {scope}",
                               kind="unsupported", op=op)
    shared = list(m.shared.values())

    def run(mask: _Mask) -> None:
        if scope == "threadgroup":
            if mask.full:
                for sh in shared:
                    sh.wr_tid.fill(-1)
                    sh.rd_warp.fill(-1)
                m.warp_epoch += 1
                return
            a = mask.arr.any(1)
            f = mask.arr.all(1)
            partial = a & ~f
            if partial.any():
                g = int(np.argmax(partial))
                t = int(np.argmax(~mask.arr[g]))
                active = int(np.argmax(mask.arr[g]))
                m.fail("divergent_barrier", op, f"threadgroup barrier reached by only part of the "
                       f"threadgroup ({int(mask.arr[g].sum())} of {T} threads, e.g. thread {active}); "
                       "this thread does not reach it", g, t)
            for sh in shared:
                sh.wr_tid.reshape(G, sh.size)[f] = -1
                sh.rd_warp.reshape(G, sh.size)[f] = -1
            m.warp_epoch[f] += 1
            return
        s = mask.arr.reshape(G, W, ws)
        f = s.all(-1)
        if not mask.full:
            partial = s.any(-1) & ~f
            if partial.any():
                flat = int(np.argmax(partial.reshape(-1)))
                g, w = divmod(flat, W)
                lane = int(np.argmax(~s[g, w]))
                m.fail("divergent_barrier", op, "simdgroup barrier reached by only part of the warp; "
                       "this thread does not reach it", g, w * ws + lane)
        m.warp_epoch[f] += 1
    return run


def _h_async_copy(m: _Machine, op: Op) -> Fn:
    """Issue: read the source now, mark the destination in flight (any access before the
    wait retires it is an error: on the hardware its contents are undefined until then)."""
    dst, src, size = str(op.attrs["dst"]), str(op.attrs["src"]), int(op.attrs["size"])  # type: ignore[arg-type]
    sh, buf = m.shared[dst], m.device[src]
    S, n = sh.size, len(buf)
    da, sa = m.slot(op.operands[0]), m.slot(op.operands[1])
    pa = m.slot(op.operands[2]) if len(op.operands) > 2 else None
    regs = m.regs
    op_id = m.register_op(op)
    lanes = np.arange(size, dtype=np.int64)

    def run(mask: _Mask) -> None:
        if not mask.any:
            return
        gi, ti = np.nonzero(mask.arr)
        d = regs[da][gi, ti].astype(np.int64)
        s_ = regs[sa][gi, ti].astype(np.int64)
        p = regs[pa][gi, ti] if pa is not None else np.ones(len(gi), bool)
        for what, idx, check in (("shared", d, np.ones(len(gi), bool)), ("device", s_, p)):
            mis = check & (idx % size != 0)
            if mis.any():
                q = int(np.argmax(mis))
                m.fail("misaligned", op, f"async_copy {what} index not a multiple of {size}",
                       int(gi[q]), int(ti[q]), index=int(idx[q]))
        bad = d + size > S
        if bad.any():
            q = int(np.argmax(bad))
            m.fail("bounds", op, f"shared @{dst} index out of bounds (size {S})", int(gi[q]), int(ti[q]),
                   index=int(d[q]))
        bad = p & (s_ + size > n)
        if bad.any():
            q = int(np.argmax(bad))
            m.fail("bounds", op, f"@{src} index out of bounds (size {n})", int(gi[q]), int(ti[q]),
                   index=int(s_[q]))
        safe = np.where(p, s_, 0)
        values = np.where(p[:, None], buf[safe[:, None] + lanes] if n else 0, 0).astype(buf.dtype)
        flat = (gi * S + d)[:, None] + lanes
        rep = np.repeat
        m.check_write(op, op_id, sh, flat.reshape(-1), rep(gi, size), rep(ti, size), rep(ti // m.ws, size), False)
        sh.in_flight[flat] = True
        m.async_pending.append(_AsyncCopies(op, op_id, sh, gi, ti, flat, values,
                                            m.async_commits[gi, ti].copy()))
    return run


def _h_async_commit(m: _Machine, op: Op) -> Fn:
    def run(mask: _Mask) -> None:
        m.async_commits[mask.arr] += 1
    return run


def _h_async_wait(m: _Machine, op: Op) -> Fn:
    """Retire, for each active thread, its copies in committed groups older than the
    `pending` most recent: they land now, as writes by the issuing thread."""
    pending = int(op.attrs["pending"])  # type: ignore[arg-type]

    def run(mask: _Mask) -> None:
        keep: list[_AsyncCopies] = []
        for rec in m.async_pending:
            done = mask.arr[rec.gi, rec.ti] & (rec.group < m.async_commits[rec.gi, rec.ti] - pending)
            if done.any():
                flat = rec.flat[done]
                size = flat.shape[1]
                rec.sh.in_flight[flat] = False
                gi, ti = np.repeat(rec.gi[done], size), np.repeat(rec.ti[done], size)
                m.check_write(rec.op, rec.op_id, rec.sh, flat.reshape(-1), gi, ti, ti // m.ws, False)
                rec.sh.data[flat] = rec.values[done]
            if not done.all():
                rest = ~done
                keep.append(_AsyncCopies(rec.op, rec.op_id, rec.sh, rec.gi[rest], rec.ti[rest],
                                         rec.flat[rest], rec.values[rest], rec.group[rest]))
        m.async_pending = keep
    return run


def _h_frag_elems(m: _Machine, op: Op) -> Fn:
    """Gather every lane's elements from the warp's tile through the target's lane layout."""
    from ..targets import TARGETS

    t = op.operands[0].type
    assert isinstance(t, FragmentType)
    rows, cols = TARGETS[str(m.kernel.attrs["target"])].lane_elements(t.role, t.rows, t.cols)  # type: ignore[misc]
    if rows.shape[0] != m.ws:
        raise InterpreterError(f"kernel {m.kernel.name}: {m.desc(op)}: the lane layout is for "
                               f"{rows.shape[0]} lanes, warps have {m.ws}", kind="unsupported", op=op)
    fa, r = m.slot(op.operands[0]), m.slot(op.result)
    regs = m.regs
    G, T = m.G, m.T

    def run(mask: _Mask) -> None:
        _warps(m, op, mask)
        frag = regs[fa]  # [G, W, rows, cols]
        regs[r] = frag[:, :, rows, cols].reshape(G, T, rows.shape[1])
    return run


def _h_fence(m: _Machine, op: Op) -> Fn:
    def run(mask: _Mask) -> None:
        pass
    return run


# ----- fragments ------------------------------------------------------------------------------

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


def _h_frag_zero(m: _Machine, op: Op) -> Fn:
    r = m.slot(op.result)
    regs = m.regs
    zero = _zeros(_shape(m, op.result.type), op.result.type)

    def run(mask: _Mask) -> None:
        _warps(m, op, mask)
        regs[r] = zero
    return run


def _tile_offsets(t: FragmentType, ld: int, transpose: bool) -> np.ndarray:
    rr = np.arange(t.rows, dtype=np.int64)[:, None]
    cc = np.arange(t.cols, dtype=np.int64)[None, :]
    return cc * ld + rr if transpose else rr * ld + cc


def _frag_memory(m: _Machine, op: Op, name: str, warps: np.ndarray, off: np.ndarray,
                 rel: np.ndarray, n: int):
    """(gi, wi, element indices [Nw, R, C]) of the active warps, bounds-checked."""
    gi, wi = np.nonzero(warps)
    idx = off[gi, wi].astype(np.int64)[:, None, None] + rel
    bad = idx >= n
    if bad.any():
        p = int(np.argmax(bad.reshape(len(gi), -1).any(1)))
        e = int(idx[p][bad[p]][0])
        m.fail("bounds", op, f"fragment access of @{name} out of bounds (size {n})",
               int(gi[p]), warp=int(wi[p]), index=e)
    return gi, wi, idx


def _h_frag_load(m: _Machine, op: Op) -> Fn:
    name = str(op.attrs["buffer"])
    oa = m.slot(op.operands[0])
    r = m.slot(op.result)
    regs = m.regs
    t = op.result.type
    assert isinstance(t, FragmentType)
    rel = _tile_offsets(t, int(op.attrs["ld"]), bool(op.attrs.get("transpose", False)))
    op_id = m.register_op(op)
    shape = _shape(m, t)
    zero = _zeros(shape, t)
    G, T, W = m.G, m.T, m.W
    shared = m.shared.get(name)
    src_elem = shared.decl.elem if shared else m.kernel.symbol(name).elem  # type: ignore[union-attr]

    def run(mask: _Mask) -> None:
        warps = _warps(m, op, mask)
        if not mask.full and not warps.any():
            regs[r] = zero
            return
        off = _warp_uniform(m, op, regs[oa], warps, "fragment offset")
        if shared is not None:
            sh = shared
            gi, wi, idx = _frag_memory(m, op, name, warps, off, rel, sh.size)
            flat = (gi * sh.size)[:, None, None] + idx
            k = rel.size
            m.check_read(op, op_id, sh, flat.reshape(-1), np.repeat(gi, k), np.repeat(T + wi, k),
                         np.repeat(wi, k), True)
            vals = sh.data[flat]
        else:
            buf = m.device[name]
            gi, wi, idx = _frag_memory(m, op, name, warps, off, rel, len(buf))
            vals = buf[idx]
        vals = _cast(vals, src_elem, t.elem)[0]
        if len(gi) == G * W:
            regs[r] = vals.reshape(shape)
        else:
            out = zero.copy()
            out[gi, wi] = vals
            regs[r] = out
    return run


def _h_frag_build(m: _Machine, op: Op) -> Fn:
    """Scatter every lane's elements into the warp's tile through the target's lane layout."""
    from ..targets import TARGETS

    t = op.result.type
    assert isinstance(t, FragmentType)
    rows, cols = TARGETS[str(m.kernel.attrs["target"])].lane_elements(t.role, t.rows, t.cols)  # type: ignore[misc]
    if rows.shape[0] != m.ws:
        raise InterpreterError(f"kernel {m.kernel.name}: {m.desc(op)}: the lane layout is for "
                               f"{rows.shape[0]} lanes, warps have {m.ws}", kind="unsupported", op=op)
    xs = [(m.slot(v), isinstance(v.type, VectorType)) for v in op.operands]
    r = m.slot(op.result)
    regs = m.regs
    G, W, ws = m.G, m.W, m.ws
    lanes = np.broadcast_to(np.arange(ws)[:, None], rows.shape)
    zero = _zeros(_shape(m, t), t)

    def run(mask: _Mask) -> None:
        warps = _warps(m, op, mask)
        parts = [regs[x] if is_vec else regs[x][..., None] for x, is_vec in xs]
        elems = np.concatenate(parts, axis=-1).reshape(G, W, ws, -1)
        out = zero.copy()
        out[:, :, rows, cols] = elems[:, :, lanes, np.arange(rows.shape[1])[None, :]]
        regs[r] = out if mask.full else np.where(warps[:, :, None, None], out, regs[r] if regs[r] is not None else zero)
    return run


def _h_frag_store(m: _Machine, op: Op) -> Fn:
    name = str(op.attrs["buffer"])
    _access_error(m, op, name, True)
    fa, oa = m.slot(op.operands[0]), m.slot(op.operands[1])
    regs = m.regs
    t = op.operands[0].type
    assert isinstance(t, FragmentType)
    rel = _tile_offsets(t, int(op.attrs["ld"]), False)
    op_id = m.register_op(op)
    T = m.T
    shared = m.shared.get(name)
    dst_elem = shared.decl.elem if shared else m.kernel.symbol(name).elem  # type: ignore[union-attr]

    def run(mask: _Mask) -> None:
        warps = _warps(m, op, mask)
        if not mask.full and not warps.any():
            return
        off = _warp_uniform(m, op, regs[oa], warps, "fragment offset")
        frag = regs[fa]
        if shared is not None:
            sh = shared
            gi, wi, idx = _frag_memory(m, op, name, warps, off, rel, sh.size)
        else:
            gi, wi, idx = _frag_memory(m, op, name, warps, off, rel, len(m.device[name]))
        vals, bad = _cast(frag[gi, wi], t.elem, dst_elem)
        if bad is not None and bad.any():
            p = int(np.argmax(bad.reshape(len(gi), -1).any(1)))
            m.fail("cast", op, f"fragment value out of range for {dst_elem}", int(gi[p]), warp=int(wi[p]))
        if shared is not None:
            sh = shared
            flat = ((gi * sh.size)[:, None, None] + idx).reshape(-1)
            k = rel.size
            m.check_write(op, op_id, sh, flat, np.repeat(gi, k), np.repeat(T + wi, k),
                          np.repeat(wi, k), True)
            sh.data[flat] = vals.reshape(-1)
        else:
            m.device[name][idx.reshape(-1)] = vals.reshape(-1)
    return run


def _h_mma(m: _Machine, op: Op) -> Fn:
    a, b, c = (m.slot(v) for v in op.operands)
    r = m.slot(op.result)
    regs = m.regs
    t = op.result.type
    assert isinstance(t, FragmentType)

    def run(mask: _Mask) -> None:
        _warps(m, op, mask)
        x, y, z = regs[a], regs[b], regs[c]
        if t.elem.is_float:
            acc = np.matmul(x.astype(np.float64), y.astype(np.float64)) + z.astype(np.float64)
            regs[r] = _round_f64(acc, t.elem)
        else:
            acc = np.matmul(x.astype(np.int64), y.astype(np.int64)) + z.astype(np.int64)
            regs[r] = acc.astype(t.elem.holding_dtype)
    return run


def _h_mma_sp(m: _Machine, op: Op) -> Fn:
    """c + A @ b with A (rows x 2*cols) rebuilt per warp from the compressed a and the metadata
    words of the lanes that the target's table names for the selector."""
    from ..targets import TARGETS

    a, b, c, e = (m.slot(v) for v in op.operands)
    r = m.slot(op.result)
    regs = m.regs
    t = op.result.type
    ta = op.operands[0].type
    assert isinstance(t, FragmentType) and isinstance(ta, FragmentType)
    selector = int(op.attrs["selector"])  # type: ignore[arg-type]
    fields = TARGETS[str(m.kernel.attrs["target"])].sparse_metadata(selector)
    assert fields is not None  # the verifier checked the target's sparse MMA
    lanes, bits, rows, groups, slots = fields
    if int(lanes.max()) >= m.ws:
        raise InterpreterError(f"kernel {m.kernel.name}: {m.desc(op)}: the metadata layout is for "
                               f"32 lanes, warps have {m.ws}", kind="unsupported", op=op)
    G, W, ws = m.G, m.W, m.ws
    nrows, ngroups = ta.rows, ta.cols // 2
    shifts = bits.astype(np.uint32)
    # which lane holds the fields of (row, group), for messages
    lane_of = np.zeros((nrows, ngroups), np.int64)
    lane_of[rows, groups] = lanes

    def run(mask: _Mask) -> None:
        warps = _warps(m, op, mask)
        words = regs[e].reshape(G, W, ws)
        idx = (words[:, :, lanes] >> shifts) & _U32(3)  # [G, W, fields]
        pos = np.zeros((G, W, nrows, ngroups, 2), np.int64)
        pos[:, :, rows, groups, slots] = idx
        unordered = (pos[..., 0] >= pos[..., 1]) & warps[:, :, None, None]
        if unordered.any():
            g, w, row, grp = (int(v) for v in np.argwhere(unordered)[0])
            lane = int(lane_of[row, grp])
            word = int(words[g, w, lane])
            m.fail("metadata", op, f"sparse metadata not ordered: row {row} group {grp} (logical "
                   f"columns {4 * grp}..{4 * grp + 3}) keeps indices {pos[g, w, row, grp].tolist()}, "
                   f"which must be distinct and increasing (undefined on the hardware); read from "
                   f"lane {lane}'s word {word:#010x} with selector {selector}",
                   g, w * ws + lane, index=word)
        x = regs[a].astype(np.float64).reshape(G, W, nrows, ngroups, 2)
        dense = np.zeros((G, W, nrows, ngroups, 4), np.float64)
        np.put_along_axis(dense, pos, x, axis=-1)  # inactive warps: don't-care values
        dense = dense.reshape(G, W, nrows, 4 * ngroups)
        acc = np.matmul(dense, regs[b].astype(np.float64)) + regs[c].astype(np.float64)
        regs[r] = _round_f64(acc, t.elem)
    return run


# ----- control flow -------------------------------------------------------------------------

def _h_for(m: _Machine, op: Op) -> Fn:
    lb, ub, st = (m.slot(v) for v in op.operands[:3])
    inits = [m.slot(v) for v in op.operands[3:]]
    body = op.regions[0]
    fns, yields = m.compile_block(body)
    arg_i = m.slot(body.args[0])
    args = [m.slot(v) for v in body.args[1:]]
    results = [m.slot(v) for v in op.results]
    types = [v.type for v in op.results]
    regs = m.regs

    def run(mask: _Mask) -> None:
        i, upper, step = regs[lb], regs[ub], regs[st]
        carried = [regs[s] for s in inits]
        active = mask.arr
        while True:
            act = active & (i < upper)
            inner = _Mask(act)
            if not inner.any:
                break
            zero = (step == 0) & act
            if zero.any():
                m.fail_lanes("loop", op, "for loop with step 0 never ends", zero)
            regs[arg_i] = i
            for s, v in zip(args, carried):
                regs[s] = v
            for fn in fns:
                fn(inner)
            new = [regs[s] for s in yields]
            nxt = i + step
            wrapped = (nxt < i) & act
            if wrapped.any():
                m.fail_lanes("loop", op, "for loop index wraps past 2^32", wrapped, i)
            if inner.full:
                carried = new
                i = nxt
            else:
                carried = [_merge(tp, act, nv, ov, m, op, "carried by the loop")
                           for tp, nv, ov in zip(types, new, carried)]
                i = np.where(act, nxt, i)
            active = act
        for s, v in zip(results, carried):
            regs[s] = v
    return run


def _run_region(fns: list[Fn], yields: list[int], regs: list, mask: _Mask) -> list:
    for fn in fns:
        fn(mask)
    return [regs[s] for s in yields]


def _h_if(m: _Machine, op: Op) -> Fn:
    cond = m.slot(op.operands[0])
    then_fns, then_y = m.compile_block(op.regions[0])
    else_fns, else_y = m.compile_block(op.regions[1])
    results = [m.slot(v) for v in op.results]
    types = [v.type for v in op.results]
    zeros = [_zeros(_shape(m, t), t) for t in types]
    regs = m.regs

    def run(mask: _Mask) -> None:
        c = regs[cond]
        tm = _Mask(mask.arr & c)
        em = _Mask(mask.arr & ~c) if not tm.full else _Mask(np.zeros_like(c), False)
        tv = _run_region(then_fns, then_y, regs, tm) if tm.any else None
        ev = _run_region(else_fns, else_y, regs, em) if em.any else None
        if tv is None and ev is None:
            out = zeros
        elif ev is None:
            out = tv
        elif tv is None:
            out = ev
        else:
            out = [_merge(t, tm.arr, a, b, m, op, "result of if") for t, a, b in zip(types, tv, ev)]
        for s, v in zip(results, out):
            regs[s] = v
    return run


def _h_switch(m: _Machine, op: Op) -> Fn:
    sel = m.slot(op.operands[0])
    cases = [int(c) for c in op.attrs["cases"]]  # type: ignore[union-attr]
    regions = [m.compile_block(reg) for reg in op.regions]
    results = [m.slot(v) for v in op.results]
    types = [v.type for v in op.results]
    zeros = [_zeros(_shape(m, t), t) for t in types]
    regs = m.regs

    def run(mask: _Mask) -> None:
        s = regs[sel]
        taken = np.zeros_like(mask.arr)
        out: list | None = None
        for k, (fns, ys) in enumerate(regions):
            if k < len(cases):
                arr = mask.arr & (s == cases[k]) & ~taken
            else:
                arr = mask.arr & ~taken
            taken = taken | arr
            rm = _Mask(arr)
            if not rm.any:
                continue
            vals = _run_region(fns, ys, regs, rm)
            out = vals if out is None else [_merge(t, arr, a, b, m, op, "result of switch")
                                            for t, a, b in zip(types, vals, out)]
        for slot, v in zip(results, out if out is not None else zeros):
            regs[slot] = v
    return run


_HANDLERS: dict[str, Callable[[_Machine, Op], Fn]] = {
    "const": _h_const, "index": _h_index, "scalar": _h_scalar,
    **{n: _h_binary for n in ("add", "sub", "mul", "min", "max", "and", "or", "xor",
                              "lt", "le", "gt", "ge", "eq", "ne")},
    "div": _h_divrem, "rem": _h_divrem, "shl": _h_shift, "shr": _h_shift,
    "fma": _h_fma, "select": _h_select, "cast": _h_cast, "bitcast": _h_bitcast,
    "load": _h_load, "vload": _h_load, "extract": _h_extract, "store": _h_store,
    "atomic_add": _h_atomic_add, "table": _h_table, "barrier": _h_barrier, "fence": _h_fence,
    "frag_zero": _h_frag_zero, "frag_load": _h_frag_load, "frag_build": _h_frag_build, "vec": _h_vec, "frag_store": _h_frag_store,
    "frag_elems": _h_frag_elems, "async_copy": _h_async_copy, "async_commit": _h_async_commit,
    "async_wait": _h_async_wait,
    "mma": _h_mma, "mma_sp": _h_mma_sp, "for": _h_for, "if": _h_if, "switch": _h_switch,
}
