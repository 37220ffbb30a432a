"""Module fixtures that build harness kernels on first use instead of all up front.

A module's `built` fixture used to lower and g++-compile every case of its sweeps at setup. The
default run executes only a covering subset of each sweep (tests/conftest.py), so a fixture
hands out a `LazyBuilds`: each entry is made (lowered, printed, compiled) the first time a
test asks for it and kept for the module. g++ builds are cached on disk by content, so a case
that several tests share is compiled once.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, Iterator, Mapping


class LazyBuilds(Mapping):
    """key -> make(key)'s value, made on first access and kept. The keys are known up front
    (iteration and `in` do not build anything)."""

    def __init__(self, recipes: Mapping[Hashable, Callable[[], Any]]) -> None:
        self._recipes = dict(recipes)
        self._made: dict[Hashable, Any] = {}

    def __getitem__(self, key: Hashable) -> Any:
        if key not in self._made:
            self._made[key] = self._recipes[key]()  # KeyError: not a case of this module
        return self._made[key]

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._recipes)

    def __len__(self) -> int:
        return len(self._recipes)
