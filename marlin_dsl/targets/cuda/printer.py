"""CUDA printer: kernel IR -> CUDA C++ for MLX's `mx.fast.cuda_kernel` (and for nvcc).

`print_cuda(kernel)` returns a `CudaSource`: `.header` (the shared device prelude
codegen/cuda_prelude.cuh, then this kernel's constant tables), `.body` (the statements MLX
wraps in its generated `__global__` function), `.input_names` / `.output_names`, and
`.full_source()`, a complete `extern "C" __global__` kernel with MLX's parameter list that nvcc
compiles on its own; `.mlx_source()` reproduces MLX's whole generated translation unit.
The launch side (how MLX builds and launches the text, the calling convention) is
described with `CudaSource` in targets/cuda/source.py.

Printing rules: every SSA value is a local `v_<name>`; f16 -> `__half`, bf16 ->
`__nv_bfloat16`, u32 -> `uint32_t`...; vectors -> `mdsl::vec<T, n>`; fragments ->
`mdsl::frag_a<T>` / `mdsl::frag_b<T>` / `mdsl::frag_c` holding the lane's registers of the
PTX m16n8k16 layout (see codegen/cuda_prelude.cuh), and `mdsl::frag_b32<T>` for the 32x8 B of
the 2:4 sparse m16n8k32 (`mma_sp[selector=F]` -> `mdsl::mma_sp<F>(a, b, c, meta)`, inline PTX
`mma.sp::ordered_metadata`, PTX ISA 8.5+). Arithmetic is rounded as docs/IR.md says:
f32 and f16 through `__fadd_rn`/`__hadd_rn`-style intrinsics (no contraction into FMA), bf16
as f32 rounded to bf16 after every op, fma through `__fmaf_rn`/`__hfma`; casts through the
cuda_fp16/cuda_bf16 `_rn` conversions (float -> int truncates: `_rz`); bitcasts through
`__half_as_ushort`-style intrinsics. Predicated loads are `(p ? buf[i] : 0)`, predicated stores
`if (p) buf[i] = v;`; loads from readwrite device buffers go through `__ldcg` (L2, not a
possibly stale L1: other blocks write them during the launch). `for` loops declare their
carried values before the loop and assign them at `yield`; `if`/`switch` results are declared
before the statement and assigned in every region. `barrier[threadgroup]` -> `__syncthreads()`,
`barrier[simdgroup]` -> `__syncwarp()`, `fence[device]` -> `__threadfence()`,
`fence[threadgroup]` -> `__threadfence_block()`, `atomic_add` -> `atomicAdd`, index kinds ->
`threadIdx.x`, `threadIdx.x % 32u`, `threadIdx.x / 32u`, `blockIdx.x/y/z`; shared arrays ->
`__shared__` arrays at the top of the body; tables -> `static __device__ const` arrays in the
header (global memory: lookups diverge across a warp, which `__constant__` would serialise).
The printer knows only the IR, nothing of formats or schedules; its output is deterministic.
"""
from __future__ import annotations

import re
from typing import Iterable

from ...errors import CompileError
from ...ir.core import Kernel, Op, Value
from ...ir.verify import verify_legal
from ...ir.types import BF16, BOOL, F16, F32, I32, U32, ScalarType, Type, VectorType
from ...machine.cuda import CUDA
from ..c_printer import CPrinter
from .print_mma import MMA_EMITTERS, MmaEmitters
from .print_sync import SYNC_EMITTERS, SyncEmitters, launch_bounds, role_registers
from .print_wgmma import WGMMA_EMITTERS, WGMMA_OPS, WgmmaEmitters
from .print_shared import DYNAMIC_SHARED_NAME, STATIC_SHARED_BYTES, dynamic_shared_bytes, shared_declarations
from .print_types import PAIR, bits_table, comment_value, cuda_type, f32_bits, is_pair, literal, zero
from .source import CUDA_SCALAR as _SCALAR
from .source import MLX_DEFAULT_HEADER, CudaSource

__all__ = ["CudaSource", "print_cuda", "cuda_type", "DIMS_NAME", "DYNAMIC_SHARED_NAME", "MLX_DEFAULT_HEADER",
           "STATIC_SHARED_BYTES", "dynamic_shared_bytes", "prelude"]

