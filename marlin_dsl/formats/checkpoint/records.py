"""`Record`: a block's fields stored together, GGUF style, described as data.

A record is `size` bytes describing `block` consecutive K positions of one output column. Its
fields are

- `Scalar(name, dtype, offset)`: one little-endian f16 / f32 at a byte offset (GGUF's d, dmin);
- `Bits(name, count, slices)`: `count` integers, each assembled from bit slices of the
  record's bytes. A `Slice` says: value[elements[i]] |= ((byte[bytes[i]] >> shifts[i]) &
  (2**width - 1)) << to. `plane(...)` builds the slices of a run of bytes holding `width`-bit
  fields (LSB first within a byte) whose order is a reshaping and transposition of the
  fields (GGUF's "low nibbles are elements 0..15, high nibbles 16..31");
  `signed=True` reads the assembled integer as two's complement (Q8_0's int8 codes).

The declaration checks that no bit is claimed twice and that every bit of the record is some
field's, so a mistyped offset is a FormatError at its line, not a wrong weight. Reading and
writing records are derived: `read` gathers every field of [..., size] bytes with one
vectorised indexing per slice, `write` scatters them back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence, Union

import numpy as np

from ...errors import FormatError, ShapeError, SourceLocation, ValueRangeError
from ...source import caller_location

SCALAR_TYPES = {"f16": np.dtype("<f2"), "f32": np.dtype("<f4")}


@dataclass(frozen=True)
class Slice:
    """Bit slices of a record's bytes placed into a field's values (see the module docstring)."""

    elements: tuple[int, ...]
    bytes: tuple[int, ...]
    shifts: tuple[int, ...]
    width: int
    to: int = 0


def plane(offset: int, nbytes: int, width: int, grid: Sequence[int] = (), order: Sequence[int] = (),
          to: int = 0) -> Slice:
    """The slice of `nbytes` bytes from `offset` holding 8 / `width` fields each (LSB first).
    Numbered byte by byte, field within byte, the fields form the array `grid` (default: one
    axis); transposed by `order` and flattened it lists them in element order.

    GGUF Q4_0's 16 bytes of nibbles: grid (16, 2), order (1, 0): byte j's low nibble is
    element j, its high nibble element 16 + j."""
    per_byte = 8 // width
    total = nbytes * per_byte
    grid = tuple(grid) or (total,)
    order = tuple(order) or tuple(range(len(grid)))
    field_at = np.arange(total).reshape(grid).transpose(order).reshape(-1)  # element e -> field
    element = np.empty(total, dtype=np.int64)
    element[field_at] = np.arange(total)
    fields = np.arange(total)
    return Slice(tuple(int(e) for e in element), tuple(int(offset + f // per_byte) for f in fields),
                 tuple(int((f % per_byte) * width) for f in fields), width, to)


def run(name_offset: int, elements: Sequence[int], shift: int, width: int, to: int = 0) -> Slice:
    """A slice taking the same bits of consecutive bytes from `name_offset` for `elements`."""
    elements = tuple(elements)
    return Slice(elements, tuple(range(name_offset, name_offset + len(elements))),
                 (shift,) * len(elements), width, to)


@dataclass(frozen=True)
class Scalar:
    name: str
    dtype: Literal["f16", "f32"]
    offset: int


@dataclass(frozen=True)
class Bits:
    name: str
    count: int
    slices: tuple[Slice, ...]
    signed: bool = False

    @property
    def width(self) -> int:
        """Bits of each assembled value."""
        return max(s.to + s.width for s in self.slices)


Field = Union[Scalar, Bits]


@dataclass(frozen=True)
class Record:
    """`size` bytes holding the fields of `block` consecutive K positions of a column."""

    block: int
    size: int
    fields: tuple[Field, ...]
    location: SourceLocation | None = field(default=None, compare=False, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        if self.location is None:
            object.__setattr__(self, "location", caller_location())
        owner = np.full(self.size * 8, -1, dtype=np.int64)  # which field owns each bit
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise FormatError(f"Record: field names repeat: {names}", self.location)
        for index, f in enumerate(self.fields):
            for bit in _bits_of(f, self.size, self.location):
                if owner[bit] >= 0:
                    raise FormatError(f"Record: bit {bit % 8} of byte {bit // 8} belongs to both "
                                      f"{self.fields[owner[bit]].name!r} and {f.name!r}", self.location)
                owner[bit] = index
        if (owner < 0).any():
            bit = int(np.argmax(owner < 0))
            raise FormatError(f"Record: bit {bit % 8} of byte {bit // 8} of the {self.size}-byte record "
                              f"belongs to no field", self.location)

    def field(self, name: str) -> Field:
        return next(f for f in self.fields if f.name == name)

    def read(self, records: np.ndarray, name: str) -> dict[str, np.ndarray]:
        """[..., size] uint8 -> {field: [..., count] values}: Scalars in their stored float
        type (f16 stays f16), Bits as the narrowest unsigned type of their width (int32 where
        signed)."""
        if records.dtype != np.uint8 or records.shape[-1] != self.size:
            raise ShapeError(f"{name}: expected uint8 records of {self.size} bytes, got {records.dtype} "
                             f"{list(records.shape)}")
        out: dict[str, np.ndarray] = {}
        for f in self.fields:
            if isinstance(f, Scalar):
                width = SCALAR_TYPES[f.dtype].itemsize
                raw = np.ascontiguousarray(records[..., f.offset:f.offset + width])
                out[f.name] = raw.view(SCALAR_TYPES[f.dtype])
                continue
            # The narrowest type that holds the values: a weight's codes are many (uint8 for 8 bits).
            kind = np.uint8 if f.width <= 8 else np.uint16 if f.width <= 16 else np.int64
            values = np.zeros(records.shape[:-1] + (f.count,), dtype=kind)
            for s in f.slices:
                part = (records[..., list(s.bytes)] >> np.array(s.shifts, dtype=np.uint8)) & np.uint8((1 << s.width) - 1)
                values[..., list(s.elements)] |= part.astype(kind) << kind(s.to)
            if f.signed:
                top = 1 << (f.width - 1)
                wide = values.astype(np.int32)
                values = np.where(wide >= top, wide - 2 * top, wide)
            out[f.name] = values
        return out

    def write(self, values: dict[str, np.ndarray]) -> np.ndarray:
        """{field: [..., count]} -> [..., size] uint8 records (the inverse of `read`)."""
        lead = next(iter(values.values())).shape[:-1]
        records = np.zeros(lead + (self.size,), dtype=np.uint8)
        for f in self.fields:
            v = values[f.name]
            if isinstance(f, Scalar):
                raw = np.asarray(v, dtype=SCALAR_TYPES[f.dtype]).reshape(lead + (1,))
                records[..., f.offset:f.offset + raw.itemsize] = raw.view(np.uint8)
                continue
            v = np.asarray(v, dtype=np.int64)
            low, high = (-(1 << (f.width - 1)), (1 << (f.width - 1)) - 1) if f.signed else (0, (1 << f.width) - 1)
            if v.min() < low or v.max() > high:
                raise ValueRangeError(f"{f.name}: values must lie in {low}..{high} ({f.width} bits"
                                      f"{', signed' if f.signed else ''}), got {int(v.min())}..{int(v.max())}")
            v = v & ((1 << f.width) - 1)
            for s in f.slices:
                part = ((v[..., list(s.elements)] >> s.to) & ((1 << s.width) - 1)) << np.array(s.shifts)
                # Several entries of a slice write one byte (two nibbles): their bits are
                # disjoint (checked at the declaration), so the OR is a sum, a product with
                # the one-hot [entries, size] matrix of their bytes.
                onehot = np.zeros((len(s.bytes), self.size), dtype=np.int64)
                onehot[np.arange(len(s.bytes)), list(s.bytes)] = 1
                records |= (part @ onehot).astype(np.uint8)
        return records


def _bits_of(f: Field, size: int, where: SourceLocation | None) -> list[int]:
    """The record bit positions field `f` reads (a FormatError where one lies outside)."""
    if isinstance(f, Scalar):
        if f.dtype not in SCALAR_TYPES:
            raise FormatError(f"Record field {f.name!r}: dtype must be one of {list(SCALAR_TYPES)}", where)
        span = range(f.offset * 8, (f.offset + SCALAR_TYPES[f.dtype].itemsize) * 8)
        bits = list(span)
    else:
        placed = np.zeros((f.count, 32), dtype=bool)
        bits = []
        for s in f.slices:
            if not (len(s.elements) == len(s.bytes) == len(s.shifts)) or s.shifts and max(s.shifts) + s.width > 8:
                raise FormatError(f"Record field {f.name!r}: a slice's elements, bytes and shifts must "
                                  f"pair up and stay within a byte", where)
            for e, byte, shift in zip(s.elements, s.bytes, s.shifts):
                if not 0 <= e < f.count or placed[e, s.to:s.to + s.width].any():
                    raise FormatError(f"Record field {f.name!r}: element {e} is outside 0..{f.count - 1} "
                                      f"or has bits {s.to}..{s.to + s.width - 1} twice", where)
                placed[e, s.to:s.to + s.width] = True
                bits += [byte * 8 + shift + i for i in range(s.width)]
        width = f.width
        if not placed[:, :width].all():
            e = int(np.argmax(~placed[:, :width].all(axis=1)))
            raise FormatError(f"Record field {f.name!r}: element {e} is missing some of its {width} bits",
                              where)
    if bits and (min(bits) < 0 or max(bits) >= size * 8):
        raise FormatError(f"Record field {f.name!r} reaches outside the {size}-byte record", where)
    return bits
