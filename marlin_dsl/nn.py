"""The MLX-facing API: `quantized_linear` and `MarlinLinear`, a drop-in for
`mlx.nn.QuantizedLinear` whose weight is in any marlin-dsl format.

Backends. "metal" runs our Metal kernels on an Apple GPU, "cuda" our CUDA kernels through
MLX's CUDA backend, "mlx" dequantises with MLX ops (`mlx_ops.dequantize_mx`) and calls
`mx.matmul`, which works on every MLX device (the CPU included). "auto" picks by MLX's
default device. What runs per call is a `layers.dispatch.Dispatch`, shared by all layers of
one (format, shape, backend); weights live on the device in the layout its kernels read
(`layers.weights`), converted once when they arrive.

Orientation: marlin-dsl weights are [K, N] (K = input features); `mlx.nn.Linear.weight` and
MLX's quantised weights are [N, K], so the conversions below transpose.
"""
from __future__ import annotations

import math
import sys
from typing import Callable, Mapping

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .errors import MarlinDSLError, ShapeError
from .formats import Format, PackedWeights
from .formats.builtin import GroupSize
from .formats.pack_weights import pack_fp4_weights
from .layers.arguments import Backend, activation_casts, float_dtype, resolve_format
from .layers.arguments import checked_activation as _check_activation
from .layers.arguments import checked_bias as _check_bias
from .layers.arguments import device_arrays as _device_arrays
from .layers.constructors import LayerConstructors
from .layers.dispatch import LINEAR, dispatch_for
from .layers.mlx_ops import packed_to_numpy
from .layers.mlx_pack import pack_mx
from .layers.skip import SkipPath, skip_path, skip_path_of_packed
from .layers.validate import validate_mx
from .layers.weights import layout_shapes, to_layout, to_linear, which_layout

__all__ = ["MarlinLinear", "available_backends", "pack_fp4_weights", "prepare", "quantized_linear",
           "select_backend"]

_BACKENDS = ("auto", "metal", "cuda", "mlx")
# ----- backend selection ------------------------------------------------------------------

def _metal_available() -> bool:
    return sys.platform == "darwin" and bool(mx.metal.is_available())


def _cuda_available() -> bool:
    cuda = getattr(mx, "cuda", None)  # absent in MLX builds older than the CUDA backend
    return cuda is not None and bool(cuda.is_available())


#: The kernel backends (targets with a runtime), each with its machine probe (a lambda, so
#: that the probe is looked up when called) and what it needs.
_KERNEL_BACKENDS: dict[str, tuple[Callable[[], bool], str]] = {
    "metal": (lambda: _metal_available(),
              "the Metal backend needs an Apple GPU: macOS with MLX's Metal backend available "
              "(mx.metal.is_available())"),
    "cuda": (lambda: _cuda_available(),
             "the CUDA backend needs an NVIDIA GPU with MLX's CUDA backend (mlx[cuda], "
             "mx.cuda.is_available())"),
}


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
    probe, needs = _KERNEL_BACKENDS.get(backend, (None, ""))
    if probe is not None and not probe():
        raise MarlinDSLError(f"{needs}; {_machine()}. Use backend='mlx' or 'auto'.")
    return backend


# ----- the functional form ------------------------------------------------------------------

def quantized_linear(x: mx.array, packed: PackedWeights, bias: mx.array | None = None,
                     backend: Backend = "auto", *, check_finite: bool = True) -> mx.array:
    """x [..., K] @ W [K, N] (+ bias [N]) for a packed marlin-dsl weight, in x's dtype
    (float16, bfloat16 or float32).

    `packed.arrays` may be numpy (as `pack` returns them) or MLX arrays; either way they are
    validated and put into the layout the backend's kernels read on the first call with that
    PackedWeights object (cached on it; see `_device_arrays`; a block-pattern weight's skipping
    arrays too: `layers.skip`). With `check_finite` NaN/Inf in
    x or bias raise ValueRangeError; that check evaluates x (a sync) and cannot run inside
    `mx.compile`, so layers turn it off by default.
    """
    name = select_backend(backend)
    packed, arrays = _device_arrays(packed, name)
    k, n = packed.shape
    x = _check_activation(x, k, check_finite)
    b = None if bias is None else _check_bias(bias, n, x.dtype, check_finite)
    skip = skip_path_of_packed(packed, name, arrays)  # block patterns on CUDA, where it pays
    if skip is not None and skip.serves(x):
        y = skip(x)
    else:
        dispatch = dispatch_for(packed.format, int(k), int(n), name)
        y = dispatch(x, tuple(arrays[a] for a in dispatch.names))
    return y if b is None else y + b


