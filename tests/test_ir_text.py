"""The textual IR: canonical printing, parsing with SSA scoping, round trips and errors."""
from __future__ import annotations

import math

import numpy as np
import pytest

from marlin_dsl.errors import MarlinDSLError, SourceLocation
from marlin_dsl.ir import (
    BF16, F16, F32, I32, OPS, U8, U32, Block, Builder, BufferParam, ConstTable, FragmentType,
    GridDim, Kernel, ScalarParam, SharedArray, Value, VectorType, VerifyError, verify,
)
from marlin_dsl.ir.text import (
    IRParseError, assert_round_trip, kernel_difference, kernels_equal, parse_kernel,
    parse_kernels, print_kernel, print_kernels,
)

__all__ = ["assert_round_trip"]  # for the compiler's round trip tests of lowered kernels

FRAG_A = FragmentType("a", F16, 16, 16)
FRAG_B = FragmentType("b", F16, 16, 8)
FRAG_C = FragmentType("c", F32, 16, 8)


def _kernel(b: Builder, name: str = "k", **kw) -> Kernel:
    """A kernel around the builder's body with the declarations the test kernels use."""
    defaults = dict(
        threads=128,
        grid=(GridDim("N", 64), GridDim("M", 64, 2), GridDim(None, count=1)),
        scalars=[ScalarParam("M"), ScalarParam("N"), ScalarParam("K")],
        buffers=[BufferParam("x", F16, "read"), BufferParam("y", F16, "write"),
                 BufferParam("counter", U32, "readwrite"), BufferParam("out", F32, "readwrite")],
        shared=[SharedArray("a_s", F16, 4096), SharedArray("c_s", F32, 128),
                SharedArray("w_s", F16, 8192, align=1024), SharedArray("bars", U32, 4)],
        tables=[ConstTable("lut", U8, (0, 1, 2)),
                ConstTable("nf", F16, (-1.0, -0.0, 0.0, 1e-05, 0.5, 1.5e20))],
    )
    defaults.update(kw)
    kernel = Kernel(name, body=b.block, **defaults)
    verify(kernel)
    return kernel


