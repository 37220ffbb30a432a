"""`Words`: small integers packed into the words of a checkpoint tensor, described as data.

The ecosystem's layouts differ in four things, each a field here:

- `axis`: the logical axis the fields of one word run along: "K" (GPTQ's qweight [K/8, N],
  bitsandbytes' bytes) or "N" (GPTQ's qzeros [K/G, N/8], AWQ's qweight [K, N/8]);
- `order`: which position of the word's run field i holds (field i is bits [i*b, (i+1)*b)):
  identity for GPTQ, (0, 2, 4, 6, 1, 3, 5, 7) for AWQ, (1, 0) for bitsandbytes' bytes (the
  first code in the high nibble);
- `word`: the stored integer type; signed words (GPTQ's and AWQ's int32) are read as their
  bits;
- `offset`: stored = value - offset (GPTQ v1 stores zero points minus 1).

`transposed` says the tensor is [N, K] rather than [K, N] (PyTorch's [out, in]), and `flat`
that it may come as one flat vector of that matrix (bitsandbytes keeps [N*K/2, 1]).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ...errors import FormatError, ShapeError, SourceLocation, ValueRangeError
from ...source import caller_location

#: The stored word types and their numpy types (signed ones are viewed as unsigned bits).
WORD_TYPES: dict[str, np.dtype] = {"u8": np.dtype(np.uint8), "u16": np.dtype(np.uint16),
                                   "u32": np.dtype(np.uint32), "i32": np.dtype(np.int32)}


@dataclass(frozen=True)
class Words:
    """`bits`-bit fields packed into `word` integers along `axis` (see the module docstring)."""

    bits: int
    word: Literal["u8", "u16", "u32", "i32"] = "i32"
    axis: Literal["K", "N"] = "K"
    order: tuple[int, ...] | None = None
    offset: int = 0
    transposed: bool = False
    flat: bool = False
    location: SourceLocation | None = field(default=None, compare=False, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        if self.location is None:
            object.__setattr__(self, "location", caller_location())
        if self.word not in WORD_TYPES:
            raise FormatError(f"Words: word must be one of {list(WORD_TYPES)}, got {self.word!r}", self.location)
        width = self.word_bits
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or not 1 <= self.bits <= width \
                or width % self.bits:
            raise FormatError(f"Words: bits must divide the {width}-bit word, got {self.bits!r}", self.location)
        if self.axis not in ("K", "N"):
            raise FormatError(f"Words: axis must be 'K' or 'N', got {self.axis!r}", self.location)
        order = tuple(range(self.per_word)) if self.order is None else tuple(self.order)
        if sorted(order) != list(range(self.per_word)):
            raise FormatError(f"Words: order must be a permutation of 0..{self.per_word - 1} (the "
                              f"{self.per_word} fields of a word), got {self.order!r}", self.location)
        object.__setattr__(self, "order", order)

    @property
    def word_bits(self) -> int:
        return WORD_TYPES[self.word].itemsize * 8

    @property
    def per_word(self) -> int:
        return self.word_bits // self.bits

    def stored_shape(self, rows: int, cols: int) -> tuple[int, int]:
        """The tensor's shape for a logical [rows (K or groups), cols (N)] array."""
        if self.axis == "K":
            rows //= self.per_word
        else:
            cols //= self.per_word
        return (cols, rows) if self.transposed else (rows, cols)

    def unpack(self, tensor: np.ndarray, rows: int, cols: int, name: str) -> np.ndarray:
        """The [rows, cols] values (stored field + offset; the narrowest unsigned type of the
        field's width, int32 with an offset) of a checkpoint tensor."""
        logical = (rows, cols)
        if (self.axis == "K" and rows % self.per_word) or (self.axis == "N" and cols % self.per_word):
            raise ShapeError(f"{name}: {self.per_word} fields a word along {self.axis}, but that axis "
                             f"is {rows if self.axis == 'K' else cols} long")
        words = _as_words(tensor, self, self.stored_shape(*logical), name)
        if self.transposed:
            words = words.T
        unsigned = np.dtype(f"u{words.dtype.itemsize}").type
        words = words.view(unsigned)  # signed words are read as their bits
        narrow = np.uint8 if self.bits <= 8 else np.uint16 if self.bits <= 16 else np.uint32
        shifts = np.arange(self.per_word, dtype=unsigned) * unsigned(self.bits)
        fields = ((words[..., None] >> shifts) & unsigned((1 << self.bits) - 1)).astype(narrow)
        placed = np.empty_like(fields)
        placed[..., list(self.order)] = fields  # field i holds position order[i] of its run
        if self.axis == "K":  # [rows/p, cols, p] -> [rows/p, p, cols]
            values = placed.transpose(0, 2, 1).reshape(rows, cols)
        else:
            values = placed.reshape(rows, cols)
        return values.astype(np.int32) + self.offset if self.offset else values

    def pack(self, values: np.ndarray, name: str = "values") -> np.ndarray:
        """[rows, cols] integers -> the checkpoint tensor (the inverse of `unpack`)."""
        stored = np.asarray(values, dtype=np.int64) - self.offset
        if stored.min() < 0 or stored.max() >> self.bits:
            bad = tuple(int(i) for i in np.argwhere((stored < 0) | (stored >> self.bits != 0))[0])
            raise ValueRangeError(f"{name}{list(bad)} = {int(values[bad])} does not fit {self.bits} bits "
                                  f"with offset {self.offset}")
        rows, cols = stored.shape
        p = self.per_word
        if self.axis == "K":
            runs = stored.reshape(rows // p, p, cols).transpose(0, 2, 1)
        else:
            runs = stored.reshape(rows, cols // p, p)
        fields = runs[..., list(self.order)].astype(np.uint64)
        shifts = np.arange(p, dtype=np.uint64) * np.uint64(self.bits)
        words = np.bitwise_or.reduce(fields << shifts, axis=-1)
        unsigned = np.dtype(f"u{WORD_TYPES[self.word].itemsize}")
        out = words.astype(unsigned).view(WORD_TYPES[self.word])
        return out.T.copy() if self.transposed else out

    def describe(self) -> str:
        order = "" if self.order == tuple(range(self.per_word)) else f" order {list(self.order)}"
        offset = f", stored = value - {self.offset}" if self.offset else ""
        return (f"{self.bits}-bit fields in {self.word} words along {self.axis}{order}"
                f"{', [N, K]' if self.transposed else ''}{offset}")


def _as_words(tensor: object, words: Words, shape: tuple[int, int], name: str) -> np.ndarray:
    """The tensor as a [shape] array of the declared word type, or a ShapeError naming it."""
    if not isinstance(tensor, np.ndarray):
        tensor = np.asarray(tensor)
    want = WORD_TYPES[words.word]
    if tensor.dtype != want and not (tensor.dtype.itemsize == want.itemsize and tensor.dtype.kind in "iu"):
        raise ShapeError(f"{name}: expected {want} words ({words.describe()}), got {tensor.dtype}")
    if tensor.shape != shape:
        if not (words.flat and tensor.size == shape[0] * shape[1]):
            raise ShapeError(f"{name}: expected shape {list(shape)} ({words.describe()}), got "
                             f"{list(tensor.shape)}")
        tensor = tensor.reshape(shape)
    return tensor.view(want)
