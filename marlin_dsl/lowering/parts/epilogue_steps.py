"""The arithmetic of a Gemm's `Epilogue` (marlin_dsl/epilogue.py) on one output's f32 sum:
bias, the gated activation, the residual add. A pipeline's epilogue calls these where it holds
an output's value (the weight stream: after the K-warp reduction, `parts/epilogues.py`); they
emit scalar f32 IR and loads of the `bias` and `residual` buffers, predicated like the store.

The activations are built from the IR's exp2 and recip (docs/IR.md):
silu(g) = g / (1 + 2^(-g log2 e)); gelu_tanh(g) = g - g / (1 + 2^(2 log2 e z)), with
z = sqrt(2/pi) (g + 0.044715 g^3), which is 0.5 g (1 + tanh z) written so that a large |z|
gives g or 0 (2^(..) overflows to inf, its reciprocal to 0) instead of inf / inf."""
from __future__ import annotations

import math
from typing import Callable

from ...ir import F32, Value
from ...machine.outputs import GATE_ROWS
from .context import GemmParts

_LOG2E = 1.0 / math.log(2.0)
_GELU_C = math.sqrt(2.0 / math.pi)


class EpilogueSteps(GemmParts):
    """Epilogue arithmetic for the lowerings (mixed into a pipeline's epilogue part)."""

    @property
    def epilogue_steps(self) -> tuple[str, ...]:
        epilogue = self.gemm.epilogue
        return epilogue.steps if epilogue is not None else ()

    def f32(self, value: float) -> Value:
        return self.b.const(value, F32)

    def add_bias(self, v: Value, gn: Value, ok: Value | None) -> Value:
        """v + bias[gn] (read where `ok`)."""
        bias = self.b.load("bias", gn, self.act, ok, hint="bv")
        return self.op2("add", v, self.b.cast(bias, F32, hint="bv"), hint="ep")

    def add_residual(self, v: Value, index: Value, ok: Value | None) -> Value:
        """v + residual[index] (read where `ok`)."""
        r = self.b.load("residual", index, self.act, ok, hint="rv")
        return self.op2("add", v, self.b.cast(r, F32, hint="rv"), hint="ep")

    def store_pair(self, gate: str, g: Value, u: Value, ok: Value, gate_n: Callable[[], Value],
                   index: Callable[[], Value]) -> None:
        """Y[index] = act(g + bias[gate_n]) * (u + bias[gate_n + 8]) (+ residual[index]), rounded
        once, where `ok`: the gated output of one (gate, up) pair, however a pipeline holds it.
        `gate_n` and `index` emit their IR when needed (the bias's row first, Y's index after
        the activation), so every pipeline's text keeps one order."""
        steps = self.epilogue_steps
        if "bias" in steps:
            n = gate_n()
            g = self.add_bias(g, n, ok)
            u = self.add_bias(u, self.op2("add", n, GATE_ROWS, hint="yn"), ok)
        v = self.op2("mul", self.activate(gate, g), u, hint="ep")
        at = index()
        if "residual" in steps:
            v = self.add_residual(v, at, ok)
        self.b.store("y", at, self.b.cast(v, self.act, hint="yv"), ok)

    def activate(self, gate: str, g: Value) -> Value:
        """silu(g) or gelu_tanh(g), f32."""
        b = self.b
        if gate == "silu":
            e = b.value("exp2", [self.op2("mul", g, self.f32(-_LOG2E), hint="ea")], F32, hint="ea")
            return self.op2("mul", g, b.value("recip", [self.op2("add", e, self.f32(1.0), hint="ea")], F32,
                                              hint="ea"), hint="act")
        g2 = self.op2("mul", g, g, hint="ea")
        inner = self.op2("mul", g, b.value("fma", [g2, self.f32(0.044715), self.f32(1.0)], F32, hint="ea"),
                         hint="ea")  # g + 0.044715 g^3
        e = b.value("exp2", [self.op2("mul", inner, self.f32(2.0 * _GELU_C * _LOG2E), hint="ea")], F32, hint="ea")
        low = self.op2("mul", g, b.value("recip", [self.op2("add", e, self.f32(1.0), hint="ea")], F32, hint="ea"),
                       hint="ea")
        return self.op2("sub", g, low, hint="act")


__all__ = ["EpilogueSteps"]
