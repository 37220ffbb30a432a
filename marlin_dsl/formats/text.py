"""Textual form of formats: a canonical printer and a parser for `grammar/format.lark`.

    format fp4_2of4 {
      element float(bits=4, exp_bits=2, man_bits=1, bias=1, signed=true)
      packing bitstream(word_bits=32)
      scale group(size=128, dtype=f16)
      sparsity nm(n=2, m=4, chunk=1)
      doc "2:4 structured sparse FP4 (seed 000 layout)"
    }

The text becomes part of the compiler's textual IR and of generated manifests, so printing
is canonical: fixed item and attribute order, every attribute written out, floats as
`repr(float)` (which reads back exactly). Print -> parse -> print is the identity and
parse(print(f)) == f. When parsing, attributes with a default in the Python API may be left
out, like the keyword arguments they mirror; so may the lines for packing and scale (default
Packing() and GroupScale()), zero_point, bias and sparsity (none) and doc (empty).
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from functools import lru_cache
from typing import Any, Callable, Iterable

from lark import Lark, Token, v_args
from lark.exceptions import UnexpectedInput, VisitError

from ..lark_errors import describe_syntax_error
from ..errors import FormatError, SourceLocation
from ..attr_text import Attr, AttrTransformer, Call, Symbol, Value, attrs_to_text, quote, value_to_text
from ..grammar import read_grammar
from .encodings import FloatEncoding, IntEncoding, TableEncoding
from .format import Format, Packing
from .scaling import PER_COLUMN, SCALE_SCHEMES, GroupBias, GroupScale, ZeroPoint
from .sparsity import BlockPatternSparsity, NMSparsity


# ----- what each line of a format may say ---------------------------------------------------

class _WrongType(Exception):
    def __init__(self, expected: str) -> None:
        self.expected = expected


def _int(value: Value) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _WrongType("an integer")


def _bool(value: Value) -> bool:
    if isinstance(value, bool):
        return value
    raise _WrongType("true or false")


def _ident(value: Value) -> str:
    if isinstance(value, Symbol):
        return str(value)
    raise _WrongType("an identifier")


def _floats(value: Value) -> tuple[float, ...]:
    # Integers are accepted (values=[-1, 0, 1]); they print back as floats.
    if isinstance(value, list) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
    ):
        return tuple(float(v) for v in value)
    raise _WrongType("a list of numbers")


def _group_size(value: Value) -> int | str:
    if isinstance(value, Symbol) and value == PER_COLUMN:
        return PER_COLUMN
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _WrongType(f"an integer or {PER_COLUMN}")


Checker = Callable[[Value], Any]


def _scheme_kinds() -> dict[str | None, tuple[type, tuple[tuple[str, str, Checker], ...]]]:
    """The `scale <kind>(...)` lines of the scale schemes (formats/scaling/), from each
    scheme's own `text_kind` and `text_attrs`."""
    checkers: dict[str, Checker] = {"int": _int, "ident": _ident, "group_size": _group_size}
    return {kind: (cls, tuple((text, name, checkers[check]) for text, name, check in cls.text_attrs))
            for kind, cls in SCALE_SCHEMES.items()}
#: (class, ((text attribute, dataclass field, checker), ...)); the order is the printed order.
_Kind = tuple[type, tuple[tuple[str, str, Checker], ...]]

