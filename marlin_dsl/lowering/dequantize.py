"""The dequantize kernel: a weight in the stream layout (`layouts/weight_stream.py`, what CUDA
layers hold) decoded to W^T [N, K] in the activation type, for many rows of activations, where
one decode of the weight followed by the fp16/bf16 GEMM (`mx.matmul`, cuBLAS) is faster than
decoding it once per M tile inside our GEMM (`targets/cuda/tuning.dequantize_min_m`; exllama's
route for large batches).

The decode is the warpgroup pipeline's: each warp decodes its 16 N rows of one K vector pair by
pair (`PairDecoder`, the same arithmetic as the GEMMs' A operands, so the values are the ones
our kernels multiply) and stores them as the decoded-weight plan of `WarpgroupLowering`
(`a_store_plan`) lays them out: runs of a lane's elements in true K order (16 bytes where the
layout's K shuffle allows), here at w[n, k] in device memory instead of a swizzled shared tile.

Threadgroup (group_x, group_y) covers N rows [128 group_x, +128) (8 warps, 16 rows each) and
K vectors [KB group_y, + KB); each warp loads its vector words DEQUANT_DEPTH steps ahead
(register double buffering) and stores every decoded run. K must be whole vectors (`dequantize_supported`);
rows past N are not stored.
"""
from __future__ import annotations

from ..errors import ScheduleError
from ..formats import Format
from ..ir import U32, BufferParam, ConstTable, GridDim, Kernel, Value, VectorType
from ..layouts.weight_stream import LAYOUT_NAME, stream_layout
from ..machine.target import Target
from ..schedule import Gemm, Schedule, Warpgroup
from .group_params import GroupParams
from .parts.context import GemmContext
from .parts.shell import finish_kernel
from .warpgroup import WarpgroupLowering

#: warps a threadgroup (16 N rows each), K vectors it decodes, and vectors a warp loads ahead
DEQUANT_WARPS = 8
DEQUANT_VECTORS = 8
DEQUANT_DEPTH = 1


def dequantize_supported(fmt: Format, target: Target, k: int | None = None) -> str | None:
    """None where a dequantize kernel decodes `fmt` (at K = k where given) on `target`, else
    why not."""
    try:
        layout = stream_layout(fmt, target)
    except ScheduleError as e:
        return str(e)
    if target.warpgroup_mma is None:
        return f"{target.name} has no warpgroup decode plan (the decoded-weight runs)"
    if layout.sparse or layout.scatter is not None:
        return f"{fmt.name!r} is sparse: its stream layout holds compressed values"
    if k is not None and k % layout.dense_chunk:
        return f"K={k} is not a whole number of {layout.dense_chunk}-element K vectors"
    return None


def dequantize_gemm(fmt: Format, activation: str, target: Target) -> Gemm:
    """The Gemm description the dequantize kernel's lowering context is built from (its
    schedule shapes the decode: 8 warps of 16 N rows, one K vector a step)."""
    chunk = stream_layout(fmt, target).dense_chunk
    schedule = Schedule("dequantize", tile_m=8, tile_n=16 * DEQUANT_WARPS, tile_k=chunk, warps_m=1,
                        warps_n=DEQUANT_WARPS, pipeline=Warpgroup(stages=3, a_source="shared"))
    return Gemm(f"{fmt.name}_{activation}_dequantize", fmt, schedule, activation)


