"""The `Scaling` interface: one class per scale scheme, owning everything about its parameters.

A weight is codes plus the parameters of its scale scheme. Every scheme reduces, per K group
and output column, to an affine map of the decoded table value t,

    value = (t - zero) * scale + bias        (zero and bias optional)

but what is *stored* (which arrays, their number types, shapes, how quantisation picks them,
how a kernel loads and combines them) is the scheme's own. A scheme implements, once:

- `arrays()`: its parameter arrays (name, `StorageType`, per group [K/G, N] or per output
  column [1, N], SSA hint), in buffer order; `Format.buffers` and the kernels' buffer lists
  derive from it;
- `check(fmt)`: what it needs of the format's encoding;
- `choose(...)`: quantisation, the stored arrays and the float64 affine the codes round with;
- `affine(params)`: the (scale, zero, bias) of decoded parameter arrays, for the float64
  reference (`apply_f64`), the MLX-op dequantisation and the checks; numpy or MLX arrays;
- `emit_load` / `emit_apply`: the in-kernel load of one (group, column)'s parameters and
  their application to a decoded value. The group of a K position is `emit_group`, the one
  place a kernel computes it (`Grouping` is the host-side twin);
- `text_kind` / `text_attrs`: its line in the textual form (`scale <kind>(...)`).

The lowering (`lowering/group_params.py`) and the printers know no scheme: a new one is a
module in this package and an entry in `SCALE_SCHEMES` (`__init__.py`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal, NamedTuple, Protocol, Sequence

import numpy as np

from ...ir.types import BF16, F32, U32, ScalarType, VectorType
from ..storage import StorageType
from .parts import PER_COLUMN, Grouping

if TYPE_CHECKING:
    from ...errors import SourceLocation
    from ...ir.builder import Builder
    from ...ir.core import Value
    from ..encodings import Encoding


class ScaledFormat(Protocol):
    """What a scheme reads of the format it scales (a `Format` is one): the element encoding
    whose codes it scales, and the name and declaration site that its errors cite. A protocol,
    so that the schemes do not import `formats/format.py`, which builds its scheme from them."""

    @property
    def name(self) -> str: ...

    @property
    def element(self) -> Encoding: ...

    @property
    def location(self) -> SourceLocation | None: ...


@dataclass(frozen=True)
class ParamArray:
    """One stored parameter array of a scheme."""

    name: str
    storage: StorageType
    role: str
    hint: str  # SSA name hint of its in-kernel load
    per_group: bool = True  # [K/G, N]; False: one value per output column, [1, N]
    #: validation of loaded values: "positive" (> 0), "non_negative" (>= 0: a 0 is the
    #: declared encoding of an all-zero group, `GroupScale.zero`) or "any"
    sign: Literal["positive", "non_negative", "any"] = "positive"
    #: per-group arrays: one row per this many groups (a super-block's parameters, [K/S, N])
    super_groups: int = 1

    def rows(self, scaling: Grouping, k: int) -> int:
        return scaling.groups(k) // self.super_groups if self.per_group else 1

    def row_of(self, group: int) -> int:
        """The row holding group `group`'s parameter."""
        return group // self.super_groups if self.per_group else 0

    def sign_ok(self, values: Any) -> Any:
        """Elementwise: the decoded `values` (numpy or MLX) have the sign `sign` admits; None
        for "any" (nothing to check). The one definition both validators use."""
        if self.sign == "any":
            return None
        return values > 0 if self.sign == "positive" else values >= 0


class Affine(NamedTuple):
    """(scale, zero, bias) of a group, as arrays that broadcast against [groups, N]."""

    scale: Any
    zero: Any = None
    bias: Any = None


@dataclass
class GroupChoice:
    """What quantisation chose per group: the stored arrays by name (in their storage types)
    and the exact float64 values the codes are rounded with: the scale, the zero point (for
    `affine` rounding) or the bias, and the table's finite range (lo, hi)."""

    stored: dict[str, np.ndarray]
    scale: np.ndarray
    zero: np.ndarray | None
    bias: np.ndarray | None
    table_range: tuple[float, float]


