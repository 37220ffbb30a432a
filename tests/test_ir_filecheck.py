"""FileCheck tests of the textual IR: every tests/ir/*.ir file is a kernel (or several) in the
textual form with `// RUN:` lines saying what to do with it and `// CHECK:` lines saying what the
output must contain (tests/filecheck.py; the parser ignores `//` comments).

A RUN line is a pipeline of stages joined by `|`, applied to the kernels parsed from the file
(parsing verifies them):

- `passes P1,P2,...` — the registered passes (`marlin_dsl.passes.PASSES`) through a
  `PassManager`, which verifies after each; its notes go to the output as `// note: ...`;
- `print` — the canonical text of the kernels (also what a RUN line ending in `passes` prints);
- `roundtrip` — print, parse the printed text again and require an equal kernel; the output is
  the printed text;
- `interpret NAME=INIT ... SCALAR=INT` — run `run_kernel` (every buffer given as
  `zeros(n)`, `arange(n)` or `full(n,v)`, in its element type); the output is one line
  `@name = [v, ...]` per written buffer;
- a leading `not` — the line must fail (a parse, verify, pass or interpreter error); the output
  is `error: <ExceptionType>: <message>`.

`--check-prefix=NAME` (anywhere on the RUN line) matches that RUN line's output against NAME:
directives instead of CHECK: ones, so one file can check a kernel before and after a pass.
`--split-input-file` (as in MLIR) runs the pipeline on each chunk of the file between
`// -----` lines separately (line numbers stay those of the file) and joins the outputs with
`// -----`: one file can hold many small error cases, each failing on its own.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from filecheck import filecheck
from marlin_dsl.errors import MarlinDSLError
from marlin_dsl.ir.core import Kernel
from marlin_dsl.ir.interpret import run_kernel
from marlin_dsl.ir.text import kernel_difference, parse_kernels, print_kernels
from marlin_dsl.ir.types import HOLDING_DTYPE
from marlin_dsl.passes import PASSES, PassManager

IR_DIR = Path(__file__).resolve().parent / "ir"
CASES = sorted(IR_DIR.glob("*.ir"))
_RUN = re.compile(r"^\s*//\s*RUN:(.*)$")
_PREFIX = re.compile(r"\s--check-prefix=([A-Z][A-Z0-9_]*)\b")
_SPLIT_FLAG = " --split-input-file"
_SPLIT = re.compile(r"^// -----\s*$", re.M)


class RunLineError(AssertionError):
    """A RUN line that does not say something this runner can do."""


def run_lines(text: str) -> list[tuple[str, str, bool]]:
    """(pipeline, check prefix, split the input) of each RUN line."""
    out = []
    for line in text.splitlines():
        m = _RUN.match(line)
        if m is None:
            continue
        command = " " + m.group(1) + " "
        prefix = _PREFIX.search(command)
        split = _SPLIT_FLAG + " " in command
        command = _PREFIX.sub(" ", command).replace(_SPLIT_FLAG + " ", " ")
        out.append((command.strip(), prefix.group(1) if prefix else "CHECK", split))
    return out


def split_input(text: str) -> list[str]:
    """The chunks between `// -----` lines, each padded with blank lines to its place in the
    file so that parse and verify errors name the file's line numbers."""
    chunks, start = [], 0
    for m in [*_SPLIT.finditer(text), None]:
        end = m.start() if m else len(text)
        chunks.append("\n" * text.count("\n", 0, start) + text[start:end])
        start = m.end() if m else end
    return chunks


def _buffer(kernel: Kernel, name: str, init: str) -> np.ndarray:
    decl = {b.name: b for b in kernel.buffers}.get(name)
    if decl is None:
        raise RunLineError(f"interpret: kernel @{kernel.name} has no buffer @{name}")
    dtype = HOLDING_DTYPE[decl.elem.name]
    m = re.fullmatch(r"(zeros|arange)\((\d+)\)|full\((\d+),\s*(-?[\d.e+-]+)\)", init)
    if m is None:
        raise RunLineError(f"interpret: {name}={init}: expected zeros(n), arange(n) or full(n,v)")
    if m.group(1) == "zeros":
        return np.zeros(int(m.group(2)), dtype)
    if m.group(1) == "arange":
        return np.arange(int(m.group(2))).astype(dtype)
    return np.full(int(m.group(3)), float(m.group(4))).astype(dtype)


