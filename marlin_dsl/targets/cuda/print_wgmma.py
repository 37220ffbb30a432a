"""The CUDA printer's emitters of the warpgroup MMA (sm_90a): `wgmma` as inline PTX
`wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16}` with A from registers and B
through a shared-memory matrix descriptor (`mdsl::wgmma_desc_sw128`, codegen/cuda_prelude.cuh),
the sparse form (a 4th operand) as `wgmma.mma_async.sp...m64nNk32` with the metadata register
and the selector immediate after B, `wgmma_fence` / `wgmma_commit` / `wgmma_wait` as `wgmma.fence` / `commit_group` /
`wait_group`, and the async-proxy fence. The instruction spellings are those of
bench/probes/wgmma_probe.cu, which checked them on an H100.

Inline asm needs every accumulator register as its own operand ("+f"), so the emitters write
the operand lists out (N/2 floats for N columns). A wait names the accumulator ("+f") and the
a fragments it keeps alive ("r"): the compiler cannot read the accumulator before the wait
nor reuse the a registers while the hardware may still read them. Kernels that use these ops
are marked `cuda_arch = sm_90a` (printer.py): they compile only for that architecture.
"""
from __future__ import annotations

from typing import Callable

from ...errors import CompileError
from ...ir.core import Kernel, Op, Value
from ...ir.types import BF16, F16, FragmentType
from ...machine.cuda import CUDA
from .print_types import cuda_type

__all__ = ["WGMMA_EMITTERS", "WgmmaEmitters", "WGMMA_OPS"]

#: the ops that make a kernel need sm_90a
WGMMA_OPS = frozenset({"wgmma", "wgmma_fence", "wgmma_commit", "wgmma_wait"})
_PTX_TYPE = {F16: "f16", BF16: "bf16"}


def _regs(frag: str, t: FragmentType) -> list[str]:
    """The register expressions of a fragment value (32-bit words or floats)."""
    count = t.cols // 2 if t.role == "c" and t.cols > 8 else 4
    return [f"{frag}.x[{i}]" for i in range(count)]


