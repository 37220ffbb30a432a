"""The CUDA printer's emitters of warp specialisation (docs/IR.md, "Warp roles and mbarriers"):
`warp_roles` as one branch per role on the warp index (role 0 first), each starting with
`setmaxnreg` where the op gives the role a register count (sm_90a), and the mbarrier ops as
the prelude's `mdsl::mbar_init` / `mbar_arrive` / `mbar_wait` (codegen/cuda_prelude.cuh:
`mbarrier.init` / `.arrive` / `.try_wait.parity` on the 64-bit barrier object at that index).

Register counts: a kernel with warp roles is printed with `__launch_bounds__(threads, 1)`
(`launch_bounds` below), so ptxas allocates at most `base_registers(threads)` per thread;
a role asking for more increases (`setmaxnreg.inc`), one asking for less decreases
(`setmaxnreg.dec`). Together the roles may not ask for more than the register file (64K
32-bit registers per block on sm_90); ptxas allocates each role's code within its count."""
from __future__ import annotations

from typing import Callable

from ...errors import CompileError
from ...ir.core import Block, Kernel, Op
from ...machine.cuda import CUDA

__all__ = ["BOUNDED_THREADS", "SYNC_EMITTERS", "SyncEmitters", "base_registers", "launch_bounds", "role_registers"]

#: registers of a block (sm_90: the register file of one SM)
REGISTER_FILE = CUDA.registers_per_block


def base_registers(threads: int) -> int:
    """The per-thread register count of a block of `threads` under `__launch_bounds__(threads,
    1)`: the register file shared out, in the allocation unit of 8 per thread."""
    return min(CUDA.max_registers, REGISTER_FILE // threads) // 8 * 8


def role_registers(k: Kernel) -> tuple[int, ...] | None:
    """The register counts the kernel's warp_roles asks for (None where it asks none)."""
    for op in k.body.ops:
        if op.name == "warp_roles" and op.attrs.get("regs") and any(op.attrs["regs"]):  # type: ignore[arg-type]
            return tuple(op.attrs["regs"])  # type: ignore[arg-type]
    return None


#: blocks of this many threads or more are printed with `__launch_bounds__` (`launch_bounds`)
BOUNDED_THREADS = 512


def launch_bounds(k: Kernel) -> int | None:
    """The `__launch_bounds__` thread count the kernel is printed with (None: none): a kernel
    with warp roles, so that ptxas keeps every role within the block's share of registers
    (without it ptxas gave a 384-thread warpgroup kernel 196 registers, which cannot launch),
    and a block of BOUNDED_THREADS threads or more, whose share is 64 to 128 registers a
    thread: a 1024-thread weight stream compiled to 70 registers and did not launch on the
    H200 (bench/results/issue33_h200_2026-11-28/run5b_kv_ahead), and a 512-thread one (2:4,
    bf16, M = 16, with a residual epilogue) to 132: it did not launch either, and MLX said
    nothing; its output was zeros (bench/results/issue35_h200_2026-11-29, run 2). Such kernels
    launch through the precompiled path (`launch_precompiled.launch_path`), where the signature
    is ours."""
    roles = any(op.name == "warp_roles" for op in k.body.ops)
    return k.threads if roles or k.threads >= BOUNDED_THREADS else None


class SyncEmitters:
    """Emitters of the warp-role ops (mixed into the CUDA printer)."""

    k: Kernel
    refs: Callable[[Op], list[str]]
    memory: Callable[[str], tuple[str, object, str]]
    emit: Callable[[int, str], None]
    block: Callable[[Block, int, Callable[[Op, int], None]], None]

    def op_warp_roles(self, op: Op, depth: int) -> None:
        warps = [int(w) for w in op.attrs["warps"]]  # type: ignore[union-attr]
        regs = [int(r) for r in op.attrs.get("regs") or [0] * len(warps)]  # type: ignore[union-attr]
        base = base_registers(self.k.threads)
        if any(regs):
            total = sum((r or base) * w * 32 for r, w in zip(regs, warps))
            if total > REGISTER_FILE:
                raise CompileError(f"cuda: kernel {self.k.name}: warp_roles asks {total} registers "
                                   f"({regs} x {warps} warps), over the {REGISTER_FILE} of a block")

        def no_yield(y: Op, d: int) -> None:
            if y.operands:
                raise CompileError(f"cuda: kernel {self.k.name}: warp_roles regions yield nothing")

        first = 0
        for i, (w, region) in enumerate(zip(warps, op.regions)):
            last = i == len(warps) - 1
            cond = f"threadIdx.x < {32 * (first + w)}u"
            head = "if" if i == 0 else "} else if"
            self.emit(depth, f"{head} ({cond}) {{  // role {i}: warps {first} .. {first + w - 1}"
                      if not last or i == 0 else f"}} else {{  // role {i}: warps {first} .. {first + w - 1}")
            if regs[i] and regs[i] != base:
                kind = "inc" if regs[i] > base else "dec"
                self.emit(depth + 1, f'asm volatile("setmaxnreg.{kind}.sync.aligned.u32 {regs[i]};\\n" ::: "memory");')
            self.block(region, depth + 1, no_yield)
            first += w
        self.emit(depth, "}")

    def _barrier(self, op: Op) -> str:
        mem, _, _ = self.memory(str(op.attrs["barriers"]))
        return f"&{mem}[2u * ({self.refs(op)[0]})]"

    def op_mbarrier_init(self, op: Op, depth: int) -> None:
        self.emit(depth, f"mdsl::mbar_init({self._barrier(op)}, {int(op.attrs['count'])}u);")  # type: ignore[arg-type]

    def op_mbarrier_arrive(self, op: Op, depth: int) -> None:
        self.emit(depth, f"mdsl::mbar_arrive({self._barrier(op)});")

    def op_mbarrier_wait(self, op: Op, depth: int) -> None:
        self.emit(depth, f"mdsl::mbar_wait({self._barrier(op)}, {self.refs(op)[1]});")


SYNC_EMITTERS = {
    "warp_roles": SyncEmitters.op_warp_roles, "mbarrier_init": SyncEmitters.op_mbarrier_init,
    "mbarrier_arrive": SyncEmitters.op_mbarrier_arrive, "mbarrier_wait": SyncEmitters.op_mbarrier_wait,
}
