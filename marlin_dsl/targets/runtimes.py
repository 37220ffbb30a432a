"""The runtime of every target (`TargetRuntime`: shipping files, native checks of the shipped
text, layer launches), by target name. The runtimes sit above the compiler, so the package face
(`targets/__init__.py`, which registers the printers for `emit`) does not import them; the CLI
and the layers look them up here."""
from __future__ import annotations

from ..errors import MarlinDSLError
from ..machine.target import Target
from .base import TargetRuntime
from .cuda.runtime import RUNTIME as CUDA_RUNTIME
from .metal.runtime import RUNTIME as METAL_RUNTIME

RUNTIMES: dict[str, TargetRuntime] = {r.target.name: r for r in (METAL_RUNTIME, CUDA_RUNTIME)}


def runtime_for(target: Target | str) -> TargetRuntime:
    """The runtime of a target (or of a target name, as users spell backends)."""
    name = target if isinstance(target, str) else target.name
    if name not in RUNTIMES:
        raise MarlinDSLError(f"no runtime for target {name!r}; known: {sorted(RUNTIMES)}")
    return RUNTIMES[name]


__all__ = ["RUNTIMES", "runtime_for"]
