"""`marlin-dsl bench`: the benchmark runner, outside the compiler's core (nothing under
formats/, ir/, lowering/, passes/, targets/ or the compiler imports it)."""
from .runner import *  # noqa: F401,F403  (split into modules in the next commit)
