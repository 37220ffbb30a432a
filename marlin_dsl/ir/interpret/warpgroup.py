"""Interpreter handlers of the warpgroup MMA (docs/IR.md, "Warpgroup MMA"): `wgmma`,
`wgmma_fence`, `wgmma_commit`, `wgmma_wait`, and `fence` with scope async_proxy.

A wgmma is modelled per warp (each warp's rows of the 64 x N product: its a fragment times the
B tile every warp of the warpgroup reads from shared memory) and checked as the hardware needs
it to be used:

- every warp of a warpgroup issues it, with one B offset (warpgroup-uniform);
- B's elements were written (never-written elements are an error), not by a copy still in
  flight, not racing with another thread's write (a barrier between), and each ordinary write
  of them was followed by its thread's `fence async_proxy` (the tensor cores read shared
  memory through the asynchronous proxy);
- a batch of wgmmas starts with a `wgmma_fence` of the warp (after the last commit);
- the result is computed at issue (A @ B + c in float64, rounded to f32 once) but is in flight
  until a `wgmma_wait` retires its group: until then no thread may write the B elements it
  reads, and the wait that returns its accumulator chain must retire it. (The verifier makes
  sure the result is read only through the wait, `tensor_rules.warpgroup_chains`.)
"""
from __future__ import annotations

import numpy as np

from ..core import Op
from ..numerics import _round_f64
from ..types import FragmentType
from .machine import Fn, InterpreterError, _Machine, _Mask, _warp_uniform, _warps


class _Issued:
    """One wgmma execution: which warps issued it, the B elements each reads (flat indices,
    [warps, k * n]) and the group index of each warp's issue."""

    __slots__ = ("op", "gi", "wi", "flat", "group", "sh")

    def __init__(self, op: Op, gi: np.ndarray, wi: np.ndarray, flat: np.ndarray, group: np.ndarray, sh) -> None:
        self.op, self.gi, self.wi, self.flat, self.group, self.sh = op, gi, wi, flat, group, sh


def _target(m: _Machine):
    from ...targets.base import TARGETS

    return TARGETS[str(m.kernel.attrs["target"])]


