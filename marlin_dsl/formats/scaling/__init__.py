"""Scale schemes: how a format's parameters are stored, quantised, checked, printed and applied.

`Scaling` (scheme.py) is the interface; `GroupAffine` (affine.py) is the scheme of a
`GroupScale` with an optional `ZeroPoint` or `GroupBias` (parts.py), `TwoLevelScale`
(two_level.py) a per-column scale times per-group 8-bit sub-scales. A new scheme is a module
here and one entry in `SCALE_SCHEMES` (the kinds a format's `scale` line may name).
"""
from __future__ import annotations

from .affine import GroupAffine
from .parts import (BIAS_DTYPES, PER_COLUMN, SCALE_DTYPES, ZERO_POINT_DTYPES, GroupBias, Grouping,
                    GroupScale, ZeroPoint)
from .scheme import Affine, GroupChoice, ParamArray, Scaling, parameter_table_name
from .super_block import SuperBlockScale
from .two_level import TwoLevelScale

#: Schemes declared in place of a GroupScale (`Format(name, element, TwoLevelScale(...))`),
#: by their kind in the textual form (`scale two_level(...)`).
SCALE_SCHEMES: dict[str, type[Scaling]] = {cls.text_kind: cls for cls in (TwoLevelScale, SuperBlockScale)}

__all__ = ["Affine", "BIAS_DTYPES", "GroupAffine", "GroupBias", "GroupChoice", "GroupScale", "Grouping",
           "PER_COLUMN", "ParamArray", "SCALE_DTYPES", "SCALE_SCHEMES", "Scaling", "SuperBlockScale", "TwoLevelScale",
           "ZERO_POINT_DTYPES", "ZeroPoint", "parameter_table_name"]
