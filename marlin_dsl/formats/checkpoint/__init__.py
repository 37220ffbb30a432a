"""The storage vocabulary: how checkpoints of the ecosystem (GGUF, GPTQ, AWQ, bitsandbytes)
lay out a weight, declared as data (words.py, records.py, layout.py), and their catalogue
(catalog.py). Reading a checkpoint gives the kernel format's QuantizedWeights."""
from .catalog import AWQ_ORDER, BNB_FP4, BNB_NF4, GGUF_TYPES, awq, bnb, gguf_format, gptq
from .layout import CheckpointFormat, GroupIndex, Imported, Packed, Plain, QuantizedScales, Records
from .records import Bits, Record, Scalar, Slice, plane, run
from .words import Words

__all__ = ["AWQ_ORDER", "BNB_FP4", "BNB_NF4", "Bits", "CheckpointFormat", "GGUF_TYPES", "GroupIndex", "Imported",
           "Packed", "Plain", "QuantizedScales", "Record", "Records", "Scalar", "Slice", "Words", "awq", "bnb",
           "gguf_format", "gptq", "plane", "run"]
