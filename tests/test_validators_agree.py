"""Issue 32, item 2: the two validators of loaded packed weights, numpy's `marlin_dsl.validate`
and MLX's `validate_mx` (checkpoints, `update`, `from_packed`, `from_quantized_linear`), give
one verdict on every corruption of every float parameter array of every format.

For each format of tests/format_catalogue.py (built-in, examples', MLX's modes, and declared
ones that complete the storage types x sign rules) and each parameter array (scales, biases,
zero points, two-level sub-scales and column scales), one element is set to NaN (either
sign), +-inf, a negative value, +-0 or the smallest subnormal of either sign, as far as its
storage type can hold it. Both validators then refuse it with the same ValueRangeError,
naming that array and index and saying what `validate` documents (not finite; not positive;
negative), or both accept it. A device check that tested `!isinf` instead of `isfinite`
would accept a NaN wherever no sign check catches it (biases, f16 zero points, the scales of
MLX's affine formats): caught here.

The whole product (about 90 formats, 1,200 corrupted arrays) takes under two seconds, so it
all runs by default; no sweep.
"""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl.formats.storage import STORAGE_TYPES
from marlin_dsl.layers.mlx_ops import packed_to_mx
from marlin_dsl.layers.validate import validate_mx
from marlin_dsl.nn import MarlinLinear

from format_catalogue import CORRUPTIONS, catalogue, corrupted_cases, stored, validation_outcome

NAMES = sorted(catalogue())


def test_the_catalogue_covers_every_storage_type_and_sign_rule() -> None:
    """Every storage type a parameter array can have meets every sign rule it can have (E8M0
    and E4M3 scales refused at 0 and, as MLX declares them, allowed to be 0; u8 zero points
    and sub-scales), and every built-in and example format is in."""
    pairs = {(a.storage.name, a.sign) for fmt in catalogue().values() for a in fmt.scaling.arrays()}
    assert {s for s, _ in pairs} == set(STORAGE_TYPES)
    for storage in ("f16", "bf16", "f32"):
        assert {(storage, sign) for sign in ("positive", "any")} <= pairs, storage
    assert {("f16", "non_negative"), ("e8m0", "positive"), ("e8m0", "non_negative"), ("e4m3", "positive"),
            ("e4m3", "non_negative"), ("u8", "positive"), ("u8", "any"), ("i8", "any")} <= pairs
    names = set(catalogue())
    assert {f"builtin-{n}" for n in md.BUILTIN_FORMATS} <= names
    assert len([n for n in names if n.startswith("example-")]) == 15
    assert len([n for n in names if n.startswith("mlx-affine")]) == 6 * 3 * 3


@pytest.mark.parametrize("name", NAMES)
def test_validators_agree_on_every_corrupted_parameter(name: str) -> None:
    cases = corrupted_cases(name)
    assert {array for array, *_ in cases} == set(catalogue()[name].parameters())
    wrong = []
    for array, corruption, index, packed, want in cases:
        numpy_says = validation_outcome(lambda: md.validate(packed))
        mlx_says = validation_outcome(lambda: validate_mx(packed.format, packed.shape, packed_to_mx(packed.arrays, packed.format)))
        where = f"ValueRangeError: {array}[{index[0]}, {index[1]}]"
        if want is None:
            ok = numpy_says is None and mlx_says is None
        else:  # refused by both, word for word, naming the array and index
            ok = mlx_says == numpy_says and numpy_says is not None and numpy_says.startswith(where) \
                and want in numpy_says
        if not ok:
            wrong.append(f"{array} {corruption} at {index}: expected {want or 'accepted'}; "
                         f"numpy: {numpy_says}; mlx: {mlx_says}")
    assert not wrong, f"{name}:\n" + "\n".join(wrong)


# ----- MLX's own quantised layers, corrupted as MLX holds them ----------------------------------

MODES = [("affine", 4, 64, mx.float16), ("affine", 3, 32, mx.bfloat16), ("affine", 8, 128, mx.float32),
         ("mxfp4", 4, 32, None), ("nvfp4", 4, 16, None), ("mxfp8", 8, 32, None)]


def _quantized(mode: str, bits: int, group: int, dtype) -> nn.QuantizedLinear:
    mx.random.seed(0)
    linear = nn.Linear(128, 24)
    if dtype is not None:
        linear.set_dtype(dtype)
    return nn.QuantizedLinear.from_linear(linear, group_size=group, bits=bits, mode=mode)


@pytest.mark.parametrize("mode, bits, group, dtype", MODES, ids=lambda v: str(v).rpartition(".")[2])
def test_corrupted_mlx_quantized_layers_are_refused_by_name(mode, bits, group, dtype) -> None:
    """An nn.QuantizedLinear's scales or biases ([N, K/G] as MLX holds them) with a NaN or an
    infinity where its type has one: `from_quantized_linear` refuses it naming the array at
    its index in our [K/G, N] layout, as `validate` of the same arrays does."""
    from marlin_dsl.layers.interop import packed_from_quantized

    for array in ("scales", "biases") if mode == "affine" else ("scales",):
        values = [np.nan, np.inf, -np.inf] if mode == "affine" else [None]
        for value in values:
            ql = _quantized(mode, bits, group, dtype)
            held = np.array(ql[array].astype(mx.float32) if ql[array].dtype == mx.bfloat16 else ql[array])
            row, col = held.shape[0] - 2, held.shape[1] - 1  # output feature, group
            if value is None:  # E8M0 code 255 (NaN), E4M3 code 0x7F (NaN)
                held[row, col] = 0x7F if mode == "nvfp4" else 0xFF
            else:
                held[row, col] = value
            ql[array] = mx.array(held).astype(ql[array].dtype)
            numpy_says = validation_outcome(lambda: md.validate(md.PackedWeights(
                packed_from_quantized(ql).format, (128, 24),
                {n: np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a)
                 for n, a in packed_from_quantized(ql).arrays.items()})))
            mlx_says = validation_outcome(lambda: MarlinLinear.from_quantized_linear(ql, backend="mlx"))
            assert mlx_says == numpy_says, (array, value, mlx_says, numpy_says)
            assert numpy_says is not None and numpy_says.startswith(
                f"ValueRangeError: {array}[{col}, {row}] is not finite"), numpy_says


def test_every_corruption_reaches_some_array() -> None:
    """No corruption is one that no storage type can hold (a typo in CORRUPTIONS)."""
    for corruption in CORRUPTIONS:
        assert any(stored(t, corruption) is not None for t in STORAGE_TYPES.values()), corruption
