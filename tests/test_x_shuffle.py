"""`WeightStream(x_shuffle=L)`: 2:4 activation loads shared by L lanes through warp shuffles
(lowering/parts/x_transpose.py) and the IR's `shfl_xor` under them. The plan derived from
CUDA's m16n8k32 B lane table gives every lane exactly its fragment words; the kernels match
the float64 reference through the interpreter (the printed CUDA, through the CPU harness:
tests/test_cuda_cpu_harness.py, `ws_shfl*`); the op's type rule, semantics and errors."""
from __future__ import annotations

import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl import CUDA, METAL, Gemm, Schedule, WeightStream
from marlin_dsl.checks.kernel_check import check_kernel
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.cost import kernel_cost
from marlin_dsl.errors import ScheduleError
from marlin_dsl.ir import U16, U32, Builder, BufferParam, GridDim, Kernel, VectorType
from marlin_dsl.ir.interpret import InterpreterError, run_kernel
from marlin_dsl.ir.text import assert_round_trip
from marlin_dsl.ir.verify import VerifyError, verify
from marlin_dsl.layouts.weight_stream import stream_layout
from marlin_dsl.layouts.activation_transpose import transpose_plan
from marlin_dsl.targets.cuda.printer import print_cuda

K_TILE = 32  # dense K of CUDA's sparse m16n8k32


def shuffle_schedule(fmt, lanes: int, tile_m: int = 8, n_tiles: int = 1, k_warps: int = 4, depth: int = 2,
                     unroll: int = 1, x_ahead: int = 0) -> Schedule:
    chunk = stream_layout(fmt, CUDA).dense_chunk
    return Schedule("ws_shfl", tile_m=tile_m, tile_n=16 * n_tiles, tile_k=chunk, warps_m=1, warps_n=1,
                    pipeline=WeightStream(k_warps=k_warps, depth=depth, unroll=unroll, x_ahead=x_ahead,
                                          x_shuffle=lanes))


# ----- the plan ---------------------------------------------------------------------------------

def transpose_words(loaded: np.ndarray, big_l: int) -> np.ndarray:
    """The butterfly transpose as numpy (the lowering emits the same steps as IR): loaded
    [lanes, L] words (lane q's load) -> [lanes, L] (register s of lane q = word q of the
    group's lane s's load). An independent model of
    `ActivationTranspose.transposed_fragment`."""
    regs = loaded.copy()
    lane = np.arange(regs.shape[0])
    for b in range(big_l.bit_length() - 1):
        bit = 1 << b
        high = (lane & bit) != 0
        for j in range(big_l):
            if j & bit:
                continue
            send = np.where(high, regs[:, j], regs[:, j | bit])
            recv = send[lane ^ bit]
            regs[:, j], regs[:, j | bit] = np.where(high, recv, regs[:, j]), np.where(high, regs[:, j | bit], recv)
    return regs


