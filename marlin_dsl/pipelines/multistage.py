"""The multistage pipeline (`Multistage`, large M): the stream layout's weights and the
activation tile staged in shared (threadgroup) memory, copied asynchronously with several K
steps in flight where the target has asynchronous copies (CUDA), else through registers, one
step ahead (Metal). Lowered by `lowering/multistage.py`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from ..errors import ScheduleError
from ..formats import Format
from ..machine.target import Target
from .base import ScheduleShape, is_positive_int, register_pipeline
from .weight_stream import check_stream


@register_pipeline
@dataclass(frozen=True)
class Multistage:
    """Marlin's large-M mode: the weight-stream product and physical layout (Y^T = W^T X^T,
    weights as the MMA's A operand, each lane's fragments for several K tiles in one 128-bit
    vector), with the threadgroup's weight vectors and its activation tile copied into shared
    memory asynchronously, `stages` K steps in flight (cp.async groups on CUDA). A target
    without asynchronous copies (`Target.async_copy_bytes` = 0: Metal) loads the next step
    into registers while the current one computes and stores it into one of `stages` - 1
    threadgroup buffers: stages = 2, one buffer and two barriers a step (MLX's steel
    loaders); stages = 3, two buffers and one barrier (more buffers would hold no further
    step: the registers are the only stage in flight). Each warp
    decodes its A fragments once per K tile and reuses them across all its M tiles, so large
    tiles amortise the decode; activations are read from shared memory as each lane's
    contiguous run (the layout's K shuffle) instead of once per N tile from device memory.

    Schedule fields: tile_n N rows and tile_m M rows per threadgroup, split over warps_n x
    warps_m warps (tile_n/warps_n a multiple of the MMA's M, tile_m/warps_m of its N), tile_k
    the dense K of one step (the layout's vector chunk, or a multiple of it inside one scale
    group: then a step stages that many consecutive vectors and loads its scales once; so
    Metal's 128-position step is two CUDA vectors)."""

    stages: int = 3
    kind: Literal["multistage"] = "multistage"
    #: Its epilogue applies a Gemm's `Epilogue` on each lane's elements (LaneStore; a gate needs
    #: the target's C lane table to pair rows 8 apart in a lane: CUDA's m16n8, not Metal's 8x8).
    applies_epilogue: ClassVar[bool] = True

    def validate(self, schedule: ScheduleShape) -> None:
        if not is_positive_int(self.stages) or not 2 <= self.stages <= 8:
            raise ScheduleError(f"schedule {schedule.name!r}: multistage stages must be an integer "
                                f"2..8 (K steps in flight plus the one computing), got {self.stages!r}",
                                schedule.location)

    def warps(self, schedule: ScheduleShape) -> int:
        return schedule.warps_m * schedule.warps_n

    def check(self, schedule: ScheduleShape, fmt: Format, target: Target) -> None:
        if not target.async_copy_bytes and self.stages > 3:
            raise ScheduleError(f"schedule {schedule.name!r}: {target.name} has no asynchronous copies "
                                "(Target.async_copy_bytes), so multistage stages one K step through "
                                "registers into stages - 1 threadgroup buffers: stages must be 2 (one "
                                f"buffer) or 3 (two buffers), got {self.stages}", schedule.location)
        check_stream(schedule, self.kind, fmt, target, vectors=True)


__all__ = ["Multistage"]
