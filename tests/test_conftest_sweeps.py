"""The covering subset of a sweep (tests/conftest.py): every value of every axis runs by
default, and what is left out is exactly what `-m slow` adds."""
from __future__ import annotations

import itertools

from conftest import covering_subset


def test_every_value_of_every_axis_is_taken_and_the_rest_left_out() -> None:
    fmts, pipelines, acts = ["fp4", "int4", "nf4", "fp4_2of4"], ["db", "fd", "striped"], ["f16", "bf16"]
    cases = [{"fmt": f, "pipeline": p, "act": a} for f, p, a in itertools.product(fmts, pipelines, acts)]
    taken = covering_subset(cases)
    chosen = [c for c, t in zip(cases, taken) if t]
    for axis, values in (("fmt", fmts), ("pipeline", pipelines), ("act", acts)):
        assert {c[axis] for c in chosen} == set(values), axis
    assert len(chosen) <= len(fmts) + len(pipelines) + len(acts) < len(cases)  # a subset, not the product
    assert taken[0] and taken == covering_subset(cases)  # collection order decides: repeatable


def test_tuple_parameters_are_one_axis_per_element() -> None:
    cases = [{"case": (name, act, m)} for name in ("fp4", "int4") for act in ("f16", "bf16") for m in (1, 16, 40)]
    chosen = [c["case"] for c, t in zip(cases, covering_subset(cases)) if t]
    assert {c[0] for c in chosen} == {"fp4", "int4"} and {c[1] for c in chosen} == {"f16", "bf16"}
    assert {c[2] for c in chosen} == {1, 16, 40}


def test_a_sweep_may_name_its_own_axes() -> None:
    names = ["ws_fp4_f16", "ws_fp4_bf16", "ms_fp4_f16", "ms_int4_f16", "ws_int4_bf16"]
    taken = covering_subset([{"name": n} for n in names], axes=lambda p: tuple(p["name"].split("_")))
    assert taken == [True, True, True, True, False]
