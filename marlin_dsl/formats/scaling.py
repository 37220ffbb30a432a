"""Per-group scales and zero points along K, described as data."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ..errors import FormatError, SourceLocation
from ..source import caller_location

#: `group_size="K"` means one scale per output column (a single group spanning K).
PER_COLUMN = "K"

_NUMPY_DTYPES: dict[str, np.dtype] = {"f16": np.dtype(np.float16), "u8": np.dtype(np.uint8)}


@dataclass(frozen=True)
class GroupScale:
    """One scale per `group_size` consecutive K positions and per column: shape [K/G, N].

    The group of dense position k is k // G, also for sparse formats (seed 000 section 7).
    """

    group_size: int | Literal["K"] = 128
    dtype: Literal["f16"] = "f16"
    location: SourceLocation | None = field(default=None, compare=False, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        if self.location is None:
            object.__setattr__(self, "location", caller_location())
        g = self.group_size
        if g != PER_COLUMN and (not isinstance(g, int) or isinstance(g, bool) or g < 1):
            raise FormatError(
                f"GroupScale: group_size must be a positive integer or 'K', got {g!r}",
                self.location,
            )
        if self.dtype not in ("f16",):
            raise FormatError(f"GroupScale: dtype must be 'f16', got {self.dtype!r}", self.location)

    def groups(self, k: int) -> int:
        return 1 if self.group_size == PER_COLUMN else k // int(self.group_size)

    def size_for(self, k: int) -> int:
        return k if self.group_size == PER_COLUMN else int(self.group_size)

    @property
    def numpy_dtype(self) -> np.dtype:
        return _NUMPY_DTYPES[self.dtype]


@dataclass(frozen=True)
class ZeroPoint:
    """A per-group zero point z, same grid as the scales: value = (table[code] - z) * scale.

    `dtype="u8"` stores integer zero points (exact, GPTQ style); `"f16"` stores them as
    half floats, which also admits fractional zero points loaded from elsewhere.
    """

    dtype: Literal["u8", "f16"] = "u8"
    location: SourceLocation | None = field(default=None, compare=False, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        if self.location is None:
            object.__setattr__(self, "location", caller_location())
        if self.dtype not in _NUMPY_DTYPES:
            raise FormatError(
                f"ZeroPoint: dtype must be one of {sorted(_NUMPY_DTYPES)}, got {self.dtype!r}",
                self.location,
            )

    @property
    def numpy_dtype(self) -> np.dtype:
        return _NUMPY_DTYPES[self.dtype]
