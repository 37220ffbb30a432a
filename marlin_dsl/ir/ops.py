"""The op set, declared as data: arity, attributes, regions, effects, a type rule, the traits
the passes read and, for the ALU ops, the scalar semantics (`evaluate`, from semantics.py).

Every consumer (verifier, textual form, interpreter, folder and the other passes) reads these
definitions instead of keeping its own list, so an op is added in one place; a printer's table
(targets/c_printer.py) says which of them its target can print.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Callable

from . import semantics
from .core import BufferParam, Kernel, Op, SharedArray
from .tensor_rules import (_async_copy, _async_wait, _frag_build, _frag_elems, _frag_load, _frag_store,
                           _frag_zero, _mma, _mma_sp, _shfl_xor, _vstore, _wgmma, _wgmma_fence, _wgmma_wait)
from .sync_rules import _mbarrier, _warp_roles
from .types import BOOL, F32, U8, U16, U32, ScalarType, Type, VectorType

TypeRule = Callable[[Op, Kernel], str | None]  # returns an error message or None


@dataclass(frozen=True)
class OpDef:
    name: str
    operands: tuple[int, int | None]  # (min, max); max None = variadic
    attrs: tuple[str, ...] = ()  # required attributes
    optional_attrs: tuple[str, ...] = ()
    regions: int = 0
    results: tuple[int, int | None] = (0, 0)
    writes_memory: bool = False  # a store, atomic or barrier: never removed or reordered freely
    reads_memory: bool = False
    collective: bool = False  # executed by a whole warp: operands must be warp-uniform
    terminator: bool = False
    rule: TypeRule | None = None
    doc: str = ""
    #: Traits the passes read (declared here, once, for every op):
    #: f(a, b) == f(b, a): fold puts a constant second, cse keys both orders alike.
    commutative: bool = False
    #: the hardware pipe the interleave pass's latency model charges: "alu" (integer or float
    #: by the value's type), "int" (always the integer pipe: bit reinterpretation), "free"
    #: (no instruction: constants), "memory" (beyond what reads/writes_memory say: constant
    #: tables) or "" (classified by the other traits).
    pipe: str = ""
    #: the op computes in its operands' type, not its result's (comparisons give bool): the
    #: type an "alu" op's pipe is chosen by.
    operand_typed: bool = False
    #: the scalar semantics (semantics.py): Signature -> numpy evaluator over operand arrays,
    #: shared by the interpreter and the folder; None for ops that are not pure arithmetic.
    evaluate: semantics.Semantics | None = None
    #: no op moves across it when a pass reorders a block (ir/graph.py): what lies between two
    #: such ops stays there (a batch of wgmmas: ptxas serialises them if anything else runs
    #: between the batch's fence and its commit)
    schedule_fence: bool = False

    @property
    def pure(self) -> bool:
        """No side effect and no control flow: the op's results depend on its operands (and
        attributes) only, so cse may merge it, dce drop it and the folder evaluate it."""
        return not (self.writes_memory or self.reads_memory or self.regions or self.terminator)


def _same(op: Op, _: Kernel) -> str | None:
    t = op.operands[0].type
    if any(v.type != t for v in op.operands):
        return f"operands must share one type, got {[str(v.type) for v in op.operands]}"
    if op.result.type != t:
        return f"result type {op.result.type} must be {t}"
    return None


def _int_same(op: Op, k: Kernel) -> str | None:
    t = op.operands[0].type
    if not (isinstance(t, ScalarType) and (t.is_int or t == BOOL)):
        return f"needs integer or bool operands, got {t}"
    if op.name in ("div", "rem") and t not in (U8, U16, U32):
        return f"div and rem are unsigned, got {t}"
    return _same(op, k)


def _float_same(op: Op, k: Kernel) -> str | None:
    t = op.operands[0].type
    elem = t.elem if isinstance(t, VectorType) else t
    if not (isinstance(elem, ScalarType) and elem.is_float):
        return f"needs float operands (scalars or vectors), got {t}"
    return _same(op, k)


def _compare(op: Op, _: Kernel) -> str | None:
    if op.operands[0].type != op.operands[1].type:
        return "compared operands must share one type"
    return None if op.result.type == BOOL else "a comparison yields bool"


def _select(op: Op, _: Kernel) -> str | None:
    c, a, b = op.operands
    if c.type != BOOL:
        return "select condition must be bool"
    return None if a.type == b.type == op.result.type else "select arms and result must share one type"


def _scalar_result(op: Op, _: Kernel) -> str | None:
    return None if isinstance(op.result.type, ScalarType) else "result must be a scalar"


def _width(t: Type) -> int | None:
    if isinstance(t, ScalarType):
        return t.bits
    if isinstance(t, VectorType):
        return t.elem.bits * t.size
    return None


def _convert(op: Op, _: Kernel) -> str | None:
    src, dst = op.operands[0].type, op.result.type
    if op.name == "bitcast" and U32 in (src, dst) and VectorType in (type(src), type(dst)):
        # A 32-bit word reinterpreted as a pair of 16-bit floats (element 0 in the low half).
        if str(dst) != op.attrs.get("to"):
            return f"result type {dst} does not match to={op.attrs.get('to')}"
        vec = src if isinstance(src, VectorType) else dst
        ok = isinstance(vec, VectorType) and vec.elem.name in ("f16", "bf16") and _width(vec) == 32
        return None if ok else f"bitcast between u32 and {vec}: only vec<f16|bf16, 2> is 32 bits"
    if not (isinstance(src, ScalarType) and isinstance(dst, ScalarType)):
        return "cast/bitcast take and give scalars"
    if str(dst) != op.attrs.get("to"):
        return f"result type {dst} does not match to={op.attrs.get('to')}"
    if op.name == "bitcast" and src.bits != dst.bits:
        return f"bitcast between different widths {src} -> {dst}"
    return None


def _f32_unary(op: Op, k: Kernel) -> str | None:
    if op.operands[0].type != F32:
        return f"{op.name} takes and gives f32, got {op.operands[0].type}"
    return _same(op, k)


def _lop3(op: Op, _: Kernel) -> str | None:
    if any(v.type != U32 for v in op.operands) or op.result.type != U32:
        return "lop3 takes and gives u32"
    lut = op.attrs.get("lut")
    return None if isinstance(lut, int) and 0 <= lut <= 255 else f"lop3 lut must be 0..255, got {lut!r}"


def _u32_result(op: Op, _: Kernel) -> str | None:
    return None if op.result.type == U32 else "result must be u32"


def _memory(op: Op, kernel: Kernel) -> str | None:
    name = op.attrs.get("buffer")
    try:
        decl = kernel.symbol(str(name))
    except KeyError:
        return f"unknown buffer @{name}"
    if not isinstance(decl, (BufferParam, SharedArray)):
        return f"@{name} is not a buffer or shared array"
    if op.name in ("store", "atomic_add") and isinstance(decl, BufferParam) and decl.access == "read":
        return f"{op.name} to read-only buffer @{name}"
    if op.name == "atomic_add" and not isinstance(decl, BufferParam):
        return "atomic_add works on device buffers only"
    elem = decl.elem
    if op.operands[0].type != U32:
        return "memory index must be u32"
    predicate_at = {"load": 1, "vload": 1, "store": 2}.get(op.name)  # atomic_add has none
    if predicate_at is not None and len(op.operands) > predicate_at and op.operands[predicate_at].type != BOOL:
        return "predicate must be bool"
    if op.name == "load" and op.result.type != elem:
        return f"load from @{name} gives {elem}, not {op.result.type}"
    if op.name == "vload" and op.result.type != VectorType(elem, int(op.attrs.get("size", 0))):
        return f"vload result must be vec<{elem}, size>"
    if op.name == "store" and op.operands[1].type != elem:
        return f"store to @{name} needs {elem}, got {op.operands[1].type}"
    if op.name == "atomic_add" and (elem != U32 or op.operands[1].type != U32 or op.result.type != U32):
        return "atomic_add works on u32 buffers"
    return None


def _extract(op: Op, _: Kernel) -> str | None:
    t = op.operands[0].type
    if not isinstance(t, VectorType):
        return "extract needs a vector"
    if not 0 <= int(op.attrs["index"]) < t.size:
        return f"index {op.attrs['index']} outside vec of {t.size}"
    return None if op.result.type == t.elem else f"extract from {t} gives {t.elem}"


def _vec(op: Op, _: Kernel) -> str | None:
    t = op.result.type
    first = op.operands[0].type
    if isinstance(first, VectorType):  # concatenation of vectors of one element type
        if any(not isinstance(v.type, VectorType) or v.type.elem != first.elem for v in op.operands):
            return f"vec takes scalars of one type or vectors of one element type, got {[str(v.type) for v in op.operands]}"
        total = sum(v.type.size for v in op.operands)  # type: ignore[union-attr]
        return None if t == VectorType(first.elem, total) else \
            f"vec of vectors of {total} x {first.elem} gives vec<{first.elem}, {total}>, not {t}"
    elem = first
    if not isinstance(elem, ScalarType) or any(v.type != elem for v in op.operands):
        return "vec takes scalars of one type or vectors of one element type"
    if t != VectorType(elem, len(op.operands)):
        return f"vec of {len(op.operands)} x {elem} gives vec<{elem}, {len(op.operands)}>, not {t}"
    return None


def _table(op: Op, kernel: Kernel) -> str | None:
    try:
        decl = kernel.symbol(str(op.attrs["name"]))
    except KeyError:
        return f"unknown table @{op.attrs['name']}"
    if op.operands[0].type != U32:
        return "table index must be u32"
    return None if op.result.type == getattr(decl, "elem", None) else "table result type mismatch"


_INDEX_KINDS = ("tid", "lane", "warp", "group_x", "group_y", "group_z")
#: fence scope "async_proxy": this thread's earlier writes of shared memory become visible to
#: the asynchronous proxy (the warpgroup MMA reading shared memory) once a barrier follows
_SCOPES = {"barrier": ("threadgroup", "simdgroup"), "fence": ("device", "threadgroup", "async_proxy")}


def _index(op: Op, k: Kernel) -> str | None:
    if op.attrs["kind"] not in _INDEX_KINDS:
        return f"index kind must be one of {_INDEX_KINDS}, got {op.attrs['kind']!r}"
    return _u32_result(op, k)


def _scoped(op: Op, _: Kernel) -> str | None:
    allowed = _SCOPES[op.name]
    return None if op.attrs["scope"] in allowed else f"{op.name} scope must be one of {allowed}"


def _const(op: Op, k: Kernel) -> str | None:
    t, value = op.result.type, op.attrs["value"]
    if not isinstance(t, ScalarType):
        return "const gives a scalar"
    if t == BOOL:
        return None if isinstance(value, bool) else f"a bool const needs true/false, got {value!r}"
    if t.is_int:
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            return f"an integer const needs an integer value, got {value!r}"
        lo, hi = (-(2 ** 31), 2 ** 31 - 1) if t.name == "i32" else (0, 2 ** t.bits - 1)
        return None if lo <= value <= hi else f"{value} does not fit in {t}"
    return None if isinstance(value, numbers.Real) and not isinstance(value, bool) else \
        f"a float const needs a number, got {value!r}"


def _for(op: Op, _: Kernel) -> str | None:
    if any(v.type != U32 for v in op.operands[:3]):
        return "for bounds and step must be u32"
    inits = op.operands[3:]
    body = op.regions[0]
    if len(body.args) != 1 + len(inits) or body.args[0].type != U32:
        return "for body takes the u32 index and one argument per carried value"
    if [a.type for a in body.args[1:]] != [v.type for v in inits]:
        return "for body arguments must match the carried values' types"
    return _yields(op, [v.type for v in inits])


def _if(op: Op, _: Kernel) -> str | None:
    if op.operands[0].type != BOOL:
        return "if condition must be bool"
    return _yields(op, [r.type for r in op.results])


def _switch(op: Op, _: Kernel) -> str | None:
    cases = op.attrs["cases"]
    if not isinstance(cases, tuple) or len(op.regions) != len(cases) + 1:
        return "switch needs one region per case plus a default region"
    if op.operands[0].type != U32:
        return "switch selector must be u32"
    return _yields(op, [r.type for r in op.results])


def _yields(op: Op, types: list[Type]) -> str | None:
    if op.name != "for" and [r.type for r in op.results] != types:
        return "result types mismatch"
    if op.name == "for" and [r.type for r in op.results] != types:
        return "for results must match the carried values"
    for region in op.regions:
        if not region.ops or region.ops[-1].name != "yield":
            return f"every region of {op.name} ends with yield"
        if [v.type for v in region.ops[-1].operands] != types:
            return f"yield types {[str(v.type) for v in region.ops[-1].operands]} != {[str(t) for t in types]}"
    return None


#: Binary ops whose operands commute (the `commutative` trait below).
_COMMUTATIVE = frozenset({"add", "mul", "min", "max", "and", "or", "xor", "eq", "ne"})

#: The integer ops whose semantics are not plain element-wise numpy (they have error cases).
_INT_SEMANTICS = {"div": semantics.div_rem, "rem": semantics.div_rem, "shl": semantics.shift,
                  "shr": semantics.shift}

OPS: dict[str, OpDef] = {}


def _define(*defs: OpDef) -> None:
    for d in defs:
        OPS[d.name] = d


_BIN = (2, 2)
_define(
    OpDef("const", (0, 0), ("value",), results=(1, 1), rule=_const, pipe="free",
          doc="a compile-time constant of the result type"),
    OpDef("index", (0, 0), ("kind",), results=(1, 1), rule=_index,
          doc="thread coordinates: tid, lane, warp, group_x, group_y, group_z"),
    OpDef("scalar", (0, 0), ("name",), results=(1, 1), rule=_u32_result,
          doc="a launch-time scalar (M, N, K)"),
    *(OpDef(n, _BIN, results=(1, 1), rule=_same, pipe="alu", commutative=n in _COMMUTATIVE,
            evaluate=semantics.binary)
      for n in ("add", "sub", "mul", "min", "max")),
    *(OpDef(n, _BIN, results=(1, 1), rule=_int_same, pipe="alu", commutative=n in _COMMUTATIVE,
            evaluate=_INT_SEMANTICS.get(n, semantics.binary))
      for n in ("div", "rem", "and", "or", "xor", "shl", "shr")),
    OpDef("fma", (3, 3), results=(1, 1), rule=_float_same, pipe="alu", evaluate=semantics.fma,
          doc="a * b + c"),
    *(OpDef(n, (1, 1), results=(1, 1), rule=_f32_unary, pipe="alu", evaluate=semantics.transcendental,
            doc=doc)
      for n, doc in (("exp2", "2 ** a (f32; within 2 ulp on a device, docs/IR.md)"),
                     ("recip", "1 / a (f32; within 1 ulp on a device, docs/IR.md)"))),
    OpDef("lop3", (3, 3), ("lut",), results=(1, 1), rule=_lop3, pipe="alu", evaluate=semantics.lop3,
          doc="any bitwise function of three u32 operands by its truth table: result bit i is bit "
              "(4 a_i + 2 b_i + c_i) of lut (PTX's lop3 convention; (a & b) | c is 0xEA)"),
    *(OpDef(n, _BIN, results=(1, 1), rule=_compare, pipe="alu", operand_typed=True,
            commutative=n in _COMMUTATIVE, evaluate=semantics.binary)
      for n in ("lt", "le", "gt", "ge", "eq", "ne")),
    OpDef("select", (3, 3), results=(1, 1), rule=_select, pipe="alu", evaluate=semantics.select),
    OpDef("cast", (1, 1), ("to",), results=(1, 1), rule=_convert, pipe="alu", evaluate=semantics.cast,
          doc="numeric conversion"),
    OpDef("bitcast", (1, 1), ("to",), results=(1, 1), rule=_convert, pipe="int",
          evaluate=semantics.bitcast, doc="reinterpret bits"),
    OpDef("load", (1, 2), ("buffer",), results=(1, 1), reads_memory=True, rule=_memory,
          doc="buffer[index]; with a false predicate no access happens and the result is 0"),
    OpDef("vload", (1, 2), ("buffer", "size"), results=(1, 1), reads_memory=True, rule=_memory,
          doc="size consecutive elements from buffer[index], index a multiple of size"),
    OpDef("extract", (1, 1), ("index",), results=(1, 1), rule=_extract),
    OpDef("vec", (2, None), results=(1, 1), rule=_vec,
          doc="a short vector of the operands in order: scalars, or vectors concatenated"),
    OpDef("store", (2, 3), ("buffer",), writes_memory=True, rule=_memory,
          doc="buffer[index] = value, skipped where the predicate is false"),
    OpDef("vstore", (2, 3), ("buffer", "size"), writes_memory=True, rule=_vstore,
          doc="buffer[index .. index + size) = the vector's elements (one wide store) into a shared "
              "array or a written device buffer, index a multiple of size; skipped where the "
              "predicate is false"),
    OpDef("atomic_add", (2, 2), ("buffer",), results=(1, 1), writes_memory=True,
          reads_memory=True, rule=_memory, doc="returns the old value"),
    OpDef("table", (1, 1), ("name",), results=(1, 1), rule=_table, pipe="memory", evaluate=semantics.table,
          doc="constant table lookup"),
    OpDef("barrier", (0, 0), ("scope",), writes_memory=True, rule=_scoped,
          doc="threadgroup: all threads of the group; simdgroup: the threads of one warp"),
    OpDef("fence", (0, 0), ("scope",), writes_memory=True, rule=_scoped, doc="memory ordering for device memory"),
    OpDef("frag_zero", (0, 0), results=(1, 1), rule=_frag_zero, collective=True),
    OpDef("frag_load", (1, 1), ("buffer", "ld"), ("transpose",), results=(1, 1),
          reads_memory=True, collective=True, rule=_frag_load,
          doc="a warp loads a rows x cols tile at offset with leading dimension ld"),
    OpDef("frag_build", (1, None), results=(1, 1), collective=True, rule=_frag_build,
          doc="a fragment from each lane's own elements (scalars or vectors, concatenated) in "
              "the order the target's lane layout gives them (Target.lane_elements)"),
    OpDef("frag_store", (2, 2), ("buffer", "ld"), writes_memory=True, collective=True,
          rule=_frag_store),
    OpDef("frag_elems", (1, 1), results=(1, 1), collective=True, rule=_frag_elems,
          doc="this lane's elements of a fragment as a vector, in the order of the target's lane "
              "layout (the inverse of frag_build)"),
    # Asynchronous copies name their memories `dst`/`src`, not `buffer`, so the dependence
    # graph treats them as barriers (they write shared memory and read device memory).
    OpDef("async_copy", (2, 3), ("dst", "src", "size"), writes_memory=True, reads_memory=True,
          rule=_async_copy,
          doc="start copying size elements (4, 8 or 16 bytes) of device @src[src_index] to shared "
              "@dst[dst_index], zeros where the predicate is false; the destination is undefined "
              "until an async_wait retires the copy's group"),
    OpDef("async_commit", (0, 0), writes_memory=True,
          doc="close this thread's open group of async copies"),
    OpDef("async_wait", (0, 0), ("pending",), writes_memory=True, rule=_async_wait,
          doc="wait until at most `pending` of this thread's committed groups are in flight; the "
              "retired copies are visible to this thread, to others after a barrier"),
    # pipe "memory": a shuffle crosses the warp like a shared-memory access (CUDA's MIO pipe)
    OpDef("shfl_xor", (1, 1), ("mask",), results=(1, 1), collective=True, rule=_shfl_xor, pipe="memory",
          doc="the operand's value in lane (this lane xor mask) of the warp: a warp shuffle, "
              "executed by every lane of the warp"),
    OpDef("mma", (3, 3), results=(1, 1), collective=True, rule=_mma, doc="c + a @ b"),
    OpDef("mma_sp", (4, 4), ("selector",), results=(1, 1), collective=True, rule=_mma_sp,
          doc="c + decompress(a, meta) @ b: 2:4 sparse a, compressed to half its columns; meta is "
              "each lane's u32 metadata word, read at the lanes and bits the target's table "
              "(Target.sparse_metadata(selector)) names"),
    # The warpgroup MMA (docs/IR.md, "Warpgroup MMA"). It names its shared memory `smem`, not
    # `buffer`, and the fence/commit/wait have none, so the dependence graph keeps them in
    # order against every memory op; all are collective, so fragment builds stay on their side.
    OpDef("wgmma", (3, 4), ("smem",), ("smem_a", "selector"), results=(1, 1), reads_memory=True,
          collective=True, rule=_wgmma,
          doc="start c + A @ B, issued by a warpgroup: a is this warp's rows of A (a fragment), or with "
              "`smem_a` the element offset of the warpgroup's A tile in shared @smem_a (m rows of k, "
              "the target's swizzled rows; warp w's rows m/4 w ..); B (k x n) is read from shared "
              "@smem at element offset b as the target's swizzled rows (one row per column of B); c "
              "is this warp's rows of the accumulator. The result is in flight until a wgmma_wait "
              "retires it: only a wgmma, a wgmma_fence, a yield and a wgmma_wait may take it. With a 4th "
              "operand meta (u32) and `selector`: the 2:4 sparse form (k = the target's "
              "warpgroup_sparse_k; A given compressed, k/2 columns, located by each warp's "
              "metadata words as in mma_sp)"),
    OpDef("wgmma_fence", (0, None), writes_memory=True, collective=True, rule=_wgmma_fence, schedule_fence=True,
          doc="order earlier register writes of the operand fragments before the wgmmas that follow "
              "(needed before each batch of wgmmas)"),
    OpDef("wgmma_commit", (0, 0), writes_memory=True, collective=True, schedule_fence=True,
          doc="close this warp's open group of wgmmas"),
    OpDef("wgmma_wait", (0, None), ("pending",), results=(0, 1), writes_memory=True, collective=True,
          rule=_wgmma_wait,
          doc="wait until at most `pending` of this warp's committed wgmma groups are in flight. With a "
              "result (pending 0): the result is the first operand, an accumulator, now readable; "
              "the other operands (a fragments of the retired wgmmas) are kept alive until here"),
    # Warp specialisation (docs/IR.md, "Warp roles and mbarriers"). The mbarrier ops name
    # their array `barriers`, not `buffer`, so the dependence graph orders them against every
    # memory op (they are the roles' only means of ordering memory between warps).
    OpDef("warp_roles", (0, 0), ("warps",), ("regs",), regions=1, writes_memory=True, reads_memory=True,
          rule=_warp_roles,
          doc="split the threadgroup's warps into roles that run apart: region i runs on the next "
              "warps[i] warps (role 0 on warps 0 .., in order) and only there; the roles meet only at "
              "mbarriers. `regs`: per role the register count it moves to on entry (CUDA's "
              "setmaxnreg; 0 leaves it). In the kernel body only; every region yields nothing"),
    OpDef("mbarrier_init", (1, 1), ("barriers", "count"), writes_memory=True, rule=_mbarrier,
          doc="initialise barrier index of shared @barriers (two u32 words each): phase 0, `count` "
              "arrivals complete a phase. One thread initialises; a threadgroup barrier follows "
              "before any other thread uses it"),
    OpDef("mbarrier_arrive", (1, 1), ("barriers",), writes_memory=True, rule=_mbarrier,
          doc="this thread arrives once on barrier index: its earlier memory accesses are released to "
              "the threads that wait for the phase its arrival completes"),
    OpDef("mbarrier_wait", (2, 2), ("barriers",), writes_memory=True, reads_memory=True, rule=_mbarrier,
          doc="wait until the phase of barrier index whose parity (0 or 1) is given has completed "
              "(the current phase, or the one just before it); then the memory accesses released by "
              "that phase's arrivals are visible to this thread"),
    OpDef("for", (3, None), optional_attrs=("specialise",), regions=1, results=(0, None), rule=_for,
          doc="for index = lb; index < ub; index += step, carrying values through yield"),
    OpDef("if", (1, 1), regions=2, results=(0, None), rule=_if),
    OpDef("switch", (1, 1), ("cases",), regions=1, results=(0, None), rule=_switch,
          doc="one region per case value, then a default region"),
    OpDef("yield", (0, None), terminator=True),
)
# switch and warp_roles have variable region counts; the verifier checks them through the rules.
