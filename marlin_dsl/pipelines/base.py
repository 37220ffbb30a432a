"""The `Pipeline` protocol and the registry of pipelines (kind -> class), as `PASSES` is for
passes.

A pipeline is a frozen dataclass that says how a threadgroup's K loop is arranged. It owns its
fields' validation (`validate`, called when a `Schedule` is built), the threads it needs
(`warps`), and its checks against a format and a target (`check`, called when a Gemm is
compiled). Its lowering is registered by `kind` in `marlin_dsl/lowering/pipelines.py`. The
schedule is seen through `ScheduleShape` so that this package needs no import of
`schedule.py` (which imports it).
"""
from __future__ import annotations

from typing import Protocol, TypeVar, runtime_checkable

from ..errors import ScheduleError, SourceLocation
from ..formats import Format
from ..machine.target import Target


class ScheduleShape(Protocol):
    """What a pipeline reads of its schedule (`schedule.Schedule` has all of it)."""

    name: str
    tile_m: int
    tile_n: int
    tile_k: int
    warps_m: int
    warps_n: int
    location: SourceLocation | None

    @property
    def warp_tile(self) -> tuple[int, int]: ...


@runtime_checkable
class Pipeline(Protocol):
    """How a threadgroup's K loop is arranged; see the module docstring."""

    kind: str
    # A pipeline whose epilogue writes Y's columns as several outputs (`Gemm.outputs`) says
    # so with a class attribute `splits_outputs = True`; without it, one output.

    def validate(self, schedule: ScheduleShape) -> None:
        """Raise ScheduleError (at the schedule's line) if the pipeline's fields, or the
        schedule's fields this pipeline constrains, are invalid."""

    def warps(self, schedule: ScheduleShape) -> int:
        """Warps of a threadgroup under this pipeline."""

    def check(self, schedule: ScheduleShape, fmt: Format, target: Target) -> None:
        """Raise ScheduleError if the schedule cannot run `fmt` on `target` with this pipeline
        (the schedule's generic checks, such as the thread limit, follow)."""


def splits_outputs(pipeline: object) -> bool:
    """Whether the pipeline's epilogue writes Y's columns as several outputs (`Gemm.outputs`):
    its class says so with `splits_outputs = True`."""
    return bool(getattr(pipeline, "splits_outputs", False))


def applies_epilogue(pipeline: object) -> bool:
    """Whether the pipeline's epilogue applies a Gemm's `Epilogue` (bias, gate, residual): its
    class says so with `applies_epilogue = True`."""
    return bool(getattr(pipeline, "applies_epilogue", False))


#: kind -> pipeline class; filled by `register_pipeline` when `marlin_dsl.pipelines` is imported.
PIPELINES: dict[str, type] = {}

P = TypeVar("P", bound=type)


def register_pipeline(cls: P) -> P:
    """Class decorator: make a pipeline known under its `kind` (the lowering registry and the
    spec loader find it there)."""
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"{cls.__name__} has no kind")
    if kind in PIPELINES and PIPELINES[kind] is not cls:
        raise ValueError(f"pipeline kind {kind!r} is registered twice ({PIPELINES[kind].__name__}, {cls.__name__})")
    PIPELINES[kind] = cls
    return cls


def is_positive_int(value: object) -> bool:
    """A positive int that is not a bool (booleans are not integers in declarations)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def require_positive(schedule: ScheduleShape, kind: str, pipeline: object, attrs: tuple[str, ...]) -> None:
    """Each of `attrs` of `pipeline` is a positive integer, else ScheduleError."""
    for attr in attrs:
        value = getattr(pipeline, attr)
        if not is_positive_int(value):
            raise ScheduleError(f"schedule {schedule.name!r}: {kind} {attr} must be a "
                                f"positive integer, got {value!r}", schedule.location)


__all__ = ["PIPELINES", "Pipeline", "ScheduleShape", "is_positive_int", "register_pipeline", "require_positive",
           "splits_outputs", "applies_epilogue"]
