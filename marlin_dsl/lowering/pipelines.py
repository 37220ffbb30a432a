"""Which lowering builds a Gemm's kernel: the registry of pipeline lowerings, by pipeline kind
(the kinds of `marlin_dsl.pipelines.PIPELINES`).

`lower_gemm` creates the lowering context once (`parts/context.py`: builder, gemm, format,
schedule, target, types; it checks the schedule) and hands it to the pipeline's lowering, a
class assembled from the shared parts (`lowering/parts/`) with one `lower()`.
"""
from __future__ import annotations

from typing import Callable, Protocol

from ..ir import Kernel
from ..machine.target import Target
from ..schedule import Gemm
from .multistage import MultistageLowering
from .parts.context import GemmContext
from .staged import DoubleBufferedLowering, FusedDequantLowering, StripedLowering
from .warpgroup import WarpgroupLowering
from .warpgroup_roles import WarpgroupRolesLowering
from .weight_stream import WeightStreamLowering
from .weight_stream_skip import WeightStreamSkipLowering


class Lowering(Protocol):
    def lower(self) -> Kernel: ...


#: pipeline kind -> the lowering of its kernels (constructed with the lowering context).
LOWERINGS: dict[str, Callable[[GemmContext], Lowering]] = {
    "double_buffered": DoubleBufferedLowering,
    "fused_dequant": FusedDequantLowering,
    "striped": StripedLowering,
    # skipping empty blocks: the same step over each block's stored vectors (weight_stream_skip.py)
    "weight_stream": lambda ctx: (WeightStreamSkipLowering if ctx.pipeline.skip_empty else WeightStreamLowering)(ctx),
    "multistage": MultistageLowering,
    # with producer warpgroups the warps specialise (warpgroup_roles.py)
    "warpgroup": lambda ctx: (WarpgroupRolesLowering if ctx.pipeline.producers else WarpgroupLowering)(ctx),
}


def lower_gemm(gemm: Gemm, target: Target) -> Kernel:
    """Lower one Gemm to verified kernel IR for `target`."""
    ctx = GemmContext(gemm, target)
    return LOWERINGS[ctx.pipeline.kind](ctx).lower()


__all__ = ["LOWERINGS", "Lowering", "lower_gemm"]
