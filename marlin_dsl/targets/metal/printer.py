"""Metal printer: kernel IR -> Metal Shading Language for MLX's `mx.fast.metal_kernel`.

`print_metal(kernel)` returns a `MetalSource`: `.header` (program-scope text: the includes,
constant tables as `constant` arrays, helper functions) and `.body` (the statements MLX
wraps in its generated kernel signature), plus the names MLX needs and `.full_source()`,
which reproduces the complete kernel text MLX compiles (header + signature + body).

The printer knows only the IR (docs/IR.md), nothing of formats or schedules. It prints
kernels before passes (structured `for` / `if` / `switch` regions, loops carrying values)
and after them.

Calling convention (how `mx.fast.metal_kernel` sees the kernel):

- inputs (`input_names`): the read-only buffers in kernel order, then `dims`, a small u32
  array holding the launch scalars in `kernel.scalars` order (M, N, K). Passing them as an
  input keeps one compiled kernel for every shape (template constants would recompile per
  shape). MLX passes inputs of fewer than 8 elements in the `constant` address space, so
  `dims` arrives as `const constant uint32_t*`; the body only indexes it.
- outputs (`output_names`): the write and readwrite buffers in kernel order. MLX allocates
  outputs itself, so readwrite buffers (the striped pipeline's `partials` and `counters`)
  must start as the kernel expects: launch with `init_value=0` (counters must be zero).
- the grid MLX dispatches is in *threads*: `launch_dims(scalars)` gives `grid` and
  `threadgroup` for `mx.fast.metal_kernel(...)(grid=..., threadgroup=...)`.
- thread coordinates come from the attributes MLX adds when their names occur in the body:
  `threadgroup_position_in_grid`, `thread_index_in_threadgroup`,
  `simdgroup_index_in_threadgroup`, `thread_index_in_simdgroup`.

Printing rules: every SSA value is a local variable named `v_<name>` (`uint v_c3 = 2u;`);
f16 -> `half`, bf16 -> `bfloat` (Metal 3.1+), vectors -> `half2`/`uint4`..., fragments ->
`simdgroup_matrix<T, 8, 8>`. `for` loops declare their carried values before the loop and
assign them at `yield`; `if`/`switch` results are declared before the statement and assigned
in every region. Loads with a predicate become `(p ? buf[i] : T(0))`, stores with one
`if (p) buf[i] = v;`. A fragment stored to memory of another element type is converted lane
by lane through `thread_elements()` (helper `mtl_convert_frag` in the header).
Threadgroup barriers fence threadgroup memory, and device memory too when the kernel has a
readwrite buffer (the IR's barrier makes both visible within the group). `fence[device]`
prints as `atomic_thread_fence(mem_flags::mem_device, memory_order_seq_cst,
thread_scope_device)` (Metal 3.2+), the fence that orders device memory *between*
threadgroups, which the striped pipeline's last-arriving reduction needs;
`print_metal(k, fence="barrier")` prints `threadgroup_barrier(mem_flags::mem_device)` instead
for older Metal versions, which orders device memory only within a threadgroup.
"""
from __future__ import annotations

import math
import re

import numpy as np

from ...errors import CompileError
from ...ir.numerics import f64_to_f32_odd, round_bf16
from ...ir.core import Kernel, Op, Value
from ...ir.verify import verify_legal
from ...ir.types import BF16, BOOL, F16, F32, FragmentType, ScalarType, Type, VectorType
from ...machine.metal import METAL
from .source import DIMS_NAME, MLX_ATTRIBUTES, MLX_DTYPE, MetalSource
from ..c_printer import CPrinter, lop3_expression

__all__ = ["MetalSource", "print_metal", "metal_type", "MLX_ATTRIBUTES", "DIMS_NAME"]

_SCALAR = {"bool": "bool", "u8": "uchar", "u16": "ushort", "u32": "uint", "i32": "int",
           "f16": "half", "bf16": "bfloat", "f32": "float"}
_INDEX = {"tid": "thread_index_in_threadgroup", "lane": "thread_index_in_simdgroup",
          "warp": "simdgroup_index_in_threadgroup", "group_x": "threadgroup_position_in_grid.x",
          "group_y": "threadgroup_position_in_grid.y", "group_z": "threadgroup_position_in_grid.z"}
_BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "rem": "%", "and": "&", "or": "|",
           "xor": "^", "shl": "<<", "shr": ">>", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
           "eq": "==", "ne": "!="}
_FRAG_ELEMS = ("f16", "bf16", "f32")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")


def metal_type(t: Type) -> str:
    """The Metal spelling of an IR type."""
    if isinstance(t, ScalarType):
        return _SCALAR[t.name]
    if isinstance(t, VectorType):
        if not 2 <= t.size <= 4:
            raise CompileError(f"metal: vectors have 2 to 4 elements, not {t.size} ({t})")
        return f"{_SCALAR[t.elem.name]}{t.size}"
    if isinstance(t, FragmentType):
        if (t.rows, t.cols) != (8, 8) or t.elem.name not in _FRAG_ELEMS:
            raise CompileError(f"metal: simdgroup matrices are 8x8 of half, bfloat or float, not {t}")
        return f"simdgroup_matrix<{_SCALAR[t.elem.name]}, 8, 8>"
    raise CompileError(f"metal: no spelling for type {t}")


def _round_float(value: float, t: ScalarType) -> float:
    """value rounded once to t (as the interpreter rounds a const)."""
    if t == F32:
        return float(np.float32(value))
    if t == F16:
        return float(np.float16(value))
    if t == BF16:
        return float(round_bf16(f64_to_f32_odd(np.array([value], dtype=np.float64)))[0])
    raise TypeError(t)


def _float_literal(value: float, t: ScalarType) -> str:
    """An exact Metal expression of type t for `value` rounded to t."""
    v = _round_float(float(value), t)
    name = _SCALAR[t.name]
    if math.isnan(v) or math.isinf(v):
        if t == F32:
            bits = int(np.array([v], np.float32).view(np.uint32)[0])
            return f"as_type<float>({bits:#010x}u)"
        if t == F16:
            bits = int(np.array([v], np.float16).view(np.uint16)[0])
        else:
            bits = int(np.array([v], np.float32).view(np.uint32)[0]) >> 16
        return f"as_type<{name}>(ushort({bits:#06x}))"
    text = repr(v) + "f"  # v is a float32 value: the f32 literal is exact
    return text if t == F32 else f"{name}({text})"


def _int_literal(value: int | bool, t: ScalarType) -> str:
    if t == BOOL:
        return "true" if value else "false"
    value = int(value)
    if t.name == "u32":
        return f"{value}u"
    if t.name == "i32":
        return "int(-2147483647 - 1)" if value == -2 ** 31 else (f"{value}" if value >= 0 else f"({value})")
    return f"{_SCALAR[t.name]}({value})"


def _literal(value, t: ScalarType) -> str:
    return _float_literal(value, t) if t.is_float else _int_literal(value, t)



