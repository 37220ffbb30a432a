"""Targets above the compiler, one folder each (`metal/`, `cuda/`): a target's printer, launcher,
runtime and tuned tile tables. Importing this package registers every printer with its
description (the descriptions are data in `marlin_dsl/machine/`); `emit(kernel, target)` prints
a kernel for any of them."""
from . import cuda, metal
from .base import Launcher, Source, emit, register

__all__ = ["Launcher", "Source", "emit", "register"]
