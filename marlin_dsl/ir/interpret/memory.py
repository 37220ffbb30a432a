from __future__ import annotations

import numpy as np

from ...machine.target import TARGETS
from ..core import Op
from ..types import FragmentType
from ..numerics import _U32, _zeros
from .machine import Fn, InterpreterError, _AsyncCopies, _Machine, _Mask, _access_error, _shape, _warps


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


def _h_vstore_device(m: _Machine, op: Op, name: str, size: int) -> Fn:
    """vstore into device buffer `name`: each selected lane writes its vector's elements at
    index .. index + size (a multiple of size: what a wide store needs)."""
    _access_error(m, op, name, True)
    ia, va = m.slot(op.operands[0]), m.slot(op.operands[1])
    pa = m.slot(op.operands[2]) if len(op.operands) > 2 else None
    regs = m.regs
    buf = m.device[name]
    n = len(buf)
    lanes = np.arange(size, dtype=np.int64)

    def run(mask: _Mask) -> None:
        sel = mask.arr if pa is None else mask.arr & regs[pa]
        if not sel.any():
            return
        idx = regs[ia].astype(np.int64)
        bad = sel & (idx % size != 0)
        if bad.any():
            m.fail_lanes("misaligned", op, f"vstore index not a multiple of {size}", bad, regs[ia])
        bad = sel & (idx + size > n)
        if bad.any():
            m.fail_lanes("bounds", op, f"@{name} index out of bounds (size {n})", bad, regs[ia])
        flat = (idx[sel][:, None] + lanes).reshape(-1)
        buf[flat] = regs[va][sel].reshape(-1)
    return run


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
                    if sh.reads is not None:
                        sh.reads.tid.fill(-1)
                m.warp_epoch += 1
                if m.sync is not None:
                    m.sync.threadgroup_barrier(None)
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
                if sh.reads is not None:
                    sh.reads.clear_groups(f, G)
            m.warp_epoch[f] += 1
            if m.sync is not None:
                m.sync.threadgroup_barrier(f)
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


def _h_vstore(m: _Machine, op: Op) -> Fn:
    """A vector of `size` elements into a shared array or a device buffer, at an index that is
    a multiple of size."""
    name, size = str(op.attrs["buffer"]), int(op.attrs["size"])  # type: ignore[arg-type]
    if name not in m.shared:
        return _h_vstore_device(m, op, name, size)
    sh = m.shared[name]
    S = sh.size
    ia, va = m.slot(op.operands[0]), m.slot(op.operands[1])
    pa = m.slot(op.operands[2]) if len(op.operands) > 2 else None
    regs = m.regs
    op_id = m.register_op(op)
    lanes = np.arange(size, dtype=np.int64)

    def run(mask: _Mask) -> None:
        sel = mask.arr if pa is None else mask.arr & regs[pa]
        if not sel.any():
            return
        gi, ti = np.nonzero(sel)
        ii = regs[ia][gi, ti].astype(np.int64)
        mis = ii % size != 0
        if mis.any():
            q = int(np.argmax(mis))
            m.fail("misaligned", op, f"vstore index not a multiple of {size}", int(gi[q]), int(ti[q]), index=int(ii[q]))
        bad = ii + size > S
        if bad.any():
            q = int(np.argmax(bad))
            m.fail("bounds", op, f"shared @{name} index out of bounds (size {S})", int(gi[q]), int(ti[q]),
                   index=int(ii[q]))
        flat = ((gi * S + ii)[:, None] + lanes).reshape(-1)
        rep = np.repeat
        m.check_write(op, op_id, sh, flat, rep(gi, size), rep(ti, size), rep(ti // m.ws, size), False)
        sh.data[flat] = regs[va][gi, ti].reshape(-1)
    return run