# ----- the layer --------------------------------------------------------------------------

class MarlinLinear(LayerConstructors, nn.Module):
    """`y = x @ W + bias` with W [K, N] stored packed in a marlin-dsl format.

    Like `mlx.nn.QuantizedLinear`, the constructor draws a random weight (uniform in
    +-1/sqrt(input_dims)) and quantises it, and all parameters are frozen (not trained). The
    packed arrays are the module's parameters, named as `Format.buffers` lists them
    (`qweight`, `scales`, [`zeros` | `biases`], [`meta`], [`patterns`]), held in the physical
    layout that the backend's kernels read (`layout`: "linear", the format's own, or CUDA's
    "lane_stream"), converted once on the device when the weight arrives.

    A call looks up the kernel launch for its row count and launches it: no numpy, no host
    copy, no sync (so layers work inside `mx.compile`). Arrays replaced from outside
    (`load_weights`, `update`) are noticed, and validated and converted on the next call, in
    either the linear or the layer's own layout; `prepare()` does it at once.
    """

    def __init__(self, input_dims: int, output_dims: int, bias: bool = True,
                 format: str | Format = "fp4", group_size: GroupSize | None = None, *,
                 backend: Backend = "auto", check_finite: bool = False) -> None:
        super().__init__()
        fmt = resolve_format(format, group_size)
        fmt.check_shape(input_dims, output_dims, "input_dims/output_dims")
        scale = math.sqrt(1 / input_dims)
        weight = mx.random.uniform(low=-scale, high=scale, shape=(output_dims, input_dims))
        self._setup(fmt, (input_dims, output_dims), backend, check_finite)
        self._install(pack_mx(fmt, weight.T).arrays)
        if bias:
            self.bias = mx.zeros((output_dims,))
        self.freeze()

    # ----- state ---------------------------------------------------------------------------

    def _setup(self, fmt: Format, shape: tuple[int, int], backend: Backend, check_finite: bool) -> None:
        self.format: Format = fmt
        self.input_dims, self.output_dims = (int(d) for d in shape)
        self.backend = backend
        object.__setattr__(self, "_source_dtype", None)
        object.__setattr__(self, "_casts", {})
        # Off by default: a drop-in layer must not sync per call and must work in mx.compile.
        self.check_finite = check_finite
        # A tuple would become a dict entry of the module (mlx.nn.Module keeps tuples there).
        object.__setattr__(self, "_weight_names", tuple(spec.name for spec in fmt.buffers(*shape)))
        object.__setattr__(self, "_skip", None)  # the block-skipping path, where it pays (_install)
        self._stale = False
        self._select(backend)
        self._disarm()

    def _select(self, backend: Backend) -> None:
        self._backend = select_backend(backend)
        self._dispatch = dispatch_for(self.format, self.input_dims, self.output_dims, self._backend)
        self.layout = self._dispatch.layout
        if hasattr(self, "_call"):
            self._disarm()

    def _install(self, linear: dict) -> None:
        """Hold linear-layout device arrays (valid) in this layer's layout (and `skipping`'s)."""
        self._hold(linear, to_layout(self.format, (self.input_dims, self.output_dims), linear, self.layout))
        self._stale = False
        self._disarm()

    def _hold(self, linear: Mapping[str, object], arrays: dict) -> None:
        """`arrays` (valid, in `layout`) as the parameters; the skipping path where it pays."""
        for name in self._weight_names:
            # Row-contiguous: a kernel launch copies any other array on every call (a gather
            # along columns, `models.fuse.permuted_columns`, gives column-major ones).
            dict.__setitem__(self, name, mx.contiguous(arrays[name]))  # not a replacement from outside
        shape = (self.input_dims, self.output_dims)
        object.__setattr__(self, "_skip", skip_path(self.format, shape, linear, arrays, self._backend, self.layout))

    # The per-call path is a closure over the dispatch, the held arrays and the bias, built on
    # the first call after anything it captures changes (`_disarm` marks that).

    def _disarm(self) -> None:
        object.__setattr__(self, "_call", self._arm_and_call)
        object.__setattr__(self, "_parts_call", self._arm_and_call_parts)
        # per-call closures of calls with an epilogue (models/fused_block.py), by steps
        object.__setattr__(self, "_epilogue_calls", {})

    def _arm_and_call(self, x: mx.array) -> mx.array:
        self.prepare()
        object.__setattr__(self, "_call", self._closure())
        return self._call(x)

    def _arm_and_call_parts(self, x: mx.array) -> list[mx.array]:
        self.prepare()
        object.__setattr__(self, "_parts_call", self._parts_closure())
        return self._parts_call(x)

    def _launcher(self, dispatch, skip: SkipPath | None = None) -> Callable[[mx.array], object]:
        """x -> `dispatch`'s launch for x's shape with this layer's weights (one lookup, one
        kernel call); with `skip`, decode rows through its skipping kernels."""
        launches, launch_for = dispatch.launches, dispatch.launch
        weights = tuple(self[name] for name in dispatch.names)
        k, check_finite = self.input_dims, self.check_finite

        def run(x: mx.array):
            if check_finite:
                _check_activation(x, k, True)
            try:
                launch = launches[(x.shape, x.dtype)]
            except (KeyError, AttributeError, TypeError):  # first call with this shape, or bad x
                launch = launch_for(x)
            return launch(x, weights)

        if skip is not None:
            run = skip.wrap(run, (lambda x: _check_activation(x, k, True)) if check_finite else None)

        casts = self._casts
        if not casts:
            return run

        def run_promoted(x: mx.array):  # the source layer's promotion (source_dtype)
            to = casts.get(getattr(x, "dtype", None))
            return run(x if to is None else x.astype(to))

        return run_promoted

    def _closure(self):
        run = self._launcher(self._dispatch, self._skip)
        order = self.get("input_order")
        if order is not None:  # act-order checkpoints: W's rows take x's columns in this order
            launch = run

            def run(x: mx.array):
                return launch(mx.take(x, order, axis=-1))

        bias = self.get("bias")
        if bias is None:
            return run
        cast_bias: dict[mx.Dtype, mx.array] = {}

        def call(x: mx.array) -> mx.array:
            y = run(x)
            if bias.dtype == y.dtype:
                return y + bias
            b = cast_bias.get(y.dtype)
            if b is None:
                b = cast_bias[y.dtype] = bias.astype(y.dtype)
            return y + b

        return call

    def split_outputs(self, widths: tuple[int, ...]) -> None:
        """Make `call_parts(x)` return y's columns as parts of these widths (a fused group's
        layers, `models.fuse`): where the kernel for x's rows writes them as separate outputs
        (`Gemm.outputs`: the weight stream, the decode's rows) nothing follows the launch; else,
        and with a bias, y is split (one `mx.split`)."""
        widths = tuple(widths) if isinstance(widths, (tuple, list)) else ()
        if (len(widths) < 2 or not all(isinstance(w, (int, np.integer)) and not isinstance(w, bool) for w in widths)
                or min(widths) < 1 or sum(widths) != self.output_dims):
            raise ShapeError(f"widths: expected two or more positive part widths adding up to the "
                             f"layer's {self.output_dims} output features, got {list(widths)}")
        object.__setattr__(self, "_part_widths", tuple(int(w) for w in widths))
        self._disarm()

    def call_parts(self, x: mx.array) -> list[mx.array]:
        """y's columns as the parts `split_outputs` set (ShapeError before it was called)."""
        return self._parts_call(x)

    def _parts_closure(self):
        widths = getattr(self, "_part_widths", None)
        if widths is None:
            raise ShapeError(f"MarlinLinear({self.format.name}): call_parts before split_outputs")
        dispatch = dispatch_for(self.format, self.input_dims, self.output_dims, self._backend, widths)
        if "bias" in self:  # the bias is added to y as a whole: split after
            splits = dispatch.splits
            return lambda x: mx.split(self._call(x), splits, axis=-1)
        return self._launcher(dispatch)

    @property
    def source_dtype(self) -> mx.Dtype | None:
        """The dtype the layer this one replaces computed in (its weight's, scales' and
        bias's, promoted), or None. A call casts x as MLX's promotion with that dtype would
        (f16 x with an f32 source: f32), so the result has the dtype the source layer's had;
        with None the result has x's dtype. `from_linear` / `from_quantized_linear` and
        `models.convert` set it; checkpoints keep it."""
        return self._source_dtype

    @source_dtype.setter
    def source_dtype(self, value: mx.Dtype | str | None) -> None:
        dtype = float_dtype(value, "source_dtype")
        object.__setattr__(self, "_source_dtype", dtype)
        object.__setattr__(self, "_casts", activation_casts(dtype))
        self._disarm()

    @property
    def check_finite(self) -> bool:
        """NaN/Inf in x raise ValueRangeError (a sync per call; off by default)."""
        return self._check_finite

    @check_finite.setter
    def check_finite(self, value: bool) -> None:
        object.__setattr__(self, "_check_finite", bool(value))
        if hasattr(self, "_call"):
            self._disarm()

    def __setitem__(self, key: str, value: object) -> None:
        super().__setitem__(key, value)
        if key in getattr(self, "_weight_names", ()):
            self._stale = True  # update()/load_weights(): check and convert before the next use
        if key in ("bias", "input_order") or key in getattr(self, "_weight_names", ()):
            self._disarm()

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        if key == "bias":
            self._disarm()

    @property
    def skipping(self) -> bool:
        """Decode rows (up to 16) run the block-skipping kernels: CUDA, a block-pattern weight
        with at most `skip_max_stored` of its vectors stored (0.52; 0.35 if small)."""
        return self._skip is not None

    @property
    def weight_arrays(self) -> dict[str, mx.array]:
        """The packed arrays as held (in `layout`)."""
        return {name: self[name] for name in self._weight_names}

    def prepare(self, backend: Backend | None = None) -> MarlinLinear:
        """Validate arrays replaced since the last check and put them into the layout of
        `backend` (default: the layer's), on the device. Idempotent; one sync if anything
        changed. Returns self."""
        if backend is not None and backend != self.backend:
            linear = self.linear_arrays()
            self.backend = backend
            self._select(backend)
            self._install(linear)
            return self
        if self._stale:
            self._install(self.linear_arrays())
        return self

    def linear_arrays(self) -> dict[str, mx.array]:
        """The weight in the format's linear layout (lazy MLX ops; validated first if it was
        replaced from outside since the last check)."""
        shape = (self.input_dims, self.output_dims)
        arrays = self.weight_arrays
        layout = which_layout(self.format, shape, arrays, (self.layout, LINEAR))
        if layout is None:
            expected = {lay: layout_shapes(self.format, shape, lay) for lay in dict.fromkeys((LINEAR, self.layout))}
            got = {n: (tuple(a.shape), str(a.dtype)) if isinstance(a, mx.array) else type(a).__name__
                   for n, a in arrays.items()}
            raise ShapeError(f"MarlinLinear({self.format.name}, [{shape[0]}, {shape[1]}]): weight "
                             f"arrays {got} match no layout; expected shapes {expected}")
        linear = to_linear(self.format, shape, arrays, layout)
        if self._stale:
            try:
                validate_mx(self.format, shape, linear, "weights")
            except ValueError as err:
                if isinstance(err, MarlinDSLError):
                    raise
                raise MarlinDSLError(
                    f"MarlinLinear({self.format.name}): its weights were replaced and must be "
                    f"checked once before use, which cannot happen inside mx.compile: call "
                    f"marlin_dsl.nn.prepare(model) first ({err})") from None
        return linear

    def to_packed(self) -> PackedWeights:
        """The packed weight as numpy arrays in the linear layout (copies), as
        `marlin_dsl.pack` returns them."""
        self.prepare()
        return PackedWeights(self.format, (self.input_dims, self.output_dims),
                             packed_to_numpy(self.linear_arrays()))

    def set_dtype(self, dtype: mx.Dtype, predicate=None) -> None:
        """Cast the bias, and a `source_dtype`, as nn.Linear.set_dtype would cast its float
        parameters: the packed arrays hold the number types their format declares (bf16
        scales stay bf16). (A parent module's set_dtype casts every float parameter of the
        tree itself; packed arrays cast that way fail the next call's check by dtype.)"""
        if "bias" in self and (predicate is None or predicate(self["bias"].dtype)):
            self.bias = self["bias"].astype(dtype)
        if self._source_dtype is not None and (predicate is None or predicate(self._source_dtype)):
            self.source_dtype = dtype

    # ----- the call ------------------------------------------------------------------------

    def __call__(self, x: mx.array) -> mx.array:
        return self._call(x)

    def _extra_repr(self) -> str:
        return (f"input_dims={self.input_dims}, output_dims={self.output_dims}, "
                f"bias={'bias' in self}, format={self.format.name} ({self.format.describe()}), "
                f"backend={self._backend}, layout={self.layout}"
                + (f", source_dtype={str(self._source_dtype).rpartition('.')[2]}" if self._source_dtype else ""))


def prepare(model: nn.Module, backend: Backend | None = None) -> nn.Module:
    """`MarlinLinear.prepare` on every MarlinLinear of `model` (validate weights replaced by
    `load_weights`/`update`, convert layouts); call it before `mx.compile`. Returns model."""
    for _, module in model.named_modules():
        if isinstance(module, MarlinLinear):
            module.prepare(backend)
    return model
