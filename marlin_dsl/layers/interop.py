"""MLX's own quantised layers as marlin-dsl formats: every `mx.quantize` mode that the DSL can
describe loads bit for bit, so a model quantised by MLX (or an mlx-community checkpoint) runs
on marlin-dsl kernels without being quantised again.

| MLX mode | codes                    | scales                 | format                          |
|----------|--------------------------|------------------------|---------------------------------|
| affine   | unsigned `bits`-bit ints | model dtype, + biases  | IntEncoding(bits), GroupBias    |
| mxfp4    | FP4 E2M1                 | E8M0 (powers of two)   | E2M1, GroupScale(32, "e8m0")    |
| nvfp4    | FP4 E2M1                 | FP8 E4M3               | E2M1, GroupScale(16, "e4m3")    |
| mxfp8    | FP8 E4M3                 | E8M0                   | E4M3, GroupScale(32, "e8m0")    |

MLX packs codes LSB first along the input dimension into uint32 words, [N, K * bits / 32]:
our bit stream along K, transposed (3-, 5- and 6-bit codes straddle words the same way). The
parameters are [N, K / G]. Loading is a transpose on the device.

The scales of mxfp4, nvfp4 and mxfp8 are declared `GroupScale(..., zero="allowed")`: a stored
scale of 0 is MLX's all-zero group, which nvfp4 stores where a group's E4M3 scale underflows
(negative scales are still refused).
"""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..errors import MarlinDSLError, ShapeError, ValueRangeError
from ..formats import FloatEncoding, Format, GroupBias, GroupScale, IntEncoding, PackedWeights

#: FP4 E2M1 (OCP microscaling element; the same as the built-in fp4's).
E2M1 = FloatEncoding(bits=4, exp_bits=2, man_bits=1, bias=1)
#: FP8 E4M3FN (OCP): codes 0x7F and 0xFF are NaN (as in MLX), 448 is the largest value;
#: loading refuses weights that hold NaN codes.
E4M3 = FloatEncoding(bits=8, exp_bits=4, man_bits=3, bias=7, specials="fn")
_E4M3_NAN_CODE = 0x7F  # with the sign bit: 0xFF

_DTYPE_NAMES = {mx.float16: "f16", mx.bfloat16: "bf16", mx.float32: "f32"}
_MODES = ("affine", "mxfp4", "nvfp4", "mxfp8")


def mlx_format(mode: str, bits: int, group_size: int, dtype: mx.Dtype | None = None) -> Format:
    """The format of MLX's quantisation `mode` with these bits and group size; `dtype` is the
    type of an affine layer's scales and biases (the model's float type)."""
    if mode == "affine":
        if dtype not in _DTYPE_NAMES:
            raise ShapeError(f"scales: an affine layer's scales must be float16, bfloat16 or "
                             f"float32, got {dtype}")
        t = _DTYPE_NAMES[dtype]
        return Format(f"mlx_affine{bits}_g{group_size}_{t}", IntEncoding(bits), GroupScale(group_size, t),
                      bias=GroupBias(t), doc=f"MLX affine {bits}-bit, group {group_size}, {t} scales and biases")
    expected = {"mxfp4": (4, 32), "nvfp4": (4, 16), "mxfp8": (8, 32)}
    if mode not in expected:
        raise MarlinDSLError(f"mode: MLX quantisation mode {mode!r} has no marlin-dsl format "
                             f"(known: {list(_MODES)})")
    if (bits, group_size) != expected[mode]:
        raise ShapeError(f"{mode}: expected bits={expected[mode][0]} and group_size="
                         f"{expected[mode][1]}, got bits={bits}, group_size={group_size}")
    element, scale = {"mxfp4": (E2M1, "e8m0"), "nvfp4": (E2M1, "e4m3"), "mxfp8": (E4M3, "e8m0")}[mode]
    # MLX dequantises a group whose stored scale is 0 to zeros (nvfp4 stores E4M3 0 where a
    # group's scale underflows); declared, so that such loaded scales are accepted. E8M0 has
    # no zero, so for mxfp4/mxfp8 this admits nothing more.
    return Format(f"mlx_{mode}", element, GroupScale(group_size, scale, zero="allowed"),
                  doc=f"MLX {mode}: {element.describe()} codes, {scale} scales")


def packed_from_quantized(ql: nn.Module) -> PackedWeights:
    """An `mlx.nn.QuantizedLinear`'s weight as a PackedWeights of MLX arrays (linear layout,
    row-contiguous on the device; nothing is copied to the host). Not yet validated."""
    mode = getattr(ql, "mode", "affine")
    if mode not in _MODES:
        raise MarlinDSLError(f"ql: MLX quantisation mode {mode!r} has no marlin-dsl format "
                             f"(known: {list(_MODES)})")
    q, scales = ql.get("weight"), ql.get("scales")
    if not isinstance(q, mx.array) or q.ndim != 2 or q.dtype != mx.uint32:
        raise ShapeError(f"ql.weight: expected a uint32 [N, K*bits/32] array, got "
                         f"{getattr(q, 'dtype', type(q).__name__)} {getattr(q, 'shape', '')}")
    bits, group_size = int(ql.bits), int(ql.group_size)
    biases = ql.get("biases")
    if (biases is None) != (mode != "affine"):
        raise ShapeError(f"ql.biases: mode {mode!r} " + ("needs biases" if mode == "affine" else "has no biases"))
    fmt = mlx_format(mode, bits, group_size, scales.dtype if mode == "affine" else None)
    n, words = (int(d) for d in q.shape)
    k = words * 32 // bits
    fmt.check_shape(k, n, "ql.weight")
    arrays = {"qweight": q, "scales": scales} | ({"biases": biases} if mode == "affine" else {})
    arrays = {name: mx.contiguous(a.T) for name, a in arrays.items()}  # [N, ...] -> [..., N]
    if mode != "affine" and scales.dtype != mx.uint8:
        raise ShapeError(f"ql.scales: {mode} scales are uint8 codes, got {scales.dtype}")
    if fmt.element is E4M3:
        _refuse_nan_codes(arrays["qweight"])
    return PackedWeights(fmt, (k, n), arrays)


def _refuse_nan_codes(qweight: mx.array) -> None:
    """E4M3 codes 0x7F / 0xFF are NaN in MLX's mxfp8; refuse them, naming the first."""
    codes = mx.bitwise_and(mx.right_shift(qweight[:, None, :], mx.array([0, 8, 16, 24], dtype=mx.uint32)[None, :, None]),
                           mx.array(0x7F, dtype=mx.uint32))
    bad = codes == _E4M3_NAN_CODE
    if not bool(mx.any(bad).item()):
        return
    word, byte, col = (int(i) for i in np.argwhere(np.array(bad))[0])
    raise ValueRangeError(f"ql.weight[{col}, {word}] byte {byte}: E4M3 code "
                          f"{int(np.array(qweight)[word, col]) >> (8 * byte) & 0xFF:#04x} is NaN in "
                          f"MLX's mxfp8 (input feature {4 * word + byte}, output feature {col})")


__all__ = ["E2M1", "E4M3", "mlx_format", "packed_from_quantized"]
