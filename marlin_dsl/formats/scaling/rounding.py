"""Rounding helpers shared by the scale schemes' quantisers: the symmetric scale of a group
and scales rounded *up* to their storage type (never shrinking, so no value clips)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from ...errors import ValueRangeError
from ..storage import StorageType

if TYPE_CHECKING:
    from .scheme import ScaledFormat


def symmetric_scale(fmt: ScaledFormat, weights: Callable[[], np.ndarray], group_max: np.ndarray,
                    group_min: np.ndarray, table: np.ndarray) -> np.ndarray:
    t_max, t_min = float(table.max()), float(table.min())
    if t_min >= 0 and (group_min < 0).any():
        w = weights()
        bad = tuple(int(i) for i in np.argwhere(w < 0)[0])
        raise ValueRangeError(
            f"weights: format {fmt.name!r} ({fmt.element.describe()}) has no negative values "
            f"and no zero point, but weights{bad} = {np.float64(w[bad])} is negative"
        )
    if t_max <= 0 and (group_max > 0).any():
        w = weights()
        bad = tuple(int(i) for i in np.argwhere(w > 0)[0])
        raise ValueRangeError(
            f"weights: format {fmt.name!r} has no positive values, but weights{bad} = "
            f"{np.float64(w[bad])}"
        )
    scale = np.zeros_like(group_max)
    if t_max > 0:
        scale = np.maximum(scale, group_max / t_max)
    if t_min < 0:
        scale = np.maximum(scale, group_min / t_min)
    return scale


def scale_at_least(scale: np.ndarray, fmt: ScaledFormat, storage: StorageType) -> tuple[np.ndarray, np.ndarray]:
    """Scales rounded up to the format's scale storage, so no value clips later: (stored,
    their exact float64 values). All-zero groups (scale 0) get 1.0, any positive scale works."""
    if (scale > storage.max_value).any():
        g, col = (int(i) for i in np.argwhere(scale > storage.max_value)[0])
        raise ValueRangeError(
            f"weights: group {g} of column {col} needs scale {scale[g, col]:.6g}, beyond "
            f"{storage.name}'s largest value {storage.max_value} for format {fmt.name!r}; use a "
            f"format with wider scales (GroupScale(dtype='bf16') or 'f32') or rescale the weights"
        )
    stored = storage.round_up(np.where(scale > 0, scale, 1.0))
    values = storage.to_float64(stored)
    # Below the storage type's range a scale rounds up to its smallest value; a group whose
    # every weight then rounds to zero is lost. An error where that group matters in the
    # weight (the whole weight scaled by 1e-9), not for groups that are ~0 anyway.
    table = fmt.element.table()
    table = np.abs(table[np.isfinite(table)])
    finest = float(table[table > 0].min()) / (2.0 * float(table.max()))  # smallest kept / range
    lost = (scale > 0) & (scale < values * finest) & (scale > 1e-3 * float(scale.max()))
    if lost.any():
        g, col = (int(i) for i in np.argwhere(lost)[0])
        raise ValueRangeError(
            f"weights: group {g} of column {col} needs scale {scale[g, col]:.6g}, below what "
            f"{storage.name} scales of format {fmt.name!r} hold (it would be stored as "
            f"{values[g, col]:.6g} and the group would quantise to zeros); rescale the weights "
            f"or declare a wider scale type (GroupScale(dtype='f32'))")
    return stored, values
