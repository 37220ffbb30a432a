"""Every format a packed checkpoint can be in, and the corruptions of its float arrays, for the
tests that hold the two validators (numpy `marlin_dsl.validate`, MLX `validate_mx`) to one
verdict (tests/test_validators_agree.py, tests/test_fuzz.py).

The formats: the built-in ones, those the examples declare, the kernel formats of the
checkpoint catalogue (GGUF, GPTQ, AWQ, bitsandbytes), MLX's own quantised modes
(`mlx_format`: affine 2-8 bits x groups 32/64/128 x f16/bf16/f32 scales and biases; mxfp4,
nvfp4, mxfp8), and a few declared here so that every storage type of a parameter array
meets every sign rule (`ParamArray.sign`) at least once: f16 zero points, bf16/f32/E8M0/E4M3
scales without a bias, an f16 scale whose 0 is an all-zero group, two-level scales with f16
and bf16 column scales, a bias of another type than its scales, one scale per column.

A corruption is one stored element set to a special value, encoded in the array's storage
type (`stored`): NaN (both signs), +-inf, a negative value, +-0 and the smallest subnormal
of either sign. A value the storage cannot hold (an infinity in E4M3FN, any sign in E8M0, a
NaN in u8) is no corruption of that array. `expected` is the verdict `validate` documents.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import mlx.core as mx
import numpy as np

import marlin_dsl as md
from marlin_dsl.formats import PER_COLUMN, Format
from marlin_dsl.formats.scaling import ParamArray
from marlin_dsl.errors import ShapeError, ValueRangeError
from marlin_dsl.formats.storage import StorageType, bf16_bits
from marlin_dsl.layers.interop import mlx_format
from marlin_dsl.spec import load_spec

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

MLX_AFFINE_BITS = (2, 3, 4, 5, 6, 8)
MLX_GROUPS = (32, 64, 128)
MLX_DTYPES = {"f16": mx.float16, "bf16": mx.bfloat16, "f32": mx.float32}

E2M1 = md.FloatEncoding(bits=4, exp_bits=2, man_bits=1, bias=1)
UINT4 = md.IntEncoding(bits=4)
INT4 = md.IntEncoding(bits=4, offset=8)


def _declared() -> list[Format]:
    """Storage types and sign rules that no built-in, example or MLX format has."""
    return [
        md.Format("u4_f16zp", UINT4, md.GroupScale(32), md.ZeroPoint("f16")),
        md.Format("fp4_bf16s", E2M1, md.GroupScale(64, "bf16")),
        md.Format("fp4_f32s", E2M1, md.GroupScale(64, "f32")),
        md.Format("fp4_e8m0s", E2M1, md.GroupScale(32, "e8m0")),
        md.Format("fp4_e4m3s", E2M1, md.GroupScale(16, "e4m3")),
        md.Format("fp4_f16s_zero_ok", E2M1, md.GroupScale(64, zero="allowed")),
        md.Format("int4_2l_f16", INT4, md.TwoLevelScale(64, sub_dtype="u8", channel_dtype="f16")),
        md.Format("fp4_2l_bf16", E2M1, md.TwoLevelScale(32, sub_dtype="e8m0", channel_dtype="bf16")),
        md.Format("u4_bf16s_f32b", UINT4, md.GroupScale(64, "bf16"), bias=md.GroupBias("f32")),
        md.Format("int4_per_column", INT4, md.GroupScale(PER_COLUMN)),
    ]


@lru_cache(maxsize=None)
def catalogue() -> dict[str, Format]:
    """Every format by a test id: builtin-<name>, example-<name>, mlx-<mode>..., declared-<name>."""
    out = {f"builtin-{name}": md.builtin_format(name) for name in sorted(md.BUILTIN_FORMATS)}
    for path in sorted(EXAMPLES.glob("*.py")):
        for fmt in load_spec(path).formats:
            out[f"example-{fmt.name}"] = fmt
    for bits in MLX_AFFINE_BITS:
        for group in MLX_GROUPS:
            for dtype, mx_dtype in MLX_DTYPES.items():
                out[f"mlx-affine{bits}-g{group}-{dtype}"] = mlx_format("affine", bits, group, mx_dtype)
    out["mlx-mxfp4"] = mlx_format("mxfp4", 4, 32)
    out["mlx-nvfp4"] = mlx_format("nvfp4", 4, 16)
    out["mlx-mxfp8"] = mlx_format("mxfp8", 8, 32)
    for fmt in _declared():
        out[f"declared-{fmt.name}"] = fmt
    for cf in checkpoint_formats():
        out[f"checkpoint-{cf.name}"] = cf.format
    return out


def checkpoint_formats() -> list:
    """The kernel formats of the checkpoint catalogue (formats/checkpoint/catalog.py)."""
    from marlin_dsl.formats.checkpoint import GGUF_TYPES, awq, bnb, gguf_format, gptq

    return [*(gguf_format(t) for t in sorted(GGUF_TYPES)), gptq(4, 128, 1), gptq(8, 128, 1), gptq(4, 32, 2),
            awq(4, 128), bnb("nf4"), bnb("fp4")]


def validation_outcome(fn) -> str | None:
    """What a validator says: None when `fn()` accepts, else its error's type and message (the
    two validators must agree on both)."""
    try:
        fn()
    except (ShapeError, ValueRangeError) as err:
        return f"{type(err).__name__}: {err}"
    return None


def shape_for(fmt: Format) -> tuple[int, int]:
    """A small [K, N] the format holds with at least two groups (rows) where it has groups; N
    not a multiple of 32 (a partial column block of a block-pattern format)."""
    base = fmt.k_multiple
    return max(2 * base, 128 // base * base), 40


@lru_cache(maxsize=None)
def packed(name: str, seed: int = 0) -> md.PackedWeights:
    """The catalogue format `name` packed from random weights (cached: copy before changing)."""
    from marlin_dsl.checks.format_check import sample_weights

    fmt = catalogue()[name]
    k, n = shape_for(fmt)
    return md.pack(fmt, sample_weights(fmt, k, n, np.random.default_rng(seed)))


# ----- corruptions -------------------------------------------------------------------------------

#: name -> the value it stands for (float64); "-nan" is NaN with the sign bit set
CORRUPTIONS = {"nan": np.nan, "-nan": -np.nan, "+inf": np.inf, "-inf": -np.inf, "negative": -1.5,
               "zero": 0.0, "-zero": -0.0, "subnormal": "subnormal", "-subnormal": "-subnormal"}


def encode(storage: StorageType, value: float) -> np.generic | None:
    """The stored element (numpy) of `storage` that holds `value` exactly (NaN: a NaN of the
    same sign where the type has one), or None where it has none; f16/f32 values out of
    range become infinities, as a cast does."""
    if storage.name in ("f16", "f32"):
        with np.errstate(over="ignore", invalid="ignore"):
            return np.array(value).astype(storage.numpy_dtype)[()]
    if storage.name == "bf16":
        if np.isnan(value):
            return np.uint16(0xFFC0 if np.signbit(value) else 0x7FC0)
        with np.errstate(over="ignore"):
            return bf16_bits(np.array([value]))[0]
    if storage.is_code:  # E8M0, E4M3: the code of that value, if there is one
        table = storage.table
        if np.isnan(value):
            codes = list(np.flatnonzero(np.isnan(table)))
            codes = [c for c in codes if bool(c >> 7) == bool(np.signbit(value))] or codes
            return np.uint8(codes[0]) if codes else None
        match = np.flatnonzero((table == value) & (np.signbit(table) == np.signbit(value)))
        return np.uint8(match[0]) if match.size else None
    assert storage.name == "u8"
    ok = np.isfinite(value) and value == int(value) and 0 <= value <= 255 and not np.signbit(value)
    return np.uint8(value) if ok else None


#: the smallest positive subnormal of each storage type's bits (E8M0 has none, u8 no fractions)
_SUBNORMAL = {"f16": np.float16(np.finfo(np.float16).smallest_subnormal),
              "f32": np.float32(np.finfo(np.float32).smallest_subnormal),
              "bf16": np.uint16(0x0001), "e4m3": np.uint8(0x01)}


def stored(storage: StorageType, corruption: str) -> np.generic | None:
    """The stored element (numpy) of `storage` for a corruption, or None where that storage
    cannot hold it."""
    value = CORRUPTIONS[corruption]
    if isinstance(value, str):  # the smallest subnormal, with the sign bit for "-subnormal"
        tiny = _SUBNORMAL.get(storage.name)
        if tiny is None or not value.startswith("-"):
            return tiny
        bits = tiny.view(np.uint16 if tiny.itemsize == 2 else np.uint32 if tiny.itemsize == 4 else np.uint8)
        return (bits | type(bits)(1 << (8 * tiny.itemsize - 1))).view(tiny.dtype)
    return encode(storage, value)


def expected(array: ParamArray, storage: StorageType, element: np.generic) -> str | None:
    """What `validate` says of one stored element: None (accepted), "not finite" or the
    sign rule's refusal ("is not positive" / "is negative")."""
    value = float(storage.to_float64(np.asarray(element)))
    if not np.isfinite(value):
        return "is not finite"
    ok = array.sign_ok(np.array(value))
    if ok is None or bool(ok):
        return None
    return "is not positive" if array.sign == "positive" else "is negative"


def index_for(shape: tuple[int, int]) -> tuple[int, int]:
    """Not the first element (a validator must find it, not stop at [0, 0]): the last row, a
    column past the middle."""
    rows, cols = shape
    return rows - 1, min(cols - 1, cols // 2 + 3)


def corrupted_cases(name: str) -> list[tuple[str, str, tuple[int, int], md.PackedWeights, str | None]]:
    """(array, corruption, index, corrupted copy, expected verdict) of every parameter array of
    catalogue format `name` and every corruption its storage can hold."""
    base = packed(name)
    fmt = base.format
    out = []
    for array in fmt.scaling.arrays():
        storage = array.storage
        seen = set()
        for corruption in CORRUPTIONS:
            element = stored(storage, corruption)
            if element is None or element.tobytes() in seen:  # E8M0: "nan" and "-nan" are code 255
                continue
            seen.add(element.tobytes())
            arrays = {n: a.copy() for n, a in base.arrays.items()}
            index = index_for(arrays[array.name].shape)
            arrays[array.name][index] = element
            out.append((array.name, corruption, index, md.PackedWeights(fmt, base.shape, arrays),
                        expected(array, storage, element)))
    return out
