"""Passes over the kernel IR, each a small module with one job, run by a `PassManager` that
verifies the IR after every pass.

Default pipeline: specialise (dispatch marked loops on their trip count), unroll (constant
loops), fold (constants, identities, constant if/switch), cse, dce, interleave (list
scheduling: critical path first, integer and float work interleaved).
"""
from .manager import (
    DEFAULT_PIPELINE,
    PASSES,
    Namer,
    Pass,
    PassError,
    PassManager,
    build_pipeline,
    clone_op,
    register,
    substitute,
)
from .specialise import SpecialisePass
from .unroll import UnrollPass
from .fold import FoldPass
from .cse import CSEPass
from .dce import DCEPass
from .interleave import InterleavePass

__all__ = [
    "CSEPass", "DCEPass", "DEFAULT_PIPELINE", "FoldPass", "InterleavePass", "Namer", "PASSES",
    "Pass", "PassError", "PassManager", "SpecialisePass", "UnrollPass", "build_pipeline",
    "clone_op", "register", "substitute",
]
