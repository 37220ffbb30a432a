"""Tiling schedules and the GEMMs a spec asks the compiler to build. A schedule is
target-neutral unless it declares `targets=`: the targets it is meant for (a schedule tuned to
one target's MMA or lane layout), which `compile --target` and `compile_gemm` honour."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .errors import ScheduleError, SourceLocation
from .formats import Format
# The pipelines live in marlin_dsl/pipelines/ (one module each, registered by kind); their
# classes stay importable from here.
from .pipelines import (PIPELINES, DoubleBuffered, FusedDequant, Multistage, Pipeline, StripedKParallel, Warpgroup,
                        WeightStream, applies_epilogue, splits_outputs)
from .epilogue import Epilogue
from .machine.outputs import GATE_ROWS
from .machine.target import TARGETS, Target
from .source import caller_location, record_declaration


def _located(obj: object) -> None:
    if getattr(obj, "location", None) is None:
        object.__setattr__(obj, "location", caller_location())


@dataclass(frozen=True)
class Schedule:
    """A threadgroup computes a tile_m x tile_n output tile, stepping K by tile_k; its warps
    are laid out warps_m x warps_n, each owning a (tile_m/warps_m) x (tile_n/warps_n) tile,
    which the target covers with its MMA shape. Threads = 32 * warps_m * warps_n.

    `targets`: the names of the targets it is meant for (None: every target). A Gemm whose
    schedule does not declare a target is not compiled for it: `compile --target` lists it as
    skipped, `compile_gemm` refuses it."""

    name: str
    tile_m: int = 64
    tile_n: int = 64
    tile_k: int = 32
    warps_m: int = 2
    warps_n: int = 2
    pipeline: Pipeline = field(default_factory=DoubleBuffered)
    targets: tuple[str, ...] | None = field(default=None, kw_only=True)
    location: SourceLocation | None = field(default=None, compare=False, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        _located(self)
        object.__setattr__(self, "targets", _checked_targets(self.name, self.targets, self.location))
        for attr in ("tile_m", "tile_n", "tile_k", "warps_m", "warps_n"):
            value = getattr(self, attr)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ScheduleError(f"schedule {self.name!r}: {attr} must be a positive "
                                         f"integer, got {value!r}", self.location)
        for tile, warps in (("tile_m", "warps_m"), ("tile_n", "warps_n")):
            if getattr(self, tile) % getattr(self, warps):
                raise ScheduleError(
                    f"schedule {self.name!r}: {tile}={getattr(self, tile)} is not divisible by "
                    f"{warps}={getattr(self, warps)}", self.location)
        if not isinstance(self.pipeline, Pipeline) or PIPELINES.get(self.pipeline.kind) is not type(self.pipeline):
            raise ScheduleError(f"schedule {self.name!r}: pipeline must be one of "
                                f"{', '.join(cls.__name__ for cls in PIPELINES.values())}, got "
                                f"{self.pipeline!r}", self.location)
        self.pipeline.validate(self)

    @property
    def warps(self) -> int:
        """Warps of a threadgroup: warps_m x warps_n, times what the pipeline adds (the
        weight stream's k_warps)."""
        return self.pipeline.warps(self)

    def threads(self, target: Target) -> int:
        return self.warps * target.warp_size

    @property
    def warp_tile(self) -> tuple[int, int]:
        return self.tile_m // self.warps_m, self.tile_n // self.warps_n

    def mma_grid(self, target: Target) -> tuple[int, int]:
        """How many MMA tiles (rows, cols) each warp owns on `target`."""
        wm, wn = self.warp_tile
        return wm // target.mma_m, wn // target.mma_n

    def k_substeps(self, target: Target) -> int:
        return self.tile_k // target.mma_k

    def runs_on(self, target: Target) -> bool:
        """Whether the schedule is meant for `target` (it declares no targets, or names it)."""
        return self.targets is None or target.name in self.targets

    def check_target(self, target: Target, gemm: str | None = None) -> None:
        """Raise ScheduleError (at the schedule's spec line) if the schedule does not declare
        `target`: a schedule restricted to other targets is never compiled for it."""
        if not self.runs_on(target):
            who = f"gemm {gemm!r}: " if gemm is not None else ""
            raise ScheduleError(
                f"{who}schedule {self.name!r} declares targets={self.targets!r}, so it is not "
                f"compiled for {target.name}; compile it for one of those, or use a schedule that "
                f"declares {target.name!r} (or no targets)", self.location)

    def check(self, fmt: Format, target: Target) -> None:
        """Raise ScheduleError (at the schedule's spec line) if it cannot run: its declared
        targets, the pipeline's own checks, then the generic ones."""
        self.check_target(target)
        self.pipeline.check(self, fmt, target)
        threads = self.threads(target)
        if threads > target.max_threads:
            raise ScheduleError(
                f"schedule {self.name!r}: {threads} threads per threadgroup exceed "
                f"{target.name}'s limit of {target.max_threads}", self.location)


@dataclass(frozen=True)
class Gemm:
    """Y[M, N] = X[M, K] @ W[K, N] with W in `format`, X and Y in `activation` (f16 or bf16).

    `outputs`: Y's columns written as separate arrays y0, y1, ... of these widths (N is their
    sum), for sibling layers fused into one GEMM (q/k/v): each part comes out of the kernel as
    its own array, with no split after it. Empty: one output, y. Only pipelines whose epilogue
    writes parts (`splits_outputs`, the weight stream) take it.

    `epilogue`: bias, a gated activation and a residual add applied before Y is written
    (`marlin_dsl/epilogue.py`); only pipelines that apply one (`applies_epilogue`) take it."""

    name: str
    format: Format
    schedule: Schedule
    activation: Literal["f16", "bf16"] = "f16"
    outputs: tuple[int, ...] = ()
    epilogue: Epilogue | None = None
    location: SourceLocation | None = field(default=None, compare=False, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        _located(self)
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ScheduleError(f"Gemm name must be an identifier (it names kernels and files), "
                                f"got {self.name!r}", self.location)
        if not isinstance(self.format, Format) or not isinstance(self.schedule, Schedule):
            raise ScheduleError(f"gemm {self.name!r}: needs a Format and a Schedule", self.location)
        if self.activation not in ("f16", "bf16"):
            raise ScheduleError(f"gemm {self.name!r}: activation must be 'f16' or 'bf16', "
                                     f"got {self.activation!r}", self.location)
        check_outputs(self.name, self.outputs, self.schedule, self.location)
        check_epilogue(self.name, self.epilogue, self.outputs, self.schedule, self.location)
        record_declaration(self)


def known_target_names() -> list[str]:
    """The names of the registered targets, sorted (what `targets=` may name; the machine
    package registers every description when it is imported)."""
    return sorted(TARGETS)


def _checked_targets(name: str, targets: object, location: SourceLocation | None) -> tuple[str, ...] | None:
    """`targets` of schedule `name` as a tuple of distinct known target names (a list is
    accepted), or None (every target); else ScheduleError at `location`."""
    if targets is None:
        return None
    known = known_target_names()
    # a lone string is the likely slip: suggest it as a one-element tuple
    example = f"targets=({(targets if isinstance(targets, str) else (known or ['...'])[0])!r},)"
    if isinstance(targets, str) or not isinstance(targets, (tuple, list)) or not targets:
        raise ScheduleError(f"schedule {name!r}: targets must be a non-empty tuple of target names "
                            f"such as {example} (or None: every target), got {targets!r}", location)
    for t in targets:
        if t not in known:
            raise ScheduleError(f"schedule {name!r}: unknown target {t!r} in targets; the targets "
                                f"are {', '.join(map(repr, known))}", location)
    if len(set(targets)) < len(targets):
        raise ScheduleError(f"schedule {name!r}: targets {tuple(targets)!r} names a target twice", location)
    return tuple(targets)


def written_outputs(schedule: Schedule | None, outputs: tuple[int, ...]) -> tuple[int, ...]:
    """The part widths a kernel of `schedule` writes for a request of `outputs`: all of them
    where its pipeline writes parts (`splits_outputs`), else () (one y, which the caller splits)."""
    return outputs if outputs and schedule is not None and splits_outputs(schedule.pipeline) else ()


def check_outputs(name: str, outputs: object, schedule: Schedule, location: SourceLocation | None) -> None:
    """`outputs` of gemm `name` are () or two or more positive widths, and the schedule's
    pipeline writes parts; else ScheduleError at `location`."""
    if outputs == ():
        return
    if (not isinstance(outputs, tuple) or len(outputs) < 2
            or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in outputs)):
        raise ScheduleError(f"gemm {name!r}: outputs must be a tuple of two or more positive column "
                            f"counts (the parts' widths), got {outputs!r}", location)
    if not splits_outputs(schedule.pipeline):
        raise ScheduleError(f"gemm {name!r}: outputs {outputs}: the {schedule.pipeline.kind} pipeline "
                            f"(schedule {schedule.name!r}) writes one output; only "
                            f"{', '.join(k for k, c in PIPELINES.items() if splits_outputs(c))} "
                            "writes parts", location)


def check_epilogue(name: str, epilogue: object, outputs: tuple[int, ...], schedule: Schedule,
                   location: SourceLocation | None) -> None:
    """`epilogue` of gemm `name` is None or an Epilogue its schedule's pipeline applies, not
    with `outputs`, and with a gate on tiles of whole (gate, up) runs; else ScheduleError."""
    if epilogue is None:
        return
    if not isinstance(epilogue, Epilogue):
        raise ScheduleError(f"gemm {name!r}: epilogue must be an Epilogue(...) or None, got {epilogue!r}", location)
    if not applies_epilogue(schedule.pipeline):
        raise ScheduleError(f"gemm {name!r}: epilogue {'+'.join(epilogue.steps)}: the {schedule.pipeline.kind} "
                            f"pipeline (schedule {schedule.name!r}) does not apply epilogues; only "
                            f"{', '.join(k for k, c in PIPELINES.items() if applies_epilogue(c))} does", location)
    if outputs:
        raise ScheduleError(f"gemm {name!r}: an epilogue and outputs {outputs} together: write one "
                            "output, or split without an epilogue", location)
    if epilogue.gate is not None and (schedule.tile_n // schedule.warps_n) % (2 * GATE_ROWS):
        raise ScheduleError(f"gemm {name!r}: a gated epilogue pairs gate and up columns in runs of "
                            f"{GATE_ROWS}, so each warp's N rows (tile_n / warps_n = "
                            f"{schedule.tile_n // schedule.warps_n}) must be a multiple of {2 * GATE_ROWS}",
                            location)


def default_schedule(fmt: Format) -> Schedule:
    """The schedule `quantized_linear` compiles a format with when no spec names one: seed
    002's fused kernel (64x64 tiles, 2x2 warps) with K steps of 32 positions, or of the
    format's K granule when that is larger (so a step holds whole packed units)."""
    from math import lcm

    return Schedule("auto_fused", tile_k=lcm(32, fmt.k_granule), pipeline=FusedDequant())
