"""Which format each layer of a model gets: one format for all, rules by layer path, or a
function (`convert`'s `format` argument), and the check that every rule matches a layer.

A rule's pattern matches a layer when it matches (fnmatch: `*`, `?`, `[...]`) the layer's whole
dotted path or a run of whole dotted parts of it. For `model.layers.0.mlp.down_proj`:
`mlp`, `down_proj`, `layers.0.mlp`, `mlp.down_proj`, `*proj` and `layers.0.*` match; `down`
and `mlp.down` do not (a part is never matched in pieces).
"""
from __future__ import annotations

import difflib
import fnmatch
import re
from typing import Callable, Iterable, Mapping, Union

import mlx.nn as nn

from ..errors import FormatError, MarlinDSLError, UsageError
from ..formats import Format
from ..formats.builtin import BUILTIN_FORMATS, GroupSize, builtin_format

#: Loads an nn.QuantizedLinear in its own MLX format (layers.interop), without re-quantising.
EXACT = "exact"

Choice = Union[str, Format, None]
Chooser = Callable[[str, nn.Module], Choice]
FormatChoice = Union[Choice, Mapping[str, Choice], Chooser]

#: The matching rule in one sentence, for --help, errors and docs.
MATCHING_RULE = ("a pattern matches a layer when it matches (fnmatch: * ? [...]) the layer's whole "
                 "dotted path or a run of whole dotted parts of it: 'mlp', 'down_proj', 'mlp.down_proj', "
                 "'layers.0.*' match model.layers.0.mlp.down_proj; 'down' and 'mlp.down' do not")


def matches(pattern: str, path: str) -> bool:
    """A rule matches the whole path or any run of its dotted parts ("mlp", "layers.0")."""
    if fnmatch.fnmatchcase(path, pattern):
        return True
    parts = path.split(".")
    return any(fnmatch.fnmatchcase(".".join(parts[i:j]), pattern)
               for i in range(len(parts)) for j in range(i + 1, len(parts) + 1))


def chooser(choice: FormatChoice) -> Chooser:
    """A function (path, module) -> format name / Format / None from any accepted choice."""
    if callable(choice) and not isinstance(choice, Format):
        return choice  # type: ignore[return-value]
    if isinstance(choice, Mapping):
        rules = list(choice.items())

        def by_rule(path: str, _: nn.Module) -> Choice:
            for pattern, value in rules:
                if matches(pattern, path):
                    return value
            return None

        return by_rule
    return lambda _path, _module: choice  # type: ignore[return-value]


def by_default(choice: FormatChoice, path: str) -> bool:
    """True when the layer's format comes from a default for all layers: one format for all,
    or the catch-all rule "*" (not a rule that names the layer, not a function)."""
    if isinstance(choice, (str, Format)) or choice is None:
        return True
    if isinstance(choice, Mapping):
        return next((pattern for pattern in choice if matches(pattern, path)), None) == "*"
    return False


class UnmatchedRules(UsageError):
    """Rules whose pattern matches no linear layer of the model (a typo would otherwise convert
    what it meant to leave alone, or the reverse). `unmatched` holds (pattern, near matches)."""

    def __init__(self, unmatched: list[tuple[str, list[str]]], describe: Callable[[str], str] | None = None) -> None:
        self.unmatched = unmatched
        name = describe or (lambda pattern: f"format rule {pattern!r}")
        said = []
        for pattern, near in unmatched:
            hint = f" (near: {', '.join(map(repr, near))})" if near else ""
            said.append(f"{name(pattern)} matches no linear layer{hint}")
        super().__init__("; ".join(said) + f"; {MATCHING_RULE}")


def near_matches(pattern: str, paths: Iterable[str], n: int = 3) -> list[str]:
    """Patterns close to `pattern` that would match: the layer paths, their runs of one to
    three dotted parts, and the same with layer numbers as `*`."""
    candidates: set[str] = set()
    for path in paths:
        for parts in (path.split("."), [re.sub(r"^\d+$", "*", p) for p in path.split(".")]):
            candidates.add(".".join(parts))
            for i in range(len(parts)):
                if parts[i].isdigit() or parts[i] == "*":  # "0.mlp" is never what was meant
                    continue
                for j in range(i + 1, min(i + 3, len(parts)) + 1):
                    candidates.add(".".join(parts[i:j]))
    return difflib.get_close_matches(pattern, sorted(candidates), n=n, cutoff=0.6)


def check_rules_match(choice: FormatChoice, paths: list[str]) -> None:
    """UnmatchedRules unless every pattern of a rule mapping matches one of `paths` (the
    model's linear layers). A catch-all "*" is exempt: it matches whatever there is."""
    if not isinstance(choice, Mapping):
        return
    unmatched = [(pattern, near_matches(pattern, paths)) for pattern in choice
                 if pattern != "*" and not any(matches(pattern, path) for path in paths)]
    if unmatched:
        raise UnmatchedRules(unmatched)


class Resolver:
    """Choices -> Formats (built-in names with the group size made once per name), naming the
    layer (and `group_size=`) in errors."""

    def __init__(self, group_size: GroupSize | None) -> None:
        self.group_size = group_size
        self._made: dict[str, Format] = {}

    def __call__(self, value: Choice, path: str) -> Format | str | None:
        if value is None or value == EXACT or isinstance(value, Format):
            return value
        if isinstance(value, str) and value in BUILTIN_FORMATS:
            if value not in self._made:
                try:
                    self._made[value] = builtin_format(value, self.group_size)
                except FormatError as err:  # its location would be our caller's frame: say the argument
                    raise FormatError(f"group_size={self.group_size}: {err.message}") from None
            return self._made[value]
        raise MarlinDSLError(f"format for layer {path!r}: expected a built-in format name "
                             f"{sorted(BUILTIN_FORMATS)}, {EXACT!r}, a marlin_dsl Format or None, "
                             f"got {value!r}")


__all__ = ["EXACT", "MATCHING_RULE", "Choice", "Chooser", "FormatChoice", "Resolver", "UnmatchedRules",
           "by_default", "check_rules_match", "chooser", "matches", "near_matches"]
