"""The textual form of formats: canonical printing, parsing, round trips and errors."""
from __future__ import annotations

import pytest
from lark import Lark
from lark.load_grammar import FromPackageLoader

from marlin_dsl import (
    BUILTIN_FORMATS, BlockPatternSparsity, FloatEncoding, Format, FormatError, GroupScale,
    IntEncoding, NMSparsity, Packing, TableEncoding, ZeroPoint, builtin_format,
)
from marlin_dsl.errors import SourceLocation
from marlin_dsl.formats.text import (
    AttrTransformer, Symbol, format_to_text, formats_from_text, formats_to_text,
)

FP4_2OF4_TEXT = """\
format fp4_2of4 {
  element float(bits=4, exp_bits=2, man_bits=1, bias=1, signed=true)
  packing bitstream(word_bits=32)
  scale group(size=128, dtype=f16)
  sparsity nm(n=2, m=4, chunk=1)
  doc "2:4 structured sparse FP4 (seed 000 layout)"
}
"""


def round_trip(fmt: Format) -> Format:
    """Print, parse and print again; the parsed format must equal the original."""
    text = format_to_text(fmt)
    parsed = formats_from_text(text)
    assert len(parsed) == 1
    assert parsed[0] == fmt
    assert format_to_text(parsed[0]) == text
    return parsed[0]


def parse_error(text: str, source: str = "spec.fmt") -> FormatError:
    with pytest.raises(FormatError) as info:
        formats_from_text(text, source)
    return info.value


# ----- round trips ------------------------------------------------------------------------------

@pytest.mark.parametrize("group_size", [None, 64, 256, "K"])
@pytest.mark.parametrize("name", sorted(BUILTIN_FORMATS))
def test_builtin_round_trip(name: str, group_size: int | str | None) -> None:
    fmt = builtin_format(name, group_size)
    parsed = round_trip(fmt)
    assert parsed.location == SourceLocation("<text>", 1)
    assert parsed.element.location == SourceLocation("<text>", 2)


def test_per_column_scale_prints_identifier_k() -> None:
    assert "  scale group(size=K, dtype=f16)\n" in format_to_text(builtin_format("int4", "K"))


CUSTOM = {
    "int3_zp": Format("int3_zp", IntEncoding(3), GroupScale(128), ZeroPoint("u8"),
                      doc="unsigned INT3 with integer zero points"),
    "int3_fzp": Format("int3_fzp", IntEncoding(3, offset=4), GroupScale("K"), ZeroPoint("f16")),
    "table2": Format("table2", TableEncoding(bits=2, values=(-1.5, -1 / 3, 5e-324, 1e20)),
                     GroupScale(32)),
    "table_signed_zero": Format("table_signed_zero", TableEncoding(1, values=(-0.0, 1e-05))),
    "int4_4of8": Format("int4_4of8", IntEncoding(4, offset=8), GroupScale(128),
                        sparsity=NMSparsity(2, 4, chunk=2), doc="pair-wise 4:8 (seed 001)"),
    "fp4_block4x16": Format("fp4_block4x16", FloatEncoding(4, exp_bits=2, man_bits=1),
                            sparsity=BlockPatternSparsity(block_k=4, block_n=16)),
    "fp4_word16": Format("fp4_word16", FloatEncoding(4), GroupScale(64), packing=Packing(16)),
    "e3m2_unsigned": Format("e3m2_unsigned",
                            FloatEncoding(5, exp_bits=3, man_bits=2, bias=3, signed=False)),
    "doc_escapes": Format("doc_escapes", IntEncoding(8, offset=128),
                          doc='quote " backslash \\ newline \n tab \t // not a comment, µ'),
    # Keywords of the grammar are still fine as names.
    "element": Format("element", IntEncoding(2)),
}


@pytest.mark.parametrize("key", sorted(CUSTOM))
def test_custom_round_trip(key: str) -> None:
    round_trip(CUSTOM[key])


