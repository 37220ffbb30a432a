"""Activation loads shared by the lanes that read one M row (`WeightStream(x_shuffle=L)`), as
data derived from the target's B lane table: which lanes form a group, and where each lane's
vector load starts in a K tile. The lowering (`lowering/parts/x_transpose.py`) emits the loads
and the butterfly transpose; the schedule check asks for the plan, so a table that does not
allow it is refused before lowering."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ScheduleError
from ..machine.target import Target


@dataclass(frozen=True)
class TransposePlan:
    """How the lanes of a warp load one K tile's B words with L-lane transposes."""

    lanes_per_group: int  # L: the lanes differing in the low log2(L) bits of their index
    units: int  # loads per lane per K tile (each L words)
    load_base: tuple[int, ...]  # per lane: K row (within the tile) where its first unit's load starts
    unit_offset: tuple[int, ...]  # per unit: added to load_base

    @property
    def stages(self) -> int:
        return self.lanes_per_group.bit_length() - 1


def transpose_plan(b_k: np.ndarray, b_n: np.ndarray, lanes_per_group: int) -> TransposePlan:
    """The plan for a B lane table (b_k / b_n: [lanes, elements] K row and M column of each
    element; elements 2i, 2i + 1 are word i: adjacent K rows of one column). Lane q of a group
    (q = lane % L) loads, for unit u, the words that the group's lane j (j = 0..L-1) needs as
    its fragment word u L + q: they must be the consecutive pairs base, base + 2, .. of one
    M column, base a multiple of 2L (one aligned vector). ScheduleError where the table does
    not allow it."""
    big_l = lanes_per_group
    lanes, elems = b_k.shape
    words = elems // 2
    if big_l not in (2, 4, 8) or lanes % big_l or elems % 2 or words % big_l:
        raise ScheduleError(f"x_shuffle={big_l}: the target's B lane table ({lanes} lanes x {elems} elements) "
                            f"does not split into groups of {big_l} lanes loading {big_l} words each")
    if not ((b_k[:, 1::2] == b_k[:, 0::2] + 1).all() and (b_n == b_n[:, :1]).all()):
        raise ScheduleError(f"x_shuffle={big_l}: the target's B elements are not pairs of adjacent K rows "
                            "of one M column per lane")
    units = words // big_l
    pair_k = b_k[:, 0::2]  # [lane, word i]: the word's first K row
    base = np.zeros((lanes, units), dtype=np.int64)
    for lane in range(lanes):
        group = (lane & ~(big_l - 1)) + np.arange(big_l)  # the group's lanes, in-group index j
        q = lane & (big_l - 1)
        if (b_n[group, 0] != b_n[lane, 0]).any():
            raise ScheduleError(f"x_shuffle={big_l}: lanes {group.tolist()} read different M columns")
        for u in range(units):
            run = pair_k[group, u * big_l + q]  # what lane j of the group needs from this load
            if run[0] % (2 * big_l) or (np.diff(run) != 2).any():
                raise ScheduleError(f"x_shuffle={big_l}: lane {lane}'s unit {u} would need K rows "
                                    f"{run.tolist()}, not one aligned run of {2 * big_l} activations")
            base[lane, u] = run[0]
    unit_offset = base[0] - base[0, 0]
    if not (base - base[:, :1] == unit_offset).all():
        raise ScheduleError(f"x_shuffle={big_l}: the lanes' load offsets are not a per-lane base plus "
                            "per-unit offsets")
    return TransposePlan(big_l, units, tuple(int(v) for v in base[:, 0]), tuple(int(v) for v in unit_offset))


def target_transpose_plan(target: Target, tile_k: int, lanes_per_group: int) -> TransposePlan:
    """The plan for `target`'s B fragment of `tile_k` dense K rows."""
    b_k, b_n = target.lane_elements("b", tile_k, target.mma_n)  # type: ignore[misc]
    return transpose_plan(np.asarray(b_k), np.asarray(b_n), lanes_per_group)


__all__ = ["TransposePlan", "target_transpose_plan", "transpose_plan"]
