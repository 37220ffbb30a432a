"""The parser of the textual IR (`grammar/ir.lark`): text -> verified kernels, with errors that
name the source and line (see `marlin_dsl.ir.text`)."""
from __future__ import annotations

from collections import ChainMap
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Mapping

from lark import Lark, Token, v_args
from lark.exceptions import UnexpectedInput, VisitError
from lark.load_grammar import FromPackageLoader

from ...lark_errors import describe_syntax_error
from ...errors import MarlinDSLError, SourceLocation
from ...attr_text import Attr, AttrTransformer
from ...grammar import read_grammar
from ..core import (
    AttrValue, Block, BufferParam, ConstTable, GridDim, Kernel, Op, ScalarParam, SharedArray, Value,
)
from ..types import FragmentType, ScalarType, Type, VectorType
from ..verify import VerifyError, verify

from .printer import _ACCESS  # the names the grammar accepts


class IRParseError(MarlinDSLError):
    """The text is not a well-formed kernel: a syntax error, an undefined or out-of-scope
    value, a duplicate definition or item; the location names the source and line."""




class _Results(list):
    """Result %names (Tokens) of an op."""


class _Operands(list):
    """Operand %names (Tokens) of an op."""


class _Types(list):
    """Result types of an op."""


class _OpAttrs(list):
    """The `[...]` attributes of an op."""


class _RegionArgs(list):
    """(%name Token, Type) pairs of a region's `^(...)` line."""


@dataclass
class _OpText:
    line: int
    name: str
    results: list[Token]
    attrs: list[Attr]
    operands: list[Token]
    types: list[Type]
    regions: list["_RegionText"]


@dataclass
class _RegionText:
    line: int
    args: list[tuple[Token, Type]]
    ops: list[_OpText]


@dataclass
class _Item:
    """One header line of a kernel (`threads 128`, `buffer @x : f16 read`, ...)."""

    kind: str
    line: int
    value: Any


@dataclass
class _KernelText:
    name: str
    line: int
    items: list[_Item]
    body: list[_OpText] = field(default_factory=list)


