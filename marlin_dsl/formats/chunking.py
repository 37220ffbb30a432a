"""Row blocks for the element-wise passes over a [K, N] weight.

Quantising, pruning and dequantising a large weight in one piece makes numpy stream several
float64 temporaries of the whole weight through memory (about 470 MB each for 4096 x 14336).
Running the same operations over blocks of rows that fit in the CPU caches gives bit-identical
results (every operation is element-wise, or reduces only within a block) several times faster
and with a small, bounded working set.
"""
from __future__ import annotations

from typing import Iterator

#: Elements of one block: 2**16 float64 values (512 KiB) stay within a core's L2 cache.
BLOCK_ELEMENTS = 1 << 16


def block_rows(n: int, group: int, multiple: int = 1) -> int:
    """Rows of the blocks `row_blocks` yields (the last block of a group may have fewer)."""
    rows = max(multiple, BLOCK_ELEMENTS // max(n, 1) // multiple * multiple)
    return min(rows, group)


def row_blocks(k: int, n: int, group: int, multiple: int = 1) -> Iterator[tuple[int, int, int]]:
    """Blocks (r0, r1, g) of the rows of a [K, N] array, in order: each lies inside scale
    group g (rows g*group .. (g+1)*group - 1), holds a multiple of `multiple` rows and about
    BLOCK_ELEMENTS elements (at least `multiple` rows). `group` must divide K and be a
    multiple of `multiple`.
    """
    assert k % group == 0 and group % multiple == 0
    rows = block_rows(n, group, multiple)
    for g in range(k // group):
        end = (g + 1) * group
        for r0 in range(g * group, end, rows):
            yield r0, min(r0 + rows, end), g
