"""Host buffers of a CPU-harness launch, shared by the Metal and CUDA harnesses
(`targets/metal/cpu_harness.py`, `targets/cuda/cpu_harness.py`): each flat array sits between
two guard regions of 0xFF bytes that must come back untouched; outputs are poisoned (0xFF
bytes: NaN in f16, bf16 and f32) unless they are read-write; a read-only input can be checked
to come back unchanged. bf16 travels as its bits (uint16); executors hold bf16 values in
float32. Each harness names its element types its own way and raises its own error type."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..ir.numerics import round_to_activation

__all__ = ["GuardedBuffer"]

#: (message, kind) -> the harness's own error (MetalCPUError, CudaCPUError)
ErrorFactory = Callable[[str, str], Exception]


class GuardedBuffer:
    """A flat buffer of `storage` values between two guard regions of 0xFF bytes, its payload
    aligned to `align` bytes (as the device allocator's would be). `bf16`: the values are
    bfloat16, stored as their upper 16 bits."""

    def __init__(self, name: str, storage: np.dtype, data: np.ndarray, guard: int, poison: bool, *,
                 bf16: bool, error: ErrorFactory, align: int = 128, what: str = "") -> None:
        self.name, self.guard, self.bf16, self.error = name, guard, bf16, error
        flat = np.asarray(data).reshape(-1)
        self.n = flat.size
        count = 2 * guard + self.n
        self.raw = np.full(count * storage.itemsize + align, 0xFF, dtype=np.uint8)
        start = (-self.raw.ctypes.data) % align
        self.buf = self.raw[start:start + count * storage.itemsize].view(storage)
        self.initial: np.ndarray | None = None
        if not poison:
            self.buf[guard:guard + self.n] = self._to_storage(flat, what or str(storage))
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
                raise self.error(f"kernel {kernel}: wrote outside buffer {self.name} (size {n}): {len(bad)} "
                                 f"element(s) {label} it, first at index {int(bad[0]) + offset}", "guard")

    def check_unchanged(self, kernel: str) -> None:
        """A read-only input must come back as it went in (bit for bit)."""
        assert self.initial is not None
        now = self.payload()
        changed = np.nonzero(now.view(np.uint8) != self.initial.view(np.uint8))[0]
        if len(changed):
            raise self.error(f"kernel {kernel}: wrote into its read-only input {self.name}, first at index "
                             f"{int(changed[0]) // now.itemsize}", "guard")

    def result(self) -> np.ndarray:
        """The payload in the executors' holding dtype (bf16 as float32)."""
        payload = self.payload()
        if self.bf16:
            return (payload.astype(np.uint32) << np.uint32(16)).view(np.float32)
        return payload.copy()

    def _to_storage(self, flat: np.ndarray, what: str) -> np.ndarray:
        if self.bf16:
            bits = round_to_activation(flat.astype(np.float32), "bf16").view(np.uint32) >> np.uint32(16)
            return bits.astype(np.uint16)
        storage = self.buf.dtype
        if flat.dtype != storage and storage.kind in "iub" and not np.array_equal(flat.astype(storage), flat):
            raise self.error(f"buffer {self.name}: values do not fit in {what}", "input")
        return flat.astype(storage)