class DequantizeLowering(WarpgroupLowering):
    def lower(self) -> Kernel:
        b = self.b
        self.stream_setup(("lane", "warp", "tid"), "wm", "wt", clamp=False)
        self.setup_fetch(1)
        mm = self.target.mma_m
        self.warp_row = self.op2("add", self.op2("mul", self.n_tiles[0], mm, hint="ar"), self.a_row0, hint="ar")
        self.a_k0 = b.value("table", [self.lane], U32, {"name": "a_k0"}, hint="ak")
        begin = self.op2("mul", b.index("group_y"), DEQUANT_VECTORS, hint="kb")
        end = self.op2("min", self.op2("add", begin, DEQUANT_VECTORS, hint="ke"), self.KS, hint="ke")

        depth = DEQUANT_DEPTH
        first = [self.fetch(self.op2("add", begin, d, hint="pk") if d else begin) for d in range(depth)]
        per_set = len(first[0])

        def body(kv: Value, groups: list[list[Value]]) -> list[Value]:
            (carried,) = groups
            # clamped loads: the block's last steps read its last vector (or the matrix's) again
            new = self.fetch(self.op2("add", kv, depth, hint="nx"))
            self.store_w(kv, carried[:per_set])
            return [*carried[per_set:], *new]

        self.carried_for(begin, end, 1, [("pf", [v for f in first for v in f])], body, iv_hint="kv", hint="fin")
        ctx, act = self.ctx, self.act
        buffers = [BufferParam("qweight", U32, "read"), *GroupParams(b, self.fmt, act).buffers(),
                   BufferParam("w", act, "write")]
        return finish_kernel(
            b, self.target, name=ctx.gemm.name, threads=ctx.threads,
            grid=(GridDim("N", self.s.tile_n), GridDim("K", DEQUANT_VECTORS * self.layout.dense_chunk), GridDim(None)),
            buffers=buffers, scalars="MNK", tables=self.stream_tables([ConstTable("a_k0", U32, self.a_k_base)]),
            attrs={"target": self.target.name, "format": self.fmt.name, "schedule": self.s.name,
                   "pipeline": "dequantize", "activation": act.name, "weight_layout": LAYOUT_NAME},
            who=f"dequantize {ctx.gemm.name!r}")

    def store_w(self, kv: Value, fetched: list[Value]) -> None:
        """Decode vector kv of the warp's N tile and store its runs at w[n, k] (rows < N)."""
        b, lay = self.b, self.layout
        words, _, params = self.unpack_fetched(fetched)
        k_vec0 = self.op2("mul", kv, lay.dense_chunk, hint="kb")
        pairs_per_tile = lay.per_lane // 2
        decoded: dict[tuple[int, int], Value] = {}
        for t in range(lay.tiles):
            p = self.tile_params(params, k_vec0, 0, t)
            for p_ in range(pairs_per_tile):
                word, shift = lay.pair_slot(t * pairs_per_tile + p_)
                w = b.value("extract", [words[0][0]], U32, {"index": word}, hint="w")
                decoded[(t, p_)] = self.pairs.dequant(w, shift, p[self.a_row_off[2 * p_]])
        col0 = self.op2("add", k_vec0, self.a_k0, hint="wk")
        for row_off, start, members in self.a_runs:
            parts = [decoded[m] for m in members]
            value = parts[0] if len(parts) == 1 else b.value("vec", parts, VectorType(self.act, 2 * len(parts)), hint="wv")
            row = self.op2("add", self.warp_row, row_off, hint="wr") if row_off else self.warp_row
            col = self.op2("add", col0, start, hint="wc") if start else col0
            idx = self.op2("add", self.op2("mul", row, self.K, hint="wi"), col, hint="wi")
            b.op("vstore", [idx, value, self.op2("lt", row, self.N, hint="wok")],
                 attrs={"buffer": "w", "size": 2 * len(parts)})


def lower_dequantize(fmt: Format, activation: str, target: Target) -> Kernel:
    """The dequantize kernel's verified IR (before the passes); ScheduleError where the target
    or format has none (`dequantize_supported`)."""
    why = dequantize_supported(fmt, target)
    if why is not None:
        raise ScheduleError(f"dequantize {fmt.name!r} on {target.name}: {why}")
    return DequantizeLowering(GemmContext(dequantize_gemm(fmt, activation, target), target)).lower()


__all__ = ["DEQUANT_DEPTH", "DEQUANT_VECTORS", "DEQUANT_WARPS", "DequantizeLowering", "dequantize_gemm", "dequantize_supported",
           "lower_dequantize"]
