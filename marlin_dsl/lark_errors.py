"""Readable syntax errors for the lark grammars (format text, IR text): one wording for both."""
from __future__ import annotations

from typing import Iterable

from lark import Lark
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken
from lark.lexer import PatternStr


def _expected(parser: Lark, names: Iterable[str]) -> str:
    """Terminal names as a reader knows them: keywords and punctuation quoted."""
    shown = []
    for name in names:
        try:
            pattern = parser.get_terminal(name).pattern
        except KeyError:
            shown.append(name)
            continue
        shown.append(f'"{pattern.value}"' if isinstance(pattern, PatternStr) else name)
    return ", ".join(sorted(shown))


def describe_syntax_error(parser: Lark, err: UnexpectedInput, text: str) -> tuple[str, int]:
    """(message, line) for a lark parse error; errors at the end of input name the last line."""
    line = err.line if err.line > 0 else text.count("\n") + 1
    if isinstance(err, UnexpectedToken):
        got = "end of input" if err.token.type == "$END" else repr(str(err.token))
        # `accepts` (after reductions) is exact; `expected` may hold LALR look-ahead extras.
        message = f"unexpected {got}, expected one of: {_expected(parser, err.accepts or err.expected)}"
    elif isinstance(err, UnexpectedCharacters):
        message = f"unexpected character {err.char!r} at column {err.column}"
    else:
        message = "unexpected end of input"
    return f"syntax error: {message}", line
