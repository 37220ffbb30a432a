"""A small FileCheck: match `// CHECK...:` directives of a test file, in order, against a text.

The subset of LLVM's FileCheck that the IR tests (tests/ir/*.ir) need:

- `CHECK: pat` — the next match of `pat` at or after the end of the previous match;
- `CHECK-NEXT: pat` — a match on the line right after the previous match's line;
- `CHECK-SAME: pat` — a match on the previous match's line, after it;
- `CHECK-NOT: pat` — `pat` does not occur between the previous match and the next positive
  match (or the end of the region when no positive directive follows);
- `CHECK-LABEL: pat` — matched first, all of them, in order; they cut the text into regions,
  and the other directives between two labels are matched inside that region only, so one
  failing block of checks cannot swallow the next kernel's lines;
- `CHECK-EMPTY:` — the next line is empty.

Patterns are literal text with two escapes: `{{regex}}` matches a Python regular expression,
`[[NAME:regex]]` matches it and binds NAME to the matched text, `[[NAME]]` matches the text
bound earlier (SSA names differ between runs of a pass, the dataflow between them does not).
Runs of blanks in a pattern match any run of blanks, and leading/trailing blanks are ignored,
as FileCheck does without --strict-whitespace. Another prefix than CHECK (e.g. `FOLD`) gives
`FOLD:`, `FOLD-NEXT:` ... directives, so one file can check several RUN lines.

A failure raises `FileCheckError` naming the directive, its line in the test file and where
the search started in the text.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

KINDS = ("", "-NEXT", "-SAME", "-NOT", "-LABEL", "-EMPTY")


class FileCheckError(AssertionError):
    """A directive did not hold (or the directives themselves are malformed)."""


@dataclass(frozen=True)
class Directive:
    kind: str  # "CHECK", "NEXT", "SAME", "NOT", "LABEL", "EMPTY"
    pattern: str
    line: int  # 1-based line in the test file


@dataclass
class _Pos:
    line: int  # index into the text's lines
    col: int  # column in that line where the next search starts


@dataclass
class _State:
    lines: list[str]
    variables: dict[str, str] = field(default_factory=dict)


def parse_directives(check_text: str, prefix: str = "CHECK") -> list[Directive]:
    """The directives with this prefix, in file order (`// PREFIX[-KIND]: pattern`)."""
    if not re.fullmatch(r"[A-Z][A-Z0-9_]*", prefix):
        raise FileCheckError(f"bad check prefix {prefix!r}")
    head = re.compile(rf"(?<![A-Za-z0-9_-]){prefix}(-[A-Z]+)?:(.*)$")
    out: list[Directive] = []
    for number, raw in enumerate(check_text.splitlines(), 1):
        m = head.search(raw)
        if m is None:
            continue
        suffix = m.group(1) or ""
        if suffix not in KINDS:
            raise FileCheckError(f"line {number}: unknown directive {prefix}{suffix}")
        pattern = m.group(2).strip()
        kind = suffix[1:] if suffix else "CHECK"
        if not pattern and kind != "EMPTY":
            raise FileCheckError(f"line {number}: {prefix}{suffix} has an empty pattern")
        if kind == "EMPTY" and pattern:
            raise FileCheckError(f"line {number}: {prefix}-EMPTY takes no pattern")
        out.append(Directive(kind, pattern, number))
    return out


_ESCAPE = re.compile(r"\{\{(.*?)\}\}|\[\[([A-Za-z_][A-Za-z0-9_]*)(?::(.*?))?\]\]")


def compile_pattern(pattern: str, variables: dict[str, str]) -> tuple[re.Pattern[str], list[str]]:
    """A regex for `pattern` and the names its groups bind, in group order."""
    parts: list[str] = []
    binds: list[str] = []
    at = 0
    for m in _ESCAPE.finditer(pattern):
        parts.append(_literal(pattern[at:m.start()]))
        regex, name, bound = m.group(1), m.group(2), m.group(3)
        if regex is not None:
            parts.append(f"(?:{regex})")
        elif bound is not None:
            parts.append(f"({bound})")
            binds.append(name)
        else:
            if name not in variables:
                raise FileCheckError(f"[[{name}]] is used before it is defined")
            parts.append(re.escape(variables[name]))
        at = m.end()
    parts.append(_literal(pattern[at:]))
    return re.compile("".join(parts)), binds


def _literal(text: str) -> str:
    return r"[ \t]+".join(re.escape(piece) for piece in re.split(r"[ \t]+", text))


def _search(state: _State, d: Directive, start: _Pos, stop: int) -> tuple[_Pos, _Pos] | None:
    """The first match of `d` in lines [start.line, stop), from start.col on the first line:
    (begin, end) positions, binding its variables."""
    regex, binds = compile_pattern(d.pattern, state.variables)
    for i in range(start.line, stop):
        m = regex.search(state.lines[i], start.col if i == start.line else 0)
        if m is not None:
            for name, value in zip(binds, m.groups()):
                state.variables[name] = value
            return _Pos(i, m.start()), _Pos(i, m.end())
    return None


def _where(state: _State, pos: _Pos) -> str:
    if pos.line >= len(state.lines):
        return "at the end of the output"
    return f"from output line {pos.line + 1}: {state.lines[pos.line]!r}"


def _fail(d: Directive, prefix: str, message: str) -> FileCheckError:
    name = prefix if d.kind == "CHECK" else f"{prefix}-{d.kind}"
    return FileCheckError(f"check line {d.line}: {name}: {d.pattern!r}: {message}")


def _match_region(state: _State, directives: list[Directive], begin: _Pos | None, stop: int, prefix: str) -> None:
    """Match the non-label directives of one region: from the end of the label that opens it
    (`begin`; None: the start of the text) up to line `stop` (exclusive)."""
    pos = _Pos(begin.line, begin.col) if begin is not None else _Pos(0, 0)
    prev_line: int | None = begin.line if begin is not None else None
    pending_not: list[tuple[Directive, _Pos]] = []
    for d in directives:
        if d.kind == "NOT":
            pending_not.append((d, _Pos(pos.line, pos.col)))
            continue
        if d.kind == "EMPTY":
            want = (prev_line + 1) if prev_line is not None else pos.line
            if want >= stop or state.lines[want].strip():
                raise _fail(d, prefix, f"the line after the previous match is not empty ({_where(state, _Pos(want, 0))})")
            found = (_Pos(want, 0), _Pos(want, len(state.lines[want])))
        elif d.kind in ("NEXT", "SAME"):
            if prev_line is None:
                raise _fail(d, prefix, "has no previous match to follow")
            line = prev_line + 1 if d.kind == "NEXT" else prev_line
            if line >= stop:
                raise _fail(d, prefix, "no line after the previous match")
            found = _search(state, d, _Pos(line, pos.col if d.kind == "SAME" else 0), line + 1)
            if found is None:
                where = "on the line after the previous match" if d.kind == "NEXT" else "on the same line"
                later = _search(state, d, _Pos(line, 0), stop) if d.kind == "NEXT" else None
                hint = f" (it occurs later, on output line {later[0].line + 1})" if later else ""
                raise _fail(d, prefix, f"not found {where}: {state.lines[line]!r}{hint}")
        else:
            found = _search(state, d, pos, stop)
            if found is None:
                raise _fail(d, prefix, f"not found {_where(state, pos)}")
        _check_nots(state, pending_not, found[0], prefix)
        pending_not = []
        pos, prev_line = found[1], found[1].line
    _check_nots(state, pending_not, _Pos(stop, 0), prefix)


def _check_nots(state: _State, nots: list[tuple[Directive, _Pos]], until: _Pos, prefix: str) -> None:
    """Each CHECK-NOT must not match between where it was reached and `until`."""
    for d, start in nots:
        regex, _ = compile_pattern(d.pattern, state.variables)
        for i in range(start.line, min(until.line + 1, len(state.lines))):
            text = state.lines[i]
            lo = start.col if i == start.line else 0
            hi = until.col if i == until.line else len(text)
            m = regex.search(text, lo, hi)
            if m is not None:
                raise _fail(d, prefix, f"found on output line {i + 1}: {text!r}")


def filecheck(output: str, check_text: str, prefix: str = "CHECK") -> None:
    """Raise FileCheckError unless `output` satisfies the `prefix` directives of `check_text`."""
    directives = parse_directives(check_text, prefix)
    if not directives:
        raise FileCheckError(f"no {prefix}: directives")
    state = _State(output.splitlines())
    labels = [i for i, d in enumerate(directives) if d.kind == "LABEL"]
    if directives[0].kind in ("NEXT", "SAME"):
        raise _fail(directives[0], prefix, "the first directive cannot be NEXT or SAME")
    # Labels first: each cuts the text; the directives after it are matched up to the next one.
    starts: list[tuple[_Pos, _Pos]] = []
    pos = _Pos(0, 0)
    for i in labels:
        found = _search(state, directives[i], pos, len(state.lines))
        if found is None:
            raise _fail(directives[i], prefix, f"label not found {_where(state, pos)}")
        starts.append(found)
        pos = found[1]
    bounds = [-1, *labels, len(directives)]
    for r in range(len(labels) + 1):
        group = directives[bounds[r] + 1:bounds[r + 1]]
        begin = starts[r - 1][1] if r else None  # after the label that opens the region
        stop = starts[r][0].line if r < len(labels) else len(state.lines)
        _match_region(state, group, begin, stop, prefix)
