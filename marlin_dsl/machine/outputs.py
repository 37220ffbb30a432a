"""The names of a GEMM kernel's outputs: y, or y0, y1, ... where Y comes out as several parts
(`Gemm.outputs`). It is a convention of the kernel's interface, shared by two ends that must not
import each other: the lowering, which names the output buffers (`lowering/parts/shell.py`), and
every executor that binds them (the launchers, `kernel_args.py`, `layers/dispatch.py`). So it
sits here, at the bottom beside the target descriptions, and imports nothing above the errors.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..errors import ShapeError


def output_names(outputs: tuple[int, ...] | list[int]) -> list[str]:
    """The output buffers of a GEMM kernel whose Y comes out as parts of these widths
    (`Gemm.outputs`): y, or y0, y1, ... (every launcher and the lowering name them so)."""
    return [f"y{i}" for i in range(len(outputs))] if outputs else ["y"]


def y_columns(attrs: Mapping[str, Any], name: str, n: int, arg: str) -> dict[str, int]:
    """The outputs of kernel `name` (its `attrs`) that hold Y [M, N_out] and the columns of
    each: {"y": N_out}, or the parts {"y0": w0, "y1": w1, ...} (`Gemm.outputs`), side by side in
    that order; ShapeError where the parts do not add up to the N of argument `arg`. N_out is
    N, or N / 2 for a gated epilogue (`out_columns`)."""
    widths = tuple(int(w) for w in attrs.get("outputs", ()))
    if widths and sum(widths) != n:
        raise ShapeError(f"{arg}: N={n}, but kernel {name!r} writes outputs of {list(widths)} "
                         f"columns (N={sum(widths)})")
    return dict(zip(output_names(widths), widths or (out_columns(steps_of(attrs), n, arg),)))


# ----- the epilogue's interface (marlin_dsl/epilogue.py declares it; docs/SPEC.md) ---------------

#: Activations a gated epilogue may apply.
GATES = ("silu", "gelu_tanh")
#: Columns of one gate (or up) run in a gated GEMM's interleaved order; a pair is 2 * GATE_ROWS.
GATE_ROWS = 8


def steps_of(attrs: Mapping[str, Any]) -> tuple[str, ...]:
    """A kernel's epilogue steps from its attributes (() for none)."""
    return tuple(str(s) for s in attrs.get("epilogue", ()))


def epilogue_inputs(steps: tuple[str, ...]) -> list[str]:
    """The kernel inputs an epilogue of these steps reads, in the kernel's order (after the
    format's arrays)."""
    return [name for name in ("bias", "residual") if name in steps]


def gated(steps: tuple[str, ...]) -> bool:
    """Whether the steps include a gate (Y has half the GEMM's columns)."""
    return any(s in GATES for s in steps)


def out_columns(steps: tuple[str, ...], n: int, arg: str = "N") -> int:
    """Y's columns for a GEMM of N columns: N, or N / 2 with a gate (N a multiple of 16)."""
    if not gated(steps):
        return n
    if n % (2 * GATE_ROWS):
        raise ShapeError(f"{arg}: N={n} with a gated epilogue must be a multiple of {2 * GATE_ROWS} "
                         f"(gate and up columns interleaved in runs of {GATE_ROWS}; pad with zero columns)")
    return n // 2
