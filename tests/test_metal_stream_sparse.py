"""Issue 16: the N:M example formats (2:4 FP4 and INT4, pair-wise 4:8 NF4) on Metal's weight
stream. Metal has no sparse MMA, so each lane stores its own kept codes and metadata and
scatters them into dense simdgroup fragments (layouts/sparse_scatter.py,
lowering/parts/scatter.py). Checked here: the layout puts every kept code where its lane reads
it (numpy and MLX, both ways); the exact emitted .metal text on the CPU harness for every
format, f16 and bf16, M = 1, 3, 65, 129, N tails and K tails (where the format allows K that is
not whole vectors), outputs NaN-poisoned, against the float64 reference under the error model
and bit for bit against the interpreter; the cost against the example's first-generation
kernel of the same format, pinned; mutations (a wrong metadata bit, a swapped scatter slot)
fail; what the scatter refuses; the runtime picks the stream for small M and layers hold the
weights in Metal's stream layout."""
from __future__ import annotations

import dataclasses
import os
import runpy
from pathlib import Path
from functools import partial

import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl import METAL, Gemm, Multistage, NMSparsity, Schedule
from marlin_dsl.checks.error_model import compare, kernel_weights
from marlin_dsl.checks.format_check import sample_weights
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.cost.model import kernel_cost
from marlin_dsl.errors import ScheduleError
from marlin_dsl.formats.bitstream import unpack_bits
from marlin_dsl.formats.packing import metadata_positions
from marlin_dsl.ir.interpret import run_kernel
from marlin_dsl.kernel_args import gemm_buffers, read_output
from marlin_dsl.layouts.weight_stream import stream_arrays, stream_layout
from marlin_dsl.pipelines.weight_stream import check_stream
from marlin_dsl.targets.metal.cpu_harness import compile_many, compile_metal, find_compiler
from marlin_dsl.machine.metal import STREAM_LAYOUT
from marlin_dsl.targets.metal.printer import print_metal
from marlin_dsl.targets.metal.runtime import RUNTIME

from lazy_builds import LazyBuilds

needs_gxx = pytest.mark.skipif(
    find_compiler() is None,
    reason="g++ is not installed: the Metal CPU harness compiles the emitted Metal as C++20 with it")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
_SPECS = {name: runpy.run_path(str(EXAMPLES / name)) for name in ("sparse_2of4.py", "nf4_pairwise_4of8.py")}
#: format -> (spec, its first-generation Metal Gemm, its weight-stream Gemm) in examples/
SPARSE = {"fp4_2of4_g128": ("sparse_2of4.py", "fp4_2of4_db", "fp4_2of4_stream"),
          "int4_2of4_g128": ("sparse_2of4.py", "int4_2of4_striped", "int4_2of4_stream"),
          "nf4_pairwise_4of8": ("nf4_pairwise_4of8.py", "nf4_pairwise_db", "nf4_pairwise_stream")}


def _format(name: str) -> md.Format:
    return _SPECS[SPARSE[name][0]][name]


def _gemm(name: str, which: int) -> Gemm:
    spec, *gemms = SPARSE[name]
    return _SPECS[spec][gemms[which]]


# ----- the layout -----------------------------------------------------------------------------

#: (K tiles per vector, dense K per vector, code words and metadata words per lane and vector)
PLANS = {"fp4_2of4_g128": (16, 128, 2, 1), "int4_2of4_g128": (16, 128, 2, 1), "nf4_pairwise_4of8": (32, 256, 4, 1)}


