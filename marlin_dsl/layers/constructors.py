"""`MarlinLinear`'s constructors (a mixin, so that nn.py holds the layer's state and call):
from packed weights, from a checkpoint's tensors, empty placeholders to be filled by
`load_weights`, and from MLX's own `nn.Linear` and `nn.QuantizedLinear`."""
from __future__ import annotations

from typing import Mapping, Sequence, TypeVar

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..errors import MarlinDSLError, ShapeError
from ..formats import Format, PackedWeights
from ..formats.builtin import GroupSize
from ..formats.packing import pack_codes
from .arguments import checked_bias as _check_bias
from .arguments import device_arrays as _device_arrays
from .arguments import Backend, promoted, resolve_format
from .checkpoint_import import read_checkpoint
from .interop import packed_from_quantized
from .mlx_ops import mx_dtype
from .mlx_pack import pack_mx
from .source_errors import SourcePart, source_error

#: the layer class a constructor builds (MarlinLinear, or a subclass of it)
Layer = TypeVar("Layer", bound="LayerConstructors")


class LayerConstructors:
    """The classmethods that build a `MarlinLinear` (marlin_dsl/nn.py)."""

    @classmethod
    def from_packed(cls: type[Layer], packed: PackedWeights, bias: mx.array | None = None, *,
                    backend: Backend = "auto", check_finite: bool = False) -> Layer:
        """A layer holding `packed` (numpy or MLX arrays in the linear layout, validated once
        here) and an optional bias."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        if not isinstance(packed, PackedWeights):
            raise ShapeError(f"packed: expected marlin_dsl.PackedWeights, got {type(packed).__name__}")
        layer._setup(packed.format, packed.shape, backend, check_finite)
        _, arrays = _device_arrays(packed, layer._backend)
        layer._hold(packed.arrays, arrays)
        if bias is not None:
            layer.bias = _check_bias(bias, layer.output_dims, None, check_finite=False)
        layer._stale = False
        layer.freeze()
        return layer

    @classmethod
    def from_checkpoint(cls: type[Layer], tensors: Mapping[str, object], format: object, shape: tuple[int, int],
                        bias: mx.array | None = None, *, name: str = "", backend: Backend = "auto") -> Layer:
        """A layer from one layer's checkpoint tensors (numpy arrays by name) in a
        `CheckpointFormat` (`formats.checkpoint`: gguf_format("Q4_K"), gptq(...), awq(...),
        bnb(...)), shape (K, N), bit for bit; errors name `name` + the tensor. An act-order
        map (GPTQ's g_idx) becomes `input_order`: the layer permutes x's columns."""
        imported = read_checkpoint(tensors, format, shape, name)
        layer = cls.from_packed(pack_codes(imported.weights), bias, backend=backend)
        if imported.input_order is not None:
            layer.input_order = mx.array(imported.input_order.astype(np.uint32))
            layer.freeze()
        return layer

    @classmethod
    def placeholder(cls: type[Layer], fmt: Format, input_dims: int, output_dims: int, bias: bool = False, *,
                    backend: Backend = "auto") -> Layer:
        """An empty layer of this format and shape, to be filled by `load_weights` (its zero
        arrays fail validation, so using it unfilled is an error, not a silent zero)."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer._setup(fmt, (input_dims, output_dims), backend, False)
        for spec in fmt.buffers(input_dims, output_dims):
            dict.__setitem__(layer, spec.name, mx.zeros(spec.shape, dtype=mx_dtype(spec.elem)))
        if bias:
            layer.bias = mx.zeros((output_dims,))
        layer._stale = True
        layer.freeze()
        return layer

    @classmethod
    def from_linear(cls: type[Layer], linear: nn.Module, format: str | Format = "fp4",
                    group_size: GroupSize | None = None, *, backend: Backend = "auto",
                    name: str = "linear", sources: Sequence[SourcePart] | None = None) -> Layer:
        """Quantise an `mlx.nn.Linear` (weight [N, K]) into `format` on the device
        (`mlx_pack.pack_mx`, bit-identical to `marlin_dsl.pack`); its bias is kept as is.
        `source_dtype` becomes the weight's and bias's dtype, promoted (the result's dtype
        follows what `linear` returns). Errors name `name.weight` and the index in its [N, K]
        shape; a converter whose weight is made of other tensors (fused or dequantised
        layers, models/convert.py) passes them as `sources`."""
        weight = linear.get("weight") if isinstance(linear, nn.Module) else None
        if (not isinstance(weight, mx.array) or weight.ndim != 2
                or not mx.issubdtype(weight.dtype, mx.floating)):
            raise ShapeError(f"{name}: expected an mlx.nn.Linear with a float [N, K] weight"
                             + ("; use from_quantized_linear for an mlx.nn.QuantizedLinear"
                                if isinstance(linear, nn.QuantizedLinear) else ""))
        fmt = resolve_format(format, group_size)
        n, k = (int(d) for d in weight.shape)
        fmt.check_shape(k, n, f"{name}.weight (transposed to [K, N])")
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer._setup(fmt, (k, n), backend, False)
        try:
            packed = pack_mx(fmt, weight.T)
        except MarlinDSLError as err:
            parts = sources if sources is not None else [SourcePart(name, n, {"weight": weight})]
            raise source_error(err, parts, fmt.group_size_for(k)) from None
        layer._install(packed.arrays)
        dtypes = [weight.dtype]
        if "bias" in linear:
            layer.bias = _check_bias(linear["bias"], n, None, check_finite=False)
            dtypes.append(layer.bias.dtype)
        layer.source_dtype = promoted(*dtypes)
        layer.freeze()
        return layer

    @classmethod
    def from_quantized_linear(cls: type[Layer], ql: nn.Module, *, backend: Backend = "auto") -> Layer:
        """Load an `mlx.nn.QuantizedLinear` exactly, in the format of its mode
        (`layers.interop`: affine -> integer codes with a GroupBias; mxfp4, nvfp4, mxfp8 ->
        E2M1/E4M3 codes with E8M0/E4M3 scales). The arrays are transposed on the device and
        validated once."""
        layer = cls.from_packed(packed_from_quantized(ql), ql.get("bias"), backend=backend)
        dtypes = [a.dtype for a in (ql.get("scales"), ql.get("bias"))
                  if isinstance(a, mx.array) and mx.issubdtype(a.dtype, mx.floating)]
        if dtypes:  # quantized_matmul promotes x with float scales (E8M0/E4M3 codes: x's dtype)
            layer.source_dtype = promoted(*dtypes)
        return layer
