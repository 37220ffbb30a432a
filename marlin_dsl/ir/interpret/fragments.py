from __future__ import annotations

import numpy as np

from ...machine.target import TARGETS
from ..core import Op
from ..types import FragmentType, VectorType
from ..numerics import _U32, _cast, _round_f64, _zeros
from .machine import Fn, InterpreterError, _Machine, _Mask, _access_error, _shape, _warp_uniform, _warps


# ----- fragments ------------------------------------------------------------------------------

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


def _h_shfl_xor(m: _Machine, op: Op) -> Fn:
    """Every lane takes the operand of lane (lane xor mask) of its warp; a partially active
    warp is an error (collective), as on the hardware, where an absent lane's value is undefined."""
    x = m.slot(op.operands[0])
    r = m.slot(op.result)
    regs = m.regs
    G, W, ws = m.G, m.W, m.ws
    lane_mask = int(op.attrs["mask"])
    if lane_mask >= ws:
        raise InterpreterError(f"kernel {m.kernel.name}: {m.desc(op)}: mask {lane_mask} names a lane "
                               f"past the warp's {ws}", kind="unsupported", op=op)
    source = np.arange(ws) ^ lane_mask

    def run(mask: _Mask) -> None:
        warps = _warps(m, op, mask)
        v = regs[x]
        tail = v.shape[2:]
        moved = v.reshape(G, W, ws, *tail)[:, :, source].reshape(v.shape)
        if mask.full:
            regs[r] = moved
            return
        keep = np.repeat(warps, ws, axis=1).reshape(G, W * ws, *([1] * len(tail)))
        regs[r] = np.where(keep, moved, regs[r] if regs[r] is not None else np.zeros_like(moved))
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


class SparseA:
    """The decompression of a 2:4 sparse MMA's A per warp (mma_sp, and the sparse wgmma whose
    warps each take the same A and metadata): compressed values (rows x 2 groups) and the
    metadata words of the lanes that the target's table names for the selector -> the dense
    rows x 4 groups, with unordered indices refused (undefined on the hardware)."""

    def __init__(self, m: _Machine, op: Op, selector: int, nrows: int, ngroups: int) -> None:
        fields = TARGETS[str(m.kernel.attrs["target"])].sparse_metadata(selector)
        assert fields is not None  # the verifier checked the target's sparse MMA
        self.lanes, bits, self.rows, self.groups, self.slots = fields
        if int(self.lanes.max()) >= m.ws:
            raise InterpreterError(f"kernel {m.kernel.name}: {m.desc(op)}: the metadata layout is for "
                                   f"32 lanes, warps have {m.ws}", kind="unsupported", op=op)
        self.m, self.op, self.selector = m, op, selector
        self.nrows, self.ngroups = nrows, ngroups
        self.shifts = bits.astype(np.uint32)
        # which lane holds the fields of (row, group), for messages
        self.lane_of = np.zeros((nrows, ngroups), np.int64)
        self.lane_of[self.rows, self.groups] = self.lanes

    def dense(self, values: np.ndarray, words: np.ndarray, gi: np.ndarray, wi: np.ndarray) -> np.ndarray:
        """values [n, rows, 2 * groups] (compressed, float64) and words [G, W, lanes] for the
        warps (gi, wi) -> the dense A [n, rows, 4 * groups]."""
        m, nrows, ngroups = self.m, self.nrows, self.ngroups
        w = words[gi, wi]  # [n, lanes]
        idx = (w[:, self.lanes] >> self.shifts) & _U32(3)  # [n, fields]
        pos = np.zeros((len(gi), nrows, ngroups, 2), np.int64)
        pos[:, self.rows, self.groups, self.slots] = idx
        unordered = pos[..., 0] >= pos[..., 1]
        if unordered.any():
            p, row, grp = (int(v) for v in np.argwhere(unordered)[0])
            lane = int(self.lane_of[row, grp])
            word = int(w[p, lane])
            m.fail("metadata", self.op, f"sparse metadata not ordered: row {row} group {grp} (logical "
                   f"columns {4 * grp}..{4 * grp + 3}) keeps indices {pos[p, row, grp].tolist()}, "
                   f"which must be distinct and increasing (undefined on the hardware); read from "
                   f"lane {lane}'s word {word:#010x} with selector {self.selector}",
                   int(gi[p]), int(wi[p]) * m.ws + lane, index=word)
        x = values.reshape(len(gi), nrows, ngroups, 2)
        dense = np.zeros((len(gi), nrows, ngroups, 4), np.float64)
        np.put_along_axis(dense, pos, x, axis=-1)
        return dense.reshape(len(gi), nrows, 4 * ngroups)


def _h_mma_sp(m: _Machine, op: Op) -> Fn:
    """c + A @ b with A (rows x 2*cols) rebuilt per warp from the compressed a and the metadata
    words (`SparseA`)."""
    a, b, c, e = (m.slot(v) for v in op.operands)
    r = m.slot(op.result)
    regs = m.regs
    t = op.result.type
    ta = op.operands[0].type
    assert isinstance(t, FragmentType) and isinstance(ta, FragmentType)
    sparse = SparseA(m, op, int(op.attrs["selector"]), ta.rows, ta.cols // 2)  # type: ignore[arg-type]
    G, W, ws = m.G, m.W, m.ws

    def run(mask: _Mask) -> None:
        warps = _warps(m, op, mask)
        gi, wi = np.nonzero(warps)
        dense = np.zeros((G, W, ta.rows, 2 * ta.cols), np.float64)  # inactive warps: don't-care values
        dense[gi, wi] = sparse.dense(regs[a][gi, wi].astype(np.float64), regs[e].reshape(G, W, ws), gi, wi)
        acc = np.matmul(dense, regs[b].astype(np.float64)) + regs[c].astype(np.float64)
        regs[r] = _round_f64(acc, t.elem)
    return run


