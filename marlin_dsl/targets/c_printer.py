"""What the Metal and CUDA printers share: C-family spelling of SSA values as locals and of
the IR's structured control flow (`for` with carried values, `if`/`switch` with results).

Printing an op is a lookup in the class's `EMITTERS` table, {op name: emitter(self, op, depth)}:
this base table holds the entries every C-family target shares (structured control flow, the
thread coordinates and launch scalars), a target's table adds its own and may override shared
ones. The keys of a target's table are its legal ops: `ir.verify.verify_legal` refuses a kernel
with any other op before printing starts, so a printer never finds an unknown op half-way.

A subclass supplies `target` and `target_title` (for messages), `type_name(type)`,
`declare(depth, value, expr)`, `index_exprs` (the spelling of each `index` kind), `dims_name`,
`index_type` (the spelling of a u32 loop index), `temp_decl` (how a temporary of a parallel
assignment is declared) and its `EMITTERS`; it sets `self.k`, `self.lines`, `self.taken`,
`self.names` and `self.scalar_index` before printing.
"""
from __future__ import annotations

import re
from typing import Any, Callable, ClassVar

from ..errors import CompileError
from ..ir.core import Block, Kernel, Op, Value
from ..ir.types import Type


#: How one op is printed: emitter(printer, op, depth) appends the op's lines.
Emitter = Callable[[Any, Op, int], None]


class CPrinter:
    target = ""
    target_title = ""  # the target's name in prose ("Metal", "CUDA")
    index_type = "uint32_t"
    temp_decl = "auto"
    index_exprs: ClassVar[dict[str, str]] = {}
    dims_name = ""  # the launch-scalar array the kernel reads M, N, K from
    #: op name -> emitter; the keys are the target's legal ops (filled in below the class)
    EMITTERS: ClassVar[dict[str, Emitter]]
    k: Kernel
    lines: list[str]
    taken: set[str]
    names: dict[int, str]
    scalar_index: dict[str, int]

    def type_name(self, t: Type) -> str:
        raise NotImplementedError

    def declare(self, depth: int, v: Value, expr: str) -> None:
        raise NotImplementedError

    def op(self, op: Op, depth: int) -> None:
        emitter = self.EMITTERS.get(op.name)
        if emitter is None:  # verify_legal refuses such kernels before printing
            raise CompileError(f"{self.target}: kernel {self.k.name}: no {self.target_title} for op {op.name}")
        emitter(self, op, depth)

    def refs(self, op: Op) -> list[str]:
        """The printed names of `op`'s operands."""
        return [self.ref(v) for v in op.operands]

    # ----- the shared emitters -------------------------------------------------------------

    def op_index(self, op: Op, depth: int) -> None:
        self.declare(depth, op.result, self.index_exprs[str(op.attrs["kind"])])

    def op_scalar(self, op: Op, depth: int) -> None:
        self.declare(depth, op.result, f"{self.dims_name}[{self.scalar_index[str(op.attrs['name'])]}]")

    def op_yield(self, op: Op, depth: int) -> None:
        # `block` hands every yield to its region's on_yield; one reaching here is misplaced
        raise CompileError(f"{self.target}: kernel {self.k.name}: yield outside a region")

    # ----- names ---------------------------------------------------------------------------

    def _unique(self, base: str) -> str:
        name, n = base, 1
        while name in self.taken:
            name = f"{base}_{n}"
            n += 1
        self.taken.add(name)
        return name

    def define(self, v: Value) -> str:
        name = self._unique("v_" + re.sub(r"\W", "_", v.name))
        self.names[id(v)] = name
        return name

    def ref(self, v: Value) -> str:
        try:
            return self.names[id(v)]
        except KeyError:
            raise CompileError(f"{self.target}: kernel {self.k.name}: %{v.name} used before its "
                               "definition") from None

    def emit(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text)

    # ----- blocks and structured control flow -------------------------------------------------

    def block(self, block: Block, depth: int, on_yield: Callable[[Op, int], None]) -> None:
        for op in block.ops:
            if op.name == "yield":
                on_yield(op, depth)
            else:
                self.op(op, depth)

    def _declare_results(self, op: Op, depth: int) -> list[str]:
        names = []
        for r in op.results:
            name = self.define(r)
            self.emit(depth, f"{self.type_name(r.type)} {name};")
            names.append(name)
        return names

    def _assign(self, targets: list[str], values: list[str], depth: int) -> None:
        pairs = [(t, v) for t, v in zip(targets, values) if t != v]
        if any(v in targets for _, v in pairs):  # parallel assignment through temporaries
            temps = []
            for t, v in pairs:
                tmp = self._unique(f"{t}_next")
                temps.append(tmp)
                self.emit(depth, f"{self.temp_decl} {tmp} = {v};")
            pairs = [(t, tmp) for (t, _), tmp in zip(pairs, temps)]
        for t, v in pairs:
            self.emit(depth, f"{t} = {v};")

    def for_(self, op: Op, depth: int) -> None:
        lb, ub, step = (self.ref(v) for v in op.operands[:3])
        inits = [self.ref(v) for v in op.operands[3:]]
        body = op.regions[0]
        iv, carried = body.args[0], body.args[1:]
        state = []
        for arg, init in zip(carried, inits):
            name = self.define(arg)
            self.emit(depth, f"{self.type_name(arg.type)} {name} = {init};")
            state.append(name)
        ivn = self.define(iv)
        self.emit(depth, f"for ({self.index_type} {ivn} = {lb}; {ivn} < {ub}; {ivn} += {step}) {{")

        def on_yield(y: Op, d: int) -> None:
            self._assign(state, [self.ref(v) for v in y.operands], d)

        self.block(body, depth + 1, on_yield)
        self.emit(depth, "}")
        for r, s in zip(op.results, state):
            self.emit(depth, f"{self.type_name(r.type)} {self.define(r)} = {s};")

    def _region(self, region: Block, results: list[str], depth: int) -> None:
        def on_yield(y: Op, d: int) -> None:
            self._assign(results, [self.ref(v) for v in y.operands], d)

        self.block(region, depth, on_yield)

    @staticmethod
    def _empty(region: Block) -> bool:
        return all(o.name == "yield" and not o.operands for o in region.ops)

    def if_(self, op: Op, depth: int) -> None:
        cond = self.ref(op.operands[0])
        results = self._declare_results(op, depth)
        then, other = op.regions
        self.emit(depth, f"if ({cond}) {{")
        self._region(then, results, depth + 1)
        if self._empty(other) and not results:
            self.emit(depth, "}")
            return
        self.emit(depth, "} else {")
        self._region(other, results, depth + 1)
        self.emit(depth, "}")

    def switch(self, op: Op, depth: int) -> None:
        sel = self.ref(op.operands[0])
        results = self._declare_results(op, depth)
        cases = tuple(op.attrs["cases"])  # type: ignore[arg-type]
        self.emit(depth, f"switch ({sel}) {{")
        for value, region in zip(cases, op.regions):
            self.emit(depth + 1, f"case {int(value)}u: {{")
            self._region(region, results, depth + 2)
            self.emit(depth + 2, "break;")
            self.emit(depth + 1, "}")
        self.emit(depth + 1, "default: {")
        self._region(op.regions[len(cases)], results, depth + 2)
        self.emit(depth + 2, "break;")
        self.emit(depth + 1, "}")
        self.emit(depth, "}")