# One table drives both printing and parsing, so the two cannot disagree on names, order
# or kinds. Keys are the item keywords (also the Format fields) in printed order; the inner
# keys are the kind names (None: the item has no kind, as in `zero_point(dtype=u8)`).
_ITEMS: dict[str, dict[str | None, _Kind]] = {
    "element": {
        "float": (FloatEncoding, (("bits", "bits", _int), ("exp_bits", "exp_bits", _int),
                                  ("man_bits", "man_bits", _int), ("bias", "bias", _int),
                                  ("signed", "signed", _bool), ("specials", "specials", _ident))),
        "int": (IntEncoding, (("bits", "bits", _int), ("offset", "offset", _int))),
        "table": (TableEncoding, (("bits", "bits", _int), ("values", "values", _floats))),
    },
    "packing": {"bitstream": (Packing, (("word_bits", "word_bits", _int),))},
    "scale": {"group": (GroupScale, (("size", "group_size", _group_size),
                                     ("dtype", "dtype", _ident), ("zero", "zero", _ident))),
              **_scheme_kinds()},
    "zero_point": {None: (ZeroPoint, (("dtype", "dtype", _ident),))},
    "bias": {None: (GroupBias, (("dtype", "dtype", _ident),))},
    "sparsity": {
        "nm": (NMSparsity, (("n", "n", _int), ("m", "m", _int), ("chunk", "chunk", _int))),
        "block_pattern": (BlockPatternSparsity, (("block_k", "block_k", _int),
                                                 ("block_n", "block_n", _int))),
    },
}


# ----- printing -------------------------------------------------------------------------------

#: Attributes written only when they differ from their default, so that adding them left the
#: text (and everything keyed by it: kernel names, caches, saved models) of older formats as is.
_OMITTED_AT_DEFAULT = {("element", "specials"): "none", ("scale", "zero"): "refused"}


def _item_to_text(keyword: str, part: object, fmt: Format) -> str:
    for kind, (cls, attrs) in _ITEMS[keyword].items():
        if type(part) is cls:  # exact type: a subclass may carry fields we would drop
            head = keyword if kind is None else f"{keyword} {kind}"
            values = []
            for name, field_name, _ in attrs:
                value = getattr(part, field_name)
                if _OMITTED_AT_DEFAULT.get((keyword, name), object()) == value:
                    continue
                # Every string field of a format part (dtypes, group size K) is an identifier.
                values.append((name, Symbol(value) if isinstance(value, str) else value))
            return head + attrs_to_text(values)
    raise FormatError(f"format {fmt.name!r}: {keyword} of type {type(part).__name__} "
                      f"has no textual form", fmt.location)