def every_op_kernel() -> Kernel:
    """A valid kernel that uses every op of OPS and every kind of attribute value."""
    b = Builder()
    tid = b.index("tid")
    for kind in ("lane", "warp", "group_x", "group_y", "group_z"):
        b.index(kind)
    m, n = b.scalar("M"), b.scalar("N")
    b.scalar("K")
    zero, one, four = b.const(0), b.const(1), b.const(4)
    half = b.const(0.5, F32)
    b.const(float("-inf"), F32)
    b.const(float("inf"), F16)
    b.const(float("nan"), F32)
    b.const(-0.0, BF16)
    b.const(1, F32)  # an int value on a float constant stays an int
    b.const(-7, I32)
    t = tid
    for name in ("add", "sub", "mul", "min", "max", "div", "rem", "and", "or", "xor", "shl", "shr"):
        t = b.binary(name, t, one if name in ("div", "rem", "shl", "shr") else m)
    flags = [b.binary(name, tid, n) for name in ("lt", "le", "gt", "ge", "eq", "ne")]
    p = b.binary("and", flags[0], flags[1])  # logical on bool
    sel = b.select(p, t, zero)
    f = b.cast(sel, F32)
    b.value("fma", [f, half, f], F32)
    b.bitcast(f, U32)
    b.cast(b.cast(f, F16), BF16)
    x0 = b.load("x", tid, F16)
    x1 = b.load("x", tid, F16, pred=p)
    vec = b.value("vload", [four, p], VectorType(F16, 4), {"buffer": "x", "size": 4})
    lane2 = b.value("extract", [vec], F16, {"index": 2})
    b.store("y", tid, x0)
    b.store("y", tid, lane2, pred=p)
    b.store("a_s", tid, x1)
    b.value("atomic_add", [zero, one], U32, {"buffer": "counter"})
    b.value("table", [tid], U8, {"name": "lut"})
    b.value("table", [tid], F16, {"name": "nf"})
    b.barrier()
    b.barrier("simdgroup")
    b.op("fence", attrs={"scope": "device"})

    # for with carried values (a fragment and a u32), specialise, and nested if / for.
    acc0 = b.value("frag_zero", [], FRAG_C, hint="acc")
    i, acc, s = b.fresh("i", U32), b.fresh("acc", FRAG_C), b.fresh("s", U32)
    with b.region([i, acc, s]) as loop:
        fa = b.value("frag_load", [i], FRAG_A, {"buffer": "a_s", "ld": 16}, hint="fa")
        fb = b.value("frag_load", [i], FRAG_B, {"buffer": "x", "ld": 8, "transpose": True}, hint="fb")
        acc_next = b.value("mma", [fa, fb, acc], FRAG_C, hint="acc")
        cond = b.binary("lt", i, n)
        with b.region() as then:
            j = b.fresh("j", U32)
            with b.region([j]) as inner:  # a loop without carried values or results
                b.store("y", j, x0)
                b.yield_()
            b.op("for", [zero, four, one], [], regions=[inner])
            b.yield_(b.binary("add", s, i))
        with b.region() as else_:
            b.yield_(s)
        s_next = b.op("if", [cond], [U32], regions=[then, else_], hint="s").result
        b.yield_(acc_next, s_next)
    acc_end, s_end = b.op("for", [zero, m, four, acc0, zero], [FRAG_C, U32], {"specialise": 4},
                          [loop], hint="acc").results
    b.op("frag_store", [acc_end, zero], attrs={"buffer": "c_s", "ld": 8})
    # vec, frag_build and the sparse MMA (they read the target's lane tables: attrs target=cuda)
    fa16 = b.value("frag_build", [b.value("vec", [x0] * 8, VectorType(F16, 8))], FRAG_A, hint="fa")
    fb32 = b.value("frag_build", [x0] * 8, FragmentType("b", F16, 32, 8), hint="fb")
    b.value("mma_sp", [fa16, fb32, acc_end, tid], FRAG_C, {"selector": 1}, hint="acc")
    b.value("frag_elems", [acc_end], VectorType(F32, 4), hint="ce")
    b.value("shfl_xor", [b.value("vec", [x0, x0], VectorType(F16, 2))], VectorType(F16, 2), {"mask": 3}, hint="sh")
    # asynchronous copies: device x -> shared a_s, predicated and not, then commit and wait
    b.op("async_copy", [zero, zero, p], attrs={"dst": "a_s", "src": "x", "size": 8})
    b.op("async_copy", [four, four], attrs={"dst": "a_s", "src": "x", "size": 2})
    b.op("async_commit")
    b.op("async_wait", attrs={"pending": 0})
    # the warpgroup MMA (A in registers, then A from shared memory), its fence, commit and
    # waits, the async-proxy fence and a vector store; w_s is aligned for swizzled rows
    b.op("vstore", [four, b.value("vec", [x0, x0], VectorType(F16, 2))], attrs={"buffer": "w_s", "size": 2})
    b.op("fence", attrs={"scope": "async_proxy"})
    wide = FragmentType("c", F32, 16, 64)
    acc_w = b.value("frag_zero", [], wide, hint="accw")
    b.op("wgmma_fence", [fa16, acc_w])
    acc_w1 = b.value("wgmma", [fa16, zero, acc_w], wide, {"smem": "w_s"}, hint="accw")
    acc_w2 = b.value("wgmma", [zero, zero, acc_w1], wide, {"smem": "w_s", "smem_a": "w_s"}, hint="accw")
    b.op("wgmma_commit")
    b.op("wgmma_wait", attrs={"pending": 1})
    b.value("wgmma_wait", [acc_w2, fa16], wide, {"pending": 0}, hint="accw")
    b.value("lop3", [tid, four, one], U32, {"lut": 0xEA}, hint="l3")  # (a & b) | c

    # if without results, switch with results and a nested switch.
    with b.region() as then:
        b.barrier()
        b.yield_()
    with b.region() as else_:
        b.yield_()
    b.op("if", [p], [], regions=[then, else_])
    cases = []
    for value in (0, 1, 7):
        with b.region() as case:
            b.yield_(b.binary("add", s_end, b.const(value)), x0)
        cases.append(case)
    with b.region() as default:
        with b.region() as inner_case:
            b.yield_(one)
        with b.region() as inner_default:
            b.yield_(zero)
        picked = b.op("switch", [tid], [U32], {"cases": (3,)}, [inner_case, inner_default]).result
        b.yield_(picked, lane2)
    r, h = b.op("switch", [s_end], [U32, F16], {"cases": (0, 1, 7)}, [*cases, default], hint="r").results
    b.store("y", r, h)
    # warp specialisation: two roles (1 and 3 of the 4 warps) meeting at mbarriers
    with b.region() as init:
        b.op("mbarrier_init", [zero], attrs={"barriers": "bars", "count": 32})
        b.yield_()
    with b.region() as no_init:
        b.yield_()
    b.op("if", [b.binary("eq", tid, zero)], [], regions=[init, no_init])
    b.barrier()
    with b.region() as producer:
        b.op("mbarrier_arrive", [zero], attrs={"barriers": "bars"})
        b.yield_()
    with b.region() as consumer:
        b.op("mbarrier_wait", [zero, zero], attrs={"barriers": "bars"})
        b.yield_()
    b.op("warp_roles", [], attrs={"warps": (1, 3), "regs": (0, 152)}, regions=[producer, consumer])
    b.value("recip", [b.value("exp2", [b.const(0.5, F32)], F32)], F32)  # the epilogues' f32 functions
    return _kernel(b, "every_op", attrs={"target": "cuda",
        "format": "fp4_g128", "schedule": "db 64", "tile_m": 64, "neg": -3, "ratio": 0.1,
        "inf": float("inf"), "on": True, "off": False, "word": "true", "empty": "",
        "quoted": 'a "b"\n\tc é', "shape": (64, (2, 4), ()), "mixed": (1, 1.0, "x", False),
        "at": "@x", "digits": "8x8",
    })


