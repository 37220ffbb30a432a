"""Host buffers of a CUDA CPU-harness launch (`cpu_harness.py`): the shared guarded buffers
(`targets/harness_buffers.py`) over the IR's element types, and the harness's error type."""
from __future__ import annotations

import numpy as np

from ...errors import MarlinDSLError
from ..harness_buffers import GuardedBuffer

__all__ = ["CudaCPUError", "GuardedBuffer", "STORAGE", "guarded_buffer"]

#: numpy storage of every IR element type a printed kernel's buffer can have.
STORAGE: dict[str, type] = {"f16": np.float16, "bf16": np.uint16, "f32": np.float32, "u32": np.uint32,
                            "u16": np.uint16, "u8": np.uint8, "i32": np.int32, "bool": np.bool_}


class CudaCPUError(MarlinDSLError):
    """Running printed CUDA on the CPU failed.

    `kind`: unavailable (no g++), unsupported (a kernel the shim does not emulate: wgmma),
    compile (g++ rejected the text), error (divergent barrier or warp operation, deadlock,
    unordered mma.sp metadata, misaligned cp.async...), fault (segmentation fault, division by
    zero, stack overflow), timeout, guard (a write outside a buffer or into a read-only
    input), input (bad arguments)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def guarded_buffer(name: str, elem: str, data: np.ndarray, guard: int, poison: bool) -> GuardedBuffer:
    """A guarded host buffer (`targets/harness_buffers.py`) of IR element type `elem`, aligned to
    128 bytes as cudaMalloc's are (256)."""
    if elem not in STORAGE:
        raise CudaCPUError(f"buffer {name}: element type {elem} has no host storage", "input")
    return GuardedBuffer(name, np.dtype(STORAGE[elem]), data, guard, poison, bf16=elem == "bf16",
                   error=CudaCPUError, align=128, what=elem)
