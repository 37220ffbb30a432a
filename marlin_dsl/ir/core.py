"""Kernel IR: SSA values, ops with nested regions, and the kernel's declarations.

A kernel is a SIMT program: its body runs once per thread, for every thread of every
threadgroup of the launch grid. Within a block ops are in SSA form and their order is a
schedule of a dataflow graph (`ir.graph` builds that graph with networkx); structured
control flow (`for`, `if`, `switch`) holds nested blocks whose values flow out through
`yield`. Memory is named: kernel buffers (global), shared arrays (threadgroup memory) and
constant tables, referenced from ops by name.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Union

from .types import FragmentType, ScalarType, Type

AttrValue = Union[int, float, bool, str, tuple]


@dataclass(eq=False)
class Value:
    """An SSA value; `name` is printed as %name and is unique within its kernel."""

    name: str
    type: Type

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


@dataclass(eq=False)
class Block:
    """A straight-line list of ops; `args` are the region's arguments (loop index, carried values)."""

    args: list[Value] = field(default_factory=list)
    ops: list["Op"] = field(default_factory=list)

    def walk(self) -> Iterator["Op"]:
        """Every op in this block and its nested regions, pre-order."""
        for op in self.ops:
            yield op
            for region in op.regions:
                yield from region.walk()


@dataclass(eq=False)
class Op:
    name: str
    operands: list[Value] = field(default_factory=list)
    results: list[Value] = field(default_factory=list)
    attrs: dict[str, AttrValue] = field(default_factory=dict)
    regions: list[Block] = field(default_factory=list)

    @property
    def result(self) -> Value:
        assert len(self.results) == 1, f"{self.name} has {len(self.results)} results"
        return self.results[0]

    def __repr__(self) -> str:
        res = ", ".join(f"%{r.name}" for r in self.results)
        args = ", ".join(f"%{v.name}" for v in self.operands)
        return f"<{res + ' = ' if res else ''}{self.name}({args}) {self.attrs}>"


@dataclass(frozen=True)
class BufferParam:
    """A device (global) memory buffer passed to the kernel."""

    name: str
    elem: ScalarType
    access: str  # "read", "write" or "readwrite"


@dataclass(frozen=True)
class ScalarParam:
    """A u32 launch-time constant such as M, N or K."""

    name: str


@dataclass(frozen=True)
class SharedArray:
    """Threadgroup (shared) memory: `size` elements of `elem`."""

    name: str
    elem: ScalarType
    size: int
    #: byte alignment of the array's start (a power of two; 16 unless an op needs more: the
    #: warpgroup MMA reads swizzled tiles whose swizzle acts on absolute addresses)
    align: int = 16

    @property
    def nbytes(self) -> int:
        return self.size * self.elem.bits // 8


@dataclass(frozen=True)
class ConstTable:
    """A compile-time constant array (value tables, block-pattern lookup tables)."""

    name: str
    elem: ScalarType
    values: tuple


@dataclass(frozen=True)
class GridDim:
    """One grid dimension: ceil(symbol / tile) * count, or just count when symbol is None."""

    symbol: str | None
    tile: int = 1
    count: int = 1

    def evaluate(self, sizes: dict[str, int]) -> int:
        if self.symbol is None:
            return self.count
        return -(-sizes[self.symbol] // self.tile) * self.count

    def __str__(self) -> str:
        if self.symbol is None:
            return str(self.count)
        base = f"ceil({self.symbol}, {self.tile})"
        return base if self.count == 1 else f"{base} * {self.count}"


@dataclass(eq=False)
class Kernel:
    name: str
    threads: int
    grid: tuple[GridDim, GridDim, GridDim]
    body: Block
    warp_size: int = 32
    buffers: list[BufferParam] = field(default_factory=list)
    scalars: list[ScalarParam] = field(default_factory=list)
    shared: list[SharedArray] = field(default_factory=list)
    tables: list[ConstTable] = field(default_factory=list)
    attrs: dict[str, AttrValue] = field(default_factory=dict)

    def walk(self) -> Iterator[Op]:
        return self.body.walk()

    def symbol(self, name: str) -> BufferParam | SharedArray | ConstTable | ScalarParam:
        for decl in (*self.buffers, *self.shared, *self.tables, *self.scalars):
            if decl.name == name:
                return decl
        raise KeyError(name)

    @property
    def shared_bytes(self) -> int:
        return sum(s.nbytes for s in self.shared)

    def fragment_types(self) -> set[FragmentType]:
        return {r.type for op in self.walk() for r in op.results if isinstance(r.type, FragmentType)}