class _IRTransformer(AttrTransformer):
    """Tokens to syntax records; attribute values become IR attribute values (plain str for
    identifiers, tuples for lists)."""

    def _error(self, message: str, line: int) -> IRParseError:
        return IRParseError(message, SourceLocation(self.source, line))

    # -- attribute values: the IR's AttrValue has no Symbol or list --
    def ident_value(self, children: list[Token]) -> str:
        return str(children[0])

    def list_value(self, children: list[Any]) -> tuple:
        return tuple(children)

    def symbol_value(self, children: list[Token]) -> str:
        return str(children[0])[1:]

    def nonfinite_value(self, children: list[Token]) -> float:
        return float(children[0])

    def unquote(self, token: Token) -> str:
        try:
            return super().unquote(token)
        except MarlinDSLError as err:  # FormatError from the format grammar's helper
            raise self._error(err.message, token.line) from None

    def op_attr(self, children: list[Any]) -> Attr:
        return self.attr(children)

    def op_attrs(self, children: list[Attr]) -> _OpAttrs:
        return _OpAttrs(children)

    # -- types --
    def _scalar(self, token: Token) -> ScalarType:
        try:
            return ScalarType(str(token))
        except ValueError as err:
            raise self._error(str(err), token.line) from None

    def scalar_type(self, children: list[Token]) -> ScalarType:
        return self._scalar(children[0])

    def vec_type(self, children: list[Token]) -> VectorType:
        elem, size = children
        return VectorType(self._scalar(elem), int(size))

    def frag_type(self, children: list[Token]) -> FragmentType:
        role, elem, shape = children
        rows, cols = (int(n) for n in str(shape).split("x"))
        try:
            return FragmentType(str(role), self._scalar(elem), rows, cols)
        except ValueError as err:
            raise self._error(str(err), role.line) from None

    def types(self, children: list[Type]) -> _Types:
        return _Types(children)

    # -- ops and regions --
    def results(self, children: list[Token]) -> _Results:
        return _Results(children)

    def operands(self, children: list[Token]) -> _Operands:
        return _Operands(children)

    def region_arg(self, children: list[Any]) -> tuple[Token, Type]:
        return children[0], children[1]

    def region_args(self, children: list[tuple[Token, Type]]) -> _RegionArgs:
        return _RegionArgs(children)

    @v_args(meta=True)
    def region(self, meta: Any, children: list[Any]) -> _RegionText:
        args = children[0] if children and isinstance(children[0], _RegionArgs) else []
        ops = [c for c in children if isinstance(c, _OpText)]
        return _RegionText(meta.line, list(args), ops)

    @v_args(meta=True)
    def op(self, meta: Any, children: list[Any]) -> _OpText:
        parts: dict[type, Any] = {type(c): c for c in children if not isinstance(c, (Token, _RegionText))}
        name = next(c for c in children if isinstance(c, Token))
        return _OpText(meta.line, str(name), list(parts.get(_Results, [])), list(parts.get(_OpAttrs, [])),
                       list(parts[_Operands]), list(parts.get(_Types, [])),
                       [c for c in children if isinstance(c, _RegionText)])

    # -- kernel header --
    @v_args(meta=True)
    def kernel_attrs(self, meta: Any, children: list[Attr]) -> _Item:
        return _Item("attrs", meta.line, children)

    @v_args(meta=True)
    def threads(self, meta: Any, children: list[Token]) -> _Item:
        return _Item("threads", meta.line, int(children[0]))

    @v_args(meta=True)
    def warp_size(self, meta: Any, children: list[Token]) -> _Item:
        return _Item("warp_size", meta.line, int(children[0]))

    @v_args(meta=True)
    def grid(self, meta: Any, children: list[GridDim]) -> _Item:
        if len(children) != 3:
            raise self._error(f"grid needs 3 dimensions, got {len(children)}", meta.line)
        return _Item("grid", meta.line, tuple(children))

    def grid_ceil(self, children: list[Token]) -> GridDim:
        count = int(children[2]) if len(children) > 2 else 1
        return GridDim(str(children[0]), int(children[1]), count)

    def grid_count(self, children: list[Token]) -> GridDim:
        return GridDim(None, 1, int(children[0]))

    @v_args(meta=True)
    def scalar_decl(self, meta: Any, children: list[Token]) -> _Item:
        return _Item("decl", meta.line, ScalarParam(str(children[0])[1:]))

    @v_args(meta=True)
    def buffer_decl(self, meta: Any, children: list[Token]) -> _Item:
        name, elem, access = children
        if access not in _ACCESS:
            raise self._error(f"buffer {name}: access must be one of {', '.join(_ACCESS)}, "
                              f"got {access!r}", access.line)
        return _Item("decl", meta.line, BufferParam(str(name)[1:], self._scalar(elem), str(access)))

    @v_args(meta=True)
    def shared_decl(self, meta: Any, children: list[Token]) -> _Item:
        name, elem, size, *align = children
        return _Item("decl", meta.line, SharedArray(str(name)[1:], self._scalar(elem), int(size),
                                                    *(int(a) for a in align)))

    @v_args(meta=True)
    def table_decl(self, meta: Any, children: list[Any]) -> _Item:
        name, elem, count, values = children
        if len(values) != int(count):
            raise self._error(f"table {name} declares {count} values but lists {len(values)}", meta.line)
        return _Item("decl", meta.line, ConstTable(str(name)[1:], self._scalar(elem), values))

    def body(self, children: list[_OpText]) -> list[_OpText]:
        return list(children)

    @v_args(meta=True)
    def kernel(self, meta: Any, children: list[Any]) -> _KernelText:
        name, *items, body = children
        return _KernelText(str(name)[1:], meta.line, items, body)

    def start(self, children: list[_KernelText]) -> list[_KernelText]:
        return list(children)


# ----- syntax objects -> Kernel -----------------------------------------------------------------

