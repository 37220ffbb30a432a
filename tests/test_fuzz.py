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
from marlin_dsl.layers.validate import validate_mx
from marlin_dsl.layers.mlx_ops import packed_to_mx
from marlin_dsl.nn import MarlinLinear
from marlin_dsl.spec import load_spec
from marlin_dsl.checks.format_check import sample_weights, verify_format

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

FORMATS = [md.builtin_format(n) for n in ("fp4", "uint4_zp", "nf4", "fp4_2of4", "fp4_blockpattern")]
_SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -1.0, 1e30, 65504.0, 6e-8]


@st.composite
def corruptions(draw):
    fmt = draw(st.sampled_from(FORMATS))
    seed = draw(st.integers(0, 2**16))
    k, n = 256, draw(st.sampled_from([16, 40]))
    packed = md.pack(fmt, sample_weights(fmt, k, n, np.random.default_rng(seed)))
    arrays = {name: a.copy() for name, a in packed.arrays.items()}
    name = draw(st.sampled_from(sorted(arrays)))
    a = arrays[name]
    how = draw(st.sampled_from(["value", "bits", "shape", "dtype"]))
    if how == "shape":
        arrays[name] = a[: max(1, a.shape[0] - 1)] if a.shape[0] > 1 else np.concatenate([a, a])
    elif how == "dtype":
        arrays[name] = a.astype(np.float32 if a.dtype.kind in "ui" else np.int32)
    else:
        index = tuple(draw(st.integers(0, d - 1)) for d in a.shape)
        if how == "bits" or a.dtype.kind in "ui":
            a.view(np.uint8).reshape(-1)[draw(st.integers(0, a.nbytes - 1))] = draw(st.integers(0, 255))
        else:
            with np.errstate(over="ignore"):
                a[index] = draw(st.sampled_from(_SPECIALS))
    return md.PackedWeights(fmt, (k, n), arrays)


def _outcome(fn) -> str | None:
    try:
        fn()
    except (ShapeError, ValueRangeError) as err:
        return f"{type(err).__name__}: {err}"
    return None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corruptions())
def test_packed_arrays_are_refused_by_name_or_match_the_reference(packed) -> None:
    numpy_says = _outcome(lambda: md.validate(packed))
    names = sorted(packed.arrays)
    if numpy_says is not None:
        assert any(name in numpy_says for name in names) or "arrays" in numpy_says, numpy_says
    # MLX arrays (checkpoints loaded with MLX) get the same verdict with the same message.
    try:
        as_mx = packed_to_mx(packed.arrays, packed.format)
    except (ShapeError, ValueRangeError) as err:  # a dtype MLX arrays cannot carry
        assert numpy_says is not None, err
        return
    mlx_says = _outcome(lambda: validate_mx(packed.format, packed.shape, as_mx))
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
    ref = x.astype(np.float64) @ w
    assert np.linalg.norm(y - ref) <= 1e-4 * max(np.linalg.norm(ref), 1e-30)
