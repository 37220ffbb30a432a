"""The canonical printer of the textual IR (see `marlin_dsl.ir.text` for the form and its rules)."""
from __future__ import annotations

import re
from numbers import Integral, Real
from typing import Any, Iterable, Mapping

import numpy as np

from ...attr_text import quote
from ..core import (
    AttrValue, GridDim, Kernel, Op, Value,
)


# ----- printing -------------------------------------------------------------------------------

#: The grammar's NAME and the names it accepts after `%` (Python's \w, as lark uses `re`).
_NAME = re.compile(r"[^\W\d]\w*")
_VALUE_NAME = re.compile(r"[\w.]+")
#: Identifier-like words that read back as something else, so a string spelling one is quoted.
_RESERVED = frozenset({"true", "false", "inf", "nan"})
#: Op attributes naming a kernel symbol (buffer, shared array, table, scalar), printed `@name`.
_SYMBOL_ATTRS = frozenset({"buffer", "name"})
_ACCESS = ("read", "write", "readwrite")


def _is_bare(text: str) -> bool:
    return _NAME.fullmatch(text) is not None and text not in _RESERVED


def _checked_name(kind: str, name: str, pattern: re.Pattern[str] = _NAME) -> str:
    if not isinstance(name, str) or pattern.fullmatch(name) is None:
        raise ValueError(f"{kind} name {name!r} has no textual form")
    return name


def attr_value_text(value: Any) -> str:
    """Canonical text of an attribute value (int, float, bool, str, tuple of these)."""
    if isinstance(value, (bool, np.bool_)):  # before Integral: bool is an int
        return "true" if value else "false"
    if isinstance(value, Integral):
        return str(int(value))
    if isinstance(value, Real):
        return repr(float(value))  # also 'inf', '-inf', 'nan', which the grammar reads
    if isinstance(value, str):
        return str(value) if _is_bare(value) else quote(str(value))
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(attr_value_text(v) for v in value) + "]"
    raise TypeError(f"no textual form for attribute value {value!r} ({type(value).__name__})")


def _op_attr_text(key: str, value: AttrValue) -> str:
    if key in _SYMBOL_ATTRS and isinstance(value, str) and _NAME.fullmatch(value):
        return f"{key}=@{value}"
    return f"{_checked_name('attribute', key)}={attr_value_text(value)}"


def _attrs_text(attrs: Mapping[str, AttrValue], open_: str, close: str, op: bool) -> str:
    items = sorted(attrs.items())
    if op:
        return open_ + ", ".join(_op_attr_text(k, v) for k, v in items) + close
    return open_ + ", ".join(f"{_checked_name('attribute', k)}={attr_value_text(v)}"
                             for k, v in items) + close


def _value(v: Value) -> str:
    return "%" + _checked_name("value", v.name, _VALUE_NAME)


def _symbol(name: str) -> str:
    return "@" + _checked_name("symbol", name)


def _grid_dim_text(dim: GridDim) -> str:
    # Same spelling as GridDim.__str__, with the symbol checked so that it reads back.
    if dim.symbol is None:
        return str(dim.count)
    base = f"ceil({_checked_name('grid symbol', dim.symbol)}, {dim.tile})"
    return base if dim.count == 1 else f"{base} * {dim.count}"


def _print_ops(ops: Iterable[Op], depth: int, lines: list[str]) -> None:
    pad = "  " * depth
    for op in ops:
        head = ", ".join(_value(r) for r in op.results) + " = " if op.results else ""
        head += _checked_name("op", op.name)
        if op.attrs:
            head += _attrs_text(op.attrs, "[", "]", op=True)
        head += "(" + ", ".join(_value(v) for v in op.operands) + ")"
        if op.results:
            head += " : " + ", ".join(str(r.type) for r in op.results)
        if not op.regions:
            lines.append(pad + head)
            continue
        lines.append(pad + head + " {")
        for i, region in enumerate(op.regions):
            if i:
                lines.append(pad + "} {")
            if region.args:
                lines.append(pad + "^(" + ", ".join(f"{_value(a)}: {a.type}" for a in region.args) + "):")
            _print_ops(region.ops, depth + 1, lines)
        lines.append(pad + "}")


def print_kernel(kernel: Kernel) -> str:
    """The canonical text of one kernel, ending in a newline."""
    if kernel.body.args:
        raise ValueError(f"kernel {kernel.name}: the body block cannot have arguments")
    lines = [f"kernel {_symbol(kernel.name)} {{"]
    if kernel.attrs:
        lines.append("  attrs " + _attrs_text(kernel.attrs, "{", "}", op=False))
    lines.append(f"  threads {int(kernel.threads)}")
    lines.append(f"  warp_size {int(kernel.warp_size)}")
    lines.append("  grid [" + ", ".join(_grid_dim_text(d) for d in kernel.grid) + "]")
    lines += [f"  scalar {_symbol(s.name)}" for s in kernel.scalars]
    lines += [f"  buffer {_symbol(b.name)} : {b.elem} {b.access}" for b in kernel.buffers]
    lines += [f"  shared {_symbol(s.name)} : {s.elem}[{int(s.size)}]" + (f" align {s.align}" if s.align != 16 else "")
              for s in kernel.shared]
    lines += [f"  table {_symbol(t.name)} : {t.elem}[{len(t.values)}] = {attr_value_text(tuple(t.values))}"
              for t in kernel.tables]
    lines.append("  body {")
    _print_ops(kernel.body.ops, 2, lines)
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def print_kernels(kernels: Iterable[Kernel]) -> str:
    """Several kernels, separated by blank lines (what `parse_kernels` reads)."""
    return "\n".join(print_kernel(k) for k in kernels)


# ----- parse tree -> syntax objects -----------------------------------------------------------
# The transformer works bottom-up, so it cannot know which values are in scope; it builds
# these plain records and `_KernelBuilder` resolves them top-down.
