"""Operand source of the warpgroup pipeline: each K step's activation tile copied into
shared-memory stages asynchronously, as the rows the warpgroup MMA reads its B from (the
target's swizzled rows, `Target.warpgroup_b_layout`), with the K positions in the order the
weight layout uses (`StreamLayout.k_perm`: MMA K position p of a step holds original offset
k_perm[p]).

Copies move `granule` activations at a time: the largest run (up to the target's widest
asynchronous copy) that the K order keeps together, so each copy lands in one place. With
Marlin's K shuffle runs of 2 stay together (4-byte copies); without it whole 16-byte chunks do.
Rows past M and positions past K are zero-filled (predicated copies). Needs the stream setup
(`stream_family.py`) and `x_stage`, `n_stages`, `row` of the lowering."""
from __future__ import annotations

import numpy as np

from ...errors import CompileError
from ...ir import U32, ConstTable, Value
from .context import GemmParts


def k_positions(k_perm: np.ndarray | None, chunk: int) -> np.ndarray:
    """pos[o]: the MMA K position of original offset o within a chunk (the inverse order)."""
    if k_perm is None:
        return np.arange(chunk)
    pos = np.empty(chunk, dtype=np.int64)
    pos[np.asarray(k_perm)] = np.arange(chunk)
    return pos


def copy_granule(pos: np.ndarray, widest: int) -> int:
    """The largest power of two g <= widest such that every aligned run of g original offsets
    lands on g consecutive positions starting at a multiple of g."""
    g = widest
    while g > 1:
        runs = pos.reshape(-1, g)
        if ((runs[:, 0] % g == 0) & (np.diff(runs, axis=1) == 1).all(axis=1)).all():
            return g
        g //= 2
    return 1