def small_kernel() -> Kernel:
    b = Builder()
    tid = b.index("tid")
    v = b.load("x", tid, F16)
    b.store("y", tid, v)
    return _kernel(b, "copy", threads=32, grid=(GridDim(None, count=4), GridDim(None), GridDim(None)),
                   scalars=[], shared=[], tables=[],
                   buffers=[BufferParam("x", F16, "read"), BufferParam("y", F16, "write")])


SMALL_TEXT = """\
kernel @copy {
  threads 32
  warp_size 32
  grid [4, 1, 1]
  buffer @x : f16 read
  buffer @y : f16 write
  body {
    %tid0 = index[kind=tid]() : u32
    %ld0 = load[buffer=@x](%tid0) : f16
    store[buffer=@y](%tid0, %ld0)
  }
}
"""


# ----- round trips ------------------------------------------------------------------------------

def test_every_op_is_covered() -> None:
    used = {op.name for op in every_op_kernel().walk()}
    assert used == set(OPS)


def test_every_op_round_trip() -> None:
    kernel = every_op_kernel()
    parsed = assert_round_trip(kernel)
    assert kernels_equal(kernel, parsed)
    # Attribute values keep their Python types.
    attrs = parsed.attrs
    assert attrs["tile_m"] == 64 and type(attrs["tile_m"]) is int
    assert attrs["on"] is True and attrs["word"] == "true"
    assert attrs["shape"] == (64, (2, 4), ()) and attrs["mixed"] == (1, 1.0, "x", False)
    assert type(attrs["mixed"][1]) is float
    consts = [op.attrs["value"] for op in parsed.walk() if op.name == "const"]
    assert any(type(c) is int and c == 1 for c in consts)
    assert any(isinstance(c, float) and math.isnan(c) for c in consts)
    assert any(c == 0 and math.copysign(1, c) < 0 for c in consts if isinstance(c, float))
    loads = [op for op in parsed.walk() if op.name in ("load", "store", "vload")]
    assert all(type(op.attrs["buffer"]) is str and not op.attrs["buffer"].startswith("@") for op in loads)


def test_small_kernel_golden_text() -> None:
    kernel = small_kernel()
    assert print_kernel(kernel) == SMALL_TEXT
    assert kernels_equal(parse_kernel(SMALL_TEXT), kernel)


def test_canonical_text_details() -> None:
    text = print_kernel(every_op_kernel())
    assert "  attrs {at=\"@x\", digits=\"8x8\", empty=\"\", format=fp4_g128, inf=inf," in text
    assert "  grid [ceil(N, 64), ceil(M, 64) * 2, 1]\n" in text
    assert "  table @nf : f16[6] = [-1.0, -0.0, 0.0, 1e-05, 0.5, 1.5e+20]\n" in text
    assert "    %acc3, %acc4 = for[specialise=4](%c0, %M0, %c2, %acc0, %c0) : frag<c, f32, 16x8>, u32 {\n" \
           "    ^(%i0: u32, %acc1: frag<c, f32, 16x8>, %s0: u32):\n" \
           "      %fa0 = frag_load[buffer=@a_s, ld=16](%i0) : frag<a, f16, 16x16>\n" in text
    assert "        for(%c0, %c2, %c1) {\n        ^(%j0: u32):\n" in text
    assert "%fb0 = frag_load[buffer=@x, ld=8, transpose=true](%i0) : frag<b, f16, 16x8>" in text
    assert "%v25 = vload[buffer=@x, size=4](%c2, %v18) : vec<f16, 4>" in text
    assert "    %r0, %r1 = switch[cases=[0, 1, 7]](%acc4) : u32, f16 {\n" in text
    assert "    } {\n      %c12 = const[value=7]() : u32\n" in text
    assert "%v28 = table[name=@lut](%tid0) : u8" in text