#: The name of the input holding the launch scalars (the Metal printer's convention).
DIMS_NAME = "dims"

_INDEX = {"tid": "threadIdx.x", "lane": "(threadIdx.x % 32u)", "warp": "(threadIdx.x / 32u)",
          "group_x": "blockIdx.x", "group_y": "blockIdx.y", "group_z": "blockIdx.z"}
#: arithmetic of CUDA's native 16-bit float pairs (print_types.PAIR)
_PAIR_OP = {"add": "__hadd2", "sub": "__hsub2", "mul": "__hmul2", "min": "__hmin2", "max": "__hmax2"}
_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_HALF_CMP = {"lt": "__hlt", "le": "__hle", "gt": "__hgt", "ge": "__hge", "eq": "__heq",
             "ne": "__hneu"}  # ordered, except ne (true for NaN, as numpy's != is)
_INT_OP = {"add": "+", "sub": "-", "mul": "*", "div": "/", "rem": "%", "and": "&", "or": "|",
           "xor": "^", "shl": "<<", "shr": ">>"}
_F32_OP = {"add": "__fadd_rn", "sub": "__fsub_rn", "mul": "__fmul_rn"}
_F16_OP = {"add": "__hadd_rn", "sub": "__hsub_rn", "mul": "__hmul_rn"}
_TO_F32 = {"f16": "__half2float", "bf16": "__bfloat162float"}
_FROM_F32 = {"f16": "__float2half_rn", "bf16": "__float2bfloat16_rn"}
#: Types __ldcg has an overload for.
_LDCG = {"u8", "u16", "u32", "i32", "f16", "bf16", "f32"}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")
#: Identifiers a buffer or shared array may not take: C++ keywords and names the CUDA/MLX
#: environment defines around the body.
_RESERVED = frozenset("""
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char16_t char32_t
class compl const constexpr const_cast continue decltype default delete do double dynamic_cast
else enum explicit export extern false float for friend goto if inline int long mutable
namespace new noexcept not not_eq nullptr operator or or_eq private protected public register
reinterpret_cast return short signed sizeof static static_assert static_cast struct switch
template this thread_local throw true try typedef typeid typename union unsigned using virtual
void volatile wchar_t while xor xor_eq threadIdx blockIdx blockDim gridDim warpSize inf cg mlx
mdsl cuda std Shape Strides uint8_t uint16_t uint32_t int32_t int64_t uint64_t
""".split())


def prelude() -> str:
    """The shared device prelude (codegen/cuda_prelude.cuh)."""
    from ...codegen import read_codegen_file

    return read_codegen_file("cuda_prelude.cuh")


