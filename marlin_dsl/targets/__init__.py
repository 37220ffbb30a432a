"""Targets, one folder each behind one protocol (`base.Target`): `metal/` and `cuda/` hold a
target's description, printer, launcher and runtime. Importing this package registers them in
`TARGETS`; `emit(kernel, target)` prints a kernel for any of them."""
from . import cuda, metal
from .base import ROW_MAJOR, TARGETS, Launcher, SparseMetadataFields, Source, Target, emit, reader_of, register

METAL = metal.METAL
CUDA = cuda.CUDA

__all__ = ["CUDA", "METAL", "ROW_MAJOR", "TARGETS", "Launcher", "SparseMetadataFields", "Source", "Target",
           "emit", "reader_of", "register"]
