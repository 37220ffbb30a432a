"""Pipelines are a registry (issue 14): every registered kind has a lowering, a schedule accepts
only registered pipelines, and a kind is registered once."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

import marlin_dsl as m
from marlin_dsl.errors import ScheduleError
from marlin_dsl.lowering.pipelines import LOWERINGS
from marlin_dsl.pipelines import PIPELINES, Pipeline, register_pipeline


def test_every_pipeline_has_a_lowering() -> None:
    assert set(PIPELINES) == set(LOWERINGS) == {"double_buffered", "fused_dequant", "striped",
                                                "weight_stream", "multistage", "warpgroup"}
    for kind, cls in PIPELINES.items():
        assert cls().kind == kind and isinstance(cls(), Pipeline)


def test_user_names_are_the_registered_classes() -> None:
    from marlin_dsl import schedule
    for name in ("DoubleBuffered", "FusedDequant", "StripedKParallel", "WeightStream", "Multistage"):
        cls = getattr(m, name)
        assert getattr(schedule, name) is cls and PIPELINES[cls().kind] is cls


def test_warps_come_from_the_pipeline() -> None:
    s = m.Schedule("s", tile_m=16, tile_n=32, tile_k=64, warps_m=1, warps_n=2, pipeline=m.WeightStream(k_warps=4))
    assert s.warps == 8
    assert m.Schedule("t", pipeline=m.Multistage()).warps == 4


def test_a_schedule_takes_only_registered_pipelines() -> None:
    with pytest.raises(ScheduleError, match="pipeline must be one of"):
        m.Schedule("s", pipeline="double_buffered")  # type: ignore[arg-type]


def test_a_kind_is_registered_once() -> None:
    @dataclass(frozen=True)
    class Other:
        kind: str = "double_buffered"

    with pytest.raises(ValueError, match="registered twice"):
        register_pipeline(Other)
    assert PIPELINES["double_buffered"] is m.DoubleBuffered
