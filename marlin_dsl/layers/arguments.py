"""What `quantized_linear` and `MarlinLinear` check in their arguments (activations, biases,
packed weights), and the packed weights put on the device once per PackedWeights object.
Kept apart from nn.py, which holds the layer itself."""
from __future__ import annotations

from typing import Literal

import mlx.core as mx
import numpy as np

from ..errors import MarlinDSLError, ShapeError, ValueRangeError
from ..formats import Format, PackedWeights, validate
from ..formats.builtin import BUILTIN_FORMATS, GroupSize, builtin_format
from .dispatch import LINEAR, check_activation, layout_for
from .mlx_ops import packed_to_mx
from .validate import validate_mx
from .weights import to_layout

#: The activation dtypes the layers take.
FLOAT_DTYPES = (mx.float16, mx.bfloat16, mx.float32)

#: The backends a layer may run on (marlin_dsl.nn.select_backend).
Backend = Literal["auto", "metal", "cuda", "mlx"]


def first_non_finite(a: mx.array) -> tuple[int, ...] | None:
    """Index of the first NaN/Inf in `a`, or None. Evaluates `a` (a sync)."""
    bad = mx.logical_not(mx.isfinite(a))
    if not bool(mx.any(bad).item()):
        return None
    flat = int(mx.argmax(bad.reshape(-1)).item())
    return tuple(int(i) for i in np.unravel_index(flat, a.shape)) if a.ndim else ()


def checked_activation(x: object, k: int, check_finite: bool) -> mx.array:
    check_activation(x, k)
    if check_finite and (bad := first_non_finite(x)) is not None:  # type: ignore[arg-type]
        raise ValueRangeError(f"x: non-finite value {x[bad].item()} at index {bad}")  # type: ignore[index]
    return x  # type: ignore[return-value]


def checked_bias(bias: object, n: int, dtype: mx.Dtype | None, check_finite: bool) -> mx.array:
    """A float [N] bias, cast to `dtype` (the activation's, so it cannot promote the result)."""
    if not isinstance(bias, mx.array):
        raise ShapeError(f"bias: expected an mlx.core.array [N={n}], got {type(bias).__name__}")
    if tuple(bias.shape) != (n,):
        raise ShapeError(f"bias: expected shape ({n},), got {tuple(bias.shape)}")
    if not mx.issubdtype(bias.dtype, mx.floating):
        raise ShapeError(f"bias: expected a floating-point array, got dtype {bias.dtype}")
    if check_finite and (bad := first_non_finite(bias)) is not None:
        raise ValueRangeError(f"bias: non-finite value {bias[bad].item()} at index {bad}")
    return bias if dtype is None else bias.astype(dtype)


def device_arrays(packed: object, backend: str, argument: str = "packed") -> tuple[PackedWeights, dict]:
    """(`packed`, its arrays in the layout `backend`'s kernels read). numpy arrays are validated
    and copied to the device; MLX arrays are validated on the device. Both happen once per
    PackedWeights object and set of arrays: the result is cached on the object, keyed by the
    identity of its arrays, so repeated calls with the same weight do no work."""
    if not isinstance(packed, PackedWeights):
        raise ShapeError(f"{argument}: expected marlin_dsl.PackedWeights, got {type(packed).__name__}")
    if packed.layout != LINEAR:
        raise ShapeError(f"{argument}: holds layout {packed.layout!r}; pass the format's linear "
                         f"layout (as marlin_dsl.pack writes it)")
    fmt, shape = packed.format, tuple(int(d) for d in packed.shape)
    key = (backend, tuple((name, id(a)) for name, a in packed.arrays.items()))
    cached = packed.device_cache.get("arrays")
    if cached is not None and cached[0] == key:
        return packed, cached[1]
    if all(isinstance(a, mx.array) for a in packed.arrays.values()):
        validate_mx(fmt, shape, packed.arrays, f"{argument}.arrays")
        linear = dict(packed.arrays)
    else:
        validate(packed)
        linear = packed_to_mx(packed.arrays, fmt)
    arrays = to_layout(fmt, shape, linear, layout_for(fmt, *shape, backend))
    packed.device_cache["arrays"] = (key, arrays)
    return packed, arrays


# ----- the result's dtype ---------------------------------------------------------------------
# nn.Linear computes x @ W.T (+ b) and MLX promotes: f16 x with an f32 weight gives f32 (and f16
# with bf16 gives f32). A MarlinLinear converted from such a layer records the source's dtype
# and casts x up the same way, so that it returns what the layer it replaces returned (an f32
# model fed f16 activations stays f32, and finite where f16 would overflow).

def promoted(*dtypes: mx.Dtype) -> mx.Dtype:
    """The dtype MLX gives arithmetic on arrays of these dtypes (no evaluation)."""
    out = mx.zeros((), dtypes[0])
    for dtype in dtypes[1:]:
        out = out + mx.zeros((), dtype)
    return out.dtype


def activation_casts(source_dtype: mx.Dtype | None) -> dict[mx.Dtype, mx.Dtype]:
    """{x's dtype: the dtype to cast x to} for the activation dtypes that a layer whose weight
    (and bias) promote to `source_dtype` would promote; empty for None (x's dtype rules)."""
    if source_dtype is None:
        return {}
    return {d: p for d in FLOAT_DTYPES if (p := promoted(d, source_dtype)) != d}


def dtype_name(dtype: mx.Dtype) -> str:
    """'float32' for mx.float32 (what a config file holds)."""
    return str(dtype).rpartition(".")[2]


def float_dtype(value: object, where: str) -> mx.Dtype | None:
    """mx.float16 / bfloat16 / float32 from an mx.Dtype or its name; None stays None."""
    if value is None:
        return None
    if isinstance(value, mx.Dtype) and value in FLOAT_DTYPES:
        return value
    dtype = getattr(mx, value, None) if isinstance(value, str) else None
    if dtype not in FLOAT_DTYPES:
        raise ShapeError(f"{where}: expected one of {[dtype_name(d) for d in FLOAT_DTYPES]}, got {value!r}")
    return dtype


def resolve_format(format: str | Format, group_size: GroupSize | None) -> Format:
    """The layer's format: a Format as given, or a built-in name with an optional group size."""
    if isinstance(format, Format):
        if group_size is not None:
            raise MarlinDSLError(
                f"group_size: format {format.name!r} is a Format with its own group size "
                f"({format.scale.group_size}); give group_size only with a built-in name")
        return format
    if format not in BUILTIN_FORMATS:
        raise MarlinDSLError(f"format: expected a marlin_dsl Format or a built-in format name "
                             f"{sorted(BUILTIN_FORMATS)}, got {format!r}")
    return builtin_format(format, group_size)


__all__ = ["FLOAT_DTYPES", "activation_casts", "checked_activation", "checked_bias", "device_arrays", "resolve_format",
           "dtype_name", "first_non_finite", "float_dtype", "promoted"]
