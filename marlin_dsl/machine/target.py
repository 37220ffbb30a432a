"""What a target is, as data: the `Target` dataclass (MMA shapes, the lanes' register tables,
the sparse metadata table, limits and the few constants of its memory system), the values it is
made of (`SparseMetadataFields`, `SwizzledRows`, `LaneTables`), and `TARGETS`, the registry of
descriptions by name, which `marlin_dsl.machine` fills with every target it describes.

This module sits at the bottom of the stack: the IR's verifier and interpreter, the layouts,
the pipelines, the lowering and the cost model read a `Target` and never branch on its name
(tests/test_target_boundary.py keeps it so). It imports nothing of the package but its errors,
so reading a description never loads a printer (the printers, launchers and runtimes that make
a target run live in `marlin_dsl/targets/`, above the compiler).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, NamedTuple

import numpy as np

from ..errors import CompileError


class SparseMetadataFields(NamedTuple):
    """One row per 2-bit metadata field (sorted by lane, then bit offset): bits
    [bit_offsets[i] + 1 : bit_offsets[i]] of lane `lanes[i]`'s metadata word hold the in-group
    index (0..3) of the kept value in slot `slots[i]` (0: the lower of the two, 1: the higher;
    compressed column 2 * group + slot) of group `groups[i]` (logical columns 4 * group ..
    4 * group + 3) of row `rows[i]` of A. Lanes not listed are not read."""

    lanes: np.ndarray
    bit_offsets: np.ndarray
    rows: np.ndarray
    groups: np.ndarray
    slots: np.ndarray


@dataclass(frozen=True)
class SwizzledRows:
    """A shared-memory tile of rows of `row_bytes` bytes, `atom_rows` rows an atom, the
    16-byte chunk c of row r stored at chunk c ^ (r % atom_rows) (CUDA's 128-byte swizzle)."""

    row_bytes: int
    atom_rows: int
    chunk_bytes: int = 16

    @property
    def align(self) -> int:
        """Byte alignment of a tile: the swizzle acts on absolute addresses within an atom."""
        return self.row_bytes * self.atom_rows

    def element(self, row: np.ndarray, col: np.ndarray, elem_bytes: int) -> np.ndarray:
        """Element index (from an aligned tile start) of logical element (row, col)."""
        per_chunk = self.chunk_bytes // elem_bytes
        per_row = self.row_bytes // elem_bytes
        r = np.asarray(row, dtype=np.int64)
        c = np.asarray(col, dtype=np.int64)
        chunk = (c // per_chunk) ^ (r % self.atom_rows)
        return r * per_row + chunk * per_chunk + c % per_chunk


#: (role, rows, cols) of an MMA operand tile -> (row[lane, e], col[lane, e]) of the element
#: each lane holds in register order.
LaneTables = Mapping[tuple[str, int, int], tuple[np.ndarray, np.ndarray]]

#: The row-major physical layout of a sparsified activation operand (every target reads it).
ROW_MAJOR = "row_major"


@dataclass(frozen=True)
class Target:
    """A target as data. Only generic fields: code reads the fields, never the name."""

    name: str
    mma: tuple[int, int, int]  # (m, n, k) of one MMA instruction
    warp_size: int
    max_threads: int
    max_shared_bytes: int
    #: (m, n, k) of the 2:4 structured-sparse MMA (k counts the logical, uncompressed A
    #: columns; A is passed compressed, m x k/2, with per-lane metadata), or None
    sparse_mma: tuple[int, int, int] | None = None
    #: the lanes' register tables of the MMA operands that the target exposes (opaque ones
    #: are absent): `lane_elements` reads them
    lane_tables: LaneTables = field(default_factory=dict, compare=False, repr=False)
    #: sparsity selector -> the metadata fields the sparse MMA reads (empty: no sparse MMA)
    metadata_tables: Mapping[int, SparseMetadataFields] = field(default_factory=dict, compare=False,
                                                                repr=False)
    #: bytes of padding after each activation row staged in shared memory (bank conflicts)
    shared_row_pad_bytes: int = 0
    #: bytes of the widest asynchronous global -> shared copy (0: no asynchronous copies)
    async_copy_bytes: int = 0
    #: a metadata word the sparse MMA accepts (valid ordered positions in every field), for
    #: tiles that are absent; None without a sparse MMA
    sparse_idle_metadata: int | None = None
    #: the physical layout of a sparsified activation operand that the sparse MMA reads in
    #: fragment order (`layouts/sparse_activation.py`); None: the row-major layout
    sparse_activation_layout: str | None = None
    #: physical weight layouts (other than the format's own) that the target's kernels read;
    #: the first is its weight-stream layout (`layouts/weight_stream.py`, from `lane_tables`)
    weight_layouts: tuple[str, ...] = ()
    #: the weight stream's block-skipping layout (`layouts/block_skip.py`: empty vectors of
    #: each block not stored, a kernel loop over the stored ones); None: the target's stream
    #: reads every vector
    skip_layout: str | None = None
    #: the most elements one vector value (a `vload`) may have; None: no limit below the
    #: lowering's own
    max_vector_elems: int | None = None
    #: (m, max n, k) of the warpgroup MMA (`wgmma` op: `warpgroup_warps` warps issue one
    #: m x n x k product together, each warp its mma_m rows; A from registers in the MMA's A
    #: layout, B read from shared memory in `warpgroup_b_layout`, the accumulator of each warp
    #: its mma_m rows x n columns, whose lane table is `lane_elements("c", mma_m, n)`), or None
    warpgroup_mma: tuple[int, int, int] | None = None
    warpgroup_warps: int = 4
    #: dense K of the 2:4 sparse warpgroup MMA (A given compressed, k / 2 columns, located by
    #: each warp's metadata words exactly as the sparse MMA's, `sparse_metadata`), or None
    warpgroup_sparse_k: int | None = None
    #: the shared-memory layout the warpgroup MMA reads B in: rows of `row_bytes` (one K tile
    #: of `row_bytes` / element size elements per B column), atoms of `atom_rows` rows, the
    #: 16-byte chunk c of row r stored at chunk c ^ (r % atom_rows); tiles aligned to
    #: `row_bytes * atom_rows` bytes. None without a warpgroup MMA.
    warpgroup_b_layout: "SwizzledRows | None" = None
    #: shared memory per threadgroup where kernels use the warpgroup MMA (they run only on the
    #: architecture that has it, which may allow more than `max_shared_bytes`)
    warpgroup_max_shared_bytes: int = 0
    #: the architecture whose code has the warpgroup MMA (printers mark such kernels with it;
    #: runtimes pick warpgroup schedules on a device of that architecture), or None
    warpgroup_arch: str | None = None
    #: 32-bit registers one threadgroup may hold in all, and one thread at most: warp roles
    #: share them out unevenly (`warp_roles` regs); 0 where the target does not say
    registers_per_block: int = 0
    max_registers: int = 255
    #: the weight stream scales its MMA sums per scale group also where groups are shorter
    #: than a K vector (and adds a group bias through an MMA of ones): on where measured
    #: (CUDA on the H200, bench/results/issue36_h200_2026-11-29); off elsewhere
    scale_group_runs: bool = False

    def shared_limit(self, warpgroup: bool = False) -> int:
        """Shared memory one threadgroup may use (kernels with the warpgroup MMA: its own)."""
        return self.warpgroup_max_shared_bytes if warpgroup and self.warpgroup_max_shared_bytes \
            else self.max_shared_bytes

    @property
    def mma_m(self) -> int:
        return self.mma[0]

    @property
    def mma_n(self) -> int:
        return self.mma[1]

    @property
    def mma_k(self) -> int:
        return self.mma[2]

    def lane_elements(self, role: str, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Which elements of an MMA operand tile each lane holds in its registers, in register
        order: (row[lane, e], col[lane, e]), or None where the target keeps them opaque.
        `frag_build` and the weight layouts that feed fragments straight from registers
        (`layouts/weight_stream.py`) read this table; nothing else hard-codes it."""
        table = self.lane_tables.get((role, rows, cols))
        if table is None:
            return None
        return table[0].copy(), table[1].copy()  # callers may index into them freely

    def sparse_metadata(self, selector: int) -> SparseMetadataFields | None:
        """Where the sparse MMA (`sparse_mma`) reads the positions of A's kept values, for
        sparsity selector `selector`: every 2-bit field of the per-lane u32 metadata words that
        the instruction reads, as parallel int arrays (see `SparseMetadataFields`), or None
        where the target has no sparse MMA. A selector the target does not have raises
        ValueError. `mma_sp` (interpreter) and the sparse weight layouts read this table."""
        if self.sparse_mma is None or not self.metadata_tables:
            return None
        if selector not in self.metadata_tables:
            allowed = " or ".join(str(s) for s in sorted(self.metadata_tables))
            raise ValueError(f"{self.name}: sparsity selector must be {allowed}, got {selector!r}")
        return SparseMetadataFields(*(a.copy() for a in self.metadata_tables[selector]))

    @property
    def activation_layout(self) -> str:
        """The physical layout of a sparsified activation operand on this target."""
        return self.sparse_activation_layout or ROW_MAJOR


#: Every described target, by name (filled by `marlin_dsl/machine/__init__.py`; a printer is
#: registered for a description in `marlin_dsl/targets/`).
TARGETS: dict[str, Target] = {}


def register_target(target: Target) -> Target:
    """Add a target's description to `TARGETS` (once per name: the same object again is a
    no-op, another description under a registered name is an error)."""
    if target.name in TARGETS and TARGETS[target.name] is not target:
        raise CompileError(f"target {target.name!r} is registered twice")
    TARGETS[target.name] = target
    return target


def reader_of(layout: str) -> Target:
    """The registered target whose kernels read physical weight layout `layout` (the layout
    was made from its lane tables)."""
    for target in TARGETS.values():
        if layout in target.weight_layouts:
            return target
    raise CompileError(f"no target reads weight layout {layout!r}")


__all__ = ["LaneTables", "ROW_MAJOR", "SparseMetadataFields", "SwizzledRows", "TARGETS", "Target",
           "reader_of", "register_target"]
