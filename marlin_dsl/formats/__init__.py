"""The weight-format DSL: declarative descriptions and everything derived from them."""
from .bitstream import pack_bits, unpack_bits
from .encodings import Encoding, FloatEncoding, IntEncoding, TableEncoding
from .format import BufferSpec, Format, Packing
from .packing import pack_codes, unpack
from .prune import prune
from .quantize import quantize
from .evaluate import dequantize, reference_matmul
from .scaling import PER_COLUMN, GroupAffine, GroupBias, GroupScale, Scaling, SuperBlockScale, TwoLevelScale, ZeroPoint
from .storage import STORAGE_TYPES, StorageType
from .sparsity import BlockPatternSparsity, NMSparsity, pattern_table
from .tensors import PackedWeights, QuantizedWeights
from .validate import validate

__all__ = [
    "BlockPatternSparsity", "BufferSpec", "Encoding", "FloatEncoding", "Format", "GroupAffine", "GroupBias", "GroupScale",
    "IntEncoding", "NMSparsity", "PER_COLUMN", "PackedWeights", "Packing", "QuantizedWeights",
    "STORAGE_TYPES", "Scaling", "SuperBlockScale", "TwoLevelScale", "StorageType", "TableEncoding", "ZeroPoint", "dequantize", "pack_bits", "pack_codes", "pattern_table",
    "prune", "quantize", "reference_matmul", "unpack", "unpack_bits", "validate",
]
