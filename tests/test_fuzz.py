"""Fuzz tests (hypothesis), issue 13: whatever a user writes in a spec file, and whatever a
loaded checkpoint holds, marlin-dsl either raises one of its own errors naming the spec line
or the array, or gives the reference's answer. Nothing else: no foreign exception, no silent
wrong result."""
from __future__ import annotations

import itertools
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import marlin_dsl as md
from marlin_dsl.errors import MarlinDSLError, ShapeError, ValueRangeError
from marlin_dsl.formats.scaling import GroupAffine
from marlin_dsl.layers.validate import validate_mx
from marlin_dsl.layers.mlx_ops import packed_to_mx
from marlin_dsl.nn import MarlinLinear
from marlin_dsl.spec import load_spec
from marlin_dsl.checks.format_check import sample_weights, verify_format

from format_catalogue import catalogue, encode, validation_outcome

_FILES = itertools.count()

# ----- spec files ----------------------------------------------------------------------------------

_WILD = st.one_of(st.integers(-3, 300), st.sampled_from(["'x'", "None", "1.5", "True", "'K'"]))


def _or_wild(plausible: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly values a user would write, sometimes anything at all."""
    return st.one_of(*[plausible] * 9, _WILD).map(str)


@st.composite
def encodings(draw) -> str:
    kind = draw(st.sampled_from(["float", "int", "table"]))
    bits = draw(st.integers(2, 8))
    if kind == "float":
        exp = draw(st.integers(1, bits - 1))
        args = [f"bits={draw(_or_wild(st.just(bits)))}", f"exp_bits={draw(_or_wild(st.just(exp)))}",
                f"man_bits={draw(_or_wild(st.just(bits - 1 - exp)))}",
                f"bias={draw(_or_wild(st.integers(0, 2 ** (exp - 1))))}",
                f"specials={draw(st.sampled_from(['none', 'none', 'fn', 'ieee', 'nan']))!r}"]
        return f"FloatEncoding({', '.join(args)})"
    if kind == "int":
        return f"IntEncoding({draw(_or_wild(st.just(bits)))}, offset={draw(_or_wild(st.integers(0, 2 ** bits - 1)))})"
    bits = min(bits, 5)
    count = draw(st.one_of(st.just(1 << bits), st.just(1 << bits), st.integers(0, 40)))
    values = draw(st.lists(st.one_of(st.floats(-4, 4, allow_nan=False), st.just(0.0)),
                           min_size=count, max_size=count))
    return f"TableEncoding(bits={bits}, values={tuple(values)!r})"


@st.composite
def formats(draw, name: str) -> str:
    group = draw(_or_wild(st.sampled_from(["32", "64", "128", "256", "PER_COLUMN"])))
    dtype = draw(st.sampled_from(["f16", "f16", "bf16", "f32", "e8m0", "e4m3", "f8"]))
    scale = f"GroupScale({group}, dtype={dtype!r})"
    extras = []
    if draw(st.booleans()):
        extras.append(f"zero_point=ZeroPoint({draw(st.sampled_from(['u8', 'u8', 'f16', 'i4']))!r})")
    elif draw(st.booleans()):
        extras.append(f"bias=GroupBias({draw(st.sampled_from(['f16', 'bf16', 'f32', 'u8']))!r})")
    sparse = draw(st.sampled_from(["none", "none", "nm", "block"]))
    if sparse == "nm":
        extras.append(f"sparsity=NMSparsity({draw(_or_wild(st.sampled_from([1, 2, 3])))}, "
                      f"{draw(_or_wild(st.sampled_from([4, 8])))})")
    elif sparse == "block":
        extras.append(f"sparsity=BlockPatternSparsity(block_k={draw(_or_wild(st.sampled_from([4, 8])))}, "
                      f"block_n={draw(_or_wild(st.sampled_from([16, 32])))})")
    if draw(st.booleans()):
        extras.append(f"packing=Packing(word_bits={draw(st.sampled_from([8, 16, 32, 32, 12, 64]))})")
    return f"{name} = Format({name!r}, {draw(encodings())}, {scale}{''.join(', ' + e for e in extras)})"


HEADER = ("from marlin_dsl import (BlockPatternSparsity, FloatEncoding, Format, GroupBias, GroupScale,\n"
          "    IntEncoding, NMSparsity, Packing, TableEncoding, ZeroPoint)\n"
          "from marlin_dsl.formats import PER_COLUMN\n")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 2), min_size=1, max_size=3).flatmap(
    lambda ns: st.tuples(*[formats(f"f{i}") for i in range(len(ns))])))
def test_spec_files_load_with_a_located_error_or_verify(tmp_path_factory, lines) -> None:
    path = tmp_path_factory.mktemp("fuzz") / f"spec_{next(_FILES)}.py"
    path.write_text(HEADER + "\n".join(lines) + "\n")
    try:
        spec = load_spec(path)
    except MarlinDSLError as err:
        assert err.location is not None and Path(err.location.file) == path, repr(err)
        assert 1 <= err.location.line <= 3 + len(lines), repr(err)
        return
    rng = np.random.default_rng(0)
    for fmt in spec.formats:
        check = verify_format(fmt, rng)  # pack, reload, compare with the float64 reference
        assert check.ok, (fmt, check.checks)


# ----- packed arrays -------------------------------------------------------------------------------

#: Every format a checkpoint can be in (tests/format_catalogue.py): the built-in ones, the
#: examples', MLX's modes (affine 2-8 bits x groups x f16/bf16/f32, mxfp4, nvfp4, mxfp8) and
#: declared ones completing the parameter storage types x sign rules.
CATALOGUE = catalogue()
#: By kind (builtin, example, mlx, declared), drawn kind first: MLX's 57 modes do not crowd out
#: the others.
FORMATS: dict[str, list[str]] = {}
for _name in sorted(CATALOGUE):
    FORMATS.setdefault(_name.split("-")[0], []).append(_name)
#: Values written into a parameter array, in its storage type (`encode`; one it cannot hold is
#: a random code instead): the corruptions of tests/test_validators_agree.py and some large and
#: small finite ones.
_SPECIALS = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, -1.0, -1.5, 1e30, 65504.0, 6e-8, 1e-40]


@st.composite
def corruptions(draw):
    fmt = CATALOGUE[draw(st.sampled_from(FORMATS[draw(st.sampled_from(sorted(FORMATS)))]))]
    seed = draw(st.integers(0, 2**16))
    k, n = 256, draw(st.sampled_from([16, 40]))
    packed = md.pack(fmt, sample_weights(fmt, k, n, np.random.default_rng(seed)))
    arrays = {name: a.copy() for name, a in packed.arrays.items()}
    storage = fmt.parameters()
    # Parameter arrays (scales, biases, zero points, sub-scales) as often as all others.
    name = draw(st.sampled_from(sorted(storage)) if draw(st.booleans()) else st.sampled_from(sorted(arrays)))
    a = arrays[name]
    how = draw(st.sampled_from(["value", "bits", "shape", "dtype"]))
    if how == "shape":
        arrays[name] = a[: max(1, a.shape[0] - 1)] if a.shape[0] > 1 else np.concatenate([a, a])
    elif how == "dtype":
        arrays[name] = a.astype(np.float32 if a.dtype.kind in "ui" else np.int32)
    else:
        index = tuple(draw(st.integers(0, d - 1)) for d in a.shape)
        element = encode(storage[name], draw(st.sampled_from(_SPECIALS))) if name in storage else None
        if how == "value" and element is not None:
            a[index] = element
        elif how == "bits" or a.dtype.kind in "ui":
            a.view(np.uint8).reshape(-1)[draw(st.integers(0, a.nbytes - 1))] = draw(st.integers(0, 255))
    return md.PackedWeights(fmt, (k, n), arrays)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corruptions())
def test_packed_arrays_are_refused_by_name_or_match_the_reference(packed) -> None:
    numpy_says = validation_outcome(lambda: md.validate(packed))
    names = sorted(packed.arrays)
    if numpy_says is not None:
        assert any(name in numpy_says for name in names) or "arrays" in numpy_says, numpy_says
    # MLX arrays (checkpoints loaded with MLX) get the same verdict with the same message.
    try:
        as_mx = packed_to_mx(packed.arrays, packed.format)
    except (ShapeError, ValueRangeError) as err:  # a dtype MLX arrays cannot carry
        assert numpy_says is not None, err
        return
    mlx_says = validation_outcome(lambda: validate_mx(packed.format, packed.shape, as_mx))
    if numpy_says is None or numpy_says.startswith("ValueRangeError"):
        assert mlx_says == numpy_says  # value checks: the numpy message, word for word
    else:  # shape and dtype: the same kind of error, naming the same array
        assert mlx_says is not None and mlx_says.split(":")[0] == numpy_says.split(":")[0], (mlx_says, numpy_says)
        assert any(f"{name}" in mlx_says for name in names if name in numpy_says), (mlx_says, numpy_says)
    if numpy_says is not None:
        return
    # Accepted: the layer computes x @ dequantize(packed), finite where the weights are.
    w = md.dequantize(packed)
    assert np.isfinite(w).all()
    layer = MarlinLinear.from_packed(packed, backend="mlx")
    x = np.random.default_rng(1).standard_normal((3, packed.shape[0])).astype(np.float32)
    y = np.array(layer(mx.array(x)), dtype=np.float64)
    x64 = x.astype(np.float64)
    ref = x64 @ w
    slack = _mlx_affine_rounding(packed, w)
    if slack is None or (np.abs(x64) @ np.abs(w)).max() > np.finfo(np.float32).max / 4:
        return  # weights beyond what the layer's float type holds (fuzzed bits: 3e38 scales)
    tolerance = 1e-4 * max(np.linalg.norm(ref), 1e-30) + np.linalg.norm(np.abs(x64) @ slack)
    assert np.linalg.norm(y - ref) <= tolerance, (np.linalg.norm(y - ref), tolerance)


#: unit roundoff, smallest subnormal and largest value of the types MLX's affine arithmetic uses
_ROUNDING = {"f16": (2.0**-11, 2.0**-24, 65504.0), "bf16": (2.0**-8, 2.0**-133, 3.389e38),
             "f32": (2.0**-24, 2.0**-149, 3.402e38)}


def _mlx_affine_rounding(packed: md.PackedWeights, w: np.ndarray) -> np.ndarray | None:
    """How far the layer's weights may be from the float64 reference `w`, per element: 0,
    except for formats whose biases share their scales' type T (MLX's affine mode), where the
    layer follows MLX's own arithmetic (layers/mlx_ops.py): t * s rounded to T, then + b
    rounded to T, |error| <= u * (2 |t s| + |b|) (u: T's unit roundoff; t is exact in T),
    plus T's smallest subnormal per rounding. None where t * s or t * s + b pass T's largest
    value: MLX's arithmetic overflows there, as MLX's own layer would."""
    scaling = packed.format.scaling
    if not isinstance(scaling, GroupAffine) or scaling.bias is None or scaling.bias.dtype != scaling.scale.dtype:
        return np.zeros_like(w)
    u, tiny, top = _ROUNDING[scaling.bias.dtype]
    g = packed.format.group_size_for(packed.shape[0])
    b = np.repeat(scaling.bias.storage.to_float64(packed["biases"]), g, axis=0)
    ts = w - b
    if max(np.abs(ts).max(), np.abs(w).max()) * (1 + 4 * u) >= top:
        return None
    return u * (2 * np.abs(ts) + np.abs(b)) * (1 + 4 * u) + 2 * tiny