class Scaling(Grouping):
    """Base class of scale schemes (see the module docstring). Subclasses are frozen
    dataclasses with a `group_size` and a `location`."""

    #: the kind name in the textual form, `scale <text_kind>(...)`
    text_kind: ClassVar[str]
    #: (attribute in the text, dataclass field, value kind: "int", "ident" or "group_size")
    text_attrs: ClassVar[tuple[tuple[str, str, str], ...]]

    # ----- description ---------------------------------------------------------------------

    def arrays(self) -> tuple[ParamArray, ...]:
        raise NotImplementedError

    def check(self, fmt: ScaledFormat) -> None:
        """Raise FormatError where the format's other parts do not suit this scheme."""

    def describe_parts(self) -> list[str]:
        """Words for `Format.describe` after "group G"."""
        return []

    # ----- host side -----------------------------------------------------------------------

    def choose(self, fmt: ScaledFormat, group_max: np.ndarray, group_min: np.ndarray,
               weights: Callable[[], np.ndarray]) -> GroupChoice:
        """The parameters for groups with these float64 extremes [K/G, N]. `weights()` gives
        the [K, N] weights, only to name an offending element in an error."""
        raise NotImplementedError

    def affine(self, params: dict[str, Any]) -> Affine:
        """(scale, zero, bias) from the decoded value of each array ([rows, N] or a row [N]
        of each, numpy or MLX)."""
        raise NotImplementedError

    def apply_f64(self, out: np.ndarray, params: dict[str, np.ndarray]) -> None:
        """out (decoded table values, float64) becomes the weight values, in place:
        (t - zero) * scale + bias, in that order, element by element."""
        a = self.affine(params)
        if a.zero is not None:
            np.subtract(out, a.zero, out=out)
        np.multiply(out, a.scale, out=out)
        if a.bias is not None:
            np.add(out, a.bias, out=out)

    # ----- in a kernel ---------------------------------------------------------------------

    def exact_in_f16(self) -> bool:
        """True when applying the parameters to an f16-exact table value in f16 rounds at most
        where the reference's own arithmetic does (group_params.compute_type)."""
        return False

    def emit_group(self, b: Builder, dense_k: Value) -> Value:
        """The group index of dense K position `dense_k`: every lowering asks this."""
        if self.group_size == PER_COLUMN:
            return b.const(0)
        return b.binary("div", dense_k, int(self.group_size), hint="grp")

    def emit_load(self, b: Builder, group: Value, col: Value, n_cols: Value, pred: Value | None,
                  ctype: ScalarType, prefix: str = "") -> tuple[Value, ...]:
        """The parameters of (group, column) in the compute type, 0 where `pred` is false (None:
        the caller knows (group, column) exists), as the values `emit_apply` takes (carried
        through loops as they are)."""
        raise NotImplementedError

    def loaded_values(self) -> int:
        """How many values `emit_load` returns (the loops that carry them need to know)."""
        return len(self.arrays())

    def emit_apply(self, b: Builder, t: Value, params: Sequence[Value], lanes: int = 1) -> Value:
        """The weight value of a decoded table value t (a vector of `lanes` values of one
        group when lanes > 1), in the compute type."""
        raise NotImplementedError

    def plain_scale_bits(self) -> int | None:
        """When a weight is table value * scale and nothing else (no zero point, no bias,
        one stored scale): the most significant bits a scale has (`StorageType.
        significant_bits`); else None. The bf16 pair decode rounds t * scale once through it
        (lowering/pair_decode.py)."""
        return None

    def scale_factors_out(self) -> bool:
        """True when a weight is (t - zero) * scale with one scale per (group, column) and
        nothing added after: then sum_k x_k w_k over a group is scale * sum_k x_k (t_k - zero),
        and a kernel may multiply the MMA's partial sums of a group by the scale once instead
        of every weight (`emit_unscaled`, `emit_scale`)."""
        return False

    def bias_factors_out(self) -> bool:
        """True when a weight is (t - zero) * scale + bias with one scale and one bias per
        (group, column): a group's sum_k x_k w_k is then scale * sum_k x_k (t_k - zero) + bias *
        sum_k x_k, and a kernel may apply both to the MMA's sums (`emit_scale`, `emit_bias`)."""
        return False

    def emit_bias(self, b: Builder, params: Sequence[Value]) -> Value:
        """The group's bias (in the loaded compute type) when `bias_factors_out`."""
        raise NotImplementedError(f"{type(self).__name__}: the bias does not factor out")

    def emit_zero(self, params: Sequence[Value]) -> Value | None:
        """The zero point subtracted before `emit_scale`'s factor (None: there is none), when
        `scale_factors_out`."""
        raise NotImplementedError(f"{type(self).__name__}: the scale does not factor out")

    def emit_scale(self, b: Builder, params: Sequence[Value]) -> Value:
        """The group's scale (in the loaded compute type) when `scale_factors_out`."""
        raise NotImplementedError(f"{type(self).__name__}: the scale does not factor out")


