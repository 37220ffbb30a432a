"""`CheckpointFormat`: how a checkpoint stores the weight of one layer, described as data.

A checkpoint format pairs a kernel `Format` (the arithmetic: encoding, scales, zero points)
with the tensors a checkpoint holds and where each goes:

- `Packed(tensor, into, words)`: a tensor of `Words` (words.py) that holds the codes
  (`into="codes"`) or one of the format's parameter arrays (GPTQ's qzeros);
- `Plain(tensor, into, transposed, flat)`: a parameter array as it is ([K/G, N]; [N, K/G]
  where transposed; any shape of that size where flat);
- `Records(tensor, record, into)`: the weight as GGUF-style records (records.py), each
  field going to the codes or a parameter array;
- `GroupIndex(tensor)`: GPTQ's act-order `g_idx`, the group of every input row;
- `QuantizedScales(...)`: a parameter array that is itself quantised (bitsandbytes' double
  quantisation: absmax = table[code] * nested_absmax[i // block] + offset, in f32).

Reading (`read`) and writing (`write`) are derived from the description; nothing here knows a
checkpoint format by name. Reading gives the kernel format's `QuantizedWeights`, so the packer,
the reference, the validator and every target's layout and in-kernel decode are those of the
kernel format: checkpoints are re-laid out once, at load (docs/DECISIONS.md says why). A group
map that is not the identity becomes a permutation of K: the rows are sorted by group and the
layer permutes its input the same way (`Imported.input_order`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Union

import numpy as np

from ...errors import FormatError, ShapeError, SourceLocation, ValueRangeError
from ...source import caller_location, record_declaration
from ..format import Format
from ..tensors import QuantizedWeights
from .records import Bits, Record, Scalar
from .words import Words


@dataclass(frozen=True)
class Packed:
    tensor: str
    into: str
    words: Words


@dataclass(frozen=True)
class Plain:
    tensor: str
    into: str
    transposed: bool = False
    flat: bool = False


@dataclass(frozen=True)
class Records:
    tensor: str
    record: Record
    #: (record field, "codes" or a parameter array) pairs
    into: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class GroupIndex:
    tensor: str


@dataclass(frozen=True)
class QuantizedScales:
    """`into` [K/G, N] (f32) = table[codes] * scales[i // block] + offset, where i runs over
    the [N, K/G] matrix flattened (bitsandbytes' nested absmax)."""

    into: str
    codes: str
    table: str
    scales: str
    offset: str
    block: int = 256


Entry = Union[Packed, Plain, Records, GroupIndex, QuantizedScales]


@dataclass
class Imported:
    """A checkpoint's weight in its kernel format; `input_order` (or None): the layer's input
    columns in the order the rows of `weights` take them (x[..., input_order] @ W)."""

    weights: QuantizedWeights
    input_order: np.ndarray | None


@dataclass(frozen=True)
class CheckpointFormat:
    """A checkpoint's storage of one layer's weight (see the module docstring)."""

    name: str
    format: Format
    tensors: tuple[Entry, ...]
    doc: str = ""
    location: SourceLocation | None = field(default=None, compare=False, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        if self.location is None:
            object.__setattr__(self, "location", caller_location())
        where = self.location
        if not isinstance(self.format, Format):
            raise FormatError(f"checkpoint format {self.name!r}: format must be a Format", where)
        params = {a.name: a for a in self.format.scaling.arrays()}
        targets = [t for e in self.tensors for t in _targets(e)]
        wanted = ["codes", *params]
        for t in targets:
            if t not in wanted:
                raise FormatError(f"checkpoint format {self.name!r}: {t!r} is not the codes or a parameter "
                                  f"array of format {self.format.name!r} ({wanted})", where)
        for t in wanted:
            if targets.count(t) != 1:
                raise FormatError(f"checkpoint format {self.name!r}: {t!r} must come from exactly one "
                                  f"tensor, comes from {targets.count(t)}", where)
        for e in self.tensors:
            if isinstance(e, Records):
                for name, into in e.into:
                    f = e.record.field(name)
                    count = 1 if isinstance(f, Scalar) else f.count
                    rows = e.record.block if into == "codes" else params[into].rows(self.format.scaling, e.record.block)
                    if count != rows:
                        raise FormatError(f"checkpoint format {self.name!r}: record field {name!r} holds "
                                          f"{count} values a record of {e.record.block} K positions, "
                                          f"{into!r} needs {rows}", where)
        record_declaration(self)

    @property
    def names(self) -> list[str]:
        """Every tensor the checkpoint holds for one layer."""
        out: list[str] = []
        for e in self.tensors:
            out += ([e.codes, e.table, e.scales, e.offset] if isinstance(e, QuantizedScales) else [e.tensor])
        return out

    @property
    def k_block(self) -> int:
        """K must be a multiple of this (the format's and a record's)."""
        blocks = [e.record.block for e in self.tensors if isinstance(e, Records)]
        return int(np.lcm.reduce([self.format.k_multiple, *blocks]))

    def describe(self) -> str:
        return f"{self.name}: {self.format.describe()}; tensors {', '.join(self.names)}"

    # ----- reading ---------------------------------------------------------------------------

    def read(self, tensors: Mapping[str, object], shape: tuple[int, int], prefix: str = "") -> Imported:
        """The layer's [K, N] weight from its checkpoint tensors (numpy arrays by name); errors
        name `prefix + tensor`."""
        k, n = (int(d) for d in shape)
        missing = [t for t in self.names if t not in tensors]
        if missing:
            raise ShapeError(f"{prefix}{missing[0]}: missing; checkpoint format {self.name!r} stores "
                             f"{self.names}")
        if k % self.k_block:
            raise ShapeError(f"{prefix}{self.names[0]}: K={k} is not a multiple of {self.k_block} "
                             f"(checkpoint format {self.name!r})")
        self.format.check_shape(k, n, f"{prefix}{self.names[0]}")
        params = {a.name: a for a in self.format.scaling.arrays()}
        values: dict[str, np.ndarray] = {}
        order = None
        for e in self.tensors:
            name = prefix + getattr(e, "tensor", getattr(e, "codes", ""))
            if isinstance(e, Packed):
                rows = k if e.into == "codes" else params[e.into].rows(self.format.scaling, k)
                values[e.into] = e.words.unpack(np.asarray(tensors[e.tensor]), rows, n, name)
            elif isinstance(e, Plain):
                a = params[e.into]
                values[e.into] = _plain(tensors[e.tensor], e, (a.rows(self.format.scaling, k), n),
                                        a.storage.numpy_dtype, name)
            elif isinstance(e, Records):
                values.update(_read_records(e, tensors[e.tensor], self.format, k, n, name))
            elif isinstance(e, QuantizedScales):
                values[e.into] = _nested(e, tensors, (params[e.into].rows(self.format.scaling, k), n), prefix)
            else:
                order = _group_order(tensors[e.tensor], self.format, k, name)
        codes = _codes(self.format, values.pop("codes"), prefix + self.names[0])
        stored = {}
        for p, a in params.items():
            stored[p] = _stored(values[p], a.storage.numpy_dtype, a.storage.name, prefix + p)
        if order is not None:
            codes = codes[order]
        return Imported(QuantizedWeights.from_arrays(self.format, codes, stored), order)

    # ----- writing ---------------------------------------------------------------------------

    def write(self, weights: QuantizedWeights, input_order: np.ndarray | None = None,
              nested_table: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The checkpoint tensors of `weights` (the inverse of `read`; with `input_order`, the
        act-order map that `read` gave). A `QuantizedScales` entry quantises its array with
        `nested_table` (that of the checkpoint's producer), which loses precision as the
        producer's own writer does."""
        k, n = weights.codes.shape
        params = {a.name: a for a in self.format.scaling.arrays()}
        codes = weights.codes.astype(np.int64)
        order = np.arange(k) if input_order is None else np.asarray(input_order)
        if input_order is not None:
            unsorted = np.empty_like(codes)
            unsorted[order] = codes
            codes = unsorted
        logical = {"codes": codes, **{p: weights.parameter(p) for p in params}}
        out: dict[str, np.ndarray] = {}
        for e in self.tensors:
            if isinstance(e, Packed):
                out[e.tensor] = e.words.pack(logical[e.into].astype(np.int64), e.tensor)
            elif isinstance(e, Plain):
                a = np.ascontiguousarray(logical[e.into].T if e.transposed else logical[e.into])
                out[e.tensor] = a.reshape(-1) if e.flat else a
            elif isinstance(e, Records):
                out[e.tensor] = _write_records(e, logical, self.format, k, n)
            elif isinstance(e, QuantizedScales):
                if nested_table is None:
                    raise ValueRangeError(f"nested_table: checkpoint format {self.name!r} quantises "
                                          f"{e.into!r}; give the producer's table")
                out.update(_quantize_nested(e, logical[e.into], nested_table))
            else:
                g = self.format.group_size_for(k)
                g_idx = np.empty(k, dtype=np.int32)
                g_idx[order] = np.arange(k) // g
                out[e.tensor] = g_idx
        return out


def _targets(e: Entry) -> list[str]:
    if isinstance(e, Records):
        return [into for _, into in e.into]
    if isinstance(e, GroupIndex):
        return []
    return [e.into]


def _plain(tensor: object, e: Plain, shape: tuple[int, int], dtype: np.dtype, name: str) -> np.ndarray:
    a = np.asarray(tensor)
    want = (shape[1], shape[0]) if e.transposed else shape
    if a.dtype != dtype:
        raise ShapeError(f"{name}: expected {dtype}, got {a.dtype}")
    if a.shape != want:
        if not (e.flat and a.size == want[0] * want[1]):
            raise ShapeError(f"{name}: expected shape {list(want)}, got {list(a.shape)}")
        a = a.reshape(want)
    return a.T if e.transposed else a


def _read_records(e: Records, tensor: object, fmt: Format, k: int, n: int, name: str) -> dict[str, np.ndarray]:
    a = np.asarray(tensor)
    per_row = k // e.record.block
    if a.dtype != np.uint8 or a.size != n * per_row * e.record.size:
        raise ShapeError(f"{name}: expected {n} x {per_row} records of {e.record.size} bytes "
                         f"({n * per_row * e.record.size} uint8), got {a.dtype} {list(a.shape)}")
    fields = e.record.read(a.reshape(n, per_row, e.record.size), name)
    out = {}
    for field_name, into in e.into:
        values = fields[field_name].reshape(n, -1).T
        shift = _code_shift(e, field_name, into, fmt)
        out[into] = values + shift if shift else values
    return out


def _code_shift(e: Records, field_name: str, into: str, fmt: Format) -> int:
    """What reading adds to a field's values: signed codes (two's complement, Q8_0's int8)
    become the encoding's offset-binary codes, code = value + offset."""
    f = e.record.field(field_name)
    if into == "codes" and isinstance(f, Bits) and f.signed:
        return int(getattr(fmt.element, "offset", 0))
    return 0


def _write_records(e: Records, logical: dict[str, np.ndarray], fmt: Format, k: int, n: int) -> np.ndarray:
    per_row = k // e.record.block
    values = {}
    for field_name, into in e.into:
        a = np.asarray(logical[into])
        shift = _code_shift(e, field_name, into, fmt)
        values[field_name] = (a.astype(np.int64) - shift if shift else a).T.reshape(n, per_row, -1)
    return e.record.write(values).reshape(n, per_row * e.record.size)


def _codes(fmt: Format, values: np.ndarray, name: str) -> np.ndarray:
    bits = fmt.element.bits
    bad = (values < 0) | (values >= 1 << bits)
    if bad.any():
        i = tuple(int(x) for x in np.argwhere(bad)[0])
        raise ValueRangeError(f"{name}: code {int(values[i])} at [K={i[0]}, N={i[1]}] does not fit "
                              f"{fmt.name!r}'s {bits}-bit codes")
    return values.astype(np.uint8)


def _stored(values: np.ndarray, dtype: np.dtype, storage: str, name: str) -> np.ndarray:
    if dtype.kind == "f" or values.dtype == dtype:
        return np.ascontiguousarray(values.astype(dtype) if values.dtype.kind in "iu" else values)
    info = np.iinfo(dtype)
    if values.min() < info.min or values.max() > info.max:
        i = tuple(int(x) for x in np.argwhere((values < info.min) | (values > info.max))[0])
        raise ValueRangeError(f"{name}: value {int(values[i])} at {list(i)} does not fit {storage}")
    return np.ascontiguousarray(values.astype(dtype))


def _group_order(tensor: object, fmt: Format, k: int, name: str) -> np.ndarray | None:
    """act-order: the rows sorted by group (stable), None where already in order."""
    g_idx = np.asarray(tensor)
    if g_idx.shape != (k,) or g_idx.dtype.kind not in "iu":
        raise ShapeError(f"{name}: expected an integer vector of K={k} groups, got {g_idx.dtype} "
                         f"{list(g_idx.shape)}")
    g = fmt.group_size_for(k)
    groups = k // g
    if g_idx.min() < 0 or g_idx.max() >= groups:
        i = int(np.argmax((g_idx < 0) | (g_idx >= groups)))
        raise ValueRangeError(f"{name}[{i}] = {int(g_idx[i])}: groups are 0..{groups - 1}")
    counts = np.bincount(g_idx, minlength=groups)
    if (counts != g).any():
        j = int(np.argmax(counts != g))
        raise ValueRangeError(f"{name}: group {j} has {int(counts[j])} rows; format {fmt.name!r} needs "
                              f"{g} a group (K={k})")
    order = np.argsort(g_idx, kind="stable")
    return None if (order == np.arange(k)).all() else order


def _nested(e: QuantizedScales, tensors: Mapping[str, object], shape: tuple[int, int], prefix: str) -> np.ndarray:
    arrays = {}
    for name, dtype in ((e.codes, np.uint8), (e.table, np.float32), (e.scales, np.float32), (e.offset, np.float32)):
        a = np.asarray(tensors[name])
        if a.dtype != dtype:
            raise ShapeError(f"{prefix}{name}: expected {np.dtype(dtype)}, got {a.dtype}")
        arrays[name] = a.reshape(-1)
    codes, table, scales, offset = (arrays[n] for n in (e.codes, e.table, e.scales, e.offset))
    if offset.size != 1:
        raise ShapeError(f"{prefix}{e.offset}: expected one value, got {offset.size}")
    offset = offset[0]
    rows, n = shape
    if codes.size != rows * n or codes.dtype != np.uint8:
        raise ShapeError(f"{prefix}{e.codes}: expected {rows * n} uint8 codes, got {codes.dtype} {codes.size}")
    if table.size != 256:
        raise ShapeError(f"{prefix}{e.table}: expected a table of 256 values, got {table.size}")
    blocks = -(-codes.size // e.block)
    if scales.size != blocks:
        raise ShapeError(f"{prefix}{e.scales}: expected {blocks} values (one per {e.block} codes), got {scales.size}")
    values = table[codes] * np.repeat(scales, e.block)[:codes.size] + offset  # f32, as the producer
    return values.astype(np.float32).reshape(n, rows).T


def _quantize_nested(e: QuantizedScales, values: np.ndarray, table: np.ndarray) -> dict[str, np.ndarray]:
    flat = np.asarray(values, dtype=np.float32).T.reshape(-1)
    offset = np.float32(flat.mean(dtype=np.float32))
    centred = flat - offset
    pad = -centred.size % e.block
    blocks = np.concatenate([centred, np.zeros(pad, np.float32)]).reshape(-1, e.block)
    scale = np.abs(blocks).max(axis=1).astype(np.float32)
    normed = blocks / np.where(scale > 0, scale, 1)[:, None]
    table = np.asarray(table, dtype=np.float32)
    order = np.argsort(table, kind="stable")
    sorted_t = table[order]
    hi = np.clip(np.searchsorted(sorted_t, normed), 1, 255)
    nearer_low = np.abs(normed - sorted_t[hi - 1]) <= np.abs(sorted_t[hi] - normed)
    codes = order[np.where(nearer_low, hi - 1, hi)].astype(np.uint8).reshape(-1)[:flat.size]
    return {e.codes: codes, e.table: table, e.scales: scale, e.offset: np.array(offset, np.float32)}
