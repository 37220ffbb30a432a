"""A builder that appends ops to the current block and names values deterministically."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from .core import AttrValue, Block, Op, Value
from .types import BOOL, U32, ScalarType, Type


class Builder:
    """Appends ops to a stack of blocks. Value names are `hint` plus a counter, so the same
    construction sequence always produces the same names (byte-identical output)."""

    def __init__(self, block: Block | None = None) -> None:
        self.blocks: list[Block] = [block if block is not None else Block()]
        self._counts: dict[str, int] = {}

    @property
    def block(self) -> Block:
        return self.blocks[-1]

    def fresh(self, hint: str, type_: Type) -> Value:
        n = self._counts.get(hint, 0)
        self._counts[hint] = n + 1
        # "w1" + 0 must not collide with "w" + 10: hints ending in a digit get a separator.
        return Value(f"{hint}_{n}" if hint[-1].isdigit() else f"{hint}{n}", type_)

    def op(self, name: str, operands: list[Value] | tuple = (), result_types: list[Type] | tuple = (),
           attrs: dict[str, AttrValue] | None = None, regions: list[Block] | None = None,
           hint: str = "v") -> Op:
        results = [self.fresh(hint, t) for t in result_types]
        op = Op(name, list(operands), results, dict(attrs or {}), list(regions or []))
        self.block.ops.append(op)
        return op

    def value(self, name: str, operands: list[Value] | tuple, type_: Type,
              attrs: dict[str, AttrValue] | None = None, hint: str = "v") -> Value:
        return self.op(name, operands, [type_], attrs, hint=hint).result

    @contextmanager
    def region(self, args: list[Value] | None = None) -> Iterator[Block]:
        block = Block(list(args or []))
        self.blocks.append(block)
        try:
            yield block
        finally:
            self.blocks.pop()

    # ----- conveniences for the common ops ------------------------------------------------

    def const(self, value: int | float, type_: ScalarType = U32) -> Value:
        return self.value("const", [], type_, {"value": value}, hint="c")

    def index(self, kind: str) -> Value:
        return self.value("index", [], U32, {"kind": kind}, hint=kind)

    def scalar(self, name: str) -> Value:
        return self.value("scalar", [], U32, {"name": name}, hint=name)

    def binary(self, name: str, a: Value, b: Value | int | float, hint: str = "v") -> Value:
        if not isinstance(b, Value):
            b = self.const(b, a.type)  # type: ignore[arg-type]
        result_type = BOOL if name in ("lt", "le", "gt", "ge", "eq", "ne") else a.type
        return self.value(name, [a, b], result_type, hint=hint)

    def cast(self, v: Value, to: ScalarType, hint: str = "v") -> Value:
        return self.value("cast", [v], to, {"to": str(to)}, hint=hint)

    def bitcast(self, v: Value, to: ScalarType, hint: str = "v") -> Value:
        return self.value("bitcast", [v], to, {"to": str(to)}, hint=hint)

    def select(self, c: Value, a: Value, b: Value, hint: str = "v") -> Value:
        return self.value("select", [c, a, b], a.type, hint=hint)

    def load(self, buffer: str, index: Value, type_: ScalarType, pred: Value | None = None,
             hint: str = "ld") -> Value:
        operands = [index] + ([pred] if pred is not None else [])
        return self.value("load", operands, type_, {"buffer": buffer}, hint=hint)

    def store(self, buffer: str, index: Value, value: Value, pred: Value | None = None) -> None:
        operands = [index, value] + ([pred] if pred is not None else [])
        self.op("store", operands, attrs={"buffer": buffer})

    def barrier(self, scope: str = "threadgroup") -> None:
        self.op("barrier", attrs={"scope": scope})

    def yield_(self, *values: Value) -> None:
        self.op("yield", list(values))
