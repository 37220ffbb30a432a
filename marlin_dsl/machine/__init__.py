"""Target descriptions, as data: the bottom of the stack (docs/ARCHITECTURE.md).

`target.py` holds the `Target` dataclass and the `TARGETS` registry of descriptions; `cuda/`
and `metal.py` describe each target (MMA shapes, lane tables, sparse metadata, limits);
`outputs.py` names a GEMM kernel's output buffers. The IR's verifier and interpreter, the
layouts, the pipelines, the lowering and the cost model read these and nothing above them;
the printers, launchers and runtimes that make a target run are `marlin_dsl/targets/`.

Importing any module of this package runs this face, which registers every description, so
`TARGETS` is full wherever a `Target` is read.
"""
from .cuda import CUDA
from .metal import METAL
from .target import (ROW_MAJOR, TARGETS, LaneTables, SparseMetadataFields, SwizzledRows, Target, reader_of,
                     register_target)

register_target(CUDA)
register_target(METAL)

__all__ = ["CUDA", "LaneTables", "METAL", "ROW_MAJOR", "SparseMetadataFields", "SwizzledRows", "TARGETS", "Target",
           "reader_of", "register_target"]
