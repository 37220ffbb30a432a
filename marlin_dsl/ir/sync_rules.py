"""Type rules of warp specialisation (docs/IR.md, "Warp roles and mbarriers"): `warp_roles`,
which gives each of its regions its own warps of the threadgroup, and the split-phase
barriers the roles meet at, `mbarrier_init`, `mbarrier_arrive` and `mbarrier_wait`.

An mbarrier array is a shared array of u32, two words (8 bytes, the hardware's 64-bit
barrier object) per barrier, aligned to 8, touched by the mbarrier ops only."""
from __future__ import annotations

from .core import Kernel, Op, SharedArray
from .types import U32


def mbarrier_array(op: Op, kernel: Kernel) -> SharedArray | str:
    """The shared array an mbarrier op names, or what is wrong with it."""
    name = op.attrs.get("barriers")
    try:
        decl = kernel.symbol(str(name))
    except KeyError:
        return f"unknown mbarrier array @{name}"
    if not isinstance(decl, SharedArray):
        return f"@{name} is not a shared array (mbarriers live in shared memory)"
    if decl.elem != U32 or decl.size % 2 or decl.size == 0:
        return f"mbarrier array @{name} must be u32 words in pairs (8 bytes a barrier), got {decl.size} x {decl.elem}"
    if decl.align < 8:
        return f"mbarrier array @{name} must be aligned to 8 bytes, got {decl.align}"
    return decl


def _mbarrier(op: Op, kernel: Kernel) -> str | None:
    decl = mbarrier_array(op, kernel)
    if isinstance(decl, str):
        return decl
    if any(v.type != U32 for v in op.operands):
        return f"{op.name} operands (barrier index{', parity' if op.name == 'mbarrier_wait' else ''}) must be u32"
    if op.name == "mbarrier_init":
        count = op.attrs["count"]
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1024:
            return f"mbarrier_init count (arrivals per phase) must be an integer 1..1024, got {count!r}"
    for other in kernel.walk():
        if other.name in ("load", "store", "vload", "vstore") and other.attrs.get("buffer") == decl.name \
                or other.name == "async_copy" and other.attrs.get("dst") == decl.name:
            return f"mbarrier array @{decl.name} is also accessed by {other.name}: only mbarrier ops may touch it"
    return None


def _warp_roles(op: Op, kernel: Kernel) -> str | None:
    warps = op.attrs["warps"]
    if not isinstance(warps, tuple) or not warps or \
            any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in warps):
        return f"warp_roles warps must be a tuple of positive warp counts, one per role, got {warps!r}"
    if len(op.regions) != len(warps):
        return f"warp_roles has {len(op.regions)} regions for {len(warps)} roles"
    if sum(warps) * kernel.warp_size != kernel.threads:
        return (f"warp_roles gives {sum(warps)} warps roles, the threadgroup has "
                f"{kernel.threads // kernel.warp_size}")
    regs = op.attrs.get("regs")
    if regs is not None and (not isinstance(regs, tuple) or len(regs) != len(warps) or any(
            isinstance(r, bool) or not isinstance(r, int) or not (r == 0 or 24 <= r <= 256 and r % 8 == 0)
            for r in regs)):
        return (f"warp_roles regs must give each role 0 (unchanged) or a register count 24..256, "
                f"a multiple of 8, got {regs!r}")
    if op not in kernel.body.ops:
        return "warp_roles splits the whole threadgroup once: it belongs in the kernel body, not a region"
    for region in op.regions:
        if not region.ops or region.ops[-1].name != "yield" or region.ops[-1].operands:
            return "every region of warp_roles ends with a yield of nothing"
    if op.results or op.operands:
        return "warp_roles takes and gives nothing"
    return None


__all__ = ["mbarrier_array"]
