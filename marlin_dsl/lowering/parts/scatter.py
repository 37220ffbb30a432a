"""Dense A fragments from a lane's kept N:M codes, for a target without a sparse MMA (the
scattered weight-stream layout, `layouts/sparse_scatter.py`, which says what is stored where).

Per vector and N tile a lane decodes each kept pair once (`PairDecoder`: half the decodes of a
dense vector for 2:4), looks up each mask once (a constant table indexed by a metadata field:
one shift and one AND extract the field), and builds each fragment pair of a K tile as

    mux(kept pair of candidate 0, kept pair of candidate 1, select) ... & keep

on the pairs' bits: one LOP3 per further candidate and one AND (`ScatterPlan.programs`). A
half whose block does not keep the pair's unit is +0.0, so the dense MMA multiplies the
dropped positions by exact zeros. Nothing here names a target or a format."""
from __future__ import annotations

from ...ir import U32, ConstTable, Value
from ...layouts.sparse_scatter import MetaField, ScatterPlan
from ..group_params import GroupValues
from .context import GemmParts

_MUX = 0xD8  # lop3 truth table of c ? b : a, bit by bit


class ScatterFragments(GemmParts):
    """A fragments of the scattered layout (needs the stream setup: `layout`, `pairs`, `frag_a`,
    `a_row_off`, `scale_sums`)."""

    @property
    def plan(self) -> ScatterPlan:
        assert self.layout.scatter is not None
        return self.layout.scatter

    def scatter_tables(self) -> list[ConstTable]:
        """The mask tables the plan's fragment pairs read (`ScatterPlan.programs`), per kind of
        metadata field (one block's, two blocks')."""
        plan, tables = self.plan, {}
        programs, _ = plan.programs
        for pairs in plan.tile_pairs:
            for tp in pairs:
                f = plan.fields[tp.field]
                prog = programs[tp.q]
                for name in [prog.keep, *(sel for sel, _ in prog.steps[:len(tp.candidates) - 1])]:
                    full = plan.table_name(f, name)
                    if full not in tables:
                        tables[full] = ConstTable(full, U32, tuple(int(v) for v in plan.table(f, name)))
        return [tables[name] for name in sorted(tables)]

    def scatter_fragment(self, cache: dict, words: Value, meta: Value, tile: int,
                         params: dict[int, GroupValues]) -> Value:
        """K tile `tile`'s dense A fragment from one vector's kept words and metadata of one N
        tile (`cache`: that vector and tile's decoded pairs, fields and masks, shared by its
        K tiles): per fragment pair, its first candidate's kept pair, muxed with each further
        candidate's by a select mask, then ANDed with the unit's keep mask."""
        b, plan = self.b, self.plan
        programs, _ = plan.programs
        parts = []
        for p_, tp in enumerate(plan.tile_pairs[tile]):
            row_params = params[self.a_row_off[2 * p_]]
            field, prog = plan.fields[tp.field], programs[tp.q]
            acc = self._kept_bits(cache, words, tp.candidates[0][1], row_params)
            for (_, kept), (select, swap) in zip(tp.candidates[1:], prog.steps):
                value = self._kept_bits(cache, words, kept, row_params)
                arms = [value, acc] if swap else [acc, value]
                acc = b.value("lop3", [*arms, self._mask(cache, meta, field, select)], U32, {"lut": _MUX}, hint="sc")
            acc = b.binary("and", acc, self._mask(cache, meta, field, prog.keep), hint="sc")
            parts.append(b.bitcast(acc, self.pairs.pair_type, hint="sp"))
        return b.value("frag_build", parts, self.frag_a, hint="fa")

    def _kept_bits(self, cache: dict, words: Value, kept: int, params: GroupValues) -> Value:
        """Kept pair `kept` decoded (scaled, or not where the sums take the scale), as u32 bits."""
        key = ("kept", kept, id(params))  # (one vector's pairs share their parameters)
        if key not in cache:
            word, slot = divmod(kept, self.plan.per_half)
            w = words if self.plan.code_words == 1 else \
                self.b.value("extract", [words], U32, {"index": word}, hint="w")
            decode = self.pairs.unscaled if self.scale_sums else self.pairs.dequant
            cache[key] = self.b.bitcast(decode(w, slot, params), U32, hint="kp")
        return cache[key]

    def _mask(self, cache: dict, meta: Value, field: MetaField, name: str) -> Value:
        """Mask table `name` for `field`'s blocks: a lookup by the field."""
        b = self.b
        index_key = ("field", field.word, field.shift)
        if index_key not in cache:
            v = meta if self.plan.meta_words == 1 else \
                b.value("extract", [meta], U32, {"index": field.word}, hint="mw")
            if field.shift:
                v = b.binary("shr", v, field.shift, hint="mf")
            if field.shift + field.width < 32:
                v = b.binary("and", v, (1 << field.width) - 1, hint="mf")
            cache[index_key] = v
        key = ("mask", field.word, field.shift, name)
        if key not in cache:
            cache[key] = b.value("table", [cache[index_key]], U32, {"name": self.plan.table_name(field, name)},
                                 hint="mk")
        return cache[key]


__all__ = ["ScatterFragments"]
