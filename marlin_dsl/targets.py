"""What the lowering needs to know about a target: MMA shape and hard limits.

Everything else target-specific (spelling, fragment layouts, physical weight layouts)
lives in the target's printer and packer, behind this boundary.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    name: str
    mma: tuple[int, int, int]  # (m, n, k) of one MMA instruction
    warp_size: int
    max_threads: int
    max_shared_bytes: int

    @property
    def mma_m(self) -> int:
        return self.mma[0]

    @property
    def mma_n(self) -> int:
        return self.mma[1]

    @property
    def mma_k(self) -> int:
        return self.mma[2]


#: Apple GPUs: 8x8 simdgroup matrices, 32 KB of threadgroup memory (M-series).
METAL = Target("metal", (8, 8, 8), warp_size=32, max_threads=1024, max_shared_bytes=32 * 1024)
#: NVIDIA: mma.sync m16n8k16; 48 KB static shared memory per block without opt-in.
CUDA = Target("cuda", (16, 8, 16), warp_size=32, max_threads=1024, max_shared_bytes=48 * 1024)

TARGETS = {t.name: t for t in (METAL, CUDA)}
