"""Operand source of the weight stream's B fragments where the layout has no K shuffle (2:4 on
the sparse MMA, whose groups of 4 must stay together): wide activation loads transposed across
lanes by warp shuffles (`WeightStream(x_shuffle=L)`).

Without it each lane builds its B fragment from two-element loads, one per 32-bit word it
holds (CUDA's m16n8k32 B: 4 words a lane, each from another K position of its row). Every such
load touches 8 rows (the warp's 8 M columns): the L1 looks up 8 lines for 4 bytes a lane, and
at M = 16 that bounded the 2:4 decode (bench/results/issue33_h200_2026-11-29, run 17: L1
throughput 87%, 4.6 M tag requests against dense fp4's 2.1 M).

With x_shuffle = L the lanes of a group of L (lanes differing in the low log2(L) bits, which
read one M row) load L consecutive words each, one vector load of 2L activations, and the
group transposes them: word j of lane q's load is the word lane j of the group needs as
fragment word u L + q. The transpose is log2(L) butterfly stages; a stage swaps bit b of the
lane and of the register index: per register pair, the lane sends the word it does not keep
(`select`), takes its partner's (`shfl_xor`) and puts it in the place it sent from (two
`select`s). Per L words a lane: one vector load, L log2(L) / 2 shuffles and 3 L log2(L) / 2
selects, instead of L loads. CUDA at L = 4: one 128-bit load, 4 shuffles and 12 selects for
the 4 words a lane's 128 activations of one K tile need; L = 2: two 64-bit loads, 2 shuffles and
6 selects.

The plan is derived from the target's B lane table (`layouts/activation_transpose.py`): which
lanes form a group, and where each lane's load starts in a K tile (a per-lane base and
per-unit offsets). It exists only where every word a group needs is one aligned run of 2L
activations.
"""
from __future__ import annotations

from ...ir import U32, ConstTable, Value, VectorType
from ...layouts.activation_transpose import TransposePlan, target_transpose_plan
from .context import GemmParts


class ActivationTranspose(GemmParts):
    """B fragments from wide activation loads transposed across lanes (module docstring)."""

    def init_x_transpose(self, lanes_per_group: int) -> None:
        """The plan (no IR emitted; the schedule check has refused tables without one);
        x_shuffle 0 leaves `x_plan` None."""
        self.x_plan: TransposePlan | None = None
        if lanes_per_group:
            self.x_plan = target_transpose_plan(self.target, self.tile_k_dense, lanes_per_group)

    def x_transpose_tables(self) -> list[ConstTable]:
        return [] if self.x_plan is None else [ConstTable("x_sh0", U32, self.x_plan.load_base)]

    def setup_x_transpose(self) -> None:
        """The lane's load base and, per stage, whether it is the high lane of its pairs
        (emitted once, before the K loop)."""
        plan, b = self.x_plan, self.b
        assert plan is not None
        self.x_sh0 = b.value("table", [self.lane], U32, {"name": "x_sh0"}, hint="xs")
        self.x_high = [self.op2("ne", self.op2("and", self.lane, 1 << s, hint="xh"), 0, hint="xh")
                       for s in range(plan.stages)]

    def shuffle_loads(self, k_tile0: Value, mt: int) -> list[Value]:
        """This lane's vector loads of 2L activations for the K tile at dense K k_tile0 and M
        tile mt, one per unit (zero outside M and K; clamped rows where the loads are)."""
        plan, b = self.x_plan, self.b
        assert plan is not None
        m_ok, row = self.x_row(mt, "xr")
        start = self.op2("add", k_tile0, self.x_sh0, hint="xk")
        idx0 = self.op2("add", row, start, hint="xi")
        vec = VectorType(self.act, 2 * plan.lanes_per_group)
        out = []
        for off in plan.unit_offset:
            k = self.op2("add", start, off, hint="xk") if off else start
            pred = self.x_pred(m_ok, k)
            idx = self.op2("add", idx0, off, hint="xi") if off else idx0
            out.append(b.value("vload", [idx] + ([pred] if pred is not None else []), vec,
                               {"buffer": "x", "size": vec.size}, hint="xw"))
        return out

    def transposed_fragment(self, loads: list[Value]) -> Value:
        """The B fragment from `shuffle_loads`' vectors: each unit's L words transposed across
        the group (module docstring), then the fragment's words in order."""
        plan, b = self.x_plan, self.b
        assert plan is not None
        pair = VectorType(self.act, 2)
        words: list[Value] = []
        for vec in loads:
            regs = [b.value("vec", [b.value("extract", [vec], self.act, {"index": 2 * j}, hint="xe"),
                                    b.value("extract", [vec], self.act, {"index": 2 * j + 1}, hint="xe")],
                            pair, hint="xw") for j in range(plan.lanes_per_group)]
            for s in range(plan.stages):
                bit, high = 1 << s, self.x_high[s]
                for j in range(plan.lanes_per_group):
                    if j & bit:
                        continue
                    send = b.select(high, regs[j], regs[j | bit], hint="xs")
                    recv = b.value("shfl_xor", [send], pair, {"mask": bit}, hint="xr")
                    regs[j], regs[j | bit] = (b.select(high, recv, regs[j], hint="xw"),
                                              b.select(high, regs[j | bit], recv, hint="xw"))
            words += regs
        return b.value("frag_build", words, self.frag_b_stream, hint="fb")


__all__ = ["ActivationTranspose"]
