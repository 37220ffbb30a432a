"""Lowering of the warpgroup pipeline with warp roles (`Warpgroup(producers=P)`): producer
warps decode and copy, consumer warpgroups multiply, and they meet only at mbarriers
(docs/IR.md, "Warp roles and mbarriers"). The parts are the shared-A warpgroup lowering's
(`warpgroup.py`): the same weight fetch, decode and stores of A into swizzled rows, the same
activation copies, the same wgmmas and accumulator stores; what changes is who runs them and
how they wait for each other.

Why: in the unspecialised kernel every warp holds a 64 x tile_m accumulator (128 registers at
tile_m = 256), which leaves 8 warps per SM, and each of them decodes, copies, stores and then
meets the others at a threadgroup barrier every step: the decode chain of a step is longer than
the step's tensor work and nothing else can hide it (bench/results/issue15_h100_2026-11-25c:
tensor pipe 54% busy, issue slots 29%, 2 warps per scheduler). Here the decode runs on warps
without accumulators, and a producer only waits when it runs more than the slots ahead.

Warps 0 .. 4P-1 are producers: producer warp w decodes N tiles w nsub .. (nsub = the block's
16-row N tiles / 4P) into A slot kv % a_stages (what warp w does in the shared-A loop, for
nsub tiles) and all producer threads copy the activation tile of step kv + L into X slot
(kv + L) % stages, L = stages - a_stages. Warps 4P .. are the consumer warpgroups: consumer
warp c reads A rows 16 c .. (its warpgroup's 64 rows) and every activation row of the slot,
and stores N tile c of the output. Per step kv:

    producer                                      consumer
    wait x_free[(kv+L) % S] (round - 1)           wait full[kv % S] (round)
    copies of step kv+L                           wgmma_fence; wgmmas of step kv; commit
    wait a_free[kv % SA] (round - 1)              wgmma_wait pending 1 (step kv-1 retired)
    load weights of step kv+depth+1               kv >= 1: arrive x_free, a_free of step kv-1
    decode step kv, store into A slot
    async_wait pending L (step kv's copies)
    fence async_proxy; arrive full[kv % S]

A producer's first wait on a free slot asks for the parity of the phase before the first
(round - 1 = -1, parity 1), which a fresh barrier reports complete: no branch for the first
round. full counts the producer threads, x_free and a_free the consumer threads.

With `copies="consumers"` the producers only decode (wait a_free, decode, fence, arrive
a_full) and the consumers copy, L = stages - 2 steps ahead: per step each consumer thread
waits x_free for the copies' slot, issues its share, then retires its own copies of step kv
(async_wait pending L), fences, arrives at x_full and waits for it (the consumers' meeting
point: every thread's copies of the step have landed), waits a_full, and multiplies as above.
"""
from __future__ import annotations

from ..ir import U32, SharedArray, Value
from ..layouts.weight_stream import LAYOUT_NAME
from .parts.shell import gemm_buffers, gemm_kernel
from .warpgroup import WarpgroupLowering


