"""The inline PTX of a printed kernel, rewritten for the CUDA CPU harness: each `asm volatile(...)`
statement of the kernel's body and declarations becomes a call of the shim
(codegen/cuda_shim_wgmma.h) that does what the PTX instruction does; every other character
of the printed text is compiled as printed.

Accepted, exactly in the forms the printer writes them (targets/cuda/print_wgmma.py):
- `wgmma.mma_async.sync.aligned.m64nNk16.f32.T.T` with A from registers or from a shared-memory
  descriptor, B from a descriptor, scale-d set (`setp.ne.b32 p, 1, 0`), the operand scales 1,
  both K-major;
- `wgmma.fence.sync.aligned`, `wgmma.commit_group.sync.aligned`, `wgmma.wait_group.sync.aligned N`,
  `fence.proxy.async.shared::cta` and `setmaxnreg` (a register budget: nothing on the CPU).
(The warp roles' mbarriers are prelude functions, which the shim defines.) Anything else (the
sparse wgmma, ...) raises CudaCPUError of kind "unsupported",
naming the instruction: the harness then refuses the kernel instead of running something else.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .cpu_harness_buffers import CudaCPUError

__all__ = ["AsmStatement", "rewrite_asm", "asm_statements"]

_START = re.compile(r"\basm\s+volatile\s*\(")
_FIXED = {
    "fence.proxy.async.shared::cta;": "mdsl_cpu::fence_proxy_async();",
    "wgmma.fence.sync.aligned;": "mdsl_cpu::wgmma_fence();",
    "wgmma.commit_group.sync.aligned;": "mdsl_cpu::wgmma_commit();",
}
_WAIT = re.compile(r"wgmma\.wait_group\.sync\.aligned (\d+);")
_MAXNREG = re.compile(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32 (\d+);")
_WGMMA = re.compile(
    r"\{ \.reg \.pred p; setp\.ne\.b32 p, 1, 0; "
    r"wgmma\.mma_async\.sync\.aligned\.m64n(?P<n>\d+)k16\.f32\.(?P<t>f16|bf16)\.(?P=t) "
    r"\{(?P<d>[^}]*)\}, (?P<a>\{[^}]*\}|%\d+), (?P<b>%\d+), p, 1, 1, (?P<tail>0, 0|0); \}")


@dataclass(frozen=True)
class AsmStatement:
    """One `asm volatile(template : outputs : inputs : clobbers);` of the text: its span, its
    template (the string literals joined, escapes resolved) and its operands' (constraint,
    expression) in PTX order (outputs, then inputs)."""

    start: int
    end: int
    template: str
    operands: list[tuple[str, str]]

    @property
    def instruction(self) -> str:
        """The template on one line (whitespace collapsed): what the rules match."""
        return " ".join(self.template.split())


def _scan_literal(text: str, i: int) -> int:
    """The index after the string literal starting at text[i] == '"'."""
    j = i + 1
    while text[j] != '"':
        j += 2 if text[j] == "\\" else 1
    return j + 1


def _split_top(text: str, sep: str) -> list[str]:
    """Split at `sep` outside string literals and brackets."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        if c == '"':
            i = _scan_literal(text, i)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return parts


def _literals(text: str) -> str:
    """The joined value of the adjacent string literals `text` holds."""
    out, i = [], 0
    while i < len(text):
        if text[i] == '"':
            j = _scan_literal(text, i)
            out.append(text[i + 1:j - 1].encode().decode("unicode_escape"))
            i = j
        else:
            i += 1
    return "".join(out)


def asm_statements(text: str) -> list[AsmStatement]:
    """Every `asm volatile(...);` of `text`, in order."""
    out = []
    for m in _START.finditer(text):
        i, depth = m.end(), 1
        while depth:
            c = text[i]
            if c == '"':
                i = _scan_literal(text, i)
                continue
            depth += (c == "(") - (c == ")")
            i += 1
        inner = text[m.end():i - 1]
        end = text.index(";", i) + 1
        sections = _split_top(inner, ":")
        operands = []
        for section in sections[1:3]:  # outputs, inputs (clobbers carry no operand)
            for item in _split_top(section, ","):
                item = item.strip()
                if item:
                    constraint, _, expr = item.partition("(")
                    operands.append((constraint.strip().strip('"'), expr.rstrip()[:-1].strip()))
        out.append(AsmStatement(m.start(), end, _literals(sections[0]), operands))
    return out


def _translate(stmt: AsmStatement, where: str) -> str:
    ins = stmt.instruction
    if ins in _FIXED:
        return _FIXED[ins]
    wait = _WAIT.fullmatch(ins)
    if wait:
        return f"mdsl_cpu::wgmma_wait({int(wait.group(1))});"
    regs = _MAXNREG.fullmatch(ins)
    if regs:
        return f"mdsl_cpu::setmaxnreg({int(regs.group(1))});"
    mma = _WGMMA.fullmatch(ins)
    if mma is None:
        raise CudaCPUError(f"{where}: the CUDA CPU harness does not emulate the inline PTX `{ins}`", "unsupported")
    n, bf16 = int(mma.group("n")), mma.group("t") == "bf16"
    exprs = [e for _, e in stmt.operands]

    def operand(ref: str) -> str:
        return exprs[int(ref.strip().lstrip("%"))]

    d_refs = [r for r in mma.group("d").split(",")]
    if len(d_refs) != n // 2:
        raise CudaCPUError(f"{where}: wgmma m64n{n}k16 names {len(d_refs)} accumulator registers, not {n // 2}",
                           "unsupported")
    d = ", ".join(f"&({operand(r)})" for r in d_refs)
    b_desc = operand(mma.group("b"))
    a = mma.group("a")
    if a.startswith("{"):  # A in registers; the tail is scale-a, scale-b, transpose-b
        if mma.group("tail") != "0":
            raise CudaCPUError(f"{where}: `{ins}`: A in registers takes one transpose flag", "unsupported")
        regs = ", ".join(f"static_cast<uint32_t>({operand(r)})" for r in a[1:-1].split(","))
        return (f"{{ float* const mdsl_d[] = {{{d}}}; const uint32_t mdsl_a[] = {{{regs}}}; "
                f"mdsl_cpu::wgmma(mdsl_d, {n}, {str(bf16).lower()}, mdsl_a, 0, {b_desc}); }}")
    if mma.group("tail") != "0, 0":
        raise CudaCPUError(f"{where}: `{ins}`: A in shared memory takes two transpose flags", "unsupported")
    return (f"{{ float* const mdsl_d[] = {{{d}}}; "
            f"mdsl_cpu::wgmma(mdsl_d, {n}, {str(bf16).lower()}, nullptr, {operand(a)}, {b_desc}); }}")


def rewrite_asm(text: str, where: str) -> str:
    """`text` with every inline-PTX statement replaced by the shim's call (CudaCPUError,
    kind "unsupported", where one is not emulated)."""
    out, at = [], 0
    for stmt in asm_statements(text):
        out += [text[at:stmt.start], _translate(stmt, where)]
        at = stmt.end
    out.append(text[at:])
    return "".join(out)