class _KernelBuilder:
    """Builds one Kernel, resolving %names with the IR's scoping rule."""

    def __init__(self, text: _KernelText, source: str) -> None:
        self.text = text
        self.source = source
        # Every definition in the kernel with its line: names are unique per kernel (the
        # verifier's rule), and knowing where an out-of-scope name is defined makes the
        # error message useful.
        self.defined: dict[str, int] = {}
        self._collect(text.body)

    def _error(self, message: str, line: int) -> IRParseError:
        return IRParseError(f"kernel @{self.text.name}: {message}", SourceLocation(self.source, line))

    def _define(self, token: Token) -> None:
        name = str(token)[1:]
        if name in self.defined:
            raise self._error(f"value %{name} defined twice (first on line {self.defined[name]})", token.line)
        self.defined[name] = token.line

    def _collect(self, ops: list[_OpText]) -> None:
        # Same order as the definitions are made below: region args, nested ops, then results.
        for op in ops:
            for region in op.regions:
                for token, _ in region.args:
                    self._define(token)
                self._collect(region.ops)
            for token in op.results:
                self._define(token)

    def build(self) -> Kernel:
        t = self.text
        once: dict[str, _Item] = {}
        decls: list[_Item] = []
        for item in t.items:
            if item.kind == "decl":
                decls.append(item)
            elif item.kind in once:
                raise self._error(f"{item.kind} given twice (first on line {once[item.kind].line})", item.line)
            else:
                once[item.kind] = item
        for required in ("threads", "grid"):
            if required not in once:
                raise self._error(f"missing {required} line", t.line)
        symbols: dict[str, int] = {}
        for item in decls:
            if item.value.name in symbols:
                raise self._error(f"symbol @{item.value.name} declared twice "
                                  f"(first on line {symbols[item.value.name]})", item.line)
            symbols[item.value.name] = item.line

        def of(cls: type) -> list[Any]:
            return [d.value for d in decls if isinstance(d.value, cls)]

        attrs = self._attrs(once["attrs"].value) if "attrs" in once else {}
        body = self._block([], t.body, ChainMap())
        return Kernel(t.name, once["threads"].value, once["grid"].value, body,
                      warp_size=once["warp_size"].value if "warp_size" in once else 32,
                      buffers=of(BufferParam), scalars=of(ScalarParam), shared=of(SharedArray),
                      tables=of(ConstTable), attrs=attrs)

    def _attrs(self, attrs: list[Attr]) -> dict[str, AttrValue]:
        out: dict[str, AttrValue] = {}
        for attr in attrs:
            if attr.name in out:
                raise self._error(f"attribute {attr.name!r} given twice", attr.line)
            out[attr.name] = attr.value
        return out

    def _lookup(self, token: Token, scope: Mapping[str, Value]) -> Value:
        name = str(token)[1:]
        if name in scope:
            return scope[name]
        if name in self.defined:
            where = self.defined[name]
            why = "before its definition" if where >= token.line else "outside its scope"
            raise self._error(f"value %{name} used {why} (defined on line {where})", token.line)
        raise self._error(f"undefined value %{name}", token.line)

    def _block(self, args: list[tuple[Token, Type]], ops: list[_OpText],
               outer: ChainMap[str, Value]) -> Block:
        # A child map: definitions of this block are visible to the regions nested below it
        # (built while the map holds exactly the values defined so far) but not outside it.
        scope = outer.new_child()
        block = Block([Value(str(token)[1:], type_) for token, type_ in args])
        for value in block.args:
            scope[value.name] = value
        for text in ops:
            operands = [self._lookup(token, scope) for token in text.operands]
            # Regions first: they see the values defined before the op, not its results.
            regions = [self._block(r.args, r.ops, scope) for r in text.regions]
            if len(text.types) != len(text.results):
                raise self._error(f"{text.name} defines {len(text.results)} values but lists "
                                  f"{len(text.types)} types", text.line)
            results = [Value(str(token)[1:], type_) for token, type_ in zip(text.results, text.types)]
            block.ops.append(Op(text.name, operands, results, self._attrs(text.attrs), regions))
            for value in results:
                scope[value.name] = value
        return block


# ----- parsing entry points ---------------------------------------------------------------------

@lru_cache(maxsize=1)
def _parser() -> Lark:
    # propagate_positions gives each rule's meta the line of its first token.
    return Lark(read_grammar("ir.lark"), parser="lalr", propagate_positions=True,
                import_paths=[FromPackageLoader("marlin_dsl.grammar")])


def _syntax_error(err: UnexpectedInput, text: str, source: str) -> IRParseError:
    message, line = describe_syntax_error(_parser(), err, text)
    return IRParseError(message, SourceLocation(source, line))


def parse_kernels(text: str, source: str = "<ir>", check: bool = True) -> list[Kernel]:
    """Parse every kernel of `text`. With `check` (the default) each kernel is verified; a
    `VerifyError` then carries the location of the kernel's first line."""
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as err:
        raise _syntax_error(err, text, source) from None
    try:
        texts: list[_KernelText] = _IRTransformer(source).transform(tree)
    except VisitError as err:
        # lark wraps exceptions raised in callbacks; ours already carry the location.
        if isinstance(err.orig_exc, MarlinDSLError):
            raise err.orig_exc from None
        raise
    kernels: list[Kernel] = []
    first: dict[str, int] = {}
    for kt in texts:
        if kt.name in first:
            raise IRParseError(f"kernel @{kt.name} declared twice (first on line {first[kt.name]})",
                               SourceLocation(source, kt.line))
        first[kt.name] = kt.line
        kernel = _KernelBuilder(kt, source).build()
        if check:
            try:
                verify(kernel)
            except VerifyError as err:
                raise VerifyError(err.message, SourceLocation(source, kt.line)) from None
        kernels.append(kernel)
    return kernels


def parse_kernel(text: str, source: str = "<ir>", check: bool = True) -> Kernel:
    """Parse text holding exactly one kernel."""
    kernels = parse_kernels(text, source, check)
    if len(kernels) != 1:
        raise IRParseError(f"expected one kernel, found {len(kernels)}", SourceLocation(source, 1))
    return kernels[0]


# ----- structural equality --------------------------------------------------------------------