class WarpgroupRolesLowering(WarpgroupLowering):
    """The warpgroup pipeline with producer and consumer warps."""

    def lower(self):
        p, target = self.pipeline, self.target
        per = target.warpgroup_warps
        self.producer_warps = per * p.producers
        self.consumer_warps = self.s.warps_n
        self.a_slots = p.a_stages
        self.consumer_copies = p.copies == "consumers"
        # the copies run this many steps ahead: of the decode (producers copying: they share its
        # slot turn), or of the wgmmas, one slot short of the ring (consumers copying: the other
        # consumer warpgroup may still read the slot before)
        self.ahead = self.n_stages - 2 if self.consumer_copies else self.n_stages - p.a_stages
        b = self.b
        self.init_barriers(b.index("tid"))
        # No register counts for the roles: ptxas (CUDA 13.0) allocates every role within the
        # launch bound's per-thread share whatever setmaxnreg says (a 512-thread kernel whose
        # consumers' m64n256 wgmma needs 154 registers fails with C7602 "Insufficient
        # registers (128)"), so the roles fit the even share: 1 producer warpgroup with 2
        # consumer warpgroups is 168 registers each.
        roles = b.op("warp_roles", [], [], {"warps": (self.producer_warps, self.consumer_warps)})
        # The producers compute their setup inside their region, the consumers' comes before
        # the split: values computed before the split and used by the producers only, and the
        # consumers' own setup inside their region, each made ptxas serialise the consumers'
        # wgmmas (C7514, "non wgmma instructions reading accumulator registers"), although
        # neither touches an accumulator (nvcc 13.0; found by bisecting the printed text).
        for emit in (self.producer, self.consumer):
            with b.region() as region:
                roles.regions.append(region)
                emit()
                b.yield_()
        s = self.n_stages
        shared = [SharedArray("x_s", self.act, s * self.x_stage, align=self.b_layout.align),
                  SharedArray("a_s", self.act, self.a_slots * self.a_stage, align=self.b_layout.align),
                  *(SharedArray(name, U32, 2 * slots) for name, _, slots in self.barrier_rings())]
        return gemm_kernel(
            self.ctx, buffers=gemm_buffers(self.ctx), shared=shared,
            tables=self.stream_tables([*self.swizzled_tables(), *self.a_tables(), *self.acc_tables()]),
            attrs={"stages": s, "weight_layout": LAYOUT_NAME, "producers": p.producers},
            memory="shared memory (stages x tile_m activation rows, a_stages x decoded weights)")

    def setup(self, warps_n: int, nsub: int) -> None:
        """The stream setup of a role: the block's N tiles shared out among `warps_n` warps,
        `nsub` each; K steps, the weight fetch and the activation copies."""
        self.nsub = nsub
        self.stream_setup(("lane", "warp", "tid"), "wm", "wt", clamp=False, warps_n=warps_n)
        self.setup_fetch(self.vectors)
        self.steps = self.KS

    def barrier_rings(self) -> list[tuple[str, int, int]]:
        """(name, arrivals per phase, slots) of every mbarrier ring: `full` (a step's
        activations and decoded weights are in place: the producers), or with the consumers
        copying `x_full` (the consumers' copies of a step have landed) and `a_full` (its decoded
        weights); `x_free` and `a_free` (the consumers are done with a slot)."""
        s, sa = self.n_stages, self.a_slots
        producers = self.producer_warps * self.target.warp_size
        consumers = self.consumer_warps * self.target.warp_size
        full = [("x_full", consumers, s), ("a_full", producers, sa)] if self.consumer_copies else \
            [("full", producers, s)]
        return [*full, ("x_free", consumers, s), ("a_free", consumers, sa)]

    def init_barriers(self, tid: Value) -> None:
        """Thread 0 initialises every barrier; the threadgroup meets before any is used."""
        b = self.b

        def init() -> None:
            for name, count, slots in self.barrier_rings():
                for i in range(slots):
                    b.op("mbarrier_init", [self.c(i)], attrs={"barriers": name, "count": count})

        self.guarded(self.op2("eq", tid, 0, hint="t0"), init)
        b.barrier()

    def round_parity(self, step: Value, slots: int, before: bool) -> tuple[Value, Value]:
        """(slot, parity) of `step`'s use of a ring of `slots`: the slot step % slots and the
        parity of its round step / slots (`before`: of the round before, which a fresh barrier
        reports complete for the first round)."""
        slot = self.op2("rem", step, slots, hint="sl")
        rnd = self.op2("div", step, slots, hint="rd")
        if before:
            rnd = self.op2("add", rnd, 1, hint="rd")  # (round - 1) & 1 == (round + 1) & 1
        return slot, self.op2("and", rnd, 1, hint="par")

    def wait(self, name: str, slot: Value, parity: Value) -> None:
        self.b.op("mbarrier_wait", [slot, parity], attrs={"barriers": name})

    def arrive(self, name: str, slot: Value) -> None:
        self.b.op("mbarrier_arrive", [slot], attrs={"barriers": name})

    # ----- producer -------------------------------------------------------------------------

    def producer(self) -> None:
        b, target = self.b, self.target
        self.setup(self.producer_warps, self.s.tile_n // target.mma_m // self.producer_warps)
        copies = not self.consumer_copies
        if copies:
            self.threads = self.producer_warps * target.warp_size
            self.setup_copies()
        # producer warp w's first A row: its first N tile's (warp_tile0 = w * nsub)
        self.warp_row = self.op2("add", self.op2("mul", self.warp_tile0, target.mma_m, hint="ar"), self.a_row0,
                                 hint="ar")
        self.a_k0 = b.value("table", [self.lane], U32, {"name": "a_k0"}, hint="ak")
        self._a_index = {}
        stages, depth, ahead = self.n_stages, self.depth, self.ahead
        if copies:
            for step in range(ahead):  # the first copies, into slots nobody has used yet
                self.issue_x(self.c(step))
        fetched = [self.fetch(self.c(d)) for d in range(depth + 1)]
        per_set = len(fetched[0])

        def body(kv: Value, groups: list[list[Value]]) -> list[Value]:
            (carried,) = groups
            if copies:
                self.copy_ahead(kv)
            slot_a, parity_a = self.round_parity(kv, self.a_slots, before=True)
            self.wait("a_free", slot_a, parity_a)
            self.store_a(kv, carried[:per_set])
            if copies:
                b.op("async_wait", attrs={"pending": ahead})  # step kv's copies have landed
            b.op("fence", attrs={"scope": "async_proxy"})
            if copies:
                self.arrive("full", self.op2("rem", kv, stages, hint="sl"))
            else:
                self.arrive("a_full", slot_a)
            # The next weights are loaded after the fence: on the H100 the async-proxy fence is
            # MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S, and the MEMBAR waits for this thread's
            # loads in flight, so loads issued before it would cost a memory round trip a step.
            new = self.fetch(self.op2("add", kv, depth + 1, hint="nx"))
            return [*carried[per_set:], *new]

        self.carried_for(0, self.steps, 1, [("pf", [v for f in fetched for v in f])], body, iv_hint="kv",
                         hint="fin")
        if copies:
            b.op("async_wait", attrs={"pending": 0})  # the copies past K land before the warp exits

    def copy_ahead(self, kv: Value) -> None:
        """The copies of step kv + ahead, into a slot whose last readers are done with it."""
        nx = self.op2("add", kv, self.ahead, hint="nx")
        slot, parity = self.round_parity(nx, self.n_stages, before=True)
        self.wait("x_free", slot, parity)
        self.issue_x(nx)

    # ----- consumer -------------------------------------------------------------------------

    def consumer_setup(self) -> None:
        """The consumers' K steps, A rows (`wg_a0`) and output tile (`n_tiles`), and their copy
        plan where they copy (thread t of the consumers is copier t)."""
        per, mm = self.target.warpgroup_warps, self.target.mma_m
        self.setup(self.consumer_warps, 1)
        if self.consumer_copies:
            ws = self.target.warp_size
            self.tid = self.op2("sub", self.tid, self.producer_warps * ws, hint="ct")
            self.threads = self.consumer_warps * ws
            self.setup_copies()
        cw = self.op2("sub", self.warp, self.producer_warps, hint="cw")
        # this warpgroup's 64 rows of each A slot; consumer warp c stores N tile c of the block
        self.wg_a0 = self.op2("mul", self.op2("div", cw, per, hint="wg"), per * mm * self.row, hint="wg")
        self.n_tiles = [self.op2("add", self.block_nt0, cw, hint="nt")]

    def consumer(self) -> None:
        b, target = self.b, self.target
        per, mm = target.warpgroup_warps, target.mma_m
        stages = self.n_stages
        self.consumer_setup()
        bases = self.acc_bases()
        acc = b.value("frag_zero", [], self.frag_acc, hint="acc")
        if self.consumer_copies:
            for step in range(self.ahead):  # the first copies, into slots nobody has used yet
                self.issue_x(self.c(step))

        def body(kv: Value, groups: list[list[Value]]) -> list[Value]:
            (acc_in,) = groups[0]
            slot, parity = self.round_parity(kv, stages, before=False)
            if self.consumer_copies:
                self.copy_ahead(kv)
                # this thread's copies of step kv have landed; the consumers meet at x_full
                b.op("async_wait", attrs={"pending": self.ahead})
                b.op("fence", attrs={"scope": "async_proxy"})
                self.arrive("x_full", slot)
                self.wait("x_full", slot, parity)
                self.wait("a_full", *self.round_parity(kv, self.a_slots, before=False))
            else:
                self.wait("full", slot, parity)
            a_base = self.a_offset(kv)
            b.op("wgmma_fence", [acc_in])
            acc_v = acc_in
            for t in range(self.layout.tiles * self.vectors):
                atom, col = divmod(t * self.a_k, self.row)
                off = atom * self.a_atom + col
                a_off = self.op2("add", a_base, off, hint="ab") if off else a_base
                acc_v = self.wgmma([a_off, self.b_offset(slot, t), acc_v], [], t, {"smem_a": "a_s"})
            b.op("wgmma_commit")
            b.op("wgmma_wait", attrs={"pending": 1})  # step kv-1's wgmmas are done with their slots

            def release() -> None:
                prev = self.op2("sub", kv, 1, hint="pv")
                self.arrive("x_free", self.op2("rem", prev, stages, hint="sl"))
                self.arrive("a_free", self.op2("rem", prev, self.a_slots, hint="sl"))

            self.guarded(self.op2("gt", kv, 0, hint="p"), release)
            return [acc_v]

        results = self.carried_for(0, self.steps, 1, [("acc", [acc])], body, iv_hint="kv", hint="fin")
        if self.consumer_copies:
            b.op("async_wait", attrs={"pending": 0})  # the copies past K land before the warp exits
        done = b.value("wgmma_wait", [results[-1]], self.frag_acc, {"pending": 0}, hint="acc")
        self.store_acc(done, bases, self.whole_tile())


__all__ = ["WarpgroupRolesLowering"]
