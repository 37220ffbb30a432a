"""The MLX-facing API: `quantized_linear` and `MarlinLinear`, a drop-in for
`mlx.nn.QuantizedLinear` whose weight is in any marlin-dsl format.

Backends. "metal" runs our Metal kernels on an Apple GPU, "cuda" our CUDA kernels through
MLX's CUDA backend, "mlx" dequantises with MLX ops (`mlx_ops.dequantize_mx`) and calls
`mx.matmul`, which works on every MLX device (the CPU included). "auto" picks by MLX's
default device; until a kernel backend is wired into `_run_kernel_backend`, "auto" uses the
"mlx" path in its place, so a model using `MarlinLinear` runs anywhere.

Orientation: marlin-dsl weights are [K, N] (K = input features); `mlx.nn.Linear.weight` and
MLX's quantised weights are [N, K], so the conversions below transpose.
"""
from __future__ import annotations

import math
import sys
from typing import Literal

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .api import pack, pack_fp4_weights
from .errors import MarlinDSLError, ShapeError, ValueRangeError
from .formats import Format, GroupScale, IntEncoding, PackedWeights, ZeroPoint, validate
from .formats.builtin import BUILTIN_FORMATS, GroupSize, builtin_format
from .mlx_ops import check_mx_arrays, dequantize_mx, packed_to_mx

__all__ = ["MarlinLinear", "available_backends", "pack_fp4_weights", "quantized_linear",
           "select_backend"]

Backend = Literal["auto", "metal", "cuda", "mlx"]
_BACKENDS = ("auto", "metal", "cuda", "mlx")
#: Activation dtypes the layer computes in (the kernels' f16/bf16, and f32 for the MLX path).
_ACTIVATION_DTYPES = (mx.float16, mx.bfloat16, mx.float32)
# ----- backend selection ------------------------------------------------------------------

def _metal_available() -> bool:
    return sys.platform == "darwin" and bool(mx.metal.is_available())


def _cuda_available() -> bool:
    cuda = getattr(mx, "cuda", None)  # absent in MLX builds older than the CUDA backend
    return cuda is not None and bool(cuda.is_available())


def _machine() -> str:
    return (f"this machine: platform {sys.platform}, Metal available: {_metal_available()}, "
            f"CUDA available: {_cuda_available()}, MLX default device: {mx.default_device()}")


def available_backends() -> list[str]:
    """The concrete backends this machine can run (whether or not a kernel is wired in)."""
    names = ["mlx"]
    if _metal_available():
        names.insert(0, "metal")
    if _cuda_available():
        names.insert(0, "cuda")
    return names


def select_backend(backend: str = "auto") -> str:
    """The concrete backend for `backend`: for "auto", "metal" when MLX's default device is a
    GPU on macOS with Metal, "cuda" when it is a GPU of MLX's CUDA backend, else "mlx"; an
    explicit "metal" or "cuda" that this machine cannot run raises MarlinDSLError."""
    if backend not in _BACKENDS:
        raise MarlinDSLError(f"backend: expected one of {list(_BACKENDS)}, got {backend!r}")
    if backend == "auto":
        if mx.default_device().type == mx.DeviceType.gpu:
            if _metal_available():
                return "metal"
            if _cuda_available():
                return "cuda"
        return "mlx"
    if backend == "metal" and not _metal_available():
        raise MarlinDSLError(
            "the Metal backend needs an Apple GPU: macOS with MLX's Metal backend available "
            f"(mx.metal.is_available()); {_machine()}. Use backend='mlx' or 'auto'.")
    if backend == "cuda" and not _cuda_available():
        raise MarlinDSLError(
            "the CUDA backend needs an NVIDIA GPU with MLX's CUDA backend (mlx[cuda], "
            f"mx.cuda.is_available()); {_machine()}. Use backend='mlx' or 'auto'.")
    return backend


