"""Pipelines: how a threadgroup's K loop is arranged. One module per pipeline (or family),
each class registered in `PIPELINES` by its `kind`; see `base.py` for the protocol and
docs/ARCHITECTURE.md for how to add one."""
from .base import PIPELINES, Pipeline, ScheduleShape, applies_epilogue, register_pipeline, splits_outputs
from .multistage import Multistage
from .seed import DoubleBuffered, FusedDequant, StripedKParallel
from .warpgroup import Warpgroup
from .weight_stream import WeightStream

__all__ = ["DoubleBuffered", "FusedDequant", "Multistage", "PIPELINES", "Pipeline", "ScheduleShape",
           "StripedKParallel", "Warpgroup", "WeightStream", "applies_epilogue", "register_pipeline", "splits_outputs"]