class WgmmaEmitters:
    """Emitters of the warpgroup ops (mixed into the CUDA printer)."""

    k: Kernel
    refs: Callable[[Op], list[str]]
    memory: Callable[[str], tuple[str, object, str]]
    define: Callable[[Value], str]
    emit: Callable[[int, str], None]

    def _copy_acc(self, op: Op, acc: str, depth: int) -> str:
        """The result's variable: a reference to the accumulator operand where nothing but
        this op (and wgmma_fences) reads that value, so the asm updates the same registers
        (a copy would be register moves that ptxas may leave between the wgmmas of a batch,
        which makes it serialise them: C7514), else a copy."""
        t = op.result.type
        name = self.define(op.result)
        if not hasattr(self, "_wg_uses"):
            self._wg_uses: dict[int, list[Op]] = {}
            for o in self.k.walk():
                for v in o.operands:
                    self._wg_uses.setdefault(id(v), []).append(o)
        others = [o for o in self._wg_uses.get(id(op.operands[0] if op.name == "wgmma_wait" else op.operands[2]), [])
                  if o is not op]
        alias = all(o.name == "wgmma_fence" for o in others)
        self.emit(depth, f"{cuda_type(t)}{'&' if alias else ''} {name} = {acc};")
        return name

    def op_wgmma(self, op: Op, depth: int) -> None:
        a, off, c = self.refs(op)[:3]
        sparse = len(op.operands) == 4
        tc = op.result.type
        assert isinstance(tc, FragmentType)
        layout = CUDA.warpgroup_b_layout
        if layout is None or layout.row_bytes != 128:
            raise CompileError(f"cuda: kernel {self.k.name}: wgmma reads shared tiles in 128-byte swizzled rows only")
        mem, elem, _ = self.memory(str(op.attrs["smem"]))
        n = tc.cols
        name = self._copy_acc(op, c, depth)
        acc = _regs(name, tc)
        nacc = len(acc)
        d_list = ", ".join(f"%{i}" for i in range(nacc))
        ty = _PTX_TYPE[elem]  # type: ignore[index]
        desc_b = f"mdsl::wgmma_desc_sw128<{layout.align}u>(&{mem}[{off}])"
        outs = ", ".join(f'"+f"({r})' for r in acc)
        if "smem_a" in op.attrs:  # A from shared memory: d, a-desc, b-desc, scale-d, scale-a, -b, trans-a, -b
            mem_a, _, _ = self.memory(str(op.attrs["smem_a"]))
            desc_a = f"mdsl::wgmma_desc_sw128<{layout.align}u>(&{mem_a}[{a}])"
            ins = f'"l"({desc_a}), "l"({desc_b})'
            operands, tail, n_in = f"%{nacc}, %{nacc + 1}", "p, 1, 1, 0, 0", 2
        else:  # A in registers: d, {a0..a3}, b-desc, scale-d, scale-a, scale-b, trans-b
            ta = op.operands[0].type
            assert isinstance(ta, FragmentType)
            ins = ", ".join([*(f'"r"({r})' for r in _regs(a, ta)), f'"l"({desc_b})'])
            operands, tail, n_in = "{" + ", ".join(f"%{nacc + i}" for i in range(4)) + f"}}, %{nacc + 4}", "p, 1, 1, 0", 5
        shape, sp = f"m64n{n}k16", ""
        if sparse:  # 2:4: the metadata register and the selector (an immediate) follow B
            meta, selector = self.refs(op)[3], int(op.attrs["selector"])  # type: ignore[arg-type]
            ins += f', "r"({meta})'
            operands += f", %{nacc + n_in}, {selector}"
            shape, sp = f"m64n{n}k{CUDA.warpgroup_sparse_k}", ".sp"
        # scale-d = 1 (d += a b, as a predicate), scales of a and b 1, both K-major (transpose 0)
        self.emit(depth, f'asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n'
                         f'wgmma.mma_async{sp}.sync.aligned.{shape}.f32.{ty}.{ty} {{{d_list}}}, '
                         f'{operands}, {tail};\\n}}\\n"')
        self.emit(depth + 2, f": {outs}")
        self.emit(depth + 2, f": {ins});")

    def op_wgmma_fence(self, op: Op, depth: int) -> None:
        regs: list[str] = []
        for v, ref in zip(op.operands, self.refs(op)):
            assert isinstance(v.type, FragmentType)
            kind = '"+f"' if v.type.role == "c" else '"+r"'
            regs += [f"{kind}({r})" for r in _regs(ref, v.type)]
        outs = f" : {', '.join(regs)}" if regs else " :"
        self.emit(depth, f'asm volatile("wgmma.fence.sync.aligned;\\n"{outs} :: "memory");')

    def op_wgmma_commit(self, op: Op, depth: int) -> None:
        self.emit(depth, 'asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");')

    def op_wgmma_wait(self, op: Op, depth: int) -> None:
        refs = self.refs(op)
        pending = int(op.attrs["pending"])
        first = 1 if op.results else 0
        # registers the retired wgmmas may still read (a fragments, sparse metadata words)
        kept = [f'"r"({r})' for v, ref in zip(op.operands[first:], refs[first:])
                for r in (_regs(ref, v.type) if isinstance(v.type, FragmentType) else [ref])]
        if not op.results:  # retires groups: no register of the accumulator is read
            ins = f" : : {', '.join(kept)} : " if kept else " ::: "
            self.emit(depth, f'asm volatile("wgmma.wait_group.sync.aligned {pending};\\n"{ins}"memory");')
            return
        tc = op.result.type
        assert isinstance(tc, FragmentType)
        name = self._copy_acc(op, refs[0], depth)
        outs = ", ".join(f'"+f"({r})' for r in _regs(name, tc))
        self.emit(depth, f'asm volatile("wgmma.wait_group.sync.aligned {pending};\\n"')
        self.emit(depth + 2, f": {outs}")
        self.emit(depth + 2, f": {', '.join(kept)} : \"memory\");")


#: The entries of the CUDA printer's EMITTERS table these emitters fill.
WGMMA_EMITTERS = {
    "wgmma": WgmmaEmitters.op_wgmma, "wgmma_fence": WgmmaEmitters.op_wgmma_fence,
    "wgmma_commit": WgmmaEmitters.op_wgmma_commit, "wgmma_wait": WgmmaEmitters.op_wgmma_wait,
}
