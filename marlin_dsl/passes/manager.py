"""Pass infrastructure: the `Pass` base, the `PassManager`, the registry of passes, and the
small rewriting helpers every pass shares (fresh value names, cloning, use substitution).

A pass mutates a kernel in place and may append human-readable notes to a log. The manager
verifies the IR after every pass (`marlin_dsl.ir.verify`), so a pass that breaks the IR is
reported by name, and can hand each intermediate kernel to a dump callback.
"""
from __future__ import annotations

import re
from typing import Callable, Iterable, Iterator, Sequence

from ..errors import MarlinDSLError
from ..ir.core import Block, Kernel, Op, Value
from ..ir.types import ScalarType
from ..ir.verify import VerifyError, verify

DumpCallback = Callable[[str, Kernel, list[str]], None]

DEFAULT_PIPELINE = ["specialise", "unroll", "fold", "cse", "dce", "interleave"]

#: name -> Pass subclass; filled by `register` when the pass modules are imported
#: (importing `marlin_dsl.passes` imports all of them).
PASSES: dict[str, type["Pass"]] = {}


class PassError(MarlinDSLError):
    """A pass failed, or left IR that does not verify; the message names the pass."""

    def __init__(self, message: str, pass_name: str) -> None:
        self.pass_name = pass_name
        super().__init__(message)


class Pass:
    """Base of all passes: `run(kernel, log)` mutates `kernel` in place and may append notes."""

    name: str = ""

    def run(self, kernel: Kernel, log: list[str]) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<pass {self.name}>"


def register(cls: type[Pass]) -> type[Pass]:
    """Class decorator: make a pass available to `build_pipeline` under `cls.name`."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    PASSES[cls.name] = cls
    return cls


def build_pipeline(names: Iterable[str | Pass] | None = None) -> list[Pass]:
    """Instantiate passes by registry name (default options); Pass instances pass through.
    `PASSES` is full here: importing this module runs `marlin_dsl/passes/__init__.py` first,
    which imports every pass module."""
    result: list[Pass] = []
    for item in DEFAULT_PIPELINE if names is None else names:
        if isinstance(item, Pass):
            result.append(item)
        elif item in PASSES:
            result.append(PASSES[item]())
        else:
            raise ValueError(f"unknown pass {item!r}; known: {sorted(PASSES)}")
    return result


class PassManager:
    """Runs passes in order; verifies the kernel before the first and after every pass.

    `dump(pass_name, kernel, notes)` is called after each pass (after verification) with the
    notes that pass appended. `run` returns the notes of all passes.
    """

    def __init__(self, passes: Sequence[str | Pass] | None = None, verify_each: bool = True,
                 dump: DumpCallback | None = None) -> None:
        self.passes = build_pipeline(passes)
        self.verify_each = verify_each
        self.dump = dump

    def run(self, kernel: Kernel) -> list[str]:
        log: list[str] = []
        if self.verify_each:
            try:
                verify(kernel)
            except VerifyError as e:
                raise PassError(f"the input of the pass pipeline does not verify: {e}", "<input>") from e
        for p in self.passes:
            notes: list[str] = []
            try:
                p.run(kernel, notes)
            except PassError:
                raise
            except Exception as e:  # a crash inside a pass is reported with its name
                raise PassError(f"pass {p.name} failed on kernel {kernel.name}: "
                                f"{type(e).__name__}: {e}", p.name) from e
            if self.verify_each:
                try:
                    verify(kernel)
                except VerifyError as e:
                    raise PassError(f"pass {p.name} left invalid IR: {e}", p.name) from e
            log.extend(notes)
            if self.dump is not None:
                self.dump(p.name, kernel, notes)
        return log


# ----- rewriting helpers shared by the passes -----------------------------------------------

_TRAILING_DIGITS = re.compile(r"\d+$")


def name_hint(name: str) -> str:
    """The builder's hint of a value name: the name without its counter (`acc12` -> `acc`)."""
    hint = _TRAILING_DIGITS.sub("", name)
    return hint or "v"


def iter_values(block: Block) -> Iterator[Value]:
    """Every value defined in a block and its nested regions (arguments and results)."""
    yield from block.args
    for op in block.ops:
        yield from op.results
        for region in op.regions:
            yield from iter_values(region)


class Namer:
    """Deterministic fresh value names, unique within one kernel: hint + the next free counter,
    in the builder's style (`v57`, `c12`)."""

    def __init__(self, kernel: Kernel) -> None:
        self.used: set[str] = {v.name for v in iter_values(kernel.body)}
        self._next: dict[str, int] = {}

    def fresh(self, hint: str) -> str:
        n = self._next.get(hint, 0)
        while f"{hint}{n}" in self.used:
            n += 1
        self._next[hint] = n + 1
        name = f"{hint}{n}"
        self.used.add(name)
        return name

    def value_like(self, v: Value) -> Value:
        """A fresh value with `v`'s type and naming hint."""
        return Value(self.fresh(name_hint(v.name)), v.type)


def clone_op(op: Op, vmap: dict[Value, Value], namer: Namer) -> Op:
    """Deep copy of `op` (regions included) with fresh names; operands are mapped through
    `vmap`, which receives old -> new for every value the clone defines."""
    new = Op(op.name, [vmap.get(v, v) for v in op.operands], [], dict(op.attrs), [])
    new.regions = [clone_block(region, vmap, namer) for region in op.regions]
    for r in op.results:
        nr = namer.value_like(r)
        vmap[r] = nr
        new.results.append(nr)
    return new


def clone_block(block: Block, vmap: dict[Value, Value], namer: Namer) -> Block:
    args = []
    for a in block.args:
        na = namer.value_like(a)
        vmap[a] = na
        args.append(na)
    return Block(args, [clone_op(op, vmap, namer) for op in block.ops])


def resolve(mapping: dict[Value, Value], v: Value) -> Value:
    """Follow replacement chains (a -> b -> c gives c)."""
    while v in mapping:
        v = mapping[v]
    return v


def substitute(ops: Iterable[Op], mapping: dict[Value, Value]) -> None:
    """Replace every use (nested regions included) of a key of `mapping` by its value."""
    if not mapping:
        return
    for op in ops:
        op.operands = [resolve(mapping, v) for v in op.operands]
        for region in op.regions:
            substitute(region.ops, mapping)


def make_const(namer: Namer, value: int | float | bool, type_: ScalarType, hint: str = "c") -> Op:
    return Op("const", [], [Value(namer.fresh(hint), type_)], {"value": value})


def block_paths(block: Block, path: str = "body") -> Iterator[tuple[str, Block]]:
    """Every block with a readable path: `body`, `body.for0`, `body.if1.else`,
    `body.switch0.case3`, `body.switch0.default` (ops numbered per name within their block)."""
    yield path, block
    counts: dict[str, int] = {}
    for op in block.ops:
        if not op.regions:
            continue
        k = counts.get(op.name, 0)
        counts[op.name] = k + 1
        base = f"{path}.{op.name}{k}"
        if op.name == "if":
            labels = ["then", "else"]
        elif op.name == "switch":
            labels = [f"case{c}" for c in op.attrs.get("cases", ())] + ["default"]
        else:
            labels = [] if len(op.regions) == 1 else [f"r{i}" for i in range(len(op.regions))]
        for i, region in enumerate(op.regions):
            sub = base if not labels else f"{base}.{labels[i] if i < len(labels) else f'r{i}'}"
            yield from block_paths(region, sub)