def _warpgroups(m: _Machine, op: Op, warps: np.ndarray) -> int:
    """Warps per warpgroup; a warpgroup partly executing the op is an error."""
    per = _target(m).warpgroup_warps
    wg = warps.reshape(m.G, m.W // per, per)
    partial = wg.any(-1) & ~wg.all(-1)
    if partial.any():
        g, q = (int(v) for v in np.argwhere(partial)[0])
        w = q * per + int(np.argmax(~wg[g, q]))
        m.fail("collective", op, f"warpgroup op executed by part of warpgroup {q} "
               f"({int(wg[g, q].sum())} of {per} warps); this warp does not", g, warp=w)
    return per


def _h_wgmma(m: _Machine, op: Op) -> Fn:
    target = _target(m)
    layout = target.warpgroup_b_layout
    a, oa, c = (m.slot(v) for v in op.operands)
    r = m.slot(op.result)
    regs = m.regs
    ta, tc = op.operands[0].type, op.result.type
    assert isinstance(ta, FragmentType) and isinstance(tc, FragmentType) and layout is not None
    name = str(op.attrs["smem"])
    sh = m.shared[name]
    eb = sh.decl.elem.bits // 8
    k, n = ta.cols, tc.cols
    if sh.decl.align < layout.align:
        raise InterpreterError(f"kernel {m.kernel.name}: {m.desc(op)}: @{name} is aligned to "
                               f"{sh.decl.align} bytes, the swizzled rows need {layout.align}",
                               kind="misaligned", op=op)
    row_elems = layout.row_bytes // eb
    atom_elems = layout.align // eb
    rows, cols = np.meshgrid(np.arange(n), np.arange(k), indexing="ij")  # B^T: [n, k]
    op_id = m.register_op(op)
    T, S = m.T, sh.size

    def run(mask: _Mask) -> None:
        warps = _warps(m, op, mask)
        if not warps.any():
            return
        per = _warpgroups(m, op, warps)
        off = _warp_uniform(m, op, regs[oa], warps, "wgmma b offset").astype(np.int64)
        wg_off = off.reshape(m.G, m.W // per, per)
        differ = (wg_off != wg_off[..., :1]).any(-1) & warps.reshape(m.G, m.W // per, per).all(-1)
        if differ.any():
            g, q = (int(v) for v in np.argwhere(differ)[0])
            m.fail("collective", op, f"wgmma b offset differs across warpgroup {q}: "
                   f"{wg_off[g, q].tolist()}", g, warp=q * per)
        unfenced = warps & ~m.wg_fenced
        if unfenced.any():
            g, w = (int(v) for v in np.argwhere(unfenced)[0])
            m.fail("async", op, "wgmma without a wgmma_fence of its warp since the last "
                   "wgmma_commit (registers written before a batch need the fence)", g, warp=w)
        gi, wi = np.nonzero(warps)
        o = off[gi, wi]
        col0 = o % row_elems
        base = o - col0
        bad = (base % atom_elems != 0) | ((col0 * eb) % layout.chunk_bytes != 0) | (col0 + k > row_elems)
        if bad.any():
            p = int(np.argmax(bad))
            m.fail("misaligned", op, f"wgmma b offset {int(o[p])} of @{name}: a tile starts at an "
                   f"atom ({layout.align} bytes) and its k columns stay in one {layout.row_bytes}-byte "
                   "row, starting at a 16-byte chunk", int(gi[p]), warp=int(wi[p]), index=int(o[p]))
        rel = layout.element(rows[None], col0[:, None, None] + cols[None], eb)  # [warps, n, k]
        idx = base[:, None, None] + rel
        if (idx >= S).any():
            p = int(np.argmax((idx >= S).reshape(len(gi), -1).any(1)))
            m.fail("bounds", op, f"wgmma reads @{name} out of bounds (size {S})", int(gi[p]),
                   warp=int(wi[p]), index=int(idx[p].max()))
        flat = (gi * S)[:, None, None] + idx
        fl = flat.reshape(-1)
        reps = n * k
        m.check_read(op, op_id, sh, fl, np.repeat(gi, reps), np.repeat(T + wi, reps), np.repeat(wi, reps), True)
        dirty = sh.gen_writer[fl] >= 0
        if dirty.any():
            p = int(np.argmax(dirty))
            g = int(gi[p // reps])
            m.fail("async", op, f"wgmma reads shared @{name} written by {m.who(int(sh.gen_writer[fl[p]]))} "
                   "with no fence async_proxy of that thread after the write", g,
                   warp=int(wi[p // reps]), index=int(fl[p] - g * S))
        bt = sh.data[flat].astype(np.float64)  # [warps, n, k] = B^T
        prod = np.matmul(regs[a][gi, wi].astype(np.float64), np.swapaxes(bt, 1, 2))
        out = regs[c].copy() if regs[c] is not None else np.zeros((m.G, m.W, tc.rows, n), np.float32)
        out[gi, wi] = _round_f64(prod + regs[c][gi, wi].astype(np.float64), tc.elem)
        regs[r] = out
        np.add.at(sh.wg_reading, fl, 1)
        m.wg_pending.append(_Issued(op, gi, wi, flat.reshape(len(gi), -1), m.wg_commits[gi, wi].copy(), sh))
    return run


def _h_wgmma_fence(m: _Machine, op: Op) -> Fn:
    def run(mask: _Mask) -> None:
        warps = _warps(m, op, mask)
        _warpgroups(m, op, warps)
        m.wg_fenced[warps] = True
    return run


def _h_wgmma_commit(m: _Machine, op: Op) -> Fn:
    def run(mask: _Mask) -> None:
        warps = _warps(m, op, mask)
        _warpgroups(m, op, warps)
        m.wg_commits[warps] += 1
        m.wg_fenced[warps] = False
    return run


def _chain(op: Op, kernel) -> set[int]:
    """The wgmma ops whose accumulators flow (within one block) into `op`'s first operand."""
    producer = {id(r): o for o in kernel.walk() for r in o.results}
    out: set[int] = set()
    src = producer.get(id(op.operands[0]))
    while src is not None and src.name == "wgmma":
        out.add(id(src))
        src = producer.get(id(src.operands[2]))
    return out


def _h_wgmma_wait(m: _Machine, op: Op) -> Fn:
    pending = int(op.attrs["pending"])  # type: ignore[arg-type]
    c, r = m.slot(op.operands[0]), m.slot(op.result)
    regs = m.regs
    chain = _chain(op, m.kernel)

    def run(mask: _Mask) -> None:
        warps = _warps(m, op, mask)
        _warpgroups(m, op, warps)
        keep = []
        for rec in m.wg_pending:
            done = warps[rec.gi, rec.wi] & (rec.group < m.wg_commits[rec.gi, rec.wi] - pending)
            if done.any():
                np.subtract.at(rec.sh.wg_reading, rec.flat[done].reshape(-1), 1)
            if not done.all():
                rest = ~done
                left = _Issued(rec.op, rec.gi[rest], rec.wi[rest], rec.flat[rest], rec.group[rest], rec.sh)
                if id(rec.op) in chain and warps[left.gi, left.wi].any():
                    p = int(np.argmax(warps[left.gi, left.wi]))
                    uncommitted = left.group[p] >= m.wg_commits[left.gi[p], left.wi[p]]
                    why = "was never committed" if uncommitted else f"is not among the groups it retires (pending={pending})"
                    m.fail("async", op, f"returns the accumulator of the wgmma giving "
                           f"%{rec.op.result.name}, whose group {why}", int(left.gi[p]), warp=int(left.wi[p]))
                keep.append(left)
        m.wg_pending = keep
        regs[r] = regs[c] if mask.full or regs[r] is None else np.where(warps[:, :, None, None], regs[c], regs[r])
    return run


def _h_fence(m: _Machine, op: Op) -> Fn:
    """device/threadgroup fences order memory the interpreter keeps coherent (nothing to do);
    async_proxy makes this thread's earlier shared-memory writes readable by wgmma."""
    scope = str(op.attrs["scope"])
    shared = list(m.shared.values())
    G, T, ws = m.G, m.T, m.ws

    def run(mask: _Mask) -> None:
        if scope != "async_proxy":
            return
        garr = np.arange(G)[:, None]
        warp_active = mask.arr.reshape(G, T // ws, ws).any(-1)
        for sh in shared:
            gw = sh.gen_writer.reshape(G, sh.size)
            thread = (gw >= 0) & (gw < T)
            own = thread & mask.arr[garr, np.where(thread, gw, 0)]
            coll = gw >= T  # a warp's collective write (T + warp)
            own |= coll & warp_active[garr, np.where(coll, gw - T, 0)]
            gw[own] = -1
    return run


__all__ = ["_h_fence", "_h_wgmma", "_h_wgmma_commit", "_h_wgmma_fence", "_h_wgmma_wait"]
