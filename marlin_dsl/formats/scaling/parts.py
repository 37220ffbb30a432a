"""The parts of the built-in group scaling scheme (`GroupAffine`, affine.py): per-group
scales, zero points and biases along K, described as data.

One group is `group_size` consecutive K positions of one column; every parameter array is
[K/G, N]. A decoded value is

    value = (table[code] - zero) * scale + bias

where `zero` is present only with a `ZeroPoint` and `bias` only with a `GroupBias` (MLX's
affine mode, `w = s * q + b`, is `GroupBias` with an unsigned integer encoding). The number
type of each array is a `StorageType` (formats/storage.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ...errors import FormatError, SourceLocation
from ...source import caller_location
from ..storage import STORAGE_TYPES, StorageType

#: `group_size="K"` means one scale per output column (a single group spanning K).
PER_COLUMN = "K"

#: The number types each parameter may be stored in.
SCALE_DTYPES = ("f16", "bf16", "f32", "e8m0", "e4m3")
ZERO_POINT_DTYPES = ("u8", "f16")
BIAS_DTYPES = ("f16", "bf16", "f32")
#: What a loaded scale of exactly 0 means (`GroupScale.zero`): refused, or an all-zero group.
SCALE_ZERO = ("refused", "allowed")


class Stored:
    """A parameter kept in one of the storage types (`dtype`, a key of STORAGE_TYPES)."""

    dtype: str

    @property
    def storage(self) -> StorageType:
        return STORAGE_TYPES[self.dtype]

    @property
    def numpy_dtype(self) -> np.dtype:
        return self.storage.numpy_dtype


class Grouping:
    """K positions grouped `group_size` at a time (or all of K): the one place that says which
    group a K position belongs to, shared by the scale parts and every scheme."""

    group_size: int | Literal["K"]

    def groups(self, k: int) -> int:
        """Groups along K (rows of a per-group array)."""
        return 1 if self.group_size == PER_COLUMN else k // int(self.group_size)

    def size_for(self, k: int) -> int:
        """K positions per group for a weight with K rows."""
        return k if self.group_size == PER_COLUMN else int(self.group_size)

    def k_step(self) -> int | Literal["K"]:
        """K must be a multiple of this (the group, or a super-block of groups)."""
        return self.group_size

    def covers(self, span: int) -> bool:
        """True when every group holds whole runs of `span` consecutive K positions."""
        return self.group_size == PER_COLUMN or int(self.group_size) % span == 0


def check_group_size(owner: str, g: object, location: SourceLocation | None) -> None:
    if g != PER_COLUMN and (not isinstance(g, int) or isinstance(g, bool) or g < 1):
        raise FormatError(f"{owner}: group_size must be a positive integer or 'K', got {g!r}",
                          location)


def check_dtype(owner: str, dtype: object, allowed: tuple[str, ...],
                 location: SourceLocation | None) -> None:
    if dtype not in allowed:
        raise FormatError(f"{owner}: dtype must be one of {list(allowed)}, got {dtype!r}", location)


@dataclass(frozen=True)
class GroupScale(Grouping, Stored):
    """One scale per `group_size` consecutive K positions and per column: shape [K/G, N].

    The group of dense position k is k // G, also for sparse formats (seed 000 section 7).
    `dtype` is the scales' number type: f16 (default), bf16, f32, or the 8-bit codes e8m0
    (powers of two, OCP mx formats) and e4m3 (nvfp4).

    `zero` says what a *loaded* scale of exactly 0 means where the format has no bias
    (with one, any scale is accepted). "refused" (default): an error, since our quantiser
    never stores 0 and a zero scale would silently zero its group. "allowed": the
    producer's own encoding of an all-zero group (MLX's nvfp4 stores E4M3 0 for a group
    whose scale underflows and dequantises it to zeros); formats imported from MLX declare
    it. Negative scales are refused either way.
    """

    group_size: int | Literal["K"] = 128
    dtype: str = "f16"
    zero: Literal["refused", "allowed"] = "refused"
    location: SourceLocation | None = field(default=None, compare=False, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        if self.location is None:
            object.__setattr__(self, "location", caller_location())
        check_group_size("GroupScale", self.group_size, self.location)
        check_dtype("GroupScale", self.dtype, SCALE_DTYPES, self.location)
        if self.zero not in SCALE_ZERO:
            raise FormatError(f"GroupScale: zero must be one of {list(SCALE_ZERO)}, got {self.zero!r}",
                              self.location)


@dataclass(frozen=True)
class ZeroPoint(Stored):
    """A per-group zero point z, same grid as the scales: value = (table[code] - z) * scale.

    `dtype="u8"` stores integer zero points (exact, GPTQ style); `"f16"` stores them as
    half floats, which also admits fractional zero points loaded from elsewhere.
    """

    dtype: Literal["u8", "f16"] = "u8"
    location: SourceLocation | None = field(default=None, compare=False, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        if self.location is None:
            object.__setattr__(self, "location", caller_location())
        check_dtype("ZeroPoint", self.dtype, ZERO_POINT_DTYPES, self.location)


@dataclass(frozen=True)
class GroupBias(Stored):
    """A per-group additive bias b, same grid as the scales: value = table[code] * scale + b.

    This is MLX's affine quantisation (`w = s * q + b`, `mx.quantize(mode="affine")`): with
    an unsigned `IntEncoding(bits)` and scales and biases in the model's dtype (f16, bf16 or
    f32), MLX's packed arrays load bit for bit.
    """

    dtype: Literal["f16", "bf16", "f32"] = "f16"
    location: SourceLocation | None = field(default=None, compare=False, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        if self.location is None:
            object.__setattr__(self, "location", caller_location())
        check_dtype("GroupBias", self.dtype, BIAS_DTYPES, self.location)