#: Short spellings of the truth tables the lowering uses; any other is printed as its minterms.
_LUT_FORMS = {0xEA: "(({a} & {b}) | {c})", 0xF8: "({a} | ({b} & {c}))", 0xC0: "({a} & {b})",
              0xFC: "({a} | {b})", 0x96: "({a} ^ {b} ^ {c})", 0x80: "({a} & {b} & {c})",
              0xD8: "(({a} & ~{c}) | ({b} & {c}))"}


def lop3_expression(lut: int, a: str, b: str, c: str) -> str:
    """A C expression of the IR's `lop3` (result bit i = bit (4 a_i + 2 b_i + c_i) of lut) for
    unsigned 32-bit operands."""
    if lut in _LUT_FORMS:
        return _LUT_FORMS[lut].format(a=a, b=b, c=c)
    terms = [" & ".join(x if i >> s & 1 else f"~{x}" for s, x in ((2, a), (1, b), (0, c)))
             for i in range(8) if lut >> i & 1]
    return "(" + " | ".join(f"({t})" for t in terms) + ")" if terms else "0u"


CPrinter.EMITTERS = {
    "index": CPrinter.op_index,
    "scalar": CPrinter.op_scalar,
    "for": CPrinter.for_,
    "if": CPrinter.if_,
    "switch": CPrinter.switch,
    "yield": CPrinter.op_yield,
}
