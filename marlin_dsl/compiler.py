"""The compiler driver: spec -> lowering -> IR -> passes (-> printers, per target)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from .errors import UsageError
from .ir import Kernel
from .lowering.dequantize import dequantize_gemm, lower_dequantize
from .lowering.pipelines import lower_gemm
from .passes import DEFAULT_PIPELINE, PASSES, PassManager, build_pipeline
from .formats import Format
from .schedule import Gemm
from .machine.target import Target

#: The name under which the IR straight out of lowering is dumped.
LOWER_STAGE = "lower"

Dump = Callable[[str, Kernel, list[str]], None]


@dataclass
class CompiledGemm:
    gemm: Gemm
    target: Target
    kernel: Kernel
    notes: list[str] = field(default_factory=list)
    stages: list[str] = field(default_factory=list)  # lower + the passes that ran


def pipeline_names(passes: Sequence[str] | None, stop_after: str | None) -> list[str]:
    """The pass names to run: `passes` (default pipeline) cut after `stop_after`."""
    names = list(DEFAULT_PIPELINE if passes is None else passes)
    for name in names:
        if name not in PASSES:
            raise UsageError(f"unknown pass {name!r}; passes: {', '.join(sorted(PASSES))}")
    if stop_after is None:
        return names
    if stop_after == LOWER_STAGE:
        return []
    if stop_after not in names:
        raise UsageError(f"--stop-after {stop_after!r} is not in the pipeline "
                             f"({', '.join([LOWER_STAGE, *names])})")
    return names[: names.index(stop_after) + 1]


def compile_gemm(gemm: Gemm, target: Target, passes: Sequence[str] | None = None,
                 stop_after: str | None = None, dump: Dump | None = None) -> CompiledGemm:
    """Lower one Gemm for `target` and run the pass pipeline, dumping after each stage.

    A schedule that declares `targets=` without `target` is refused (ScheduleError at its
    spec line), before anything is lowered."""
    gemm.schedule.check_target(target, gemm.name)
    build_pipeline([])  # importing the passes fills the registry
    names = pipeline_names(passes, stop_after)
    kernel = lower_gemm(gemm, target)
    if dump is not None:
        dump(LOWER_STAGE, kernel, [])
    notes = PassManager(names, dump=dump).run(kernel)
    return CompiledGemm(gemm, target, kernel, notes, [LOWER_STAGE, *names])


def compile_dequantize(fmt: Format, activation: str, target: Target) -> CompiledGemm:
    """The dequantize kernel of `fmt` (`lowering/dequantize.py`: the stream layout decoded to
    W^T [N, K] in the activation type) for `target`, through the default passes. ScheduleError
    where the target or format has none (`dequantize_supported` says why)."""
    build_pipeline([])  # importing the passes fills the registry
    names = pipeline_names(None, None)
    kernel = lower_dequantize(fmt, activation, target)
    notes = PassManager(names).run(kernel)
    return CompiledGemm(dequantize_gemm(fmt, activation, target), target, kernel, notes, [LOWER_STAGE, *names])