def test_parse_order_of_header_lines_is_free() -> None:
    """Declarations and header lines may come in any order; printing puts them in order."""
    text = """\
kernel @copy {
  buffer @x : f16 read
  grid [4, 1, 1]
  buffer @y : f16 write
  threads 32
  body {
    %tid0 = index[kind=tid]() : u32
    %ld0 = load[buffer=@x](%tid0) : f16
    store[buffer=@y](%tid0, %ld0)
  }
}
"""
    assert print_kernel(parse_kernel(text)) == SMALL_TEXT  # warp_size defaults to 32


def test_several_kernels_and_comments() -> None:
    a, b = small_kernel(), every_op_kernel()
    text = print_kernels([a, b])
    commented = "// two kernels\n" + text.replace("  body {\n", "  body {  // the body\n    // first op\n")
    for source in (text, commented):
        parsed = parse_kernels(source)
        assert [k.name for k in parsed] == ["copy", "every_op"]
        assert kernels_equal(parsed[0], a) and kernels_equal(parsed[1], b)
    assert print_kernels(parse_kernels(commented)) == text
    assert parse_kernels("// nothing\n") == []


def test_quoted_and_symbol_attribute_forms_are_equivalent() -> None:
    """`buffer=@x`, `buffer=x` and `buffer="x"` read the same; printing picks `@x`."""
    for spelling in ("@x", "x", '"x"'):
        text = SMALL_TEXT.replace("buffer=@x", f"buffer={spelling}")
        assert print_kernel(parse_kernel(text)) == SMALL_TEXT


def test_unverified_op_attributes_round_trip() -> None:
    """The printer and parser do not restrict attribute kinds per op: that is the verifier's job."""
    b = Builder()
    b.op("mystery", attrs={"s": "a b", "f": 2.5, "t": (1, ("u", 2.0)), "name": "not an id", "n": -1})
    kernel = Kernel("k", 32, (GridDim(None),) * 3, b.block)
    text = print_kernel(kernel)
    assert 'mystery[f=2.5, n=-1, name="not an id", s="a b", t=[1, [u, 2.0]]]()' in text
    parsed = parse_kernel(text, check=False)
    assert kernels_equal(kernel, parsed) and print_kernel(parsed) == text
    with pytest.raises(VerifyError) as info:
        parse_kernel(text, "m.ir")
    assert info.value.location == SourceLocation("m.ir", 1)


def test_numpy_scalars_print_as_python_numbers() -> None:
    b = Builder()
    b.const(np.int64(3))
    b.const(np.float32(0.1), F32)
    kernel = _kernel(b, tables=[ConstTable("t", F32, tuple(np.array([0.25, 2.0], np.float32)))])
    parsed = assert_round_trip(kernel)
    assert [op.attrs["value"] for op in parsed.walk()] == [3, float(np.float32(0.1))]
    assert parsed.tables[0].values == (0.25, 2.0)