class _Printer(MmaEmitters, WgmmaEmitters, SyncEmitters, CPrinter):
    target = "cuda"
    target_title = "CUDA"
    index_type = "uint32_t"
    temp_decl = "const auto"
    index_exprs = _INDEX
    dims_name = DIMS_NAME

    def __init__(self, kernel: Kernel, inout_inputs: Iterable[str]) -> None:
        self.k = kernel
        self.lines: list[str] = []
        self.names: dict[int, str] = {}
        self.taken: set[str] = set(_RESERVED)
        self.buffers = {b.name: b for b in kernel.buffers}
        self.shared = {s.name: s for s in kernel.shared}
        self.scalar_index = {s.name: i for i, s in enumerate(kernel.scalars)}
        self.inout = list(inout_inputs)
        for n in self.inout:
            b = self.buffers.get(n)
            if b is None or b.access != "readwrite":
                raise CompileError(f"cuda: kernel {kernel.name}: inout input @{n} must be a readwrite buffer")
        names = [DIMS_NAME, *self.buffers, *self.shared]
        for n in names:
            if not _IDENT.match(n) or n in _RESERVED or n.startswith("v_") or n.startswith("__"):
                raise CompileError(f"cuda: kernel {kernel.name}: @{n} is not usable as a CUDA identifier")
        if DIMS_NAME in self.buffers or DIMS_NAME in self.shared:
            raise CompileError(f"cuda: kernel {kernel.name}: @{DIMS_NAME} is reserved for the launch scalars")
        if len(set(names)) != len(names):
            raise CompileError(f"cuda: kernel {kernel.name}: buffer and shared array names collide")
        self.taken |= set(names)
        #: the expression through which the body accesses each buffer
        self.access_name = {n: n for n in self.buffers}
        for n in self.inout:
            self.access_name[n] = self._unique(f"{n}_rw")
        self.table_names = {t.name: self._unique("tbl_" + re.sub(r"\W", "_", t.name)) for t in kernel.tables}
        #: tables printed as f32 bits (see _bits_table)
        self.bit_tables = {self.table_names[t.name] for t in kernel.tables if bits_table(t)}
        self.tables = {t.name: t for t in kernel.tables}

    def declare(self, depth: int, v: Value, expr: str, comment: str = "") -> None:
        self.emit(depth, f"{cuda_type(v.type)} {self.define(v)} = {expr};{comment}")

    # ----- memory --------------------------------------------------------------------------

    def memory(self, name: str) -> tuple[str, ScalarType, str]:
        """(expression, element type, kind) of a buffer or shared array; kind is shared,
        read, write or readwrite."""
        if name in self.buffers:
            b = self.buffers[name]
            return self.access_name[name], b.elem, b.access
        if name in self.shared:
            return name, self.shared[name].elem, "shared"
        raise CompileError(f"cuda: kernel {self.k.name}: unknown memory @{name}")

    def read(self, name: str, index: str) -> str:
        mem, elem, kind = self.memory(name)
        if kind == "readwrite" and elem.name in _LDCG:
            return f"__ldcg(&{mem}[{index}])"
        return f"{mem}[{index}]"

    # ----- scalar expressions ------------------------------------------------------------------

    def arith(self, name: str, t: ScalarType, a: str, b: str) -> str:
        if t == BOOL:
            return {"add": f"({a} != {b})", "sub": f"({a} != {b})", "xor": f"({a} != {b})",
                    "mul": f"({a} && {b})", "and": f"({a} && {b})", "min": f"({a} && {b})",
                    "or": f"({a} || {b})", "max": f"({a} || {b})",
                    # a shift of a 1-bit value by >= 1 is an IR error: only `a << false` is defined
                    "shl": f"({a} && !{b})", "shr": f"({a} && !{b})"}[name]
        if t == F32:
            if name in _F32_OP:
                return f"{_F32_OP[name]}({a}, {b})"
            return f"{'fminf' if name == 'min' else 'fmaxf'}({a}, {b})"
        if t == F16:
            if name in _F16_OP:
                return f"{_F16_OP[name]}({a}, {b})"
            return f"{'__hmin' if name == 'min' else '__hmax'}({a}, {b})"
        if t == BF16:
            if name in _F32_OP:  # bf16 = the f32 result rounded to bf16 (docs/IR.md)
                return f"__float2bfloat16_rn({_F32_OP[name]}(__bfloat162float({a}), __bfloat162float({b})))"
            return f"{'__hmin' if name == 'min' else '__hmax'}({a}, {b})"
        # integers
        ct = _SCALAR[t.name]
        if name in ("min", "max"):
            return f"({a} {'<' if name == 'min' else '>'} {b} ? {a} : {b})"
        op = _INT_OP[name]
        if t == I32 and name in ("add", "sub", "mul", "shl"):  # no signed overflow: wrap in u32
            return f"(int32_t)((uint32_t){a} {op} (uint32_t){b})"
        if t.name in ("u8", "u16"):  # C++ promotes to int: wrap back
            return f"(({ct})({a} {op} {b}))"
        return f"({a} {op} {b})"

    def compare(self, name: str, t: ScalarType, a: str, b: str) -> str:
        if t in (F16, BF16):
            return f"{_HALF_CMP[name]}({a}, {b})"
        return f"({a} {_CMP[name]} {b})"

    def cast(self, x: str, src: ScalarType, dst: ScalarType) -> str:
        if src == dst:
            return x
        if dst == BOOL:
            if src in (F16, BF16):
                return f"({_TO_F32[src.name]}({x}) != 0.0f)"
            return f"({x} != {zero(src)})"
        if dst.is_int:
            if src.is_float:  # truncate toward zero (out of range is an error in the IR)
                f = x if src == F32 else f"{_TO_F32[src.name]}({x})"
                conv = f"__float2int_rz({f})" if dst == I32 else f"__float2uint_rz({f})"
                return conv if dst.name in ("u32", "i32") else f"(({_SCALAR[dst.name]}){conv})"
            return f"(({_SCALAR[dst.name]}){x})"  # int/bool -> int wraps
        # -> float
        if src == BOOL or src.name in ("u8", "u16"):
            small = f"(unsigned short){x}"
            if dst == F32:
                return f"(float){x}"
            return f"{'__ushort2half_rn' if dst == F16 else '__ushort2bfloat16_rn'}({small})"
        if src.name == "u32":
            return {"f32": "__uint2float_rn", "f16": "__uint2half_rn", "bf16": "__uint2bfloat16_rn"}[dst.name] + f"({x})"
        if src == I32:
            return {"f32": "__int2float_rn", "f16": "__int2half_rn", "bf16": "__int2bfloat16_rn"}[dst.name] + f"({x})"
        # float -> float: widening is exact; narrowing rounds once from the f32 value
        f = x if src == F32 else f"{_TO_F32[src.name]}({x})"
        return f if dst == F32 else f"{_FROM_F32[dst.name]}({f})"

    def bitcast(self, x: str, src: ScalarType, dst: ScalarType) -> str:
        if src == dst:
            return x
        if src.bits == 16:
            bits = {"f16": f"__half_as_ushort({x})", "bf16": f"__bfloat16_as_ushort({x})"}.get(src.name, x)
            return {"f16": f"__ushort_as_half({bits})", "bf16": f"__ushort_as_bfloat16({bits})"}.get(
                dst.name, f"((uint16_t){bits})")
        if src.bits == 32:
            bits = {"f32": f"__float_as_uint({x})", "i32": f"(uint32_t){x}"}.get(src.name, x)
            return {"f32": f"__uint_as_float({bits})", "i32": f"(int32_t){bits}"}.get(dst.name, bits)
        return f"(({_SCALAR[dst.name]}){x})"  # u8, bool: the same bits

    # ----- ops: one emitter per op, gathered in EMITTERS below -------------------------------

    def op_const(self, op: Op, depth: int) -> None:
        t, value = op.result.type, op.attrs["value"]
        if not isinstance(t, ScalarType):
            raise CompileError(f"cuda: const of type {t}")
        self.declare(depth, op.result, literal(value, t), comment_value(value, t))

    def op_compare(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        t = op.operands[0].type
        self.declare(depth, op.result, self.compare(op.name, self._scalar(t, op), ops[0], ops[1]))

    def op_arith(self, op: Op, depth: int) -> None:
        n, ops = op.name, self.refs(op)
        if n in _PAIR_OP and is_pair(op.result.type):
            self.declare(depth, op.result, f"{_PAIR_OP[n]}({ops[0]}, {ops[1]})")
            return
        t = self._scalar(op.operands[0].type, op)
        self.declare(depth, op.result, self.arith(n, t, ops[0], ops[1]))

    def op_fma(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        if is_pair(op.result.type):
            self.declare(depth, op.result, f"__hfma2({ops[0]}, {ops[1]}, {ops[2]})")
            return
        t = self._scalar(op.result.type, op)
        expr = f"__fmaf_rn({ops[0]}, {ops[1]}, {ops[2]})" if t == F32 else f"__hfma({ops[0]}, {ops[1]}, {ops[2]})"
        self.declare(depth, op.result, expr)

    def op_transcendental(self, op: Op, depth: int) -> None:
        """exp2 and recip of an f32: exp2f (2 ulp), and the IEEE division (correctly rounded
        without fast math, which our builds do not ask for)."""
        a = self.refs(op)[0]
        self.declare(depth, op.result, f"exp2f({a})" if op.name == "exp2" else f"(1.0f / {a})")

    def op_bitcast(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        if is_pair(op.result.type) or is_pair(op.operands[0].type):
            pair = op.result.type if is_pair(op.result.type) else op.operands[0].type
            if op.operands[0].type != U32 and op.result.type != U32:
                raise CompileError(f"cuda: kernel {self.k.name}: bitcast {op.operands[0].type} -> {op.result.type}")
            fn = "mdsl::bits_to_pair<%s>" % PAIR[pair.elem.name] if is_pair(op.result.type) else "mdsl::pair_bits"
            self.declare(depth, op.result, f"{fn}({ops[0]})")
            return
        src, dst = self._scalar(op.operands[0].type, op), self._scalar(op.result.type, op)
        self.declare(depth, op.result, self.bitcast(ops[0], src, dst))

    def op_vec(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        t = op.result.type
        if isinstance(op.operands[0].type, VectorType):  # concatenation: register moves only
            name = self.define(op.result)
            self.emit(depth, f"{cuda_type(t)} {name};")
            at = 0
            for v, ref in zip(op.operands, ops):
                vt = v.type
                assert isinstance(vt, VectorType)
                if is_pair(vt):
                    self.emit(depth, f"*reinterpret_cast<{cuda_type(vt)}*>(&{name}.v[{at}]) = {ref};")
                else:
                    for i in range(vt.size):
                        self.emit(depth, f"{name}.v[{at + i}] = {ref}.v[{i}];")
                at += vt.size
        elif is_pair(t):
            make = "__halves2half2" if t.elem == F16 else "__halves2bfloat162"  # type: ignore[union-attr]
            self.declare(depth, op.result, f"{make}({ops[0]}, {ops[1]})")
        else:
            self.declare(depth, op.result, f"{cuda_type(t)}{{{{{', '.join(ops)}}}}}")

    def op_select(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        self.declare(depth, op.result, f"({ops[0]} ? {ops[1]} : {ops[2]})")

    def op_lop3(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        self.declare(depth, op.result, f"mdsl::lop3<{int(op.attrs['lut']):#04x}>({ops[0]}, {ops[1]}, {ops[2]})")

    def op_cast(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        src, dst = self._scalar(op.operands[0].type, op), self._scalar(op.result.type, op)
        self.declare(depth, op.result, self.cast(ops[0], src, dst))

    def op_load(self, op: Op, depth: int) -> None:
        ops, a = self.refs(op), op.attrs
        _, elem, _ = self.memory(str(a["buffer"]))
        access = self.read(str(a["buffer"]), ops[0])
        if len(ops) > 1:
            access = f"({ops[1]} ? {access} : {zero(elem)})"
        self.declare(depth, op.result, access)

    def op_vload(self, op: Op, depth: int) -> None:
        ops, a = self.refs(op), op.attrs
        if self.wide_load(op.result.type, str(a["buffer"])):
            # One 32/64/128-bit access: the IR guarantees index % size == 0.
            mem, elem, _ = self.memory(str(a["buffer"]))
            t = cuda_type(op.result.type)
            access = f"*reinterpret_cast<const {t}*>(&{mem}[{ops[0]}])"
            if len(ops) > 1:
                access = f"({ops[1]} ? {access} : mdsl::zero_vec<{t}>())"
            self.declare(depth, op.result, access)
            return
        _, elem, _ = self.memory(str(a["buffer"]))
        size = int(a["size"])
        name = self.define(op.result)
        self.emit(depth, f"{cuda_type(op.result.type)} {name};")
        for i in range(size):
            idx = ops[0] if i == 0 else f"{ops[0]} + {i}u"
            access = self.read(str(a["buffer"]), idx)
            if len(ops) > 1:
                access = f"({ops[1]} ? {access} : {zero(elem)})"
            self.emit(depth, f"{name}.v[{i}] = {access};")

    def op_extract(self, op: Op, depth: int) -> None:
        ops, a = self.refs(op), op.attrs
        member = ("x", "y")[int(a["index"])] if is_pair(op.operands[0].type) else f"v[{int(a['index'])}]"
        self.declare(depth, op.result, f"{ops[0]}.{member}")

    def op_vstore(self, op: Op, depth: int) -> None:
        """One 32/64/128-bit store into shared memory or a device buffer (the IR guarantees
        index % size == 0; device buffers start 16-byte aligned)."""
        ops = self.refs(op)
        mem, _, _ = self.memory(str(op.attrs["buffer"]))
        stmt = f"*reinterpret_cast<{cuda_type(op.operands[1].type)}*>(&{mem}[{ops[0]}]) = {ops[1]};"
        self.emit(depth, stmt if len(ops) < 3 else f"if ({ops[2]}) {stmt}")

    def op_store(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        mem, _, _ = self.memory(str(op.attrs["buffer"]))
        stmt = f"{mem}[{ops[0]}] = {ops[1]};"
        self.emit(depth, f"if ({ops[2]}) {stmt}" if len(ops) > 2 else stmt)

    def op_atomic_add(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        mem, _, _ = self.memory(str(op.attrs["buffer"]))
        self.declare(depth, op.result, f"atomicAdd(&{mem}[{ops[0]}], {ops[1]})")

    def op_table(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        table = self.table_names[str(op.attrs['name'])]
        read = f"{table}[{ops[0]}]"
        self.declare(depth, op.result, f"__uint_as_float({read})" if table in self.bit_tables else read)

    def op_barrier(self, op: Op, depth: int) -> None:
        self.emit(depth, "__syncthreads();" if op.attrs["scope"] == "threadgroup" else "__syncwarp();")

    def op_fence(self, op: Op, depth: int) -> None:
        scope = op.attrs["scope"]
        if scope == "async_proxy":  # this thread's shared-memory writes, for wgmma (sm_90)
            self.emit(depth, 'asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");')
            return
        self.emit(depth, "__threadfence();" if scope == "device" else "__threadfence_block();")

    #: CUDA's legal ops: the shared C-family entries, these and the tensor-core ops of
    #: print_mma.py (every op of the IR).
    EMITTERS = {
        **CPrinter.EMITTERS,
        "const": op_const,
        **dict.fromkeys(_CMP, op_compare),
        **dict.fromkeys(("add", "sub", "mul", "min", "max", "div", "rem", "and", "or", "xor", "shl", "shr"),
                        op_arith),
        "fma": op_fma, "select": op_select, "cast": op_cast, "bitcast": op_bitcast, "lop3": op_lop3,
        "exp2": op_transcendental, "recip": op_transcendental, "vec": op_vec, "extract": op_extract, "frag_build": MmaEmitters.op_frag_build,
        "load": op_load, "vload": op_vload, "store": op_store, "vstore": op_vstore, "atomic_add": op_atomic_add,
        "table": op_table, "barrier": op_barrier, "fence": op_fence,
        **MMA_EMITTERS,
        **WGMMA_EMITTERS,
        **SYNC_EMITTERS,
    }

    def wide_load(self, t: Type, buffer: str) -> bool:
        """A vload printed as one vector access: 4, 8 or 16 bytes, or a multiple of 16 (that
        many 128-bit accesses from one address: the prelude aligns such a vec to 16), not
        through __ldcg."""
        _, elem, kind = self.memory(buffer)
        assert isinstance(t, VectorType)
        bits = elem.bits * t.size
        return kind != "readwrite" and (bits in (32, 64) or bits % 128 == 0) and elem.bits >= 16

    def _scalar(self, t: Type, op: Op) -> ScalarType:
        if not isinstance(t, ScalarType):
            raise CompileError(f"cuda: kernel {self.k.name}: {op.name} on {t} is not supported")
        return t

    def type_name(self, t: Type) -> str:
        return cuda_type(t)

    # ----- whole kernel -----------------------------------------------------------------------

    def declarations(self) -> str:
        k = self.k
        out = [f"// kernel {k.name}: generated by marlin_dsl.targets.cuda.printer"]
        for t in k.tables:
            bits = bits_table(t)
            values = [f32_bits(v) if bits else literal(v, t.elem) for v in t.values]
            per_row = 4 if t.elem in (F16, BF16) else 8
            rows = [", ".join(values[i:i + per_row]) for i in range(0, len(values), per_row)]
            elem = "uint32_t" if bits else _SCALAR[t.elem.name]
            out.append(f"static __device__ const {elem} {self.table_names[t.name]}"
                       f"[{max(len(values), 1)}] = {{")
            out += [f"    {r}," for r in rows]
            out.append("};")
        return "\n".join(out) + "\n\n"

    def run(self) -> CudaSource:
        k = self.k
        if k.warp_size != CUDA.warp_size:
            raise CompileError(f"cuda: kernel {k.name}: warps have {CUDA.warp_size} threads, "
                               f"the kernel assumes {k.warp_size}")
        if k.threads > CUDA.max_threads or k.threads % CUDA.warp_size or k.threads < 1:
            raise CompileError(f"cuda: kernel {k.name}: {k.threads} threads per block; CUDA "
                               f"allows a multiple of {CUDA.warp_size} up to {CUDA.max_threads}")
        limit = CUDA.shared_limit(warpgroup=any(op.name in WGMMA_OPS for op in k.walk()))
        if max(k.shared_bytes, dynamic_shared_bytes(k)) > limit:
            raise CompileError(f"cuda: kernel {k.name}: {max(k.shared_bytes, dynamic_shared_bytes(k))} bytes of shared memory, "
                               f"over the limit of {limit}")
        if "mma" in k.attrs and tuple(k.attrs["mma"]) != tuple(CUDA.mma):  # type: ignore[arg-type]
            raise CompileError(f"cuda: kernel {k.name} was lowered for MMA {k.attrs['mma']}, "
                               f"CUDA's is {CUDA.mma}")
        grid = ", ".join(str(d) for d in k.grid)
        self.emit(1, f"// {k.threads} threads per block, grid [{grid}] blocks")
        for line in shared_declarations(k):
            self.emit(1, line)
        for n in self.inout:
            t = _SCALAR[self.buffers[n].elem.name]
            self.emit(1, f"{t}* {self.access_name[n]} = const_cast<{t}*>({n});")

        def top_yield(y: Op, d: int) -> None:
            raise CompileError(f"cuda: kernel {k.name}: yield in the kernel body")

        self.block(k.body, 1, top_yield)
        body = "\n".join(self.lines) + "\n"
        inputs = [b.name for b in k.buffers if b.access == "read"] + list(self.inout) + [DIMS_NAME]
        outputs = [b.name for b in k.buffers if b.access != "read" and b.name not in self.inout]
        if not outputs:
            raise CompileError(f"cuda: kernel {k.name}: MLX kernels need at least one output buffer")
        for n in inputs:  # MLX adds shape/stride parameters when these names occur in the body
            for suffix in ("_shape", "_strides", "_ndim"):
                if n + suffix in body:
                    raise CompileError(f"cuda: kernel {k.name}: the body mentions {n + suffix}, which "
                                       "MLX would turn into an extra kernel parameter")
        elems = {b.name: b.elem.name for b in k.buffers}
        elems[DIMS_NAME] = "u32"
        attrs = {key: k.attrs[key] for key in ("target", "format", "schedule", "pipeline", "activation",
                                               "tile", "warps", "mma", "parallel", "k_warps", "weight_layout", "cuda_arch",
                                               "outputs", "epilogue")  # the launchers size y by these
                 if key in k.attrs}
        bounds = launch_bounds(k)
        if any(op.name in WGMMA_OPS for op in k.walk()) or role_registers(k) is not None:
            # wgmma and setmaxnreg (warp roles' register counts) exist only there, not in sm_90's PTX
            attrs["cuda_arch"] = CUDA.warpgroup_arch
        if bounds is not None:  # ptxas's per-thread budget, which the roles' setmaxnreg moves
            attrs["launch_bounds"] = bounds
        return CudaSource(
            name=k.name, prelude=prelude(), declarations=self.declarations(), body=body,
            input_names=inputs, output_names=outputs, elems=elems, threads=k.threads,
            grid=tuple(k.grid), scalar_names=[s.name for s in k.scalars],
            access={**{b.name: b.access for b in k.buffers}, DIMS_NAME: "read"},
            inout_inputs=list(self.inout), shared_bytes=k.shared_bytes, attrs=attrs,
            dynamic_shared_bytes=dynamic_shared_bytes(k))


def print_cuda(kernel: Kernel, inout_inputs: Iterable[str] = ()) -> CudaSource:
    """Print `kernel` as CUDA for `mx.fast.cuda_kernel` (see the module docstring).

    `inout_inputs`: readwrite buffers to pass as (zero-initialised) inputs instead of outputs."""
    verify_legal(kernel, _Printer.EMITTERS, "cuda")
    if not _IDENT.match(kernel.name):
        raise CompileError(f"cuda: kernel name {kernel.name!r} is not a valid CUDA identifier")
    return _Printer(kernel, inout_inputs).run()