def format_to_text(fmt: Format) -> str:
    """The canonical text of one format declaration, ending in a newline."""
    lines = [f"format {fmt.name} {{"]
    for keyword in _ITEMS:
        part = getattr(fmt, keyword)
        if part is not None:
            lines.append("  " + _item_to_text(keyword, part, fmt))
    lines.append(f"  doc {quote(fmt.doc)}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def formats_to_text(formats: Iterable[Format]) -> str:
    """Several declarations, separated by blank lines."""
    return "\n".join(format_to_text(f) for f in formats)


# ----- parsing --------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Item:
    keyword: str
    line: int
    kind: str | None = None
    attrs: tuple[Attr, ...] = ()
    doc: str = ""


def _describe(value: Value) -> str:
    kind = {bool: "boolean", int: "integer", float: "float", Symbol: "identifier",
            str: "string", list: "list"}[type(value)]
    return f"{kind} {value_to_text(value)}"


def _build_part(item: _Item, fmt_name: str, source: str) -> object:
    where = SourceLocation(source, item.line)
    kinds = _ITEMS[item.keyword]
    if item.kind not in kinds:
        raise FormatError(f"format {fmt_name!r}: unknown {item.keyword} kind {item.kind!r} "
                          f"(known: {', '.join(sorted(k for k in kinds if k))})", where)
    cls, spec = kinds[item.kind]
    what = f"format {fmt_name!r}: {item.keyword}" + (f" {item.kind}" if item.kind else "")
    known = [name for name, _, _ in spec]
    given: dict[str, Attr] = {}
    for attr in item.attrs:
        at = SourceLocation(source, attr.line)
        if attr.name not in known:
            raise FormatError(f"{what}: unknown attribute {attr.name!r} "
                              f"(known: {', '.join(known)})", at)
        if attr.name in given:
            raise FormatError(f"{what}: attribute {attr.name!r} given twice", at)
        given[attr.name] = attr
    required = {f.name for f in fields(cls)
                if f.default is MISSING and f.default_factory is MISSING}
    kwargs: dict[str, Any] = {}
    for name, field_name, check in spec:
        attr = given.get(name)
        if attr is None:
            if field_name in required:
                raise FormatError(f"{what}: missing attribute {name!r}", where)
            continue
        try:
            kwargs[field_name] = check(attr.value)
        except _WrongType as wrong:
            raise FormatError(f"{what}: attribute {name!r} must be {wrong.expected}, "
                              f"got {_describe(attr.value)}",
                              SourceLocation(source, attr.line)) from None
    # The constructors' own checks (e.g. sign + exp + man == bits) report this line.
    return cls(**kwargs, location=where)


class _FormatTransformer(AttrTransformer):
    """Builds `Format`s; the line of each item is the line of its keyword (meta)."""

    @v_args(meta=True)
    def element(self, meta: Any, children: list[Call]) -> _Item:
        return self._item("element", meta, children[0])

    @v_args(meta=True)
    def packing(self, meta: Any, children: list[Call]) -> _Item:
        return self._item("packing", meta, children[0])

    @v_args(meta=True)
    def scale(self, meta: Any, children: list[Call]) -> _Item:
        return self._item("scale", meta, children[0])

    @v_args(meta=True)
    def sparsity(self, meta: Any, children: list[Call]) -> _Item:
        return self._item("sparsity", meta, children[0])

    @v_args(meta=True)
    def zero_point(self, meta: Any, children: list[list[Attr]]) -> _Item:
        return _Item("zero_point", meta.line, None, tuple(children[0]))

    @v_args(meta=True)
    def bias(self, meta: Any, children: list[list[Attr]]) -> _Item:
        return _Item("bias", meta.line, None, tuple(children[0]))

    @v_args(meta=True)
    def doc(self, meta: Any, children: list[Token]) -> _Item:
        return _Item("doc", meta.line, doc=self.unquote(children[0]))

    @staticmethod
    def _item(keyword: str, meta: Any, call: Call) -> _Item:
        return _Item(keyword, meta.line, call.kind, tuple(call.attrs))

    @v_args(meta=True)
    def format_decl(self, meta: Any, children: list[Any]) -> Format:
        name, items = str(children[0]), children[1:]
        where = SourceLocation(self.source, meta.line)
        seen: dict[str, _Item] = {}
        for item in items:
            if item.keyword in seen:
                raise FormatError(
                    f"format {name!r}: {item.keyword} given twice "
                    f"(first on line {seen[item.keyword].line})",
                    SourceLocation(self.source, item.line))
            seen[item.keyword] = item
        if "element" not in seen:
            raise FormatError(f"format {name!r}: missing element line", where)
        parts = {keyword: _build_part(item, name, self.source)
                 for keyword, item in seen.items() if keyword != "doc"}
        doc = seen["doc"].doc if "doc" in seen else ""
        return Format(name, doc=doc, location=where, **parts)

    def start(self, children: list[Format]) -> list[Format]:
        first: dict[str, Format] = {}
        for fmt in children:
            if fmt.name in first:
                raise FormatError(f"format {fmt.name!r} declared twice "
                                  f"(first at {first[fmt.name].location})", fmt.location)
            first[fmt.name] = fmt
        return children


@lru_cache(maxsize=1)
def _parser() -> Lark:
    # propagate_positions gives each rule's meta the line of its first token, keyword included.
    return Lark(read_grammar("format.lark"), parser="lalr", propagate_positions=True)


def _syntax_error(err: UnexpectedInput, text: str, source: str) -> FormatError:
    message, line = describe_syntax_error(_parser(), err, text)
    return FormatError(message, SourceLocation(source, line))


def formats_from_text(text: str, source: str = "<text>") -> list[Format]:
    """Parse one or more format declarations; errors are FormatErrors naming source:line."""
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as err:
        raise _syntax_error(err, text, source) from None
    try:
        return _FormatTransformer(source).transform(tree)
    except VisitError as err:
        # lark wraps exceptions raised in callbacks; ours already carry the location.
        if isinstance(err.orig_exc, FormatError):
            raise err.orig_exc from None
        raise