@pytest.mark.parametrize("name", sorted(SPARSE))
def test_plan(name: str) -> None:
    """2:4 with groups of 128: 16 tiles, a vector is one scale group (no K predicates, scales
    on the sums). 4:8 of pairs: its 4-bit fields of 8 positions fill a word only at 32 tiles,
    each lane's 64 positions one group of 64. Every lane holds whole blocks; four mask tables
    (each unit's keep mask: the selects reuse them) per kind of field."""
    layout = stream_layout(_format(name), METAL)
    plan = layout.scatter
    assert plan is not None and not layout.sparse and layout.has_meta
    assert (layout.tiles, layout.dense_chunk, layout.code_words, layout.meta_words) == PLANS[name]
    assert layout.dense_tile_k == 8 and layout.chunk * 2 == layout.dense_chunk
    assert plan.run == 2 * plan.tiles and all(b % plan.run == 0 for b in plan.lane_base)
    programs, tables = plan.programs
    assert sorted(tables) == ["keep0", "keep1", "keep2", "keep3"]
    assert [len(programs[q].steps) for q in range(4)] == [0, 1, 1, 0]


def _dense_codes(fmt: md.Format, packed: md.PackedWeights) -> np.ndarray:
    """[K, N] codes at their dense positions, -1 where pruned."""
    sp = fmt.sparsity
    k, n = packed.shape
    stored = unpack_bits(np.asarray(packed.arrays["qweight"]), fmt.element.bits, fmt.packing.word_bits)
    pos = metadata_positions(np.asarray(packed.arrays["meta"]), sp, fmt.packing.word_bits)  # [blocks, n, N]
    blocks = k // sp.block_k
    dense = np.full((blocks, sp.m, sp.chunk, n), -1, np.int64)
    kept = stored.reshape(blocks, sp.n, sp.chunk, n).astype(np.int64)
    for i in range(sp.n):  # n kept chunks per block, each to its position
        index = np.broadcast_to(pos[:, i][:, None, None, :], (blocks, 1, sp.chunk, n))
        np.put_along_axis(dense, index, kept[:, i][:, None], axis=1)
    return dense.reshape(k, n)


def _halves(masks: np.ndarray) -> np.ndarray:
    """[...] u32 masks -> [..., 2] bool: each 16-bit half set."""
    return np.stack([(masks & 0xFFFF) != 0, (masks >> 16) != 0], axis=-1)