def test_kernels_equal_sees_differences() -> None:
    base = print_kernel(small_kernel())
    variants = {
        "name": base.replace("@copy", "@copy2"),
        "threads": base.replace("threads 32", "threads 64"),
        "grid": base.replace("[4, 1, 1]", "[ceil(N, 4), 1, 1]"),
        "buffers": base.replace("@y : f16 write", "@y : f16 readwrite"),
        "value name": base.replace("%ld0", "%ld1"),
        "attr": base.replace("kind=tid", "kind=lane"),
        "op": base.replace("store[buffer=@y](%tid0, %ld0)", "%c0 = const[value=0]() : u32\n"
                           "    store[buffer=@y](%c0, %ld0)"),
    }
    kernel = parse_kernel(base)
    for what, text in variants.items():
        other = parse_kernel(text, check=False)  # the grid variant names an undeclared scalar
        assert not kernels_equal(kernel, other), what
    int_const = parse_kernel(SMALL_TEXT.replace("    store", "    %c0 = const[value=1]() : f32\n    store"))
    float_const = parse_kernel(SMALL_TEXT.replace("    store", "    %c0 = const[value=1.0]() : f32\n    store"))
    assert "attrs" in (kernel_difference(int_const, float_const) or "")
    true_const = parse_kernel(SMALL_TEXT.replace("    store", "    %c0 = const[value=true]() : bool\n    store"))
    one_const = parse_kernel(SMALL_TEXT.replace("    store", "    %c0 = const[value=1]() : bool\n    store"),
                             check=False)  # the verifier rejects a non-bool value for bool
    assert not kernels_equal(true_const, one_const)


def test_operand_wiring_is_compared() -> None:
    """Same names and types, but an operand that is not the value defined under that name."""
    def build(rewire: bool) -> Kernel:
        b = Builder()
        b.binary("add", b.const(1), b.const(2))
        kernel = _kernel(b)
        if rewire:  # prints the same, but %c1 is now a value defined nowhere
            kernel.body.ops[-1].operands[1] = Value("c1", U32)
        return kernel
    assert print_kernel(build(False)) == print_kernel(build(True))
    assert "refers to another value" in (kernel_difference(build(False), build(True)) or "")


def test_constant_grid_dimension_ignores_tile() -> None:
    """GridDim(None, tile, count) prints as its count; the tile is not part of equality."""
    b = Builder()
    kernel = _kernel(b, grid=(GridDim(None, tile=8, count=2), GridDim(None), GridDim("K", 32)))
    assert "  grid [2, 1, ceil(K, 32)]\n" in print_kernel(kernel)
    assert_round_trip(kernel)


# ----- errors ---------------------------------------------------------------------------------

def parse_error(text: str, source: str = "k.ir") -> IRParseError:
    with pytest.raises(IRParseError) as info:
        parse_kernels(text, source)
    assert isinstance(info.value, MarlinDSLError) and isinstance(info.value, ValueError)
    return info.value


def _with_body(ops: str) -> str:
    """SMALL_TEXT with `ops` (lines of 4-space indented ops) in place of its body."""
    head, _, _ = SMALL_TEXT.partition("  body {\n")
    return head + "  body {\n" + ops + "  }\n}\n"


def test_syntax_error_names_the_line() -> None:
    text = SMALL_TEXT.replace("%ld0 = load[buffer=@x](%tid0) : f16", "%ld0 = load[buffer=@x](%tid0 : f16")
    err = parse_error(text)
    assert err.location == SourceLocation("k.ir", 9)
    assert "syntax error" in err.message and "':'" in err.message


def test_syntax_error_unexpected_character_and_end() -> None:
    err = parse_error(SMALL_TEXT.replace("threads 32", "threads 32 $"))
    assert err.location == SourceLocation("k.ir", 2) and "'$'" in err.message
    err = parse_error(SMALL_TEXT[:-3])
    assert "end of input" in err.message and err.location is not None


def test_undefined_value() -> None:
    err = parse_error(SMALL_TEXT.replace("store[buffer=@y](%tid0, %ld0)", "store[buffer=@y](%tid0, %nope)"))
    assert err.location == SourceLocation("k.ir", 10)
    assert "undefined value %nope" in err.message


def test_value_used_outside_its_scope() -> None:
    text = _with_body("""\
    %tid0 = index[kind=tid]() : u32
    %p0 = eq(%tid0, %tid0) : bool
    if(%p0) {
      %ld0 = load[buffer=@x](%tid0) : f16
      yield()
    } {
      yield()
    }
    store[buffer=@y](%tid0, %ld0)
""")
    err = parse_error(text)
    assert err.location == SourceLocation("k.ir", 16)
    assert "%ld0 used outside its scope (defined on line 11)" in err.message


def test_value_from_sibling_region_is_out_of_scope() -> None:
    text = _with_body("""\
    %tid0 = index[kind=tid]() : u32
    %p0 = eq(%tid0, %tid0) : bool
    %r0 = if(%p0) : f16 {
      %ld0 = load[buffer=@x](%tid0) : f16
      yield(%ld0)
    } {
      yield(%ld0)
    }
""")
    err = parse_error(text)
    assert err.location == SourceLocation("k.ir", 14) and "outside its scope" in err.message