def test_custom_values_are_printed_as_written() -> None:
    text = format_to_text(CUSTOM["int4_4of8"])
    assert "  sparsity nm(n=2, m=4, chunk=2)\n" in text
    assert "  zero_point" not in text
    assert "  zero_point(dtype=u8)\n" in format_to_text(CUSTOM["int3_zp"])
    assert "  sparsity block_pattern(block_k=4, block_n=16)\n" in format_to_text(
        CUSTOM["fp4_block4x16"])
    assert "  packing bitstream(word_bits=16)\n" in format_to_text(CUSTOM["fp4_word16"])
    table = format_to_text(CUSTOM["table2"])
    assert f"values=[-1.5, {-1 / 3!r}, 5e-324, 1e+20]" in table


def test_golden_fp4_2of4() -> None:
    assert format_to_text(builtin_format("fp4_2of4")) == FP4_2OF4_TEXT
    assert formats_from_text(FP4_2OF4_TEXT) == [builtin_format("fp4_2of4")]


def test_several_declarations() -> None:
    formats = [factory() for factory in BUILTIN_FORMATS.values()] + list(CUSTOM.values())
    text = formats_to_text(formats)
    parsed = formats_from_text(text, "all.fmt")
    assert parsed == formats
    assert formats_to_text(parsed) == text
    # Each location is the line of its `format` keyword.
    lines = text.splitlines()
    for fmt in parsed:
        assert fmt.location is not None and fmt.location.file == "all.fmt"
        assert lines[fmt.location.line - 1] == f"format {fmt.name} {{"


def test_optional_lines_and_attributes_take_the_python_defaults() -> None:
    [fmt] = formats_from_text("format x { element float(bits=4) }")
    assert fmt == Format("x", FloatEncoding(4))
    assert fmt.doc == "" and fmt.zero_point is None and fmt.sparsity is None
    assert format_to_text(fmt) == (
        "format x {\n"
        "  element float(bits=4, exp_bits=2, man_bits=1, bias=1, signed=true)\n"
        "  packing bitstream(word_bits=32)\n"
        "  scale group(size=128, dtype=f16)\n"
        '  doc ""\n'
        "}\n"
    )


def test_table_values_may_be_integers() -> None:
    [fmt] = formats_from_text("format t { element table(bits=1, values=[-1, 2]) }")
    assert fmt.element == TableEncoding(1, values=(-1.0, 2.0))
    assert "values=[-1.0, 2.0]" in format_to_text(fmt)


# ----- comments, whitespace, determinism ------------------------------------------------------

def test_comments_and_whitespace() -> None:
    text = """
    // A spec written by hand.

    format   fp4_2of4{   // trailing comment
      doc "2:4 structured sparse FP4 (seed 000 layout)"   // items in any order
      sparsity nm( n = 2 ,m=4,
                   chunk=1 , )     // trailing comma
      scale group(size=128,dtype=f16)
      // packing left out: the default
      element float(bits=4, exp_bits=2,
                    man_bits=1, bias=1, signed=true)
    }
    format fp4{element float(bits=4,exp_bits=2,man_bits=1,bias=1,signed=true)doc "dense FP4 E2M1 with fp16 group scales"}
    """
    first, second = formats_from_text(text, "hand.fmt")
    assert first == builtin_format("fp4_2of4") and second == builtin_format("fp4")
    assert first.location == SourceLocation("hand.fmt", 4)
    assert first.sparsity.location == SourceLocation("hand.fmt", 6)
    assert first.element.location == SourceLocation("hand.fmt", 10)
    assert second.location == SourceLocation("hand.fmt", 13)
    assert format_to_text(first) == FP4_2OF4_TEXT


def test_printing_is_deterministic() -> None:
    a = builtin_format("uint4_zp", 64)
    # Same format declared another way (keyword order, explicit defaults, other location).
    b = Format(doc=a.doc, packing=Packing(32), zero_point=ZeroPoint(), scale=GroupScale(64),
               element=IntEncoding(bits=4, offset=0), name="uint4_zp_g64")
    assert a == b
    assert format_to_text(a) == format_to_text(b) == format_to_text(a)
    text = format_to_text(a)
    assert formats_to_text(formats_from_text(text + "\n" + text.replace("uint4_zp_g64", "y"))) == (
        text + "\n" + text.replace("uint4_zp_g64", "y"))


# ----- errors ---------------------------------------------------------------------------------

