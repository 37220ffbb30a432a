"""The two states of a weight: logical codes (`QuantizedWeights`) and packed arrays
(`PackedWeights`), plus argument checking shared by the operations on them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ..errors import ShapeError, ValueRangeError
from .format import Format


#: Parameter arrays held in fields of their own (the others are in `extra`).
_NAMED = ("scales", "zeros", "biases")


@dataclass
class QuantizedWeights:
    """Unpacked, logical form of a quantised weight.

    codes:  [K, N] uint8, one code per dense position (0 at positions pruned away).
    scales: [K/G, N] in the format's scale storage (float16 by default).
    zeros:  [K/G, N] zero points (dtype from the format) or None.
    keep:   [K, N] bool for N:M formats (True where a value is stored), else None.
    biases: [K/G, N] per-group biases (formats with a GroupBias) or None.
    extra:  the other parameter arrays of the format's scale scheme by name (a
            TwoLevelScale's "channel_scales" [1, N]).
    """

    format: Format
    codes: np.ndarray
    scales: np.ndarray
    zeros: np.ndarray | None = None
    keep: np.ndarray | None = None
    biases: np.ndarray | None = None
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def from_arrays(cls, fmt: Format, codes: np.ndarray, arrays: Mapping[str, np.ndarray],
                    keep: np.ndarray | None = None) -> QuantizedWeights:
        """Codes with the format's parameter arrays taken by name from `arrays`."""
        named = {name: arrays.get(name) for name in fmt.parameters()}
        extra = {n: a for n, a in named.items() if n not in _NAMED and a is not None}
        return cls(fmt, codes, named.get("scales"), named.get("zeros"), keep, named.get("biases"),
                   extra)  # type: ignore[arg-type]

    def parameter(self, name: str) -> np.ndarray | None:
        """The parameter array `name` ("scales", "zeros", "biases" or another of the scale
        scheme's), or None."""
        if name in _NAMED:
            return getattr(self, name)
        return self.extra.get(name)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)  # type: ignore[return-value]


@dataclass
class PackedWeights:
    """Packed arrays of a [K, N] weight, named as `Format.buffers` lists them.

    `layout` names the physical layout: "linear" is the target-independent layout the format
    describes (seed 000/002); targets may choose another at pack time.
    """

    format: Format
    shape: tuple[int, int]
    arrays: dict[str, np.ndarray]
    layout: str = "linear"
    #: what the MLX layer path derived from these arrays (validated device copies in a
    #: kernel's layout), keyed by the arrays' identity; see marlin_dsl.nn._device_arrays
    device_cache: dict = field(default_factory=dict, compare=False, repr=False)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays.values())


def check_float_matrix(value: object, argument: str) -> np.ndarray:
    """A finite, 2-D floating array, or a ValueError that names the argument and index."""
    array = np.asarray(value)
    if array.ndim != 2:
        raise ShapeError(f"{argument}: expected a 2-D [K, N] array, got rank {array.ndim} "
                         f"with shape {tuple(array.shape)}")
    if not np.issubdtype(array.dtype, np.floating):
        raise ShapeError(f"{argument}: expected a floating-point array, got dtype {array.dtype}")
    finite = np.isfinite(array)
    if not finite.all():
        bad = tuple(int(i) for i in np.argwhere(~finite)[0])
        raise ValueRangeError(f"{argument}: non-finite value {array[bad]} at index {bad}")
    return array


def check_array(array: object, argument: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An array with exactly this shape and dtype, or a ShapeError naming the argument."""
    if not isinstance(array, np.ndarray):
        raise ShapeError(f"{argument}: expected a numpy array, got {type(array).__name__}")
    if array.ndim != len(shape):
        raise ShapeError(f"{argument}: expected rank {len(shape)} with shape {shape}, "
                         f"got rank {array.ndim} with shape {array.shape}")
    if tuple(array.shape) != tuple(shape):
        raise ShapeError(f"{argument}: expected shape {shape}, got {array.shape}")
    if array.dtype != dtype:
        raise ShapeError(f"{argument}: expected dtype {dtype}, got {array.dtype}")
    return array


def first_index(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])
