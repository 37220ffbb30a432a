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
- the sparse form (a metadata word and a selector) rebuilds each warp's dense A from the
  compressed one as mma_sp does (`fragments.SparseA`), B then k = warpgroup_sparse_k deep;
- the result is computed at issue (A @ B + c in float64, rounded to f32 once) but is in flight
  until a `wgmma_wait` retires its group: until then no thread may write the B elements it
  reads, and the wait that returns its accumulator chain must retire it. (The verifier makes
  sure the result is read only through the wait, `tensor_rules.warpgroup_chains`.)
"""
from __future__ import annotations

import numpy as np

from ...machine.target import TARGETS, Target
from ..core import Op
from ..numerics import _round_f64
from ..types import FragmentType
from .fragments import SparseA
from .clocks import read_stamps
from .machine import Fn, InterpreterError, _Machine, _Mask, _warp_uniform, _warps


class _Issued:
    """One wgmma execution: which warps issued it, the B elements each reads (flat indices,
    [warps, k * n]) and the group index of each warp's issue."""

    __slots__ = ("op", "gi", "wi", "flat", "group", "sh", "op_id")

    def __init__(self, op: Op, gi: np.ndarray, wi: np.ndarray, flat: np.ndarray, group: np.ndarray, sh,
                 op_id: int) -> None:
        self.op, self.gi, self.wi, self.flat, self.group, self.sh = op, gi, wi, flat, group, sh
        self.op_id = op_id


