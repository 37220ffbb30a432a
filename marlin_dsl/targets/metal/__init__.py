"""The Metal target above the compiler (its description, `METAL`, is data in
`marlin_dsl/machine/metal.py`): printer (`printer.py`, Metal Shading Language for
`mx.fast.metal_kernel`), the files a kernel ships as (`ship.py`: .metal text and a generated
launcher), the runtime that compiles on first use (`runtime.py`) and the CPU harness that runs
the printed text on Linux (`cpu_harness.py`)."""
from ...machine.metal import METAL
from ..base import register
from .printer import print_metal

register(METAL, print_metal)

__all__ = ["print_metal"]