def _run_kernel_backend(name: str, x: mx.array, packed: PackedWeights) -> mx.array:
    """x [..., K] @ W with our compiled kernel on backend `name` ("metal" or "cuda"); `packed`
    holds MLX arrays (checked). The one place where kernel launchers are dispatched; each
    compiles the format's default schedule on first use (`schedule.default_schedule`)."""
    if name == "metal":
        from .backends.metal_runtime import metal_launcher

        activation = {mx.float16: "f16", mx.bfloat16: "bf16"}.get(x.dtype, "f16")
        launcher = metal_launcher(packed.format, activation)
        x2 = x.reshape(-1, x.shape[-1]).astype(mx.float16 if activation == "f16" else mx.bfloat16)
        arrays = [packed.arrays[n] for n in launcher.INPUT_NAMES if n not in ("x", "dims")]
        y = launcher.launch(x2, *arrays)
        return y.reshape(*x.shape[:-1], y.shape[-1]).astype(x.dtype)
    if name == "cuda":
        from .backends.cuda_runtime import cuda_gemm, cuda_schedule, cuda_weights

        activation = "bf16" if x.dtype == mx.bfloat16 else "f16"
        x2 = x.reshape(-1, x.shape[-1])
        k, n = (int(v) for v in packed.shape)
        gemm = cuda_gemm(packed.format, activation, cuda_schedule(packed.format, int(x2.shape[0]), k, n))
        y = gemm(cuda_weights(gemm, packed), x2, poison=False)
        return y.reshape(*x.shape[:-1], y.shape[-1]).astype(x.dtype)
    raise MarlinDSLError(f"backend: no kernel launcher for {name!r}")


# ----- argument checks ----------------------------------------------------------------------

def _first_non_finite(a: mx.array) -> tuple[int, ...] | None:
    """Index of the first NaN/Inf in `a`, or None. Evaluates `a` (a sync)."""
    bad = mx.logical_not(mx.isfinite(a))
    if not bool(mx.any(bad).item()):
        return None
    flat = int(mx.argmax(bad.reshape(-1)).item())
    return tuple(int(i) for i in np.unravel_index(flat, a.shape)) if a.ndim else ()


def _check_activation(x: object, k: int, check_finite: bool) -> mx.array:
    if not isinstance(x, mx.array):
        raise ShapeError(f"x: expected an mlx.core.array [..., K={k}], got {type(x).__name__}")
    if x.ndim < 1:
        raise ShapeError(f"x: expected rank >= 1 with shape [..., K={k}], got rank 0 (a scalar)")
    if x.dtype not in _ACTIVATION_DTYPES:
        raise ShapeError(f"x: expected dtype float16, bfloat16 or float32, got {x.dtype}")
    if x.shape[-1] != k:
        raise ShapeError(f"x: has K={x.shape[-1]} features (shape {tuple(x.shape)}) but the "
                         f"weight has K={k} input features")
    if check_finite and (bad := _first_non_finite(x)) is not None:
        raise ValueRangeError(f"x: non-finite value {x[bad].item()} at index {bad}")
    return x


def _check_bias(bias: object, n: int, dtype: mx.Dtype | None, check_finite: bool) -> mx.array:
    """A float [N] bias, cast to `dtype` (the activation's, so it cannot promote the result)."""
    if not isinstance(bias, mx.array):
        raise ShapeError(f"bias: expected an mlx.core.array [N={n}], got {type(bias).__name__}")
    if tuple(bias.shape) != (n,):
        raise ShapeError(f"bias: expected shape ({n},), got {tuple(bias.shape)}")
    if not mx.issubdtype(bias.dtype, mx.floating):
        raise ShapeError(f"bias: expected a floating-point array, got dtype {bias.dtype}")
    if check_finite and (bad := _first_non_finite(bias)) is not None:
        raise ValueRangeError(f"bias: non-finite value {bias[bad].item()} at index {bad}")
    return bias if dtype is None else bias.astype(dtype)


def _mx_packed(packed: object) -> PackedWeights:
    """`packed` with MLX arrays: numpy arrays (from `pack` or loaded) are validated once and
    copied; MLX arrays are checked for names, shapes and dtypes only (no sync)."""
    if not isinstance(packed, PackedWeights):
        raise ShapeError(f"packed: expected marlin_dsl.PackedWeights, got {type(packed).__name__}")
    if not all(isinstance(a, mx.array) for a in packed.arrays.values()):
        validate(packed)
        packed = PackedWeights(packed.format, packed.shape, packed_to_mx(packed.arrays),
                               packed.layout)
    check_mx_arrays(packed.format, packed.shape, packed.arrays, "packed.arrays")
    return packed


# ----- the functional form ------------------------------------------------------------------

