"""The Metal target as data: Apple GPUs' 8x8 simdgroup matrices (whose lane layout Metal keeps
opaque: no lane tables) and M-series limits."""
from __future__ import annotations

from ..base import Target

#: Apple GPUs: 8x8 simdgroup matrices, 32 KB of threadgroup memory (M-series).
METAL = Target("metal", (8, 8, 8), warp_size=32, max_threads=1024, max_shared_bytes=32 * 1024)