def test_value_used_before_definition_and_own_result_in_region() -> None:
    err = parse_error(_with_body("""\
    %ld0 = load[buffer=@x](%tid0) : f16
    %tid0 = index[kind=tid]() : u32
"""))
    assert err.location == SourceLocation("k.ir", 8) and "before its definition" in err.message
    # An op's results are not visible inside its own regions.
    err = parse_error(_with_body("""\
    %tid0 = index[kind=tid]() : u32
    %p0 = eq(%tid0, %tid0) : bool
    %r0 = if(%p0) : u32 {
      yield(%r0)
    } {
      yield(%tid0)
    }
"""))
    assert err.location == SourceLocation("k.ir", 11) and "%r0" in err.message


def test_region_arguments_are_scoped_to_their_region() -> None:
    err = parse_error(_with_body("""\
    %c0 = const[value=0]() : u32
    for(%c0, %c0, %c0) {
    ^(%i0: u32):
      yield()
    }
    store[buffer=@y](%i0, %i0)
"""))
    assert err.location == SourceLocation("k.ir", 13) and "%i0 used outside its scope" in err.message


@pytest.mark.parametrize("edit, line, words", [
    (("%ld0 = load", "%tid0 = load"), 9, "%tid0 defined twice (first on line 8)"),
    (("(%tid0) : f16", "(%tid0) : f16, u32"), 9, "defines 1 values but lists 2 types"),
    (("(%tid0) : f16", "(%tid0) : f17"), 9, "unknown scalar type 'f17'"),
    (("index[kind=tid]() : u32", "index[kind=tid]() : frag<d, f32, 8x8>"), 8, "role"),
    (("@x : f16 read", "@x : f16 readonly"), 5, "access must be one of"),
    (("grid [4, 1, 1]", "grid [4, 1]"), 4, "grid needs 3 dimensions"),
    (("  threads 32\n", ""), 1, "missing threads line"),
    (("  threads 32\n", "  threads 32\n  threads 64\n"), 3, "threads given twice (first on line 2)"),
    (("  buffer @y", "  buffer @x : f16 read\n  buffer @y"), 6, "symbol @x declared twice"),
    (("kind=tid", "kind=tid, kind=lane"), 8, "attribute 'kind' given twice"),
    (("kind=tid", 'kind="\\q"'), 8, "invalid string literal"),
    (("  threads 32\n", '  threads 32\n  table @t : u8[2] = [1]\n'), 3, "declares 2 values but lists 1"),
])
def test_item_errors_name_the_line(edit: tuple[str, str], line: int, words: str) -> None:
    assert edit[0] in SMALL_TEXT
    err = parse_error(SMALL_TEXT.replace(*edit))
    assert err.location == SourceLocation("k.ir", line)
    assert words in err.message


def test_duplicate_kernel_and_parse_kernel_count() -> None:
    err = parse_error(SMALL_TEXT + SMALL_TEXT)
    assert err.location == SourceLocation("k.ir", 13) and "@copy declared twice" in err.message
    with pytest.raises(IRParseError, match="expected one kernel, found 2"):
        parse_kernel(SMALL_TEXT + SMALL_TEXT.replace("@copy", "@copy2"))


def test_verifier_errors_carry_the_kernel_location() -> None:
    text = "\n" + SMALL_TEXT.replace("(%tid0) : f16", "(%tid0) : f32")
    with pytest.raises(VerifyError) as info:
        parse_kernels(text, "k.ir")
    assert info.value.location == SourceLocation("k.ir", 2)
    assert "load from @x gives f16" in info.value.message
    assert parse_kernels(text, check=False)[0].body.ops[1].result.type == F32


def test_unprintable_names_are_rejected() -> None:
    kernel = small_kernel()
    kernel.body.ops[0].results[0].name = "has space"
    with pytest.raises(ValueError, match="value name 'has space'"):
        print_kernel(kernel)
    b = Builder()
    b.block.args.append(Value("a", U32))
    with pytest.raises(ValueError, match="body block cannot have arguments"):
        print_kernel(Kernel("k", 32, (GridDim(None),) * 3, b.block))
    with pytest.raises(TypeError, match="no textual form"):
        print_kernel(Kernel("k", 32, (GridDim(None),) * 3, Block(), attrs={"x": {1: 2}}))  # type: ignore[dict-item]