# ----- helpers for schemes' kernels ------------------------------------------------------------

def parameter_table_name(prefix: str, name: str) -> str:
    """The constant table of a parameter array stored as 8-bit codes (E8M0, E4M3)."""
    return f"{prefix}{name}_values"


def flat_index(b: Builder, group: Value, col: Value, n_cols: Value) -> Value:
    """group * N + col: the element of a per-group [K/G, N] array."""
    return b.binary("add", b.binary("mul", group, n_cols, hint="gi"), col, hint="gi")


def load_param(b: Builder, array: ParamArray, index: Value, pred: Value | None, ctype: ScalarType,
               prefix: str) -> Value:
    """One parameter in the compute type: loaded in its kernel type, decoded through its value
    table when stored as a code, converted."""
    storage = array.storage
    value = b.load(array.name, index, ScalarType(storage.kernel_type), pred, hint=array.hint)
    if storage.table is not None:
        code = b.cast(value, U32, hint=array.hint)
        value = b.value("table", [code], F32, {"name": parameter_table_name(prefix, array.name)},
                        hint=array.hint)
    return value if value.type == ctype else b.cast(value, ctype, hint=array.hint)


def splat(b: Builder, x: Value, lanes: int) -> Value:
    """x repeated in a vector of `lanes` (1: x itself)."""
    if lanes == 1:
        return x
    return b.value("vec", [x] * lanes, VectorType(x.type, lanes), hint="v2")  # type: ignore[arg-type]


def apply_affine(b: Builder, t: Value, scale: Value, zero: Value | None = None,
                 bias: Value | None = None, lanes: int = 1) -> Value:
    """(t - zero) * scale + bias in IR, each parameter splatted just before its use."""
    suffix = "2" if lanes > 1 else ""
    if zero is not None:
        t = b.binary("sub", t, splat(b, zero, lanes), hint="t" + suffix)
    if lanes > 1 and scale.type == F32 and t.type == VectorType(BF16, lanes):
        v = mul_rounded_once(b, t, scale, lanes)
    else:
        v = b.binary("mul", t, splat(b, scale, lanes), hint="w" + suffix)
    if bias is not None:
        v = b.binary("add", v, splat(b, bias, lanes), hint="w" + suffix)
    return v


def mul_rounded_once(b: Builder, t: Value, scale: Value, lanes: int) -> Value:
    """A vector of bf16 values times an f32 scale, rounded once to bf16 (as the f32 product
    rounded to bf16 is), in bf16 pair arithmetic: scale = hi + lo with hi = bf16(scale) and
    lo = bf16(scale - hi), both exact while the scale has at most 16 significant bits; t * lo
    is exact when t's and lo's significands together fit bf16's 8 bits (the caller checks:
    `Scaling.plain_scale_bits`, lowering/pair_decode.py), and fma(t, hi, t * lo) rounds
    t * hi + t * lo = t * scale once."""
    hi = b.cast(scale, BF16, hint="sh")
    lo = b.cast(b.binary("sub", scale, b.cast(hi, F32, hint="sh"), hint="sl"), BF16, hint="sl")
    low = b.binary("mul", t, splat(b, lo, lanes), hint="wl")
    return b.value("fma", [t, splat(b, hi, lanes), low], t.type, hint="w2")
