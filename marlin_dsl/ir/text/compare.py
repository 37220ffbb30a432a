"""Structural equality of kernels and the print -> parse -> print round trip check."""
from __future__ import annotations

import difflib
from numbers import Integral, Real
from typing import Any, Iterator, Mapping

import numpy as np

from ..core import (
    Block, GridDim, Kernel, Op, Value,
)

from .parser import parse_kernel
from .printer import print_kernel



def _norm(value: Any) -> Any:
    """A comparable key of an attribute value that keeps its kind (1 != 1.0 != true) and
    tells floats apart by repr (so -0.0 != 0.0 and nan == nan). numpy scalars count as the
    Python number they hold and lists as tuples, since both print the same."""
    if isinstance(value, (bool, np.bool_)):
        return ("bool", bool(value))
    if isinstance(value, Integral):
        return ("int", int(value))
    if isinstance(value, Real):
        return ("float", repr(float(value)))
    if isinstance(value, str):
        return ("str", str(value))
    if isinstance(value, (tuple, list)):
        return ("tuple", tuple(_norm(v) for v in value))
    return ("other", repr(value))


def _norm_attrs(attrs: Mapping[str, Any]) -> list[tuple[str, Any]]:
    return sorted((k, _norm(v)) for k, v in attrs.items())


def _grid_key(dim: GridDim) -> tuple:
    # A constant dimension's tile is meaningless (and not printed).
    return (None, dim.count) if dim.symbol is None else (dim.symbol, dim.tile, dim.count)


def _header(k: Kernel) -> Iterator[tuple[str, Any]]:
    yield "name", k.name
    yield "threads", k.threads
    yield "warp_size", k.warp_size
    yield "grid", [_grid_key(d) for d in k.grid]
    yield "scalars", list(k.scalars)
    yield "buffers", list(k.buffers)
    yield "shared", list(k.shared)
    yield "tables", [(t.name, t.elem, _norm(tuple(t.values))) for t in k.tables]
    yield "attrs", _norm_attrs(k.attrs)
    yield "body args", [(v.name, v.type) for v in k.body.args]


class _Differ:
    """Walks two kernels in step; values correspond when defined at the same place."""

    def __init__(self) -> None:
        self.pairs: dict[int, Value] = {}

    def define(self, a: Value, b: Value, where: str) -> str | None:
        if (a.name, a.type) != (b.name, b.type):
            return f"{where}: %{a.name}: {a.type} != %{b.name}: {b.type}"
        self.pairs[id(a)] = b
        return None

    def use(self, a: Value, b: Value, where: str) -> str | None:
        if id(a) in self.pairs:
            return None if self.pairs[id(a)] is b else f"{where}: operand %{a.name} refers to another value"
        # A value defined nowhere in the kernel (invalid IR): compare by name and type.
        return self.define(a, b, where)

    def block(self, a: Block, b: Block, where: str) -> str | None:
        if len(a.args) != len(b.args):
            return f"{where}: {len(a.args)} != {len(b.args)} region arguments"
        for x, y in zip(a.args, b.args):
            if diff := self.define(x, y, f"{where} args"):
                return diff
        if len(a.ops) != len(b.ops):
            return f"{where}: {len(a.ops)} != {len(b.ops)} ops"
        for i, (x, y) in enumerate(zip(a.ops, b.ops)):
            if diff := self.op(x, y, f"{where}/op {i} ({x.name})"):
                return diff
        return None

    def op(self, a: Op, b: Op, where: str) -> str | None:
        if a.name != b.name:
            return f"{where}: op name {a.name} != {b.name}"
        if _norm_attrs(a.attrs) != _norm_attrs(b.attrs):
            return f"{where}: attrs {a.attrs} != {b.attrs}"
        if len(a.operands) != len(b.operands) or len(a.results) != len(b.results) \
                or len(a.regions) != len(b.regions):
            return f"{where}: operand, result or region counts differ"
        for x, y in zip(a.operands, b.operands):
            if diff := self.use(x, y, where):
                return diff
        for i, (x, y) in enumerate(zip(a.regions, b.regions)):
            if diff := self.block(x, y, f"{where}/region {i}"):
                return diff
        for x, y in zip(a.results, b.results):
            if diff := self.define(x, y, where):
                return diff
        return None


def kernel_difference(a: Kernel, b: Kernel) -> str | None:
    """The first structural difference between two kernels, or None when they are equal:
    names, types, attributes (by kind and value), declarations and the wiring of operands."""
    for (what, x), (_, y) in zip(_header(a), _header(b)):
        if x != y:
            return f"kernel {a.name}: {what} differ: {x} != {y}"
    return _Differ().block(a.body, b.body, f"kernel {a.name}: body")


def kernels_equal(a: Kernel, b: Kernel) -> bool:
    return kernel_difference(a, b) is None


def assert_round_trip(kernel: Kernel) -> Kernel:
    """Print, parse (verifying) and print again: the parsed kernel must equal `kernel` and the
    two texts must be identical. Returns the parsed kernel."""
    text = print_kernel(kernel)
    parsed = parse_kernel(text, f"<print of {kernel.name}>")
    diff = kernel_difference(kernel, parsed)
    if diff is not None:
        raise AssertionError(f"parse(print(kernel)) differs: {diff}")
    again = print_kernel(parsed)
    if again != text:
        delta = "".join(difflib.unified_diff(text.splitlines(True), again.splitlines(True),
                                             "print", "print(parse(print))"))
        raise AssertionError(f"print -> parse -> print is not the identity:\n{delta}")
    return parsed
