"""The compact form of printed CUDA text: what our kernels hand to MLX at run time.

MLX's `mx.fast.cuda_kernel` rebuilds the whole kernel source as a string on every call and
hashes it when the graph is evaluated (mlx/backend/cuda/custom_kernel.cpp, MLX 0.32), so a
launch's host cost grows with the text: about 11 us at 1 KB, 12.5 us at 8 KB, 22 us at 32 KB
and 109 us at 128 KB on an H100 host (bench/results/issue12_h100_2026-11-24/launch_overhead.log). The readable text
(comments, indentation) is what `marlin-dsl compile` writes and users vendor; the compact text
is the same program with comments and layout removed, token for token, and it is the text
that layers launch and the GPU checks run.

Rules (string and character literals are copied untouched): `//` and `/* */` comments are
dropped; every line is stripped and empty lines go (preprocessor lines keep their own line);
spaces next to `,`, `;`, `(`, `)`, `{`, `}`, `[`, `]` and an assignment `=` are dropped, which
never joins two tokens into another (see `_SQUEEZE`; tests/test_cuda_compact.py compares the
token streams of every kernel).
"""
from __future__ import annotations

import re

#: A string or character literal, a comment, or anything else up to the next of those.
_TOKEN = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/|[^"\'/]+|/', re.S)
#: Spaces around these are dropped, and around a lone `=` (an assignment: not part of `==`,
#: `<=`, `>=`, `!=` or a compound assignment such as `+=`, whose operators stay intact).
_SQUEEZE = re.compile(r"\s*([,;(){}\[\]])\s*|(?<![=!<>+\-*/%&|^])\s*=\s*(?!=)")


def _squeeze(code: str) -> str:
    return _SQUEEZE.sub(lambda m: m.group(1) if m.group(1) else "=", code)


def compact_cuda(text: str) -> str:
    """`text` without comments and layout (see the module docstring)."""
    pieces: list[str] = []
    for token in _TOKEN.findall(text):
        if token.startswith("//"):
            continue
        if token.startswith("/*"):
            pieces.append(" ")
            continue
        pieces.append(token)
    joined = "".join(pieces)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            out.append(line)
            continue
        out.append(_squeeze_outside_literals(line))
    return "\n".join(out) + "\n"


def _squeeze_outside_literals(line: str) -> str:
    parts = re.split(r'("(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\')', line)
    return "".join(p if i % 2 else _squeeze(p) for i, p in enumerate(parts))


# ----- the prelude, cut to what a kernel uses -----------------------------------------------------

_IDENT = re.compile(r"[A-Za-z_]\w*")
_LITERAL = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'')


def _items(prelude: str) -> list[tuple[str, str | None]]:
    """The compact prelude as (text, defined name): each top-level declaration of namespace
    mdsl (a struct or a function with its template line) is one item; preprocessor lines and
    the namespace lines are items that define nothing (always kept)."""
    items: list[tuple[str, str | None]] = []
    current: list[str] = []
    depth = 0
    for line in prelude.splitlines():
        code = _LITERAL.sub('""', line)
        if not current and (line.startswith("#") or line.startswith("namespace") or line == "}"):
            items.append((line, None))
            depth += code.count("{") - code.count("}") if line.startswith("namespace") else 0
            continue
        current.append(line)
        depth += code.count("{") - code.count("}")
        if depth == 1 and (code.endswith("}") or code.endswith(";")):
            text = "\n".join(current)
            items.append((text, _defined(current)))
            current = []
    if current:
        items.append(("\n".join(current), _defined(current)))
    return items


def _defined(lines: list[str]) -> str | None:
    """The name a declaration defines: a struct's, or the function's (its specialisations
    define the same name)."""
    text = " ".join(ln for ln in lines if not ln.startswith("template"))
    head = _LITERAL.sub('""', re.split(r"[{;]", text, maxsplit=1)[0])
    if head.startswith("struct"):  # the last word before the body: `struct alignas(...) vec`
        return _IDENT.findall(head)[-1]
    function = re.search(r"(\w+)\s*(?:<[^()]*>)?\s*\(", head)
    return function.group(1) if function else None


def trim_prelude(prelude: str, uses: str) -> str:
    """The compact prelude keeping only the declarations that `uses` (a kernel's declarations
    and body) names, directly or through other kept declarations."""
    items = _items(compact_cuda(prelude))
    by_name: dict[str, list[int]] = {}
    for i, (_, name) in enumerate(items):
        if name is not None:
            by_name.setdefault(name, []).append(i)
    keep: set[int] = set()
    todo = [n for n in set(_IDENT.findall(_LITERAL.sub('""', uses))) if n in by_name]
    while todo:
        for i in by_name.pop(todo.pop(), []):
            keep.add(i)
            todo += [n for n in set(_IDENT.findall(_LITERAL.sub('""', items[i][0]))) if n in by_name]
    return "\n".join(text for i, (text, name) in enumerate(items) if name is None or i in keep) + "\n"


__all__ = ["compact_cuda", "trim_prelude"]
