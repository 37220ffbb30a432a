"""The public packing API: `pack(fmt, weights)` (float weights to packed arrays in one call:
quantize -> prune -> pack_codes) and a `pack_<format>_weights` per built-in."""
from __future__ import annotations

from typing import Callable

from .builtin import BUILTIN_FORMATS, GroupSize
from .format import Format
from .packing import pack_codes
from .prune import prune
from .quantize import quantize
from .tensors import PackedWeights


def pack(fmt: Format, weights: object) -> PackedWeights:
    """Quantise float weights [K, N] (K = input features) into `fmt`, prune if the format is
    N:M sparse, and pack: quantize -> prune -> pack_codes."""
    if not isinstance(fmt, Format):
        raise TypeError(f"fmt: expected a marlin_dsl Format, got {type(fmt).__name__}")
    return pack_codes(prune(quantize(fmt, weights)))


def _packer(name: str) -> Callable[..., PackedWeights]:
    factory = BUILTIN_FORMATS[name]

    def packer(weights: object, group_size: GroupSize | None = None) -> PackedWeights:
        fmt = factory() if group_size is None else factory(group_size)
        return pack(fmt, weights)

    packer.__name__ = f"pack_{name}_weights"
    packer.__doc__ = (f"Pack float weights [K, N] into the built-in `{name}` format "
                      f"({factory().doc}); group_size defaults to the format's own.")
    return packer


pack_fp4_weights = _packer("fp4")
pack_int4_weights = _packer("int4")
pack_uint4_zp_weights = _packer("uint4_zp")
pack_nf4_weights = _packer("nf4")
pack_fp4_2of4_weights = _packer("fp4_2of4")
pack_int4_2of4_weights = _packer("int4_2of4")
pack_fp4_blockpattern_weights = _packer("fp4_blockpattern")