class _Printer(CPrinter):
    target = "metal"
    target_title = "Metal"
    index_type = "uint"
    temp_decl = "auto"
    index_exprs = _INDEX
    dims_name = DIMS_NAME

    def __init__(self, kernel: Kernel, fence: str = "atomic_thread_fence") -> None:
        self.k = kernel
        self.fence = fence
        self.lines: list[str] = []
        self.names: dict[int, str] = {}
        self.taken: set[str] = set()
        self.helpers: set[str] = set()
        self.buffers = {b.name: b for b in kernel.buffers}
        self.shared = {s.name: s for s in kernel.shared}
        self.tables = {t.name: t for t in kernel.tables}
        self.scalar_index = {s.name: i for i, s in enumerate(kernel.scalars)}
        self.table_names: dict[str, str] = {}
        reserved = {DIMS_NAME, *self.buffers, *self.shared}
        for n in reserved:
            if not _IDENT.match(n):
                raise CompileError(f"metal: kernel {kernel.name}: @{n} is not a valid Metal identifier")
        if DIMS_NAME in self.buffers or DIMS_NAME in self.shared:
            raise CompileError(f"metal: kernel {kernel.name}: @{DIMS_NAME} is reserved for the launch scalars")
        self.taken |= reserved | {a for a, _ in MLX_ATTRIBUTES}
        for t in kernel.tables:
            name = self._unique("tbl_" + re.sub(r"\W", "_", t.name))
            self.table_names[t.name] = name
        device_rw = any(b.access == "readwrite" for b in kernel.buffers)
        self.tg_flags = "mem_flags::mem_threadgroup | mem_flags::mem_device" if device_rw \
            else "mem_flags::mem_threadgroup"

    # ----- memory --------------------------------------------------------------------------

    def memory(self, name: str) -> tuple[str, ScalarType]:
        if name in self.buffers:
            return name, self.buffers[name].elem
        if name in self.shared:
            return name, self.shared[name].elem
        raise CompileError(f"metal: kernel {self.k.name}: unknown memory @{name}")

    # ----- blocks ----------------------------------------------------------------------------

    def declare(self, depth: int, v: Value, expr: str) -> None:
        self.emit(depth, f"{metal_type(v.type)} {self.define(v)} = {expr};")

    # ----- ops: one emitter per op, gathered in EMITTERS below -------------------------------

    def op_const(self, op: Op, depth: int) -> None:
        t = op.result.type
        if not isinstance(t, ScalarType):
            raise CompileError(f"metal: const of type {t}")
        self.declare(depth, op.result, _literal(op.attrs["value"], t))

    def op_binary(self, op: Op, depth: int) -> None:
        n, ops = op.name, self.refs(op)
        t = op.operands[0].type
        expr = f"{ops[0]} {_BINARY[n]} {ops[1]}"
        if isinstance(t, ScalarType) and t.name in ("u8", "u16", "bf16") and n not in ("lt", "le", "gt", "ge", "eq", "ne") \
                or isinstance(t, ScalarType) and t == BOOL and n in ("and", "or", "xor"):
            expr = f"{metal_type(t)}({expr})"  # undo the promotion to int
        self.declare(depth, op.result, expr)

    def op_min_max(self, op: Op, depth: int) -> None:
        n, ops = op.name, self.refs(op)
        t = op.operands[0].type
        if isinstance(t, ScalarType) and t.is_float:
            fn = "metal::fmin" if n == "min" else "metal::fmax"
            if t == BF16:
                expr = f"bfloat({fn}(float({ops[0]}), float({ops[1]})))"
            else:
                expr = f"{fn}({ops[0]}, {ops[1]})"
        else:
            expr = f"metal::{n}({ops[0]}, {ops[1]})"
        self.declare(depth, op.result, expr)

    def op_fma(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        if op.result.type == BF16:
            expr = f"bfloat(metal::fma(float({ops[0]}), float({ops[1]}), float({ops[2]})))"
        else:
            expr = f"metal::fma({ops[0]}, {ops[1]}, {ops[2]})"
        self.declare(depth, op.result, expr)

    def op_transcendental(self, op: Op, depth: int) -> None:
        """exp2 and recip of a float (Metal's fast math: within a few ulp, docs/IR.md)."""
        a = self.refs(op)[0]
        self.declare(depth, op.result, f"metal::exp2({a})" if op.name == "exp2" else f"(1.0f / {a})")

    def op_select(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        self.declare(depth, op.result, f"{ops[0]} ? {ops[1]} : {ops[2]}")

    def op_lop3(self, op: Op, depth: int) -> None:
        self.declare(depth, op.result, lop3_expression(int(op.attrs["lut"]), *self.refs(op)))

    def op_cast(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        self.declare(depth, op.result, f"static_cast<{metal_type(op.result.type)}>({ops[0]})")

    def op_bitcast(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        self.declare(depth, op.result, f"as_type<{metal_type(op.result.type)}>({ops[0]})")

    def op_load(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        buf, elem = self.memory(str(op.attrs["buffer"]))
        access = f"{buf}[{ops[0]}]"
        if len(ops) > 1:
            access = f"{ops[1]} ? {access} : {metal_type(elem)}(0)"
        self.declare(depth, op.result, access)

    def op_vload(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        buf, elem = self.memory(str(op.attrs["buffer"]))
        vt = metal_type(op.result.type)
        # One vector load (a uint4 is 128 bits): the IR's index is a multiple of the size, so
        # the address is aligned to the vector as Metal requires.
        if buf in self.shared:
            size = int(op.attrs["size"])
            parts = [f"{buf}[{ops[0]}]"] + [f"{buf}[{ops[0]} + {i}u]" for i in range(1, size)]
            access = f"{vt}({', '.join(parts)})"
        else:
            access = f"*reinterpret_cast<const device {vt}*>({buf} + {ops[0]})"
        if len(ops) > 1:
            access = f"{ops[1]} ? {access} : {vt}({metal_type(elem)}(0))"
        self.declare(depth, op.result, access)

    def op_vstore(self, op: Op, depth: int) -> None:
        """A vector into a threadgroup array or a device buffer, element by element as
        `op_vload` reads one (both are declared of their scalar type)."""
        ops = self.refs(op)
        buf, _ = self.memory(str(op.attrs["buffer"]))
        size = int(op.attrs["size"])
        stmts = [f"{buf}[{ops[0]}{f' + {i}u' if i else ''}] = {ops[1]}[{i}];" for i in range(size)]
        if len(ops) > 2:
            self.emit(depth, f"if ({ops[2]}) {{ {' '.join(stmts)} }}")
        else:
            for stmt in stmts:
                self.emit(depth, stmt)

    def op_extract(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        self.declare(depth, op.result, f"{ops[0]}[{int(op.attrs['index'])}]")

    def op_vec(self, op: Op, depth: int) -> None:
        """A vector from scalars (or shorter vectors, concatenated element by element)."""
        parts = []
        for v, ref in zip(op.operands, self.refs(op)):
            if isinstance(v.type, VectorType):
                parts += [f"{ref}[{i}]" for i in range(v.type.size)]
            else:
                parts.append(ref)
        self.declare(depth, op.result, f"{metal_type(op.result.type)}({', '.join(parts)})")

    def op_frag_build(self, op: Op, depth: int) -> None:
        """A simdgroup matrix from this lane's two elements (`thread_elements()`, the lane
        table of machine/metal.py: MLX's BlockMMA fills its fragments the same way)."""
        elems = []
        for v, ref in zip(op.operands, self.refs(op)):
            if isinstance(v.type, VectorType):
                elems += [f"{ref}[{i}]" for i in range(v.type.size)]
            else:
                elems.append(ref)
        if len(elems) != 2:
            raise CompileError(f"metal: kernel {self.k.name}: frag_build of {op.result.type} takes a "
                               f"lane's 2 elements, got {len(elems)}")
        name = self.define(op.result)
        self.emit(depth, f"{metal_type(op.result.type)} {name};")
        for i, e in enumerate(elems):
            self.emit(depth, f"{name}.thread_elements()[{i}] = {e};")

    def op_frag_elems(self, op: Op, depth: int) -> None:
        """This lane's two elements of a simdgroup matrix, in `thread_elements()` order."""
        ops = self.refs(op)
        t = op.result.type
        if not isinstance(t, VectorType) or t.size != 2:
            raise CompileError(f"metal: kernel {self.k.name}: frag_elems gives a lane's 2 elements, not {t}")
        ref = f"{ops[0]}.thread_elements()"
        self.declare(depth, op.result, f"{metal_type(t)}({ref}[0], {ref}[1])")

    def op_store(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        buf, _ = self.memory(str(op.attrs["buffer"]))
        stmt = f"{buf}[{ops[0]}] = {ops[1]};"
        self.emit(depth, f"if ({ops[2]}) {stmt}" if len(ops) > 2 else stmt)

    def op_atomic_add(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        buf = str(op.attrs["buffer"])
        self.declare(depth, op.result, f"atomic_fetch_add_explicit((device atomic_uint*)&{buf}[{ops[0]}], "
                                       f"{ops[1]}, memory_order_relaxed)")

    def op_table(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        self.declare(depth, op.result, f"{self.table_names[str(op.attrs['name'])]}[{ops[0]}]")

    def op_barrier(self, op: Op, depth: int) -> None:
        if op.attrs["scope"] == "threadgroup":
            self.emit(depth, f"threadgroup_barrier({self.tg_flags});")
        else:
            self.emit(depth, "simdgroup_barrier(mem_flags::mem_threadgroup);")

    def op_fence(self, op: Op, depth: int) -> None:
        scope_attr = op.attrs["scope"]
        flags = "mem_flags::mem_device" if scope_attr == "device" else "mem_flags::mem_threadgroup"
        if self.fence == "atomic_thread_fence":
            scope = "thread_scope_device" if scope_attr == "device" else "thread_scope_threadgroup"
            self.emit(depth, f"atomic_thread_fence({flags}, memory_order_seq_cst, {scope});")
        else:
            self.emit(depth, f"threadgroup_barrier({flags});")

    def op_frag_zero(self, op: Op, depth: int) -> None:
        t = op.result.type
        mt = metal_type(t)
        elem = _SCALAR[t.elem.name]  # type: ignore[union-attr]
        self.declare(depth, op.result, f"make_filled_{mt}({elem}(0))")

    def op_frag_load(self, op: Op, depth: int) -> None:
        ops, a = self.refs(op), op.attrs
        buf, _ = self.memory(str(a["buffer"]))
        t = op.result.type
        name = self.define(op.result)
        transpose = "true" if a.get("transpose") else "false"
        self.emit(depth, f"{metal_type(t)} {name};")
        self.emit(depth, f"simdgroup_load({name}, {buf} + {ops[0]}, {int(a['ld'])}, ulong2(0, 0), {transpose});")

    def op_frag_store(self, op: Op, depth: int) -> None:
        ops, a = self.refs(op), op.attrs
        buf, elem = self.memory(str(a["buffer"]))
        t = op.operands[0].type
        frag = ops[0]
        if t.elem != elem:  # type: ignore[union-attr]
            if elem.name not in _FRAG_ELEMS:
                raise CompileError(f"metal: frag_store of {t} to @{buf} of {elem}")
            self.helpers.add("convert_frag")
            frag = f"mtl_convert_frag<{_SCALAR[elem.name]}>({frag})"
        self.emit(depth, f"simdgroup_store({frag}, {buf} + {ops[1]}, {int(a['ld'])});")

    def op_mma(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        name = self.define(op.result)
        self.emit(depth, f"{metal_type(op.result.type)} {name};")
        self.emit(depth, f"simdgroup_multiply_accumulate({name}, {ops[0]}, {ops[1]}, {ops[2]});")

    #: Metal's legal ops: the shared C-family entries and these. `frag_build` / `frag_elems`
    #: address a lane's elements through `thread_elements()` with the ownership of the target's
    #: lane tables (machine/metal.py). Missing on purpose: the async copies and `mma_sp` (no such
    #: hardware), and the warpgroup MMA.
    EMITTERS = {
        **CPrinter.EMITTERS,
        "const": op_const,
        **dict.fromkeys(_BINARY, op_binary),
        "min": op_min_max, "max": op_min_max,
        "fma": op_fma, "select": op_select, "cast": op_cast, "bitcast": op_bitcast, "lop3": op_lop3,
        "exp2": op_transcendental, "recip": op_transcendental, "load": op_load, "vload": op_vload, "extract": op_extract, "store": op_store, "vstore": op_vstore,
        "atomic_add": op_atomic_add,
        "table": op_table, "barrier": op_barrier, "fence": op_fence,
        "frag_zero": op_frag_zero, "frag_load": op_frag_load, "frag_store": op_frag_store, "mma": op_mma,
        "vec": op_vec, "frag_build": op_frag_build, "frag_elems": op_frag_elems,
    }

    def type_name(self, t: Type) -> str:
        return metal_type(t)

    # ----- whole kernel -----------------------------------------------------------------------

    def header(self) -> str:
        k = self.k
        out = [f"// kernel {k.name}: generated by marlin_dsl.targets.metal.printer",
               "#include <metal_stdlib>", "using namespace metal;", ""]
        for t in k.tables:
            elem = _SCALAR[t.elem.name]
            values = [_literal(v, t.elem) for v in t.values]
            rows = [", ".join(values[i:i + 8]) for i in range(0, len(values), 8)]
            out.append(f"constant {elem} {self.table_names[t.name]}[{len(values)}] = {{")
            out += [f"  {r}," for r in rows]
            out.append("};")
            out.append("")
        if "convert_frag" in self.helpers:
            out += [
                "// A fragment converted element by element: both matrices share the lane layout.",
                "template <typename D, typename S>",
                "inline simdgroup_matrix<D, 8, 8> mtl_convert_frag(simdgroup_matrix<S, 8, 8> m) {",
                "  simdgroup_matrix<D, 8, 8> r;",
                "  thread vec<S, 2>& src = reinterpret_cast<thread vec<S, 2>&>(m.thread_elements());",
                "  thread vec<D, 2>& dst = reinterpret_cast<thread vec<D, 2>&>(r.thread_elements());",
                "  dst = vec<D, 2>(src);",
                "  return r;",
                "}",
                "",
            ]
        return "\n".join(out) + "\n"

    def run(self) -> MetalSource:
        k = self.k
        if k.warp_size != METAL.warp_size:
            raise CompileError(f"metal: kernel {k.name}: simdgroups have {METAL.warp_size} threads, "
                               f"the kernel assumes {k.warp_size}")
        if k.threads > METAL.max_threads or k.threads % METAL.warp_size or k.threads < 1:
            raise CompileError(f"metal: kernel {k.name}: {k.threads} threads per threadgroup; Metal "
                               f"allows a multiple of {METAL.warp_size} up to {METAL.max_threads}")
        if k.shared_bytes > METAL.max_shared_bytes:
            raise CompileError(f"metal: kernel {k.name}: {k.shared_bytes} bytes of threadgroup memory, "
                               f"over Metal's limit of {METAL.max_shared_bytes}")
        grid = ", ".join(str(d) for d in k.grid)
        self.emit(1, f"// {k.threads} threads per threadgroup, grid [{grid}] threadgroups")
        for s in k.shared:
            self.emit(1, f"threadgroup {_SCALAR[s.elem.name]} {s.name}[{s.size}];")

        def top_yield(y: Op, d: int) -> None:
            raise CompileError(f"metal: kernel {k.name}: yield in the kernel body")

        self.block(k.body, 1, top_yield)
        body = "\n".join(self.lines) + "\n"
        inputs = [b.name for b in k.buffers if b.access == "read"] + [DIMS_NAME]
        outputs = [b.name for b in k.buffers if b.access != "read"]
        if not outputs:
            raise CompileError(f"metal: kernel {k.name}: MLX kernels need at least one output buffer")
        dtypes = {b.name: MLX_DTYPE[b.elem.name] for b in k.buffers}
        dtypes[DIMS_NAME] = "uint32_t"
        for n in inputs:  # MLX adds shape/stride parameters when these names occur in the body
            for suffix in ("_shape", "_strides", "_ndim"):
                if n + suffix in body:
                    raise CompileError(f"metal: kernel {k.name}: the body mentions {n + suffix}, which "
                                       "MLX would turn into an extra kernel parameter")
        return MetalSource(name=k.name, header=self.header(), body=body, input_names=inputs,
                           output_names=outputs, dtypes=dtypes, threads=k.threads, grid=tuple(k.grid),
                           scalar_names=[s.name for s in k.scalars],
                           access={**{b.name: b.access for b in k.buffers}, DIMS_NAME: "read"},
                           shared_bytes=k.shared_bytes)


def print_metal(kernel: Kernel, *, fence: str = "atomic_thread_fence") -> MetalSource:
    """Print `kernel` as Metal for `mx.fast.metal_kernel` (see the module docstring).

    `fence` chooses how `fence` ops print: "barrier" (any Metal version):
    `threadgroup_barrier(mem_flags::mem_device)`, which every thread of the group must reach;
    "atomic_thread_fence" (default, Metal 3.2+): a per-thread device-scope fence,
    `atomic_thread_fence(mem_flags::mem_device, memory_order_seq_cst, thread_scope_device)`,
    the documented way to order device memory across threadgroups."""
    verify_legal(kernel, _Printer.EMITTERS, "metal")
    if not _IDENT.match(kernel.name):
        raise CompileError(f"metal: kernel name {kernel.name!r} is not a valid Metal identifier")
    if fence not in ("barrier", "atomic_thread_fence"):
        raise ValueError(f"fence must be 'barrier' or 'atomic_thread_fence', not {fence!r}")
    return _Printer(kernel, fence).run()
