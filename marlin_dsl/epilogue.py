"""What a Gemm does to its product before it writes Y: the epilogue, declared as data.

    Gemm("mlp_up", fp4, schedule, epilogue=Epilogue(gate="silu"))
    Gemm("down", fp4, schedule, epilogue=Epilogue(residual=True))

The steps run in this order on the f32 sums of each output, and Y is rounded once, at the end:

1. `bias`: + bias[n] (a vector of N, the activation type);
2. `gate`: the GEMM's columns are (gate, up) pairs and Y has half as many columns,
   Y[m, j] = act(G[m, j]) * U[m, j] with act silu or gelu_tanh (GELU's tanh form, as
   `mlx.nn.gelu_approx` and PyTorch's approximate="tanh"). The pairs are interleaved in groups of
   `GATE_ROWS` columns: columns 16b .. 16b + 7 are gates b*8 .. b*8 + 7, columns 16b + 8 ..
   16b + 15 the ups of the same outputs (`gate_interleave` builds the order). Eight rows is what
   every target's C lane tables share: CUDA's m16n8 C tile gives a lane rows g and g + 8, Metal's
   8x8 tile one row per tile, so a pipeline that keeps the accumulators in registers can pair
   them without shared memory. N is a multiple of 16 (pad the fused weight with zero columns);
3. `residual`: + residual[m, j] (an [M, N_out] array, the activation type: the block's
   input, whose sum with this product is the block's output).

The kernel's extra inputs are named by `epilogue_inputs` (bias, then residual, after the
format's arrays); its output y has `out_columns(N)` columns. The unfused composition rounds
after every step (the GEMM's Y, the activation, the product, the sum); the epilogue rounds once,
so it is the more accurate of the two and is checked against the float64 composition.

Which pipelines apply an epilogue: those whose class says `applies_epilogue = True`: the weight
stream (the decode; its epilogue holds the whole tile in shared memory) and the multistage
pipeline (each lane applies it to its own elements; a gate there needs the target's C lane
table to give a lane rows 8 apart: CUDA's m16n8, not Metal's 8x8).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from .errors import ScheduleError, ShapeError, SourceLocation
from .machine.outputs import GATE_ROWS, GATES, epilogue_inputs, gated, out_columns, steps_of
from .source import caller_location


@dataclass(frozen=True)
class Epilogue:
    """See the module docstring. All fields off: no epilogue (Gemm takes None for that)."""

    bias: bool = False
    gate: Literal["silu", "gelu_tanh"] | None = None
    residual: bool = False
    location: SourceLocation | None = field(default=None, compare=False, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        if self.location is None:
            object.__setattr__(self, "location", caller_location())
        for name in ("bias", "residual"):
            if not isinstance(getattr(self, name), bool):
                raise ScheduleError(f"Epilogue {name} must be True or False, got {getattr(self, name)!r}",
                                    self.location)
        if self.gate is not None and self.gate not in GATES:
            raise ScheduleError(f"Epilogue gate must be None or one of {', '.join(map(repr, GATES))}, "
                                f"got {self.gate!r}", self.location)
        if not self.steps:
            raise ScheduleError("Epilogue() does nothing: set bias, gate or residual (or pass "
                                "epilogue=None)", self.location)

    @classmethod
    def from_steps(cls, steps: tuple[str, ...]) -> "Epilogue":
        """The Epilogue whose `steps` these are (a kernel's `epilogue` attribute)."""
        gate = [s for s in steps if s in GATES]
        unknown = [s for s in steps if s not in (*GATES, "bias", "residual")]
        if unknown or len(gate) > 1 or tuple(steps) != cls(bias="bias" in steps, gate=gate[0] if gate else None,
                                                             residual="residual" in steps).steps:
            raise ScheduleError(f"epilogue steps {list(steps)}: expected [bias] [silu | gelu_tanh] [residual], "
                                "in that order")
        return cls(bias="bias" in steps, gate=gate[0] if gate else None, residual="residual" in steps)

    @property
    def steps(self) -> tuple[str, ...]:
        """The steps in the order they run: what the kernel's `epilogue` attribute records."""
        return (*(("bias",) if self.bias else ()), *((self.gate,) if self.gate else ()),
                *(("residual",) if self.residual else ()))


def gate_interleave(columns: int) -> np.ndarray:
    """The column order of a fused [K, 2 * columns] gate/up weight: entry i is the column of
    [gate | up] (side by side) that goes to position i. `columns` a multiple of GATE_ROWS."""
    if columns % GATE_ROWS:
        raise ShapeError(f"gate/up: {columns} columns per part, not a multiple of {GATE_ROWS}")
    j = np.arange(columns).reshape(-1, GATE_ROWS)
    return np.stack([j, j + columns], axis=1).reshape(-1)


def reference_epilogue(steps: tuple[str, ...], y: np.ndarray, bias: np.ndarray | None = None,
                       residual: np.ndarray | None = None) -> np.ndarray:
    """The epilogue in float64 on a product y [M, N] (interleaved columns for a gate)."""
    out = np.asarray(y, dtype=np.float64)
    if "bias" in steps:
        out = out + np.asarray(bias, dtype=np.float64)[None, :]
    gate = next((s for s in steps if s in GATES), None)
    if gate is not None:
        m, n = out.shape
        pairs = out.reshape(m, n // (2 * GATE_ROWS), 2, GATE_ROWS)
        g, u = pairs[:, :, 0, :].reshape(m, -1), pairs[:, :, 1, :].reshape(m, -1)
        out = activation(gate, g) * u
    if "residual" in steps:
        out = out + np.asarray(residual, dtype=np.float64)
    return out


def activation(gate: str, g: np.ndarray) -> np.ndarray:
    """silu or GELU's tanh form, float64."""
    if gate == "silu":
        return g / (1.0 + np.exp(-g))
    return 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g ** 3)))


__all__ = ["Epilogue", "GATES", "GATE_ROWS", "activation", "epilogue_inputs", "gate_interleave", "gated",
           "out_columns", "reference_epilogue", "steps_of"]