def quantized_linear(x: mx.array, packed: PackedWeights, bias: mx.array | None = None,
                     backend: Backend = "auto", *, check_finite: bool = True) -> mx.array:
    """x [..., K] @ W [K, N] (+ bias [N]) for a packed marlin-dsl weight, in x's dtype
    (float16, bfloat16 or float32).

    `packed.arrays` may be numpy (as `pack` returns them; validated and copied on each call)
    or MLX arrays (as `MarlinLinear` holds them). With `check_finite` NaN/Inf in x or bias
    raise ValueRangeError; that check evaluates x (a sync) and cannot run inside `mx.compile`,
    so layers turn it off by default.
    """
    name = select_backend(backend)
    packed = _mx_packed(packed)
    k, n = packed.shape
    x = _check_activation(x, k, check_finite)
    b = None if bias is None else _check_bias(bias, n, x.dtype, check_finite)
    if name == "mlx":
        w = dequantize_mx(packed.format, packed.shape, packed.arrays).astype(x.dtype)
        y = mx.matmul(x, w)
    else:
        y = _run_kernel_backend(name, x, packed)
    return y if b is None else y + b


# ----- the layer --------------------------------------------------------------------------

def _resolve_format(format: str | Format, group_size: GroupSize | None) -> Format:
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


class MarlinLinear(nn.Module):
    """`y = x @ W + bias` with W [K, N] stored packed in a marlin-dsl format.

    Like `mlx.nn.QuantizedLinear`, the constructor draws a random weight (uniform in
    +-1/sqrt(input_dims)) and quantises it, and all parameters are frozen (not trained). The
    packed arrays are the module's parameters, named as `Format.buffers` lists them
    (`qweight`, `scales`, [`zeros`], [`meta`], [`patterns`]), so `save_weights` /
    `load_weights` work as for any module.
    """

    def __init__(self, input_dims: int, output_dims: int, bias: bool = True,
                 format: str | Format = "fp4", group_size: GroupSize | None = None, *,
                 backend: Backend = "auto", check_finite: bool = False) -> None:
        super().__init__()
        fmt = _resolve_format(format, group_size)
        fmt.check_shape(input_dims, output_dims, "input_dims/output_dims")
        scale = math.sqrt(1 / input_dims)
        weight = mx.random.uniform(low=-scale, high=scale, shape=(output_dims, input_dims))
        self._init_packed(pack(fmt, np.array(weight).T), bias=None)
        if bias:
            self.bias = mx.zeros((output_dims,))
        self.backend = backend
        # Off by default: a drop-in layer must not sync per call and must work in mx.compile.
        self.check_finite = check_finite
        self.freeze()

    def _init_packed(self, packed: PackedWeights, bias: mx.array | None) -> None:
        """Store a packed weight (numpy arrays are validated) as this module's parameters."""
        packed = _mx_packed(packed)
        self.format: Format = packed.format
        self.input_dims, self.output_dims = (int(d) for d in packed.shape)
        for name, array in packed.arrays.items():
            setattr(self, name, array)
        if bias is not None:
            self.bias = _check_bias(bias, self.output_dims, None, check_finite=False)

    @classmethod
    def from_packed(cls, packed: PackedWeights, bias: mx.array | None = None, *,
                    backend: Backend = "auto", check_finite: bool = False) -> MarlinLinear:
        """A layer holding `packed` (validated if it holds numpy arrays) and an optional bias."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer._init_packed(packed, bias)
        layer.backend = backend
        layer.check_finite = check_finite
        layer.freeze()
        return layer

    @classmethod
    def from_linear(cls, linear: nn.Module, format: str | Format = "fp4",
                    group_size: GroupSize | None = None) -> MarlinLinear:
        """Quantise an `mlx.nn.Linear` (weight [N, K]) into `format` with `marlin_dsl.pack`
        (round to nearest, per the format's description); its bias is kept as is."""
        weight = linear.get("weight") if isinstance(linear, nn.Module) else None
        if (not isinstance(weight, mx.array) or weight.ndim != 2
                or not mx.issubdtype(weight.dtype, mx.floating)):
            raise ShapeError("linear: expected an mlx.nn.Linear with a float [N, K] weight"
                             + ("; use from_quantized_linear for an mlx.nn.QuantizedLinear"
                                if isinstance(linear, nn.QuantizedLinear) else ""))
        fmt = _resolve_format(format, group_size)
        w_kn = np.array(weight.astype(mx.float32)).T  # [N, K] -> [K, N]; exact for f16/bf16
        fmt.check_shape(*w_kn.shape, "linear.weight (transposed to [K, N])")
        return cls.from_packed(pack(fmt, w_kn), linear.get("bias"))

    @classmethod
    def from_quantized_linear(cls, ql: nn.QuantizedLinear) -> MarlinLinear:
        """Load MLX's affine quantised weight into the integer zero-point format it maps to.

        MLX's affine mode stores, per group of `group_size` input features of an output row,
        `w = s * q + b` with codes q packed LSB first along the input dimension in uint32
        words ([N, K*bits/32], which is our bit stream, transposed). Our zero-point format is
        `(q - z) * s` with an fp16 scale and a u8 integer zero point, so a group is exactly
        representable iff s is an fp16 value and b == -z * s for an integer z in 0..255 (MLX's
        own quantiser makes this hold for most, not all, groups). Groups that are not raise
        MarlinDSLError naming them; a general bias form (q * s + b) is future work.
        4-bit weights load into the built-in `uint4_zp`, other widths into the same
        description with `IntEncoding(bits)`.
        """
        mode = getattr(ql, "mode", "affine")
        if mode != "affine":
            raise MarlinDSLError(f"ql: only MLX's 'affine' quantisation mode maps to a marlin "
                                 f"format yet, got mode {mode!r}")
        bits, gs = int(ql.bits), int(ql.group_size)
        biases = ql.get("biases")
        if biases is None:
            raise MarlinDSLError("ql: an affine QuantizedLinear without biases")
        q = ql["weight"]
        n, words = q.shape
        k = words * 32 // bits
        fmt = (builtin_format("uint4_zp", gs) if bits == 4 else
               Format(f"uint{bits}_zp", IntEncoding(bits), GroupScale(gs), ZeroPoint("u8"),
                      doc=f"unsigned INT{bits} with u8 zero points (from MLX affine)"))
        fmt.check_shape(k, n, "ql.weight")
        s = np.array(ql["scales"].astype(mx.float32)).astype(np.float64).T  # [K/G, N]
        b = np.array(biases.astype(mx.float32)).astype(np.float64).T
        zeros = _affine_zero_points(s, b, gs, fmt)
        arrays = {"qweight": np.ascontiguousarray(np.array(q).T),  # same words, [K*bits/32, N]
                  "scales": s.astype(np.float16), "zeros": zeros}
        return cls.from_packed(PackedWeights(fmt, (k, n), arrays), ql.get("bias"))

    def to_packed(self) -> PackedWeights:
        """The packed weight as numpy arrays (copies), as `marlin_dsl.pack` returns them."""
        names = [b.name for b in self.format.buffers(self.input_dims, self.output_dims)]
        return PackedWeights(self.format, (self.input_dims, self.output_dims),
                             {name: np.array(self[name]) for name in names})

    def _packed_mx(self) -> PackedWeights:
        names = [b.name for b in self.format.buffers(self.input_dims, self.output_dims)]
        return PackedWeights(self.format, (self.input_dims, self.output_dims),
                             {name: self[name] for name in names})

    def __call__(self, x: mx.array) -> mx.array:
        return quantized_linear(x, self._packed_mx(), self.get("bias"), self.backend,
                                check_finite=self.check_finite)

    def _extra_repr(self) -> str:
        return (f"input_dims={self.input_dims}, output_dims={self.output_dims}, "
                f"bias={'bias' in self}, format={self.format.name} ({self.format.describe()})")


def _affine_zero_points(s: np.ndarray, b: np.ndarray, group_size: int, fmt: Format) -> np.ndarray:
    """u8 zero points z [K/G, N] with (q - z) * s == s * q + b exactly, or MarlinDSLError
    naming the first group (and its input features) and output column where none exists."""
    s16 = s.astype(np.float16)
    bad_scale = s16.astype(np.float64) != s
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(s != 0, np.rint(-b / s), 0.0)
    # Integer z in u8's range whose product reproduces b exactly (checked in float64, where
    # z * s is exact: an fp16 significand times an 8-bit integer). A zero scale needs b == 0.
    bad_zero = ~((z >= 0) & (z <= 255) & (-z * s == b))
    for bad, what in ((bad_scale, "scale"), (bad_zero, "bias")):
        if bad.any():
            g, col = (int(i) for i in np.argwhere(bad)[0])
            where = (f"group {g} (input features {g * group_size}..{(g + 1) * group_size - 1}) "
                     f"of output column {col}")
            if what == "scale":
                reason = f"scale {float(s[g, col])!r} is not exactly a float16 value"
            else:
                ratio = float(-b[g, col] / s[g, col]) if s[g, col] else float("nan")
                reason = (f"-b/s = {ratio!r} (s={float(s[g, col])!r}, b={float(b[g, col])!r}) "
                          f"is not an integer zero point in 0..255")
            raise MarlinDSLError(
                f"ql: {where} cannot be represented in format {fmt.name!r} ((q - z) * s with "
                f"fp16 s and u8 integer z): {reason}; MLX's general affine bias (s * q + b) "
                f"is future work")
    return z.astype(np.uint8)