def _interpret(kernels: list[Kernel], args: list[str]) -> str:
    lines = []
    for kernel in kernels:
        buffers: dict[str, np.ndarray] = {}
        scalars: dict[str, int] = {}
        for arg in args:
            name, _, value = arg.partition("=")
            if value.isdigit():
                scalars[name] = int(value)
            else:
                buffers[name] = _buffer(kernel, name, value)
        for name, array in run_kernel(kernel, buffers, scalars).items():
            values = ", ".join(repr(v.item()) if not isinstance(v.item(), float) else f"{v.item():g}" for v in array)
            lines.append(f"@{name} = [{values}]")
    return "\n".join(lines)


def run_pipeline(text: str, pipeline: str, source: str = "<ir>") -> str:
    """The output of one RUN line's pipeline over the kernels in `text`."""
    stages = [s.strip() for s in pipeline.split("|")]
    expect_error = stages[0].split()[:1] == ["not"]
    if expect_error:
        stages[0] = stages[0][3:].strip()
    notes: list[str] = []
    output: str | None = None
    try:
        kernels = parse_kernels(text, source)
        for stage in stages:
            word, *args = stage.split()
            if word == "passes":
                names = args[0].split(",") if args else []
                unknown = [n for n in names if n not in PASSES]
                if unknown or len(args) != 1:
                    raise RunLineError(f"passes {' '.join(args)}: expected registered passes, one of {sorted(PASSES)}")
                for kernel in kernels:
                    notes += PassManager(names).run(kernel)
                output = None
            elif word == "print":
                output = print_kernels(kernels)
            elif word == "roundtrip":
                output = print_kernels(kernels)
                again = parse_kernels(output, f"{source} (printed)")
                for a, b in zip(kernels, again, strict=True):
                    difference = kernel_difference(a, b)
                    assert difference is None, f"@{a.name} changes in the round trip: {difference}"
                assert print_kernels(again) == output, "printing the parsed text changes it"
            elif word == "interpret":
                output = _interpret(kernels, args)
            else:
                raise RunLineError(f"unknown RUN stage {word!r}")
        if output is None:
            output = print_kernels(kernels)
    except MarlinDSLError as exc:
        if not expect_error:
            raise
        return f"error: {type(exc).__name__}: {exc}"
    if expect_error:
        raise AssertionError(f"RUN: not {pipeline}: expected an error, got none; output:\n{output}")
    return "\n".join([*(f"// note: {n}" for n in notes), output])


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_ir_file(path: Path) -> None:
    text = path.read_text()
    runs = run_lines(text)
    assert runs, f"{path.name} has no RUN: line"
    for pipeline, prefix, split in runs:
        chunks = split_input(text) if split else [text]
        output = "\n// -----\n".join(run_pipeline(chunk, pipeline, path.name) for chunk in chunks)
        try:
            filecheck(output, text, prefix)
        except AssertionError as exc:
            raise AssertionError(f"{path.name}: RUN: {pipeline}\n{exc}\n--- output ---\n{output}") from None


def test_there_are_ir_tests_for_every_pass() -> None:
    """Each registered pass has at least one .ir file that runs it."""
    used = set()
    for path in CASES:
        for pipeline, _, _ in run_lines(path.read_text()):
            for m in re.finditer(r"passes\s+(\S+)", pipeline):
                used |= set(m.group(1).split(","))
    assert set(PASSES) <= used, f"passes without an IR test: {sorted(set(PASSES) - used)}"


def test_a_run_line_that_should_fail_but_does_not_is_an_error() -> None:
    ok = "kernel @k {\n  threads 32\n  grid [1, 1, 1]\n  body {\n  }\n}\n"
    with pytest.raises(AssertionError, match="expected an error, got none"):
        run_pipeline(ok, "not print")
    with pytest.raises(RunLineError, match="unknown RUN stage"):
        run_pipeline(ok, "optimise")
    with pytest.raises(RunLineError, match="expected registered passes"):
        run_pipeline(ok, "passes fold,nosuchpass")
