"""Which lowering builds a Gemm's kernel: one class per pipeline kind, in a registry.

`GemmLowering` (gemm.py) lowers the seed pipelines (double buffered, fused dequant, striped);
`StreamLowering` (stream.py) and `MultistageLowering` (multistage.py) build on it. This module
is the only one that knows all three, so that the lowerings import downwards only (gemm <-
stream <- multistage <- here) and a new pipeline is one entry here plus its own module.
"""
from __future__ import annotations

from ..ir import Kernel
from ..schedule import Gemm, Multistage, WeightStream
from ..targets import Target
from .gemm import GemmLowering
from .multistage import MultistageLowering
from .stream import StreamLowering

#: Pipeline class -> the lowering of its kernels; pipelines not listed use GemmLowering.
LOWERINGS: dict[type, type[GemmLowering]] = {Multistage: MultistageLowering, WeightStream: StreamLowering}


def lower_gemm(gemm: Gemm, target: Target) -> Kernel:
    """Lower one Gemm to verified kernel IR for `target`."""
    lowering = LOWERINGS.get(type(gemm.schedule.pipeline), GemmLowering)
    return lowering(gemm, target).lower()


__all__ = ["LOWERINGS", "lower_gemm"]