class SwizzledStages(GemmParts):
    """Copies of the activation tile into the swizzled stages, and the B offsets of a stage."""

    def init_swizzled(self, original_order: bool = False) -> None:
        """The copy granule and the position table (no IR emitted). `original_order`: the
        activations keep their own K order in shared memory (the decoded weights are stored
        in that order instead), so whole 16-byte chunks are copied."""
        layout = self.target.warpgroup_b_layout
        elem_bytes = self.act.bits // 8
        self.row = layout.row_bytes // elem_bytes
        self.per_chunk = layout.chunk_bytes // elem_bytes
        self.atom_rows = layout.atom_rows
        chunk = self.layout.dense_chunk
        if chunk % self.row or (chunk != self.row and self.layout.k_perm is not None):
            raise CompileError(f"warpgroup: a K vector of {chunk} is not a whole number of swizzled "
                               f"rows of {self.row} in its own K order")
        #: a step's tile is `atoms` tiles of one swizzled row (`row` K positions) per M row,
        #: atom j (K positions row j .. row j + row - 1 of the step) at j * atom_elems
        self.atoms = self.s.tile_k // self.row
        self.atom_elems = self.s.tile_m * self.row
        self.x_pos = k_positions(None if original_order else self.layout.k_perm, self.row)
        granule_k = self.fmt.k_granule & -self.fmt.k_granule  # K is a multiple of this
        widest = max(1, min(self.target.async_copy_bytes // elem_bytes, granule_k, self.per_chunk))
        self.granule = copy_granule(self.x_pos, widest)
        if self.granule * elem_bytes < 4:
            raise CompileError(f"warpgroup: format {self.fmt.name!r} keeps no 4-byte run of K together "
                               "(asynchronous copies move 4, 8 or 16 bytes)")
        self.per_row = self.atoms * self.row // self.granule  # copy pieces of one M row of a step

    def swizzled_tables(self) -> list[ConstTable]:
        """x_pos[c]: the MMA position of the step's copy piece c (original offset c * granule)."""
        return [ConstTable("x_pos", U32, tuple(int(p) for p in self.x_pos[::self.granule]))]

    def setup_copies(self) -> None:
        """The copy mapping's per-thread parts, emitted once before the K loop. Piece e =
        i * threads + tid of a step is (row e / per_row, piece c = e % per_row). Where a pass of
        the threads covers whole swizzle atoms (threads / per_row rows, a multiple of the atom),
        every pass of a thread has the same piece c and the same row phase, so its destination
        and source are one base plus a constant per pass (`regular`); otherwise each piece is
        computed in full (`issue_x` generic path)."""
        s = self.s
        pieces = s.tile_m * self.per_row
        self.passes = -(-pieces // self.threads)
        self.regular = (self.threads % self.per_row == 0 and pieces % self.threads == 0
                        and (self.threads // self.per_row) % self.atom_rows == 0)
        if not self.regular:
            return
        self.rows_per_pass = self.threads // self.per_row
        row0 = self.op2("div", self.tid, self.per_row, hint="xr")
        c = self.op2("rem", self.tid, self.per_row, hint="xc")
        self.x_dst0 = self.swizzled_index(row0, c)
        self.x_kc = self.op2("mul", c, self.granule, hint="kc")
        self.x_row0 = self.op2("add", self.m0, row0, hint="xm")
        self.x_src0 = self.op2("add", self.op2("mul", self.x_row0, self.K, hint="xi"), self.x_kc, hint="xi")
        self.x_pass_src = self.op2("mul", self.K, self.rows_per_pass, hint="xi")
        # whole tiles: every row inside M and K a whole number of steps (no predicates)
        rows_in = self.op2("le", self.op2("add", self.m0, s.tile_m, hint="xm"), self.M, hint="full")
        whole_k = self.op2("eq", self.op2("rem", self.K, self.s.tile_k, hint="full"), 0, hint="full")
        self.x_full = self.op2("and", rows_in, whole_k, hint="full")

    def swizzled_index(self, r: Value, c: Value) -> Value:
        """Element index (within a stage) of copy piece c of row r: piece c lies in atom
        j = c / pieces, where chunk p / per_chunk of row r, for position p = x_pos[c % pieces],
        is stored at chunk (p / per_chunk) ^ (r % atom_rows)."""
        b = self.b
        pieces = self.row // self.granule
        atom, c = (self.op2("div", c, pieces, hint="xa"), self.op2("rem", c, pieces, hint="xc")) \
            if self.atoms > 1 else (None, c)
        p = b.value("table", [c], U32, {"name": "x_pos"}, hint="xp")
        idx = self.swizzled_element(r, p)
        return idx if atom is None else self.op2("add", idx, self.op2("mul", atom, self.atom_elems, hint="xd"), hint="xd")

    def swizzled_element(self, r: Value, col: Value) -> Value:
        """Element index (from an atom-aligned tile start) of logical (row r, column col) in
        the target's swizzled rows: `SwizzledRows.element` as IR."""
        swz = self.op2("xor", self.op2("div", col, self.per_chunk, hint="ch"),
                       self.op2("rem", r, self.atom_rows, hint="ch"), hint="ch")
        within = self.op2("add", self.op2("mul", swz, self.per_chunk, hint="xd"),
                          self.op2("rem", col, self.per_chunk, hint="xd"), hint="xd")
        return self.op2("add", self.op2("mul", r, self.row, hint="xd"), within, hint="xd")

    def issue_x(self, kv: Value) -> None:
        """Start the copies of step kv's activation tile into slot kv % stages, as one group
        (a step past the end of K copies nothing: its group is empty and never read)."""
        b = self.b
        slot = self.op2("rem", kv, self.n_stages, hint="slot")
        k_step0 = self.op2("mul", kv, self.s.tile_k, hint="kx")
        base = self.op2("mul", slot, self.x_stage, hint="xs")
        if self.regular:
            self.issue_regular(kv, k_step0, base)
        else:
            self.issue_generic(k_step0, base)
        b.op("async_commit")

    def issue_regular(self, kv: Value, k_step0: Value, base: Value) -> None:
        dst = self.op2("add", base, self.x_dst0, hint="xd")
        src = self.op2("add", self.x_src0, k_step0, hint="xi")
        in_k = self.op2("lt", kv, self.steps, hint="kok")

        def copies(pred_of) -> None:
            for i in range(self.passes):
                d = self.op2("add", dst, i * self.rows_per_pass * self.row, hint="xd") if i else dst
                sr = self.op2("add", src, self.op2("mul", self.x_pass_src, i, hint="xi"), hint="xi") if i else src
                self.async_copy(d, sr, pred_of(i), "x_s", "x", self.granule, None)

        def whole() -> None:  # no predicates: every row and position exists
            self.guarded(in_k, lambda: copies(lambda i: None))

        def partial() -> None:
            k_ok = self.op2("lt", self.op2("add", k_step0, self.x_kc, hint="k"), self.K, hint="kok")

            def pred(i: int) -> Value:
                m = self.op2("add", self.x_row0, i * self.rows_per_pass, hint="m") if i else self.x_row0
                return self.op2("and", self.op2("lt", m, self.M, hint="mok"), k_ok, hint="xok")
            copies(pred)

        self.branch(self.x_full, whole, partial)

    def issue_generic(self, k_step0: Value, base: Value) -> None:
        s = self.s

        def piece(e: Value, inside: Value | None) -> None:
            r, c = self.op2("div", e, self.per_row, hint="r"), self.op2("rem", e, self.per_row, hint="c")
            dst = self.op2("add", base, self.swizzled_index(r, c), hint="xd")
            m = self.op2("add", self.m0, r, hint="m")
            k = self.op2("add", k_step0, self.op2("mul", c, self.granule, hint="kc"), hint="k")
            ok = self.op2("and", self.op2("lt", m, self.M, hint="mok"), self.op2("lt", k, self.K, hint="kok"), hint="xok")
            src = self.op2("add", self.op2("mul", m, self.K, hint="xi"), k, hint="xi")
            self.async_copy(dst, src, ok, "x_s", "x", self.granule, inside)

        self.per_thread(s.tile_m * self.per_row, piece)

    def b_offset(self, slot: Value, tile: int) -> Value:
        """The element offset of K tile `tile` of stage `slot`: the stage's start, its atom
        (K vector) and the tile's columns in it (the instruction reads its k columns from
        there in every row)."""
        base = self.op2("mul", slot, self.x_stage, hint="xb")
        atom, col = divmod(tile * self.wg_k, self.row)
        off = atom * self.atom_elems + col
        return self.op2("add", base, off, hint="xb") if off else base


__all__ = ["SwizzledStages", "copy_granule", "k_positions"]