def test_syntax_error_names_the_line() -> None:
    err = parse_error("format x {\n  element float(bits=4)\n  scale group(size=128 dtype=f16)\n}\n")
    assert err.location == SourceLocation("spec.fmt", 3)
    assert "syntax error" in str(err) and "'dtype'" in str(err) and str(err).startswith("spec.fmt:3:")
    assert isinstance(err, ValueError)


@pytest.mark.parametrize("text, line, fragment", [
    ("format x {\n  elemnt float(bits=4)\n}", 2, "unexpected 'elemnt'"),
    ("format x {\n  element float(bits=4) @\n}", 2, "unexpected character '@'"),
    ("format x {\n  element float(bits=4)\n", 2, "end of input"),
    ("format 1x { element int(bits=4) }", 1, "unexpected '1'"),
    ("", 1, "expected one of: \"format\""),
])
def test_syntax_errors(text: str, line: int, fragment: str) -> None:
    err = parse_error(text)
    assert err.location == SourceLocation("spec.fmt", line)
    assert fragment in str(err)


@pytest.mark.parametrize("text, line, fragment", [
    ("format x {\n  element posit(bits=4)\n}", 2, "unknown element kind 'posit'"),
    ("format x {\n  element float(exp_bits=2, man_bits=1)\n}", 2, "missing attribute 'bits'"),
    ("format x {\n  element int(bits=4)\n  sparsity nm(n=2)\n}", 3, "missing attribute 'm'"),
    ("format x {\n  element float(bits=\"4\")\n}", 2,
     "attribute 'bits' must be an integer, got string \"4\""),
    ("format x {\n  element float(bits=4,\n    signed=1)\n}", 3, "must be true or false"),
    ("format x {\n  element int(bits=4)\n  scale group(size=k)\n}", 3, "an integer or K"),
    ("format x {\n  element int(bits=4)\n  zero_point(dtype=\"u8\")\n}", 3, "an identifier"),
    ("format x {\n  element int(bits=4, width=3)\n}", 2, "unknown attribute 'width'"),
    ("format x {\n  element int(bits=4, bits=4)\n}", 2, "given twice"),
    ("format x {\n  element int(bits=4)\n  element int(bits=4)\n}", 3, "element given twice"),
    ("format x {\n  doc \"no element\"\n}", 1, "missing element"),
    ("format x {\n  element int(bits=4)\n  sparsity dense()\n}", 3, "unknown sparsity kind"),
    ("format x {\n  element int(bits=4)\n  packing bitstream(word_bits=12)\n}", 3, "word_bits"),
    ("format x {\n  element float(bits=4, man_bits=2)\n}", 2, "must equal bits(4)"),
    ("format x {\n  element int(bits=4)\n  doc \"bad \\q escape\"\n}", 3, "invalid string"),
    ("format x { element int(bits=4) }\n\nformat x { element int(bits=4) }", 3, "declared twice"),
])
def test_semantic_errors(text: str, line: int, fragment: str) -> None:
    err = parse_error(text)
    assert err.location == SourceLocation("spec.fmt", line), str(err)
    assert fragment in str(err)


# ----- reuse of the attribute rules -----------------------------------------------------------

def test_attribute_rules_can_be_imported_by_another_grammar() -> None:
    # lark wants an %import on one line.
    grammar = """
    start: "op" call
    %import format (call, attrs, attr, value, list_value, int_value, float_value, bool_value, ident_value, string_value, NAME, COMMENT, WS)
    %ignore COMMENT
    %ignore WS
    """
    parser = Lark(grammar, parser="lalr", import_paths=[FromPackageLoader("marlin_dsl.grammar")])
    tree = parser.parse('op mma(m=16, scale=0.5, fast=false, dtype=f16, tag="a", ks=[1, [2]])')
    call = AttrTransformer("<ir>").transform(tree).children[0]
    assert call.kind == "mma"
    values = {a.name: a.value for a in call.attrs}
    assert values == {"m": 16, "scale": 0.5, "fast": False, "dtype": "f16", "tag": "a",
                      "ks": [1, [2]]}
    assert isinstance(values["dtype"], Symbol) and not isinstance(values["tag"], Symbol)
