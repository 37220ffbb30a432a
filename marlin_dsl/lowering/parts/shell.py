"""The kernel shell: a `Kernel` from an emitted body and its declarations, the shared-memory
limit check and the verifier, for every lowering (one copy)."""
from __future__ import annotations

from typing import Sequence

from ...errors import CompileError, SourceLocation
from ...ir.core import AttrValue
from ...ir import BufferParam, Builder, ConstTable, GridDim, Kernel, ScalarParam, SharedArray, verify
from ...formats import BlockPatternSparsity, NMSparsity
from ...ir import F32, U32, ScalarType
from ...machine.outputs import epilogue_inputs, output_names
from ...machine.target import Target
from ..group_params import GroupParams
from .context import GemmContext


def finish_kernel(b: Builder, target: Target, *, name: str, threads: int,
                  grid: tuple[GridDim, GridDim, GridDim], buffers: Sequence[BufferParam],
                  scalars: Sequence[str], attrs: dict[str, AttrValue],
                  shared: Sequence[SharedArray] = (), tables: Sequence[ConstTable] = (),
                  who: str | None = None, memory: str = "threadgroup memory",
                  where: SourceLocation | None = None) -> Kernel:
    """The verified kernel; CompileError (`who` needs N bytes of `memory`, at `where`) if its
    shared arrays exceed the target's limit."""
    kernel = Kernel(name=name, threads=threads, grid=grid, body=b.blocks[0], warp_size=target.warp_size,
                    buffers=list(buffers), scalars=[ScalarParam(n) for n in scalars], shared=list(shared),
                    tables=list(tables), attrs=attrs)
    limit = target.shared_limit(warpgroup=any(op.name == "wgmma" for op in kernel.walk()))
    if kernel.shared_bytes > limit:
        raise CompileError(
            f"{who or f'kernel {name!r}'} needs {kernel.shared_bytes} bytes of {memory}, over "
            f"{target.name}'s limit of {limit}", where)
    verify(kernel)
    return kernel


def gemm_kernel(ctx: GemmContext, *, buffers: Sequence[BufferParam], shared: Sequence[SharedArray],
                tables: Sequence[ConstTable], grid: tuple[GridDim, GridDim, GridDim] | None = None,
                attrs: dict[str, AttrValue] | None = None, memory: str = "threadgroup memory") -> Kernel:
    """A Gemm's kernel: its name, the M N K scalars, the attributes every Gemm kernel carries
    (then the pipeline's `attrs`), grid (N tiles, M tiles) unless given."""
    s, t = ctx.s, ctx.target
    return finish_kernel(
        ctx.b, t, name=ctx.gemm.name, threads=ctx.threads,
        grid=grid or (GridDim("N", s.tile_n), GridDim("M", s.tile_m), GridDim(None)),
        buffers=buffers, scalars="MNK", shared=shared, tables=tables,
        attrs={"target": t.name, "format": ctx.fmt.name, "schedule": s.name,
               "pipeline": ctx.pipeline.kind, "activation": ctx.act.name,
               "tile": (s.tile_m, s.tile_n, s.tile_k), "warps": (s.warps_m, s.warps_n),
               "mma": tuple(t.mma), **({"outputs": tuple(ctx.gemm.outputs)} if ctx.gemm.outputs else {}),
               **({"epilogue": ctx.gemm.epilogue.steps} if ctx.gemm.epilogue is not None else {}),
               **(attrs or {})},
        who=f"gemm {ctx.gemm.name!r}: schedule {s.name!r}", memory=memory, where=s.location)


def gemm_buffers(ctx: GemmContext, extra: Sequence[BufferParam] = ()) -> list[BufferParam]:
    """A Gemm kernel's buffers: x, the packed weight and what its format reads (group
    parameters, sparse metadata, block patterns), the pipeline's `extra`, the epilogue's
    inputs (bias, residual: `machine.outputs.epilogue_inputs`), then y."""
    fmt, act = ctx.fmt, ctx.act
    bufs = [BufferParam("x", act, "read"), BufferParam("qweight", U32, "read"),
            *GroupParams(ctx.b, fmt, act).buffers()]
    if isinstance(fmt.sparsity, NMSparsity):
        bufs.append(BufferParam("meta", U32, "read"))
    if isinstance(fmt.sparsity, BlockPatternSparsity):
        bufs.append(BufferParam("patterns", ScalarType("u8"), "read"))
    bufs += extra
    steps = ctx.gemm.epilogue.steps if ctx.gemm.epilogue is not None else ()
    bufs += [BufferParam(name, act, "read") for name in epilogue_inputs(steps)]
    bufs += [BufferParam(name, act, "write") for name in output_names(ctx.gemm.outputs)]
    return bufs


#: The striped pipeline's extra buffers: f32 partial tiles and per-tile arrival counters.
STRIPED_BUFFERS = (BufferParam("partials", F32, "readwrite"), BufferParam("counters", U32, "readwrite"))

__all__ = ["STRIPED_BUFFERS", "finish_kernel", "gemm_buffers", "gemm_kernel"]
