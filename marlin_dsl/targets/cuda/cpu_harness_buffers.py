"""Host buffers of a CUDA CPU-harness launch (`cpu_harness.py`): each flat array sits between
two guard regions of 0xFF bytes that must come back untouched, outputs are poisoned (0xFF:
NaN in f16, bf16 and f32) unless they are read-write, and read-only inputs must come back
unchanged. bf16 travels as its bits (uint16); executors hold bf16 values in float32."""
from __future__ import annotations

import numpy as np

from ...errors import MarlinDSLError
from ...ir.numerics import round_to_activation

__all__ = ["CudaCPUError", "GuardedBuffer", "STORAGE"]

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


class GuardedBuffer:
    """A flat buffer of `elem` values between two guard regions of 0xFF bytes."""

    def __init__(self, name: str, elem: str, data: np.ndarray, guard: int, poison: bool) -> None:
        if elem not in STORAGE:
            raise CudaCPUError(f"buffer {name}: element type {elem} has no host storage", "input")
        self.name, self.elem, self.guard = name, elem, guard
        storage = np.dtype(STORAGE[elem])
        flat = np.asarray(data).reshape(-1)
        self.n = flat.size
        count = 2 * guard + self.n
        self.raw = np.full(count * storage.itemsize + 128, 0xFF, dtype=np.uint8)
        start = (-self.raw.ctypes.data) % 128  # 128-byte aligned, as cudaMalloc's are (256)
        self.buf = self.raw[start:start + count * storage.itemsize].view(storage)
        self.initial: np.ndarray | None = None
        if not poison:
            self.buf[guard:guard + self.n] = _to_storage(flat, elem, name)
            self.initial = self.buf[guard:guard + self.n].copy()

    def pointer(self) -> int:
        return self.buf.ctypes.data + self.guard * self.buf.itemsize

    def payload(self) -> np.ndarray:
        return self.buf[self.guard:self.guard + self.n]

    def check_guards(self, kernel: str) -> None:
        g, n = self.guard, self.n
        for label, region, offset in (("before", self.buf[:g], -g), ("after", self.buf[g + n:], n)):
            raw = region.view(np.uint8).reshape(len(region), region.itemsize)
            bad = np.nonzero((raw != 0xFF).any(axis=1))[0]
            if len(bad):
                raise CudaCPUError(f"kernel {kernel}: wrote outside buffer {self.name} (size {n}): {len(bad)} "
                                   f"element(s) {label} it, first at index {int(bad[0]) + offset}", "guard")

    def check_unchanged(self, kernel: str) -> None:
        """A read-only input must come back as it went in (bit for bit)."""
        assert self.initial is not None
        now = self.payload()
        changed = np.nonzero(now.view(np.uint8) != self.initial.view(np.uint8))[0]
        if len(changed):
            raise CudaCPUError(f"kernel {kernel}: wrote into its read-only input {self.name}, first at index "
                               f"{int(changed[0]) // now.itemsize}", "guard")

    def result(self) -> np.ndarray:
        """The payload in the executors' holding dtype (bf16 as float32)."""
        payload = self.payload()
        if self.elem == "bf16":
            return (payload.astype(np.uint32) << np.uint32(16)).view(np.float32)
        return payload.copy()


def _to_storage(flat: np.ndarray, elem: str, name: str) -> np.ndarray:
    if elem == "bf16":
        bits = round_to_activation(flat.astype(np.float32), "bf16").view(np.uint32) >> np.uint32(16)
        return bits.astype(np.uint16)
    storage = np.dtype(STORAGE[elem])
    if flat.dtype != storage and storage.kind in "iub" and not np.array_equal(flat.astype(storage), flat):
        raise CudaCPUError(f"buffer {name}: values do not fit in {elem}", "input")
    return flat.astype(storage)
