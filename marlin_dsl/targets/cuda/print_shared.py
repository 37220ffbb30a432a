"""The CUDA printer's shared-memory layout: static `__shared__` arrays where they fit, else one
dynamic block (MLX opts the function in above 48000 bytes) carved at 16-byte offsets, or at an
array's own alignment where it asks for more (the warpgroup MMA's swizzled tiles), the block's
start then aligned at run time."""
from __future__ import annotations

from ...ir.core import Kernel
from .source import CUDA_SCALAR as _SCALAR

__all__ = ["DYNAMIC_SHARED_NAME", "STATIC_SHARED_BYTES", "dynamic_shared_bytes", "shared_align",
           "shared_declarations", "shared_offsets"]

#: Static `__shared__` arrays may take this much; a kernel needing more gets one dynamic block
#: (MLX's cuda_kernel opts the function in to large dynamic shared memory above 48000 bytes).
STATIC_SHARED_BYTES = 48 * 1024
DYNAMIC_SHARED_NAME = "mdsl_smem"


def shared_offsets(kernel: Kernel) -> list[int]:
    """Byte offset of each shared array in the dynamic block (16-byte aligned, for vectors, or
    the array's own alignment where it asks for more)."""
    out, at = [], 0
    for s in kernel.shared:
        at = -(-at // s.align) * s.align
        out.append(at)
        at += -(-s.nbytes // 16) * 16
    return out


def shared_align(kernel: Kernel) -> int:
    """The largest alignment a shared array asks for (16 at least)."""
    return max([16, *(s.align for s in kernel.shared)])


def dynamic_shared_bytes(kernel: Kernel) -> int:
    """Dynamic shared memory a launch requests: 0 when the arrays fit statically. Arrays
    aligned beyond 16 bytes always go in the dynamic block, whose start the kernel aligns at
    run time (CUDA promises 16 bytes): the request includes that slack."""
    align = shared_align(kernel)
    if not kernel.shared or (kernel.shared_bytes <= STATIC_SHARED_BYTES and align <= 16):
        return 0
    last = kernel.shared[-1]
    return shared_offsets(kernel)[-1] + -(-last.nbytes // 16) * 16 + (align - 16)


def shared_declarations(k: Kernel) -> list[str]:
    """The body's first lines: the shared arrays, as pointers into the dynamic block where
    they do not fit statically."""
    if not dynamic_shared_bytes(k):
        return [f"__shared__ __align__(16) {_SCALAR[s.elem.name]} {s.name}[{s.size}];" for s in k.shared]
    out = [f"extern __shared__ __align__(16) unsigned char {DYNAMIC_SHARED_NAME}[];"]
    base, align = DYNAMIC_SHARED_NAME, shared_align(k)
    if align > 16:  # the block's start aligned at run time (the launch asks for the slack)
        base = f"{DYNAMIC_SHARED_NAME}_base"
        out.append(f"unsigned char* {base} = {DYNAMIC_SHARED_NAME} + (({align}u - (static_cast<uint32_t>("
                   f"__cvta_generic_to_shared({DYNAMIC_SHARED_NAME})) & {align - 1}u)) & {align - 1}u);")
    for s, offset in zip(k.shared, shared_offsets(k)):
        t = _SCALAR[s.elem.name]
        out.append(f"{t}* {s.name} = reinterpret_cast<{t}*>({base} + {offset});")
    return out