def _target(m: _Machine) -> Target:
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
    a, oa, c = (m.slot(v) for v in op.operands[:3])
    r = m.slot(op.result)
    regs = m.regs
    tc = op.result.type
    assert isinstance(tc, FragmentType) and layout is not None and target.warpgroup_mma is not None
    k, n = target.warpgroup_mma[2], tc.cols
    sparse = None
    if len(op.operands) == 4:  # 2:4: A compressed to k/2 columns, each warp's own metadata
        k = int(target.warpgroup_sparse_k)  # type: ignore[arg-type]
        sparse = SparseA(m, op, int(op.attrs["selector"]), tc.rows, k // 4)  # type: ignore[arg-type]
        e = m.slot(op.operands[3])
    a_k = k // 2 if sparse is not None else k
    b_tile = _SwizzledTile(m, op, str(op.attrs["smem"]), layout, n, k)
    # A from shared memory: warp w of its warpgroup reads rows (w % warps) * mma_m .. of the tile
    a_tile = _SwizzledTile(m, op, str(op.attrs["smem_a"]), layout, tc.rows, a_k) if "smem_a" in op.attrs else None
    per = target.warpgroup_warps
    op_id = m.register_op(op)

    def run(mask: _Mask) -> None:
        warps = _warps(m, op, mask)
        if not warps.any():
            return
        _warpgroups(m, op, warps)
        off = _warp_uniform(m, op, regs[oa], warps, "wgmma b offset").astype(np.int64)
        _check_uniform(m, op, off, warps, per, "b")
        unfenced = warps & ~m.wg_fenced
        if unfenced.any():
            g, w = (int(v) for v in np.argwhere(unfenced)[0])
            m.fail("async", op, "wgmma without a wgmma_fence of its warp since the last "
                   "wgmma_commit (registers written before a batch need the fence)", g, warp=w)
        gi, wi = np.nonzero(warps)
        b_flat, bt = b_tile.read(off[gi, wi], gi, wi, np.zeros_like(wi), op_id)  # [warps, n, k] = B^T
        if a_tile is not None:
            a_off = _warp_uniform(m, op, regs[a], warps, "wgmma a offset").astype(np.int64)
            _check_uniform(m, op, a_off, warps, per, "a")
            a_flat, av = a_tile.read(a_off[gi, wi], gi, wi, (wi % per) * tc.rows, op_id)
            flats = [b_flat, a_flat]
        else:
            av, flats = regs[a][gi, wi].astype(np.float64), [b_flat]
        if sparse is not None:  # the metadata is read at issue (PTX keeps only a and d in flight)
            av = sparse.dense(av, regs[e].reshape(m.G, m.W, m.ws), gi, wi)
        prod = np.matmul(av, np.swapaxes(bt, 1, 2))
        out = regs[c].copy() if regs[c] is not None else np.zeros((m.G, m.W, tc.rows, n), np.float32)
        out[gi, wi] = _round_f64(prod + regs[c][gi, wi].astype(np.float64), tc.elem)
        regs[r] = out
        for fl in flats:
            np.add.at(fl[1].sh.wg_reading, fl[0].reshape(-1), 1)
            m.wg_pending.append(_Issued(op, gi, wi, fl[0].reshape(len(gi), -1), m.wg_commits[gi, wi].copy(),
                                        fl[1].sh, op_id))
    return run


def _check_uniform(m: _Machine, op: Op, off: np.ndarray, warps: np.ndarray, per: int, what: str) -> None:
    wg_off = off.reshape(m.G, m.W // per, per)
    differ = (wg_off != wg_off[..., :1]).any(-1) & warps.reshape(m.G, m.W // per, per).all(-1)
    if differ.any():
        g, q = (int(v) for v in np.argwhere(differ)[0])
        m.fail("collective", op, f"wgmma {what} offset differs across warpgroup {q}: "
               f"{wg_off[g, q].tolist()}", g, warp=q * per)


class _SwizzledTile:
    """A tile a wgmma reads from shared memory in the target's swizzled rows: `rows` x `k`
    logical elements from an element offset (a tile starts at an atom; its k columns stay in
    one row and start at a 16-byte chunk)."""

    def __init__(self, m: _Machine, op: Op, name: str, layout, rows: int, k: int) -> None:
        self.m, self.op, self.name, self.layout = m, op, name, layout
        self.sh = m.shared[name]
        self.eb = self.sh.decl.elem.bits // 8
        if self.sh.decl.align < layout.align:
            raise InterpreterError(f"kernel {m.kernel.name}: {m.desc(op)}: @{name} is aligned to "
                                   f"{self.sh.decl.align} bytes, the swizzled rows need {layout.align}",
                                   kind="misaligned", op=op)
        self.row_elems = layout.row_bytes // self.eb
        self.atom_elems = layout.align // self.eb
        self.rows, self.cols = np.meshgrid(np.arange(rows), np.arange(k), indexing="ij")
        self.k = k

    def read(self, o: np.ndarray, gi: np.ndarray, wi: np.ndarray, row0: np.ndarray, op_id: int):
        """((flat indices [warps, rows, k], shared), values float64 [warps, rows, k]) of the tile
        at element offsets o, rows row0 + 0.. of it, each warp reading collectively; checked."""
        m, sh, layout, name = self.m, self.sh, self.layout, self.name
        col0 = o % self.row_elems
        base = o - col0
        bad = (base % self.atom_elems != 0) | ((col0 * self.eb) % layout.chunk_bytes != 0) | (col0 + self.k > self.row_elems)
        if bad.any():
            p = int(np.argmax(bad))
            m.fail("misaligned", self.op, f"wgmma offset {int(o[p])} of @{name}: a tile starts at an "
                   f"atom ({layout.align} bytes) and its k columns stay in one {layout.row_bytes}-byte "
                   "row, starting at a 16-byte chunk", int(gi[p]), warp=int(wi[p]), index=int(o[p]))
        rel = layout.element(row0[:, None, None] + self.rows[None], col0[:, None, None] + self.cols[None], self.eb)
        idx = base[:, None, None] + rel
        S = sh.size
        if (idx >= S).any():
            p = int(np.argmax((idx >= S).reshape(len(gi), -1).any(1)))
            m.fail("bounds", self.op, f"wgmma reads @{name} out of bounds (size {S})", int(gi[p]),
                   warp=int(wi[p]), index=int(idx[p].max()))
        flat = (gi * S)[:, None, None] + idx
        fl = flat.reshape(-1)
        reps = idx[0].size
        m.check_read(self.op, op_id, sh, fl, np.repeat(gi, reps), np.repeat(m.T + wi, reps), np.repeat(wi, reps), True)
        dirty = sh.gen_writer[fl] >= 0
        if dirty.any():
            p = int(np.argmax(dirty))
            g = int(gi[p // reps])
            m.fail("async", self.op, f"wgmma reads shared @{name} written by "
                   f"{m.who(int(sh.gen_writer[fl[p]]))} with no fence async_proxy of that thread after "
                   "the write", g, warp=int(wi[p // reps]), index=int(fl[p] - g * S))
        return (flat, self), sh.data[flat].astype(np.float64)


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


def _h_wgmma_wait(m: _Machine, op: Op) -> Fn:
    """Retire this warp's groups older than the `pending` most recent. A wait that returns an
    accumulator (pending 0) must leave nothing in flight: a wgmma never committed is an error."""
    pending = int(op.attrs["pending"])  # type: ignore[arg-type]
    readable = bool(op.results)
    c = m.slot(op.operands[0]) if readable else None
    r = m.slot(op.result) if readable else None
    regs = m.regs

    def run(mask: _Mask) -> None:
        warps = _warps(m, op, mask)
        _warpgroups(m, op, warps)
        keep = []
        for rec in m.wg_pending:
            done = warps[rec.gi, rec.wi] & (rec.group < m.wg_commits[rec.gi, rec.wi] - pending)
            if done.any():
                np.subtract.at(rec.sh.wg_reading, rec.flat[done].reshape(-1), 1)
                if m.sync is not None:
                    _restamp(m, rec, done)
            if not done.all():
                rest = ~done
                left = _Issued(rec.op, rec.gi[rest], rec.wi[rest], rec.flat[rest], rec.group[rest], rec.sh,
                               rec.op_id)
                if readable and warps[left.gi, left.wi].any():
                    p = int(np.argmax(warps[left.gi, left.wi]))
                    m.fail("async", op, f"returns an accumulator while the wgmma giving "
                           f"%{rec.op.result.name} was never committed", int(left.gi[p]), warp=int(left.wi[p]))
                keep.append(left)
        m.wg_pending = keep
        if readable:
            regs[r] = regs[c] if mask.full or regs[r] is None else np.where(warps[:, :, None, None], regs[c], regs[r])
    return run


def _restamp(m: _Machine, rec: _Issued, done: np.ndarray) -> None:
    """Warp roles (clocks.py): the retired wgmmas read their tiles until now, their wgmma_wait;
    their warps' read records get the warps' clocks now, so only an arrive after the wait
    releases the tiles to a warp that overwrites them."""
    assert m.sync is not None
    reps = rec.flat.shape[1]
    gi, wi = np.repeat(rec.gi[done], reps), np.repeat(rec.wi[done], reps)
    read_stamps(rec.sh, m.W).restamp(rec.flat[done].reshape(-1), wi, m.T + wi, m.warp_epoch[gi, wi],
                                     m.sync.rc[gi, wi], rec.op_id)


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
