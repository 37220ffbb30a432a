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
    """The outputs of kernel `name` (its `attrs`) that hold Y [M, N] and the columns of each:
    {"y": N}, or the parts {"y0": w0, "y1": w1, ...} (`Gemm.outputs`), side by side in that
    order; ShapeError where the parts do not add up to the N of argument `arg`."""
    widths = tuple(int(w) for w in attrs.get("outputs", ()))
    if widths and sum(widths) != n:
        raise ShapeError(f"{arg}: N={n}, but kernel {name!r} writes outputs of {list(widths)} "
                         f"columns (N={sum(widths)})")
    return dict(zip(output_names(widths), widths or (n,)))
