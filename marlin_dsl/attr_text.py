"""The attribute-list syntax shared by the textual forms (`grammar/format.lark`, whose
attribute rules `grammar/ir.lark` imports): `name=value` lists, `kind(attrs...)` calls, their
values and canonical spellings. Kept below both the format text and the IR text, so neither
imports the other."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, Iterable, Union

from lark import Token, Transformer

from .errors import FormatError, SourceLocation


class Symbol(str):
    """A bare identifier value (`dtype=f16`), kept apart from a quoted string (`"f16"`)."""


#: A parsed attribute value: int, float, bool, Symbol, str, or a list of values.
Value = Union[int, float, bool, Symbol, str, list]


@dataclass(frozen=True)
class Attr:
    """One `name=value` of an attribute list, with the line it was written on."""

    name: str
    value: Value
    line: int


@dataclass(frozen=True)
class Call:
    """`kind(attrs...)`, e.g. `float(bits=4, ...)`."""

    kind: str
    attrs: list[Attr]
    line: int


def quote(text: str) -> str:
    """A string literal; JSON syntax, which the grammar's STRING accepts and `unquote` reads."""
    return json.dumps(text, ensure_ascii=False)


def value_to_text(value: Value | tuple) -> str:
    """Canonical text of an attribute value; inverse of `AttrTransformer`'s value rules."""
    if isinstance(value, bool):  # before Integral: bool is an int
        return "true" if value else "false"
    if isinstance(value, Integral):
        return str(int(value))
    if isinstance(value, Real):
        if not math.isfinite(value):
            raise ValueError(f"attribute values must be finite, got {value!r}")
        return repr(float(value))
    if isinstance(value, Symbol):
        if not value.isidentifier():
            raise ValueError(f"not an identifier: {str(value)!r}")
        return str(value)
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(value_to_text(v) for v in value) + "]"
    raise TypeError(f"no textual form for {type(value).__name__} {value!r}")


def attrs_to_text(attrs: Iterable[tuple[str, Value | tuple]]) -> str:
    return "(" + ", ".join(f"{name}={value_to_text(value)}" for name, value in attrs) + ")"


class AttrTransformer(Transformer):
    """Turns the attribute-list rules of format.lark into `Call`, `Attr` and Python values.

    Transformers of grammars that import those rules subclass this one.
    """

    def __init__(self, source: str) -> None:
        super().__init__()
        self.source = source

    def int_value(self, children: list[Token]) -> int:
        return int(children[0])

    def float_value(self, children: list[Token]) -> float:
        return float(children[0])

    def bool_value(self, children: list[Token]) -> bool:
        return children[0] == "true"

    def ident_value(self, children: list[Token]) -> Symbol:
        return Symbol(children[0])

    def string_value(self, children: list[Token]) -> str:
        return self.unquote(children[0])

    def list_value(self, children: list[Value]) -> list:
        return list(children)

    def attr(self, children: list[Any]) -> Attr:
        name, value = children
        return Attr(str(name), value, name.line)

    def attrs(self, children: list[Attr]) -> list[Attr]:
        return list(children)

    def call(self, children: list[Any]) -> Call:
        kind, attrs = children
        return Call(str(kind), attrs, kind.line)

    def unquote(self, token: Token) -> str:
        try:
            return json.loads(token)
        except json.JSONDecodeError as err:
            raise FormatError(f"invalid string literal {token}: {err.msg}",
                              SourceLocation(self.source, token.line)) from None
