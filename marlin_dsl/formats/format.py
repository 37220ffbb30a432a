"""The weight format: one declarative description from which everything else is derived.

A `Format` combines an element encoding, the packing of codes into words, per-group scales,
optional zero points and optional sparsity. From it `formats.ops` derives quantising,
pruning, packing, unpacking, reference dequantisation and validation, and later issues derive
the in-kernel decode. Nothing in the library branches on a format's *name*.

Weights are [K, N]: K is the reduction axis (input features), N the output columns.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import gcd, lcm
from typing import Union

import numpy as np

from ..errors import FormatError, ShapeError, SourceLocation
from ..source import caller_location, record_declaration
from .bitstream import WORD_DTYPES, fields_per_group
from .encodings import Encoding
from .scaling import PER_COLUMN, GroupAffine, GroupBias, GroupScale, Scaling, ZeroPoint
from .sparsity import BlockPatternSparsity, NMSparsity
from .storage import StorageType

Sparsity = Union[NMSparsity, BlockPatternSparsity]

#: Element names of the unsigned word arrays (codes, metadata, patterns).
_WORD_ELEMS = {np.dtype(np.uint8): "u8", np.dtype(np.uint16): "u16", np.dtype(np.uint32): "u32"}


@dataclass(frozen=True)
class Packing:
    """Codes are packed along K into `word_bits`-bit words, LSB first, as a bit stream."""

    word_bits: int = 32
    location: SourceLocation | None = field(default=None, compare=False, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        if self.location is None:
            object.__setattr__(self, "location", caller_location())
        if self.word_bits not in WORD_DTYPES:
            raise FormatError(
                f"Packing: word_bits must be one of {sorted(WORD_DTYPES)}, got {self.word_bits!r}",
                self.location,
            )

    @property
    def numpy_dtype(self) -> np.dtype:
        return np.dtype(WORD_DTYPES[self.word_bits])


@dataclass(frozen=True)
class BufferSpec:
    """One array of a packed weight: its name, shape, numpy dtype, what it holds, and the
    number type it holds (a `StorageType` name for parameters, else the word type), which
    says how MLX holds it (bf16 parameters are uint16 bits in numpy, bfloat16 in MLX)."""

    name: str
    shape: tuple[int, int]
    dtype: np.dtype
    role: str
    elem: str = ""

    def __post_init__(self) -> None:
        if not self.elem:
            object.__setattr__(self, "elem", _WORD_ELEMS[np.dtype(self.dtype)])

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize


@dataclass(frozen=True)
class Format:
    """A weight format, declared as data.

    value = (table[code] - zero) * scale + bias per group, 0.0 where an N:M format stores
    nothing. `scale` is a `GroupScale` (with the optional `zero_point` and the keyword-only
    `bias`, MLX's affine mode) or another scale scheme (`TwoLevelScale`); `scaling` is the
    scheme either way (formats/scaling/), which owns the parameter arrays.
    """

    name: str
    element: Encoding
    scale: GroupScale | Scaling = field(default_factory=GroupScale)
    zero_point: ZeroPoint | None = None
    sparsity: Sparsity | None = None
    packing: Packing = field(default_factory=Packing)
    doc: str = ""
    bias: GroupBias | None = field(default=None, kw_only=True)
    location: SourceLocation | None = field(default=None, compare=False, repr=False, kw_only=True)
    #: the scale scheme (derived from scale, zero_point and bias)
    scaling: Scaling = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.location is None:
            object.__setattr__(self, "location", caller_location())
        where = self.location
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise FormatError(f"Format name must be an identifier, got {self.name!r}", where)
        if isinstance(self.scale, Scaling):
            if isinstance(self.scale, GroupAffine):
                raise FormatError(f"format {self.name!r}: give a GroupAffine's parts (GroupScale, "
                                  f"ZeroPoint, GroupBias) to Format", where)
            if self.zero_point is not None or self.bias is not None:
                raise FormatError(
                    f"format {self.name!r}: a {type(self.scale).__name__} owns its parameters; "
                    f"declare no zero_point or bias beside it", where)
            object.__setattr__(self, "scaling", self.scale)
        checks = [("element", Encoding), ("packing", Packing)]
        if not isinstance(self.scale, Scaling):
            checks.insert(1, ("scale", GroupScale))
        for attr, cls in checks:
            if not isinstance(getattr(self, attr), cls):
                raise FormatError(
                    f"format {self.name!r}: {attr} must be a {cls.__name__}, "
                    f"got {type(getattr(self, attr)).__name__}",
                    where,
                )
        if self.zero_point is not None and not isinstance(self.zero_point, ZeroPoint):
            raise FormatError(f"format {self.name!r}: zero_point must be a ZeroPoint or None", where)
        if self.bias is not None and not isinstance(self.bias, GroupBias):
            raise FormatError(f"format {self.name!r}: bias must be a GroupBias or None", where)
        if self.sparsity is not None and not isinstance(self.sparsity, (NMSparsity, BlockPatternSparsity)):
            raise FormatError(
                f"format {self.name!r}: sparsity must be NMSparsity, BlockPatternSparsity or None",
                where,
            )
        if isinstance(self.scale, GroupScale):
            object.__setattr__(self, "scaling", GroupAffine(self.scale, self.zero_point, self.bias,
                                                            location=self.scale.location))
        self.scaling.check(self)
        if self.element.bits > self.packing.word_bits:
            raise FormatError(f"format {self.name!r}: codes wider than a packing word", where)
        if isinstance(self.sparsity, NMSparsity) and self.sparsity.meta_bits > self.packing.word_bits:
            raise FormatError(
                f"format {self.name!r}: {self.sparsity.describe()} metadata fields of "
                f"{self.sparsity.meta_bits} bits are wider than a {self.packing.word_bits}-bit "
                f"packing word",
                self.sparsity.location or where,
            )
        g = self.scale.group_size
        if g != PER_COLUMN and g % self.k_granule != 0:
            raise FormatError(
                f"format {self.name!r}: group_size {g} must be a multiple of the format's "
                f"K granule {self.k_granule} (the K positions one packed word group covers)",
                self.scale.location or where,
            )
        record_declaration(self)

    # ----- derived layout -------------------------------------------------------------

    @property
    def values_per_word_group(self) -> int:
        """Stored (compressed) codes that fill a whole number of packing words."""
        return fields_per_group(self.element.bits, self.packing.word_bits)

    @property
    def k_granule(self) -> int:
        """The smallest K step at which every array of the format holds whole words."""
        per_group = self.values_per_word_group
        sp = self.sparsity
        if isinstance(sp, NMSparsity):
            kept = sp.kept_per_block
            blocks_for_values = per_group // gcd(per_group, kept)
            blocks_for_meta = fields_per_group(sp.meta_bits, self.packing.word_bits)
            return sp.block_k * lcm(blocks_for_values, blocks_for_meta)
        if isinstance(sp, BlockPatternSparsity):
            return lcm(per_group, sp.block_k)
        return per_group

    @property
    def k_multiple(self) -> int:
        """K must be a multiple of this: the K granule, the scale group and the scheme's
        super-block (`Scaling.k_step`), where there are."""
        steps = [self.k_granule] + [int(s) for s in (self.scale.group_size, self.scaling.k_step())
                                    if s != PER_COLUMN]
        return lcm(*steps)

    def group_size_for(self, k: int) -> int:
        return self.scale.size_for(k)

    def stored_k(self, k: int) -> int:
        """Number of codes stored per column along K (fewer than K for N:M sparsity)."""
        if isinstance(self.sparsity, NMSparsity):
            return k // self.sparsity.block_k * self.sparsity.kept_per_block
        return k

    def check_shape(self, k: int, n: int, argument: str = "weights") -> None:
        """Raise ShapeError unless a [K, N] weight fits this format."""
        if k < 1 or n < 1:
            raise ShapeError(f"{argument}: shape [K={k}, N={n}] must be non-empty")
        if k % self.k_granule:
            raise ShapeError(
                f"{argument}: K={k} is not a multiple of format {self.name!r}'s K granule "
                f"{self.k_granule}"
            )
        g = self.scale.group_size
        if g != PER_COLUMN and k % g:
            raise ShapeError(
                f"{argument}: group_size {g} of format {self.name!r} does not divide K={k}"
            )
        step = self.scaling.k_step()
        if step != g and k % int(step):
            raise ShapeError(
                f"{argument}: K={k} is not a multiple of format {self.name!r}'s super-block of "
                f"{step} K positions")

    def buffers(self, k: int, n: int) -> list[BufferSpec]:
        """The arrays a packed [K, N] weight consists of, in a fixed order."""
        self.check_shape(k, n)
        word = self.packing.word_bits
        specs = [
            BufferSpec("qweight", (self.stored_k(k) * self.element.bits // word, n),
                       self.packing.numpy_dtype, "packed element codes along K"),
        ]
        for a in self.scaling.arrays():
            specs.append(BufferSpec(a.name, (a.rows(self.scaling, k), n), a.storage.numpy_dtype,
                                    a.role, a.storage.name))
        sp = self.sparsity
        if isinstance(sp, NMSparsity):
            blocks = k // sp.block_k
            specs.append(BufferSpec("meta", (blocks * sp.meta_bits // word, n),
                                    self.packing.numpy_dtype, f"{sp.n}:{sp.m} metadata"))
        elif isinstance(sp, BlockPatternSparsity):
            specs.append(BufferSpec("patterns", (k // sp.block_k, -(-n // sp.block_n)),
                                    np.dtype(np.uint8), "block OR patterns"))
        return specs

    def parameters(self) -> dict[str, StorageType]:
        """The parameter arrays of this format's scale scheme ("scales", then "zeros" or
        "biases" where declared, for a GroupScale) and their number types, in buffer order."""
        return {a.name: a.storage for a in self.scaling.arrays()}

    def storage_bytes(self, k: int, n: int, include_scales: bool = True) -> int:
        """Bytes of the packed weight; without scales and zero points if asked."""
        skip = set() if include_scales else set(self.parameters())
        return sum(b.nbytes for b in self.buffers(k, n) if b.name not in skip)

    def bits_per_weight(self, k: int, n: int, include_scales: bool = True) -> float:
        return self.storage_bytes(k, n, include_scales) * 8 / (k * n)

    def describe(self) -> str:
        parts = [self.element.describe(), f"group {self.scale.group_size}",
                 *self.scaling.describe_parts()]
        if self.sparsity is not None:
            parts.append(self.sparsity.describe())
        return ", ".join(parts)
