"""Property: any subset of the passes, in any order (repeats allowed), keeps a lowered GEMM
kernel's meaning exactly. For a random format (built-ins with random group sizes, and custom
INT3 + u8 zero points, a value table with pair-wise 4:8 sparsity, 1:2 sparsity), a random
valid schedule, target and activation type, the interpreter's output on fixed random inputs
after the passes is bit-identical to the output of the kernel straight after lowering."""
from __future__ import annotations

from math import lcm

import numpy as np
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st

import marlin_dsl as m
from marlin_dsl.formats.pack_weights import pack
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.errors import CompileError, ScheduleError
from marlin_dsl.formats.builtin import E2M1, NF4
from marlin_dsl.formats.scaling import PER_COLUMN
from marlin_dsl.ir.interpret import run_kernel
from marlin_dsl.passes import PASSES
from marlin_dsl.kernel_args import gemm_buffers, read_output
from marlin_dsl.checks.format_check import sample_weights

INT3_ZP = m.Format("int3_zp", m.IntEncoding(3), m.GroupScale(32), m.ZeroPoint("u8"),
                   doc="unsigned INT3, u8 zero points, group 32 (codes straddle words)")
NF4_PAIRWISE_4OF8 = m.Format("nf4_pairwise_4of8", NF4, m.GroupScale(64),
                             sparsity=m.NMSparsity(2, 4, chunk=2),
                             doc="value table, pair-wise 4:8 sparsity")
FP4_1OF2 = m.Format("fp4_1of2", E2M1, m.GroupScale(64), sparsity=m.NMSparsity(1, 2),
                    doc="FP4, 1:2 sparsity")
CUSTOM = [INT3_ZP, NF4_PAIRWISE_4OF8, FP4_1OF2]

PASS_NAMES = sorted(PASSES)
assert set(PASS_NAMES) >= {"specialise", "unroll", "fold", "cse", "dce", "interleave"}


@st.composite
def formats(draw) -> m.Format:
    if draw(st.booleans()):
        return draw(st.sampled_from(CUSTOM))
    name = draw(st.sampled_from(sorted(m.BUILTIN_FORMATS)))
    granule = m.builtin_format(name).k_granule
    group = draw(st.sampled_from([PER_COLUMN, granule, 2 * granule, 3 * granule, 4 * granule, None]))
    return m.builtin_format(name, group)


@st.composite
def schedules(draw, fmt: m.Format, target: m.Target) -> m.Schedule:
    """Mostly valid by construction (warp tiles of whole MMA tiles, tile_k a multiple of the
    MMA k and the format granule); threadgroup memory limits may still reject some."""
    mm, mn, mk = target.mma
    warps_m, warps_n = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2]))
    tile_m = warps_m * mm * draw(st.sampled_from([1, 2]))
    tile_n = warps_n * mn * draw(st.sampled_from([1, 2, 4]))
    tile_k = lcm(fmt.k_granule, mk) * draw(st.sampled_from([1, 2]))
    kind = draw(st.sampled_from(["double_buffered", "fused_dequant", "striped"]))
    if kind == "striped":
        pipeline = m.StripedKParallel(parallel=draw(st.integers(1, 3)), groups=draw(st.integers(1, 5)))
    else:
        pipeline = m.DoubleBuffered() if kind == "double_buffered" else m.FusedDequant()
    return m.Schedule(f"s{tile_m}x{tile_n}x{tile_k}_{warps_m}x{warps_n}", tile_m=tile_m,
                      tile_n=tile_n, tile_k=tile_k, warps_m=warps_m, warps_n=warps_n,
                      pipeline=pipeline)


def problem_k(draw, fmt: m.Format, tile_k: int) -> int:
    """A K the format accepts: whole groups; with per-column scales also K tails."""
    g = fmt.scale.group_size
    unit = fmt.k_granule if g == PER_COLUMN else lcm(fmt.k_granule, int(g))
    steps = draw(st.integers(1, max(1, (3 * tile_k + unit) // unit)))
    return unit * steps


def run(kernel, packed, x) -> dict[str, np.ndarray]:
    buffers, scalars = gemm_buffers(kernel, packed, x)
    return run_kernel(kernel, buffers, scalars)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data())
def test_any_pass_sequence_is_bit_identical_to_lowering(data):
    draw = data.draw
    fmt = draw(formats(), label="format")
    target = draw(st.sampled_from([m.METAL, m.CUDA]), label="target")
    sched = draw(schedules(fmt, target), label="schedule")
    activation = draw(st.sampled_from(["f16", "bf16"]), label="activation")
    passes = draw(st.lists(st.sampled_from(PASS_NAMES), max_size=8), label="passes")
    gemm = m.Gemm("prop", fmt, sched, activation)
    try:
        lowered = compile_gemm(gemm, target, stop_after="lower").kernel
    except (ScheduleError, CompileError) as e:
        note(f"rejected: {e}")
        assume(False)
    transformed = compile_gemm(gemm, target, passes=passes)
    assert transformed.stages == ["lower", *passes]

    rows = draw(st.integers(1, 2 * sched.tile_m + 5), label="M")
    n = draw(st.integers(1, 2 * sched.tile_n + 9), label="N")
    k = problem_k(draw, fmt, sched.tile_k)
    note(f"M, N, K = {rows}, {n}, {k}")
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    packed = pack(fmt, sample_weights(fmt, k, n, rng))
    x = rng.standard_normal((rows, k))

    before = run(lowered, packed, x)
    after = run(transformed.kernel, packed, x)
    y = read_output(before, rows, n)
    assert not np.isnan(y).any(), "the lowered kernel left outputs unwritten"
    assert np.abs(y).max() > 0  # the data exercises the kernel
    assert before.keys() == after.keys()
    for name in before:
        a, b = before[name], after[name]
        assert a.dtype == b.dtype and a.shape == b.shape
        holder = np.uint16 if a.dtype.itemsize == 2 else np.uint32
        same = a.view(holder) == b.view(holder)
        assert same.all(), (f"{name}: {int((~same).sum())} of {a.size} elements differ after "
                            f"passes {passes}; first at {np.flatnonzero(~same)[:5].tolist()}")
