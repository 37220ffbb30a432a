"""marlin-dsl: a compiler for quantized and sparse GEMM kernels.

Formats are declared as data (`marlin_dsl.formats`); packing, unpacking, reference
dequantisation and validation are derived from the description. A `Gemm` pairs a format with a
`Schedule`; `marlin_dsl.lowering` lowers it to kernel IR (`marlin_dsl.ir`), `marlin_dsl.passes`
transforms it.
"""
from pathlib import Path as _Path

from ._source_layout import register_source_subpackages

register_source_subpackages(__name__, _Path(__file__).resolve().parent)

from .formats.pack_weights import (
    pack,
    pack_fp4_2of4_weights,
    pack_fp4_blockpattern_weights,
    pack_fp4_weights,
    pack_int4_2of4_weights,
    pack_int4_weights,
    pack_nf4_weights,
    pack_uint4_zp_weights,
)
from .errors import FormatError, MarlinDSLError, ShapeError, SpecError, ValueRangeError
from .formats import (
    BlockPatternSparsity,
    FloatEncoding,
    Format,
    GroupBias,
    GroupScale,
    IntEncoding,
    NMSparsity,
    PackedWeights,
    Packing,
    QuantizedWeights,
    Scaling,
    TableEncoding,
    SuperBlockScale,
    TwoLevelScale,
    ZeroPoint,
    dequantize,
    pack_codes,
    prune,
    quantize,
    reference_matmul,
    unpack,
    validate,
)
from .formats.builtin import BUILTIN_FORMATS, builtin_format
from .errors import ScheduleError
from .schedule import (DoubleBuffered, FusedDequant, Gemm, Multistage, Schedule, StripedKParallel, Warpgroup,
                       WeightStream)
from .epilogue import Epilogue
from .machine import CUDA, METAL, TARGETS, Target
from .targets import emit
from .targets.cuda.tuning import multistage_schedule, tuned_schedule
from ._version import __version__

__all__ = [
    "CUDA", "DoubleBuffered", "Epilogue", "FusedDequant", "Gemm", "METAL", "Multistage", "Schedule", "StripedKParallel", "Warpgroup",
    "WeightStream",
    "ScheduleError", "multistage_schedule", "tuned_schedule",
    "TARGETS", "Target", "emit", "BUILTIN_FORMATS", "BlockPatternSparsity", "FloatEncoding", "Format", "FormatError",
    "GroupBias", "GroupScale", "IntEncoding", "MarlinDSLError", "NMSparsity", "PackedWeights", "Packing",
    "QuantizedWeights", "Scaling", "ShapeError", "SpecError", "SuperBlockScale", "TableEncoding", "TwoLevelScale", "ValueRangeError",
    "ZeroPoint", "builtin_format", "dequantize", "pack", "pack_codes", "pack_fp4_2of4_weights",
    "pack_fp4_blockpattern_weights", "pack_fp4_weights", "pack_int4_2of4_weights",
    "pack_int4_weights", "pack_nf4_weights", "pack_uint4_zp_weights", "prune", "quantize",
    "reference_matmul", "unpack", "validate",
]