@pytest.mark.parametrize("lanes", [2, 4])
def test_plan_gives_each_lane_its_fragment_words(lanes: int) -> None:
    """Simulate the plan on one row of a K tile: each lane's loads (at its base plus the
    unit offsets), the butterfly transpose, and compare every lane's words with the K rows
    the B lane table gives its fragment."""
    b_k, b_n = (np.asarray(t) for t in CUDA.lane_elements("b", K_TILE, 8))
    plan = transpose_plan(b_k, b_n, lanes)
    assert plan.units * lanes == b_k.shape[1] // 2
    got = np.zeros((32, b_k.shape[1] // 2), dtype=np.int64)
    for u, off in enumerate(plan.unit_offset):
        start = np.asarray(plan.load_base) + off
        assert (start % (2 * lanes) == 0).all(), "each load is one aligned vector"
        loaded = start[:, None] + 2 * np.arange(lanes)[None, :]  # the K row of each word loaded
        got[:, u * lanes:(u + 1) * lanes] = transpose_words(loaded, lanes)
    assert (got == b_k[:, 0::2]).all()


def test_plan_on_cuda_is_the_quad_or_the_pair() -> None:
    b_k, b_n = (np.asarray(t) for t in CUDA.lane_elements("b", K_TILE, 8))
    quad = transpose_plan(b_k, b_n, 4)
    assert quad.units == 1 and quad.load_base[:4] == (0, 8, 16, 24) and quad.unit_offset == (0,)
    pair = transpose_plan(b_k, b_n, 2)
    assert pair.units == 2 and pair.load_base[:4] == (0, 8, 4, 12) and pair.unit_offset == (0, 16)


def test_plan_refuses_tables_it_cannot_serve() -> None:
    b_k, b_n = (np.asarray(t) for t in CUDA.lane_elements("b", K_TILE, 8))
    with pytest.raises(ScheduleError, match="groups of 8 lanes"):
        transpose_plan(b_k, b_n, 8)  # 4 words a lane
    rows, cols = (np.asarray(t) for t in METAL.lane_elements("b", 8, 8))
    with pytest.raises(ScheduleError, match="x_shuffle=2"):
        transpose_plan(rows, cols, 2)  # Metal's B pairs run along M


# ----- kernels ----------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt_name,act", [("fp4_2of4", "f16"), ("int4_2of4", "bf16")])
@pytest.mark.parametrize("lanes,tile_m,n_tiles,unroll,x_ahead", [
    (4, 8, 1, 1, 0), (4, 16, 2, 1, 1), (2, 8, 2, 2, 1), (2, 16, 1, 1, 0), (4, 8, 2, 2, 1)])
def test_shuffled_kernels_match_reference(fmt_name: str, act: str, lanes: int, tile_m: int, n_tiles: int,
                                          unroll: int, x_ahead: int) -> None:
    fmt = md.builtin_format(fmt_name)
    gemm = Gemm("ws_shfl", fmt, shuffle_schedule(fmt, lanes, tile_m, n_tiles, unroll=unroll, x_ahead=x_ahead), act)
    kernel = compile_gemm(gemm, CUDA).kernel
    rng = np.random.default_rng(lanes * 100 + tile_m + unroll)
    for shape in [(1, 33, 7 * 128), (3, 40, 1024), (tile_m + 1, 17, 512), (65, 49, 384)]:  # M = 1, 3, 65; N tails
        result = check_kernel(gemm, kernel, shape, rng)
        assert result.untouched_poison == 0, shape
        assert result.ok, (shape, result)


def test_predicated_loads_with_a_k_tail() -> None:
    """Group 32: K is not whole vectors, the loads are predicated and the last vector reads
    zeros past K (never past the buffer)."""
    fmt = md.builtin_format("fp4_2of4", 32)
    gemm = Gemm("ws_shfl_tail", fmt, shuffle_schedule(fmt, 4, 16, x_ahead=1), "f16")
    kernel = compile_gemm(gemm, CUDA).kernel
    rng = np.random.default_rng(5)
    for shape in [(3, 40, 7 * 128 - 32), (17, 20, 5 * 128 - 96)]:
        result = check_kernel(gemm, kernel, shape, rng)
        assert result.ok and result.untouched_poison == 0, (shape, result)


def test_dense_layouts_without_the_k_shuffle_take_it_too() -> None:
    """Scale groups smaller than a vector leave dense fp4 without the K shuffle: its
    two-element loads can be shared as well (2 words a lane on CUDA's m16n8k16 B: pairs of
    lanes); 4 lanes would need 4 words a lane, refused at the schedule check."""
    fmt = md.builtin_format("fp4", 32)
    assert stream_layout(fmt, CUDA).k_perm is None
    gemm = Gemm("ws_shfl_dense", fmt, shuffle_schedule(fmt, 2, x_ahead=1), "f16")
    kernel = compile_gemm(gemm, CUDA).kernel
    rng = np.random.default_rng(7)
    for shape in [(3, 40, 7 * 64), (9, 17, 512)]:
        result = check_kernel(gemm, kernel, shape, rng)
        assert result.ok and result.untouched_poison == 0, (shape, result)
    with pytest.raises(ScheduleError, match="groups of 4 lanes loading 4 words"):
        shuffle_schedule(fmt, 4).check(fmt, CUDA)


@pytest.mark.parametrize("lanes", [2, 4])
def test_shuffled_kernel_shape_text_and_cost(lanes: int) -> None:
    """Per M tile and K tile of a step: 4 / L vector loads of 2L activations, L log2(L) / 2
    shuffles per load; the text form round-trips; the CUDA text calls CUDA's shuffle;
    the cost model counts the shuffles as their own class."""
    fmt = md.builtin_format("fp4_2of4")
    sched = shuffle_schedule(fmt, lanes, tile_m=16, k_warps=4, depth=1)
    gemm = Gemm("ws_shfl", fmt, sched, "f16")
    kernel = compile_gemm(gemm, CUDA).kernel
    assert_round_trip(kernel)
    loop = next(op for op in kernel.body.ops if op.name == "for")
    body = list(loop.regions[0].walk())
    tiles, msub = stream_layout(fmt, CUDA).tiles, 2
    x_loads = [o for o in body if o.name == "vload" and o.attrs["buffer"] == "x"]
    assert len(x_loads) == tiles * msub * (4 // lanes)
    assert all(o.attrs["size"] == 2 * lanes for o in x_loads)
    stages = lanes.bit_length() - 1
    assert sum(o.name == "shfl_xor" for o in body) == len(x_loads) * lanes * stages // 2
    assert "__shfl_xor_sync(0xFFFFFFFFu, " in print_cuda(kernel).full_source()
    cost = kernel_cost(kernel, gemm, 16)
    assert cost.per_weight["shfl"] > 0


def test_x_shuffle_errors() -> None:
    fp4, sparse = md.builtin_format("fp4"), md.builtin_format("fp4_2of4")
    with pytest.raises(ScheduleError, match="x_shuffle must be 0"):
        shuffle_schedule(sparse, 3).check(sparse, CUDA)
    with pytest.raises(ScheduleError, match="x_shuffle must be 0"):
        shuffle_schedule(sparse, True).check(sparse, CUDA)
    dense = Schedule("ws_dense", tile_m=8, tile_n=16, tile_k=64, warps_m=1, warps_n=1,
                     pipeline=WeightStream(k_warps=4, x_shuffle=4))
    with pytest.raises(ScheduleError, match="format 'fp4' on cuda reads its activations otherwise"):
        dense.check(fp4, CUDA)
    with pytest.raises(ScheduleError, match="x_shuffle"):
        shuffle_schedule(sparse, 4).check(sparse, METAL)  # Metal's 2:4 scatters
    blocks = md.builtin_format("fp4_blockpattern")
    skip = Schedule("ws_skip", tile_m=8, tile_n=16, tile_k=64, warps_m=1, warps_n=1,
                    pipeline=WeightStream(k_warps=4, skip_empty=True, x_shuffle=4))
    with pytest.raises(ScheduleError, match="does not take x_shuffle=4"):
        skip.check(blocks, CUDA)


# ----- the IR op --------------------------------------------------------------------------------

def _shuffle_kernel(mask: int, value_type=U32, partial: bool = False) -> Kernel:
    b = Builder()
    tid = b.index("tid")
    v = b.load("x", tid, U32)
    if value_type != U32:
        v = b.bitcast(v, value_type)
    if partial:  # only lanes below 16 of each warp take the branch
        cond = b.binary("lt", b.binary("rem", tid, 32), 16)
        with b.region() as then:
            b.yield_(b.value("shfl_xor", [v], value_type, {"mask": mask}))
        with b.region() as other:
            b.yield_(v)
        v = b.op("if", [cond], [value_type], regions=[then, other]).results[0]
    else:
        v = b.value("shfl_xor", [v], value_type, {"mask": mask})
    if value_type != U32:
        v = b.bitcast(v, U32)
    b.store("y", tid, v)
    dims = tuple(GridDim(None, 1, 1) for _ in range(3))
    return Kernel("k", 64, dims, b.block, buffers=[BufferParam("x", U32, "read"), BufferParam("y", U32, "write")],
                  attrs={"target": "cuda"})


@pytest.mark.parametrize("mask", [1, 2, 5, 16, 31])
@pytest.mark.parametrize("value_type", [U32, VectorType(md.ir.F16, 2)])
def test_shfl_xor_moves_each_lanes_value(mask: int, value_type) -> None:
    rng = np.random.default_rng(mask)
    x = rng.integers(0, 2**32, 64, dtype=np.uint32)
    x &= ~np.uint32(0x7C007C00)  # finite f16 halves: no NaN payloads to compare
    kernel = _shuffle_kernel(mask, value_type)
    verify(kernel)
    out = run_kernel(kernel, {"x": x, "y": np.zeros(64, np.uint32)}, {})
    assert (out["y"] == x[np.arange(64) ^ mask]).all()  # within each 32-lane warp


def test_shfl_xor_type_rule() -> None:
    for bad, match in ((dict(mask=0), "mask must be an integer in 1..31"), (dict(mask=32), "1..31"),
                       (dict(mask=True), "1..31")):
        b = Builder()
        v = b.load("x", b.index("tid"), U32)
        b.value("shfl_xor", [v], U32, bad)
        dims = tuple(GridDim(None, 1, 1) for _ in range(3))
        k = Kernel("k", 32, dims, b.block, buffers=[BufferParam("x", U32, "read")], attrs={"target": "cuda"})
        with pytest.raises(VerifyError, match=match):
            verify(k)
    b = Builder()
    v = b.cast(b.load("x", b.index("tid"), U32), U16)
    b.value("shfl_xor", [v], U16, {"mask": 1})
    dims = tuple(GridDim(None, 1, 1) for _ in range(3))
    k = Kernel("k", 32, dims, b.block, buffers=[BufferParam("x", U32, "read")], attrs={"target": "cuda"})
    with pytest.raises(VerifyError, match="shfl_xor moves 32-bit values"):
        verify(k)


def test_shfl_xor_in_a_partial_warp_is_an_error() -> None:
    x = np.arange(64, dtype=np.uint32)
    with pytest.raises(InterpreterError) as e:
        run_kernel(_shuffle_kernel(1, partial=True), {"x": x, "y": np.zeros(64, np.uint32)}, {})
    assert e.value.kind == "collective"
