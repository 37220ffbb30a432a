"""The CUDA printer's emitters of the tensor-core ops: fragments (`frag_build`, `frag_zero`,
`frag_load`, `frag_store`, `frag_elems`), the MMAs (`mma`, `mma_sp`), the asynchronous
global -> shared copies (`async_copy`, `async_commit`, `async_wait`) and the warp shuffle
(`shfl_xor`, CUDA's own `__shfl_xor_sync`). The others print calls of the device prelude's
`mdsl::` helpers (codegen/cuda_prelude.cuh), which hold the PTX. A mixin of
the printer (`printer._Printer`): the emitters use its memory table and naming; MMA_EMITTERS
joins them into its EMITTERS table."""
from __future__ import annotations

from typing import Callable

from ...errors import CompileError
from ...ir.core import Kernel, Op, Value
from ...ir.types import BF16, F16, F32, FragmentType, ScalarType, VectorType
from .print_types import cuda_type, is_pair

__all__ = ["MMA_EMITTERS", "MmaEmitters"]


class MmaEmitters:
    """Emitters of the fragment, MMA and asynchronous-copy ops (mixed into the CUDA printer,
    which supplies the members declared here)."""

    k: Kernel
    refs: Callable[[Op], list[str]]
    memory: Callable[[str], tuple[str, ScalarType, str]]
    declare: Callable[..., None]
    define: Callable[[Value], str]
    emit: Callable[[int, str], None]
    ref: Callable[[Value], str]

    def op_frag_build(self, op: Op, depth: int) -> None:
        self.frag_build(op, self.refs(op), depth)

    def frag_build(self, op: Op, ops: list[str], depth: int) -> None:
        """Registers of 32 bits from the lane's elements, two 16-bit elements each (low first)."""
        t = op.result.type
        assert isinstance(t, FragmentType)
        if t.role == "c":  # 32-bit accumulator elements, one per register
            name = self.define(op.result)
            self.emit(depth, f"{cuda_type(t)} {name};")
            for r, ref in enumerate(ops):
                self.emit(depth, f"{name}.x[{r}] = {ref};")
            return
        elems: list[tuple[str, str]] = []  # (expression, "pair" | "scalar")
        sources: list[Value | None] = []  # per element: the scalar operand it is, if it is one
        for v, ref in zip(op.operands, ops):
            if is_pair(v.type):
                elems += [(ref, "pair"), ("", "pair-high")]
                sources += [None, None]
            elif isinstance(v.type, VectorType):
                elems += [(f"{ref}.v[{i}]", "scalar") for i in range(v.type.size)]
                sources += [None] * v.type.size
            else:
                elems.append((ref, "scalar"))
                sources.append(v)
        name = self.define(op.result)
        self.emit(depth, f"{cuda_type(t)} {name};")
        for r in range(len(elems) // 2):
            (lo, lo_kind), (hi, hi_kind) = elems[2 * r], elems[2 * r + 1]
            word = f"mdsl::pair_bits({lo})" if lo_kind == "pair" else f"mdsl::pack2({lo}, {hi})"
            if lo_kind == "pair-high" or hi_kind == "pair":  # a pair split across two registers
                raise CompileError(f"cuda: kernel {self.k.name}: frag_build pairs must start on a register")
            self.emit(depth, f"{name}.x[{r}] = {self.vector_word(sources[2 * r], sources[2 * r + 1]) or word};")

    def vector_word(self, lo: Value | None, hi: Value | None) -> str | None:
        """`mdsl::vec_word<i>(vec)` when lo and hi are elements 2i and 2i + 1 of one 16-bit
        vector: reading its word as it is, instead of repacking two halves, saves ptxas two
        PRMTs per fragment register (bench/probes/sass_count.py)."""
        a, b = self.extract_of(lo), self.extract_of(hi)
        if a is None or b is None or b[0] is not a[0] or a[1] % 2 or b[1] != a[1] + 1:
            return None
        return f"mdsl::vec_word<{a[1] // 2}>({self.ref(a[0])})"

    def extract_of(self, v: Value | None) -> tuple[Value, int] | None:
        """(vector, index) when v is `extract` of a vector of 16-bit elements, else None."""
        if v is None:
            return None
        if not hasattr(self, "_producers"):
            self._producers = {r: o for o in self.k.walk() for r in o.results}
        src = self._producers.get(v)
        if src is None or src.name != "extract":
            return None
        vec = src.operands[0]
        if not isinstance(vec.type, VectorType) or is_pair(vec.type) or vec.type.elem.bits != 16:
            return None
        return vec, int(src.attrs["index"])

    def op_frag_zero(self, op: Op, depth: int) -> None:
        spelled = cuda_type(op.result.type)  # refuses a fragment type CUDA does not have
        t = op.result.type
        assert isinstance(t, FragmentType)
        self.declare(depth, op.result, f"mdsl::zero_cw<{t.cols}>()" if spelled.startswith("mdsl::frag_cw")
                     else "mdsl::zero_c()")

    def op_frag_load(self, op: Op, depth: int) -> None:
        ops, a = self.refs(op), op.attrs
        mem, _, _ = self.memory(str(a["buffer"]))
        t = op.result.type
        assert isinstance(t, FragmentType)
        cuda_type(t)
        transpose = "true" if a.get("transpose") else "false"
        load = "load_b32" if cuda_type(t).startswith("mdsl::frag_b32") else f"load_{t.role}"
        self.declare(depth, op.result, f"mdsl::{load}<{int(a['ld'])}, {transpose}>({mem} + {ops[0]})")

    def op_frag_store(self, op: Op, depth: int) -> None:
        ops, a = self.refs(op), op.attrs
        mem, elem, _ = self.memory(str(a["buffer"]))
        cuda_type(op.operands[0].type)
        if elem not in (F16, BF16, F32):
            raise CompileError(f"cuda: kernel {self.k.name}: frag_store to @{a['buffer']} of {elem}")
        self.emit(depth, f"mdsl::store_c<{int(a['ld'])}>({mem} + {ops[1]}, {ops[0]});")

    def op_frag_elems(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        t = op.operands[0].type
        assert isinstance(t, FragmentType)
        if t.role != "c":  # a and b fragments hold 16-bit pairs; only c's elements are needed
            raise CompileError(f"cuda: kernel {self.k.name}: frag_elems of {t}")
        count = op.result.type.size if isinstance(op.result.type, VectorType) else 4
        elems = ", ".join(f"{ops[0]}.x[{i}]" for i in range(count))
        self.declare(depth, op.result, f"{cuda_type(op.result.type)}{{{{{elems}}}}}")

    def op_async_copy(self, op: Op, depth: int) -> None:
        ops, a = self.refs(op), op.attrs
        dst, _, _ = self.memory(str(a["dst"]))
        src, elem, _ = self.memory(str(a["src"]))
        nbytes = int(a["size"]) * elem.bits // 8
        pred = ops[2] if len(ops) > 2 else "true"
        # With a false predicate no byte is read (src-size 0): point at the buffer's start.
        self.emit(depth, f"mdsl::cp_async<{nbytes}>(&{dst}[{ops[0]}], {pred} ? &{src}[{ops[1]}] : {src}, {pred});")

    def op_async_commit(self, op: Op, depth: int) -> None:
        self.emit(depth, "mdsl::cp_async_commit();")

    def op_async_wait(self, op: Op, depth: int) -> None:
        self.emit(depth, f"mdsl::cp_async_wait<{int(op.attrs['pending'])}>();")

    def op_mma(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        for v in (*op.operands, op.result):
            cuda_type(v.type)
        self.declare(depth, op.result, f"mdsl::mma({ops[0]}, {ops[1]}, {ops[2]})")

    def op_mma_sp(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        for v in (*op.operands[:3], op.result):
            cuda_type(v.type)
        selector = op.attrs["selector"]
        if isinstance(selector, bool) or selector not in (0, 1):
            raise CompileError(f"cuda: kernel {self.k.name}: mma_sp selector {selector!r}")
        self.declare(depth, op.result,
                     f"mdsl::mma_sp<{int(selector)}>({ops[0]}, {ops[1]}, {ops[2]}, {ops[3]})")


    def op_shfl_xor(self, op: Op, depth: int) -> None:
        ops = self.refs(op)
        # CUDA's own overloads (u32, i32, f32; __half2 and __nv_bfloat162 in cuda_fp16/bf16.h)
        self.declare(depth, op.result, f"__shfl_xor_sync(0xFFFFFFFFu, {ops[0]}, {int(op.attrs['mask'])})")


#: The entries of the CUDA printer's EMITTERS table these emitters fill (in its order).
MMA_EMITTERS = {
    "frag_zero": MmaEmitters.op_frag_zero, "frag_load": MmaEmitters.op_frag_load,
    "frag_store": MmaEmitters.op_frag_store, "frag_elems": MmaEmitters.op_frag_elems,
    "async_copy": MmaEmitters.op_async_copy, "async_commit": MmaEmitters.op_async_commit,
    "async_wait": MmaEmitters.op_async_wait, "mma": MmaEmitters.op_mma, "mma_sp": MmaEmitters.op_mma_sp,
    "shfl_xor": MmaEmitters.op_shfl_xor,
}