@pytest.mark.parametrize("name", sorted(SPARSE))
def test_every_kept_code_lands_where_its_lane_reads_it(name: str) -> None:
    """Replays the kernel's scatter on the packed words (decode left out: codes instead of
    values): each lane's fragment element (tile s, element e) of every N tile and K vector is
    the code at its dense position (K shuffle, lane table), and no mask selects anything at a
    pruned position or in the padding; the packing is exactly invertible."""
    fmt = _format(name)
    layout = stream_layout(fmt, METAL)
    plan = layout.scatter
    k, n = (384, 20) if layout.dense_chunk == 256 else (256, 20)  # a K tail where the group allows one
    packed = md.pack(fmt, sample_weights(fmt, k, n, np.random.default_rng(3)))
    arrays = stream_arrays(fmt, METAL, packed)
    dense = _dense_codes(fmt, packed)
    nt, kv = -(-n // 8), -(-k // layout.dense_chunk)
    words = arrays["qweight"].reshape(nt, kv, 32, plan.code_words)
    meta = arrays["meta"].reshape(nt, kv, 32, plan.meta_words)
    lo, hi = layout.bit_order.unpack(words)
    kept = np.stack([lo, hi], -1).reshape(nt, kv, 32, -1, 2).astype(np.int64)  # [.., kept pair, half]
    programs, _ = plan.programs
    got = np.full((kv * layout.dense_chunk, nt * 8), -2, np.int64)
    for s in range(plan.tiles):
        for p, tp in enumerate(plan.tile_pairs[s]):
            f, prog = plan.fields[tp.field], programs[tp.q]
            index = (meta[..., f.word] >> np.uint32(f.shift)) & np.uint32((1 << f.width) - 1)  # [nt, kv, lanes]
            value = kept[..., tp.candidates[0][1], :]
            for (_, j), (select, swap) in zip(tp.candidates[1:], prog.steps):
                value = np.where(_halves(plan.table(f, select)[index]) != swap, kept[..., j, :], value)
            value = np.where(_halves(plan.table(f, prog.keep)[index]), value, -1)
            for h in range(2):
                e = 2 * p + h
                ks = np.arange(kv)[:, None] * layout.dense_chunk + layout.k_perm[s * 8 + layout.cols[:, e]][None, :]
                rows = np.arange(nt)[:, None] * 8 + layout.rows[:, e][None, :]
                got[ks[None, :, :], rows[:, None, :]] = value[..., h]
    assert (got != -2).all(), "a dense position no lane holds"
    np.testing.assert_array_equal(got[:k, :n], dense)
    assert (got[k:] == -1).all() and (got[:, n:] == -1).all(), "padding selects a kept code"
    codes, fields = plan.unpack(arrays["qweight"], arrays["meta"], k // fmt.sparsity.block_k, n, 8, layout.bit_order)
    np.testing.assert_array_equal(codes, unpack_bits(np.asarray(packed.arrays["qweight"]), 4, 32))
    np.testing.assert_array_equal(fields, unpack_bits(np.asarray(packed.arrays["meta"]), 4, 32))


@pytest.mark.parametrize("name", sorted(SPARSE))
def test_mlx_conversion_is_the_numpy_layout_and_inverts(name: str) -> None:
    """Layers convert on the device (layers/weight_stream_mx.py): bit-identical to the numpy
    packer, shaped as `stream_shapes` says, and back to the linear arrays exactly."""
    mx = pytest.importorskip("mlx.core")
    from marlin_dsl.layers.weight_stream_mx import linear_arrays_mx, stream_arrays_mx, stream_shapes

    fmt = _format(name)
    for k, n in ((384, 40), (256, 136)):
        packed = md.pack(fmt, sample_weights(fmt, k, n, np.random.default_rng(k + n)))
        want = stream_arrays(fmt, METAL, packed)
        got = stream_arrays_mx(fmt, METAL, (k, n), {nm: mx.array(np.asarray(a)) for nm, a in packed.arrays.items()})
        for nm, array in want.items():
            np.testing.assert_array_equal(np.array(got[nm]), array, err_msg=f"{name} {nm}")
        assert {nm: tuple(got[nm].shape) for nm in ("qweight", "meta")} == stream_shapes(fmt, METAL, k, n)
        back = linear_arrays_mx(fmt, METAL, (k, n), got)
        for nm, array in packed.arrays.items():
            np.testing.assert_array_equal(np.array(back[nm]), np.asarray(array), err_msg=f"{name} {nm} back")


# ----- kernels on the CPU harness and in the interpreter ---------------------------------------

ACTS = ("f16", "bf16")


def _cases() -> list[tuple[str, str, int]]:
    """(format, activation, tuned-for M): the small-M schedule (8 rows) and the 32-row one."""
    return [(name, act, m) for name in sorted(SPARSE) for act in ACTS for m in (1, 65)]


def _shapes(fmt: md.Format, m_tuned: int) -> list[tuple[int, int, int]]:
    """(M, N, K): M = 1, 3, 65, 129 (the 32-row schedule: 65, 129), N tails (40, 136, 24, 8 over
    tiles of 128 rows), and K not a whole number of vectors where the scale group allows it
    (pair-wise 4:8: vectors of 256, K = 384 and 64; 2:4's groups of 128 are its vectors)."""
    k_small = 64 if stream_layout(fmt, METAL).dense_chunk == 256 else 128
    ms = (1, 3, 65, 129) if m_tuned == 1 else (65, 129)
    return [(m, n, k) for m, n, k in zip(ms, (40, 136, 24, 8), (256, 384, k_small, 384))]


def case_kernel(name: str, act: str, m: int):
    """A case's kernel as the harness runs it (tests/test_harness_coverage.py reads its ops)."""
    fmt = _format(name)
    return compile_gemm(Gemm(f"mss_{name}_{act}_{m}", fmt, RUNTIME.tuned_schedule(fmt, m), act), METAL).kernel


@pytest.fixture(scope="module")
def built():
    if find_compiler() is None:
        pytest.skip("g++ is not installed")
    def make(name: str, act: str, m: int) -> tuple:
        kernel = case_kernel(name, act, m)
        return kernel, compile_metal(print_metal(kernel))

    return LazyBuilds({case: partial(make, *case) for case in _cases()})  # each built on first use


def _problem(kernel, fmt: md.Format, m: int, n: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    packed = md.pack(fmt, sample_weights(fmt, k, n, rng))
    bufs, scalars = gemm_buffers(kernel, packed, rng.standard_normal((m, k)))  # y: NaN
    return packed, bufs, scalars


def _model_check(y: np.ndarray, bufs: dict, packed: md.PackedWeights, act: str):
    """The error model (checks/error_model.py) on a kernel's output [M, N]."""
    m, k = y.shape[0], packed.shape[0]
    x = bufs["x"].reshape(m, k).astype(np.float64)
    w = md.dequantize(packed)
    return compare(y.astype(np.float64), x @ w, x, w, act, kernel_weights(packed, act))


@needs_gxx
@pytest.mark.sweep
@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c[0]}-{c[1]}-m{c[2]}")
def test_stream_kernel_on_harness_matches_reference(built, case) -> None:
    name, act, m_tuned = case
    kernel, compiled = built[case]
    fmt = _format(name)
    assert kernel.attrs["weight_layout"] == STREAM_LAYOUT and kernel.attrs["pipeline"] == "weight_stream"
    assert not {"mma_sp"} & {op.name for op in kernel.walk()}
    for seed, (m, n, k) in enumerate(_shapes(fmt, m_tuned)):
        packed, bufs, scalars = _problem(kernel, fmt, m, n, k, seed)
        out = compiled.run(bufs, scalars, seed=seed + 1)
        y = read_output(out, m, n)
        assert not np.isnan(y).any(), f"{name}/{act} M={m} N={n} K={k}: unwritten outputs"
        check = _model_check(y, bufs, packed, act)
        assert check.ok, f"{name}/{act} M={m} N={n} K={k}: {check.summary()}"
        if m <= 3:  # the interpreter runs the same IR: the same bits
            theirs = run_kernel(kernel, bufs, scalars)
            np.testing.assert_array_equal(out["y"], theirs["y"], err_msg=f"{name}/{act} M={m}")


@needs_gxx
def test_lane_grouped_2of4_with_k_tails() -> None:
    """2:4 with groups of 32 (builtin fp4_2of4 and int4_2of4 at g = 32): vectors of 128 span
    four groups, each lane's run of 32 one (per-lane scales, `a_run0`), and K need not be whole
    vectors (K = 160, 96, 32, 224): the harness against the reference and the interpreter."""
    cases = [(md.builtin_format(name, 32), act) for name in ("fp4_2of4", "int4_2of4") for act in ACTS]
    kernels = [compile_gemm(Gemm(f"mss_g32_{f.name}_{act}", f, RUNTIME.tuned_schedule(f, 1), act), METAL).kernel
               for f, act in cases]
    assert all(any(t.name == "a_run0" for t in k.tables) for k in kernels)
    for (fmt, act), kernel, compiled in zip(cases, kernels, compile_many([print_metal(k) for k in kernels],
                                                                         jobs=os.cpu_count())):
        for seed, (m, n, k) in enumerate(((1, 40, 160), (3, 136, 96), (65, 24, 32), (129, 8, 224))):
            packed, bufs, scalars = _problem(kernel, fmt, m, n, k, seed)
            out = compiled.run(bufs, scalars, seed=seed)
            check = _model_check(read_output(out, m, n), bufs, packed, act)
            assert check.ok, f"{fmt.name}/{act} M={m} N={n} K={k}: {check.summary()}"
            if m <= 3:
                np.testing.assert_array_equal(out["y"], run_kernel(kernel, bufs, scalars)["y"])


# ----- mutations the checks catch -------------------------------------------------------------

@needs_gxx
@pytest.mark.parametrize("name", ["fp4_2of4_g128", "nf4_pairwise_4of8"])
@pytest.mark.parametrize("word, bit", [(0, 0), (5, 2), (37, 9)])
def test_a_wrong_metadata_bit_fails(built, name: str, word: int, bit: int) -> None:
    """One bit of one lane's metadata word flipped in the packed stream layout: the harness
    output leaves the error model's bounds (a kept value lands on the wrong position, or a
    block's field turns invalid and drops its values)."""
    kernel, compiled = built[name, "f16", 1]
    fmt = _format(name)
    m, n, k = 3, 40, 256
    packed, bufs, scalars = _problem(kernel, fmt, m, n, k, 0)
    assert _model_check(read_output(compiled.run(bufs, scalars), m, n), bufs, packed, "f16").ok
    bufs["meta"] = bufs["meta"].copy()
    bufs["meta"][word] ^= np.uint32(1 << bit)
    bufs["y"] = np.full_like(bufs["y"], np.nan)
    check = _model_check(read_output(compiled.run(bufs, scalars), m, n), bufs, packed, "f16")
    assert not check.ok, f"a flipped metadata bit went unnoticed: {check.summary()}"


@needs_gxx
@pytest.mark.parametrize("name", ["int4_2of4_g128", "nf4_pairwise_4of8"])
def test_a_swapped_scatter_slot_fails(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The lowering reads the first kept pairs of K tile 0 and of the first tile of the next
    blocks from each other's slots (the packer unchanged): the emitted text's output on the
    harness leaves the error model's bounds, and so does the interpreter's."""
    import marlin_dsl.lowering.parts.stream_family as stream_family

    fmt = _format(name)
    layout = stream_layout(fmt, METAL)
    plan = layout.scatter
    pairs = [list(tile) for tile in plan.tile_pairs]
    other = fmt.sparsity.block_k  # tile 0 and this tile: unit 0 of neighbouring blocks
    (a, b) = pairs[0][0], pairs[other][0]
    assert a.candidates[0][1] != b.candidates[0][1]
    pairs[0][0] = dataclasses.replace(a, candidates=((a.candidates[0][0], b.candidates[0][1]),) + a.candidates[1:])
    pairs[other][0] = dataclasses.replace(b, candidates=((b.candidates[0][0], a.candidates[0][1]),) + b.candidates[1:])
    swapped = dataclasses.replace(layout, scatter=dataclasses.replace(plan, tile_pairs=tuple(map(tuple, pairs))))
    monkeypatch.setattr(stream_family, "stream_layout", lambda *args, **kw: swapped)
    kernel = compile_gemm(Gemm("mss_swapped", fmt, RUNTIME.tuned_schedule(fmt, 1), "f16"), METAL).kernel
    compiled = compile_many([print_metal(kernel)])[0]
    m, n, k = 3, 40, 256
    packed, bufs, scalars = _problem(kernel, fmt, m, n, k, 1)
    for y in (read_output(compiled.run(bufs, scalars), m, n), read_output(run_kernel(kernel, bufs, scalars), m, n)):
        check = _model_check(y, bufs, packed, "f16")
        assert not check.ok, f"a swapped scatter slot went unnoticed: {check.summary()}"


# ----- the cost model: the bar of issue 16 ----------------------------------------------------

#: At M = 1 (`marlin-dsl compile --cost --cost-m 1`): (lane instructions per weight, requested
#: bytes per weight) of the stream and of the example's first-generation kernel, pinned.
COSTS = {"fp4_2of4_g128": ((5.12, 1.44), (55.5, 2.88)),
         "int4_2of4_g128": ((4.92, 1.44), (46.1, 2.88)),
         "nf4_pairwise_4of8": ((6.40, 1.34), (36.3, 1.69))}


@pytest.mark.parametrize("name", sorted(SPARSE))
def test_stream_costs_less_per_weight_than_first_generation(name: str) -> None:
    """Fewer requested bytes and (7x to 11x) fewer lane instructions per weight than the
    first-generation kernel of the same format in examples/, no threadgroup memory traffic
    or barriers in the K loop, and the weights' requested bytes close to their storage
    (codes, metadata, scales: the rest is the 8 activation rows every lane reads)."""
    new_gemm, old_gemm = _gemm(name, 1), _gemm(name, 0)
    new = kernel_cost(compile_gemm(new_gemm, METAL).kernel, new_gemm, m=1)
    old = kernel_cost(compile_gemm(old_gemm, METAL).kernel, old_gemm, m=1)
    (instr, req), (old_instr, old_req) = COSTS[name]
    assert new.instructions_per_weight == pytest.approx(instr, abs=0.005)
    assert new.requested_bytes_per_weight == pytest.approx(req, abs=0.005)
    assert old.instructions_per_weight == pytest.approx(old_instr, abs=0.05)
    assert old.requested_bytes_per_weight == pytest.approx(old_req, abs=0.005)
    assert new.requested_bytes_per_weight < old.requested_bytes_per_weight
    assert new.instructions_per_weight < old.instructions_per_weight / 5
    assert new.unique_bytes_per_weight < old.unique_bytes_per_weight
    assert new.shared_traffic == (0.0, 0.0) and not new.barriers_per_step
    activations = 2 * new_gemm.schedule.tile_m / 16  # each lane's two M columns of 8 rows, per 16 N rows
    assert new.requested_bytes_per_weight - activations < 1.15 * new.unique_bytes_per_weight



# ----- what the scatter refuses ---------------------------------------------------------------

def _nm_format(n: int, m: int, chunk: int = 1, group: int = 128) -> md.Format:
    base = _format("int4_2of4_g128")
    return md.Format(f"int4_{n}of{m}", base.element, md.GroupScale(group), sparsity=NMSparsity(n, m, chunk=chunk),
                     packing=base.packing)


@pytest.mark.parametrize("fmt, reason", [
    (_nm_format(1, 4), "marks no kept position"),  # every 2-bit field is a valid position
    (_nm_format(2, 8), "more than 10"),  # two blocks' 6-bit fields index a 4096-entry table
    # chunks of 4: a lane's fields fill a word only at 64 tiles, whose codes need 8 words
    (_nm_format(2, 4, chunk=4), "no vector length lets each lane"),
], ids=["1of4", "2of8", "chunk4"])
def test_what_the_scatter_refuses(fmt: md.Format, reason: str) -> None:
    with pytest.raises(ScheduleError, match=reason):
        stream_layout(fmt, METAL)
    with pytest.raises(ScheduleError, match=reason):
        RUNTIME.tuned_schedule(fmt, 1)
    assert RUNTIME.layer_layout(fmt, 256, 64) is None  # layers keep the format's own kernels


def test_only_the_weight_stream_reads_the_scattered_layout() -> None:
    """Multistage and warpgroup stage whole vectors of codes (for a sparse MMA on CUDA): a
    target with a scattered layout refuses them by the layout, whatever else it lacks."""
    fmt = _format("fp4_2of4_g128")
    schedule = Schedule("ms", tile_m=16, tile_n=64, tile_k=128, warps_m=1, warps_n=8, pipeline=Multistage())
    with pytest.raises(ScheduleError, match="does not read the scattered N:M layout"):
        check_stream(schedule, "multistage", fmt, METAL)


def test_cuda_keeps_its_sparse_mma_path() -> None:
    """CUDA has mma.sp for 2:4: its layout is unchanged (values fed to the sparse MMA). 4:8 of
    single values (12-bit fields) is refused as before, with the scatter's reason added."""
    layout = stream_layout(_format("fp4_2of4_g128"), md.CUDA)
    assert layout.sparse and layout.scatter is None and layout.code_words == 4
    with pytest.raises(ScheduleError, match=r"only for 2:4 .*more than 10"):
        stream_layout(_nm_format(4, 8), md.CUDA)


# ----- CUDA: pair-wise 4:8, which mma.sp does not take, scatters too ---------------------------

def test_cuda_pairwise_plan() -> None:
    """The same derivation on CUDA's m16n8k16 lane tables: each register pair is one kept
    chunk of one block (single-block fields), 8 tiles a vector of 128, 4 code words and one
    metadata word per lane; the tuned schedules stay on the stream at every M (multistage and
    warpgroup do not read the layout)."""
    from marlin_dsl.targets.cuda.tuning import tuned_schedule

    fmt = _format("nf4_pairwise_4of8")
    layout = stream_layout(fmt, md.CUDA)
    plan = layout.scatter
    assert (plan.tiles, layout.dense_chunk, plan.code_words, plan.meta_words) == (8, 128, 4, 1)
    assert not any(f.double for f in plan.fields) and len(plan.fields) == 8
    for m, name in ((1, "stream_m8"), (16, "stream_m16"), (65, "stream_m32"), (2048, "stream_m32")):
        assert tuned_schedule(fmt, m, md.CUDA, 4096, 4096, warpgroup=True).name == name


@pytest.mark.skipif(find_compiler() is None, reason="g++ is not installed")
@pytest.mark.parametrize("act", ACTS)
def test_cuda_pairwise_on_the_cuda_harness(act: str) -> None:
    """The printed CUDA of the tuned schedules (8, 16 and 32 rows) on the CUDA CPU harness
    against the reference under the error model, K tails included (vectors of 128: K = 384,
    64), and bit for bit against the interpreter."""
    from marlin_dsl.targets.cuda.cpu_harness import compile_many as compile_cuda, cuda_cpu_executor
    from marlin_dsl.targets.cuda.tuning import tuned_schedule

    fmt = _format("nf4_pairwise_4of8")
    gemms = [Gemm(f"cu_pw_{m}_{act}", fmt, tuned_schedule(fmt, m, md.CUDA, 4096, 4096), act) for m in (1, 16, 65)]
    kernels = [compile_gemm(g, md.CUDA).kernel for g in gemms]
    for seed, (kernel, build) in enumerate(zip(kernels, compile_cuda(kernels))):
        execute = cuda_cpu_executor(seed=seed, compiled={id(kernel): build})
        for m, n, k in ((1, 40, 384), (3, 72, 256), (65, 24, 64), (129, 8, 384)):
            packed, bufs, scalars = _problem(kernel, fmt, m, n, k, seed + m)
            out = execute(kernel, bufs, scalars)
            check = _model_check(read_output(out, m, n), bufs, packed, act)
            assert check.ok, f"{kernel.name} M={m} N={n} K={k}: {check.summary()}"
            if m <= 3:
                np.testing.assert_array_equal(out["y"], run_kernel(kernel, bufs, scalars)["y"])


# ----- the runtime and the layers -------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(SPARSE))
def test_tuned_schedule_and_layer_layout(name: str) -> None:
    fmt = _format(name)
    chunk = stream_layout(fmt, METAL).dense_chunk
    for m, tile_m in ((1, 8), (8, 8), (9, 16), (17, 32), (4096, 32)):
        schedule = RUNTIME.tuned_schedule(fmt, m)
        assert (schedule.name, schedule.tile_m, schedule.tile_k) == (f"metal_stream_m{tile_m}", tile_m, chunk)
    # the example's stream Gemm (which may declare targets=("metal",): the tuned one declares none)
    assert RUNTIME.tuned_schedule(fmt, 1) == dataclasses.replace(_gemm(name, 1).schedule, targets=None)
    assert RUNTIME.layer_layout(fmt, 256, 64) == STREAM_LAYOUT


@needs_gxx
@pytest.mark.parametrize("name, m", [("fp4_2of4_g128", 1), ("nf4_pairwise_4of8", 3), ("int4_2of4_g128", 40)])
def test_quantized_linear_launches_the_stream_kernel(monkeypatch: pytest.MonkeyPatch, tmp_path,
                                                     name: str, m: int) -> None:
    """quantized_linear(backend="metal") on Linux with a stand-in for mx.fast.metal_kernel
    that checks what MLX would receive (the tuned stream kernel's exact text, the weights and
    metadata in metal_lane_stream as the layer converted them on the device) and runs that
    text on the CPU harness; MarlinLinear holds the stream layout and converts back exactly."""
    mx = pytest.importorskip("mlx.core")
    import marlin_dsl.layers.dispatch as dispatch
    import marlin_dsl.nn as mnn
    from marlin_dsl.kernel_args import physical_arrays
    from marlin_dsl.targets.metal.cpu_harness import compile_metal
    from marlin_dsl.targets.metal.runtime import metal_launcher

    monkeypatch.setenv("MARLIN_DSL_CACHE", str(tmp_path))
    monkeypatch.setattr(mnn, "_metal_available", lambda: True)
    metal_launcher.cache_clear()
    dispatch.dispatch_for.cache_clear()
    fmt = _format(name)
    k, n = 384 if name.startswith("nf4") else 256, 136
    rng = np.random.default_rng(7)
    packed = md.pack(fmt, sample_weights(fmt, k, n, rng))
    schedule = RUNTIME.tuned_schedule(fmt, m, k, n)
    launches = []

    def fake_metal_kernel(name, input_names, output_names, source, header):
        src = print_metal(compile_gemm(Gemm(name, fmt, schedule, "f16"), METAL).kernel)
        assert (source, header) == (src.body, src.header) and "meta" in input_names
        cpu = compile_metal(src)

        def launch(inputs, grid, threadgroup, output_shapes, output_dtypes, init_value=None):
            buffers = {nm: np.array(a).ravel() for nm, a in zip(input_names, inputs)}
            want = physical_arrays({"weight_layout": STREAM_LAYOUT, "target": "metal"}, packed)
            for nm, array in want.items():  # qweight and meta in Metal's stream layout
                np.testing.assert_array_equal(buffers[nm], np.ascontiguousarray(array).ravel(), err_msg=nm)
            dims = [int(v) for v in buffers.pop("dims")]
            launches.append(dims)
            for nm, shape in zip(output_names, output_shapes):
                buffers[nm] = np.full(int(np.prod(shape)), np.nan, np.float16)
            out = cpu.run(buffers, dict(zip(("M", "N", "K"), dims)), (grid[0] // threadgroup[0], grid[1], grid[2]))
            return [mx.array(out[nm]).reshape(shape) for nm, shape in zip(output_names, output_shapes)]
        return launch

    monkeypatch.setattr(mx.fast, "metal_kernel", fake_metal_kernel)
    x = rng.standard_normal((m, k)).astype(np.float16)
    from marlin_dsl.nn import quantized_linear

    y = np.array(quantized_linear(mx.array(x), packed, backend="metal"))
    bufs = {"x": x.astype(np.float64).ravel()}
    check = _model_check(y, bufs, packed, "f16")
    assert y.shape == (m, n) and check.ok, check.summary()
    assert launches == [[m, n, k]]
    layer = mnn.MarlinLinear.from_packed(packed, backend="metal")
    assert layer.layout == STREAM_LAYOUT
    assert np.array_equal(np.array(layer(mx.array(x))), y) and len(launches) == 2
    back = layer.to_packed()
    for nm, array in packed.arrays.items():
        np.testing.assert_array_equal(back.arrays[nm], array, err_msg=nm)
    dispatch.dispatch_for.cache_clear()
    metal_launcher.cache_clear()
