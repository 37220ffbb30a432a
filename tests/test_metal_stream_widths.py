"""Issue 16: the weight stream takes the two example formats it refused, int3_zp (a code width
that does not divide 16: floor(16 / bits) codes a 16-bit half, the spare bits 0, so a 128-bit
vector holds 20 of Metal's 8-wide K tiles, 160 K) and fp4_blocks_g128 (block patterns: the
values are stored dense, so the stream reads them all and ignores the patterns), and other
widths (5- and 6-bit integer, 6-bit float codes) the same way.

- the pack-time layout round-trips: an independent reader of the words gives back every code,
  spare bits are 0 (Metal and CUDA, the K shuffle with the 160-wide chunk included);
- the exact emitted .metal text on the CPU harness: f16 and bf16, M = 1, 3, 65, 129, N tails,
  K tails (K not a whole number of vectors), outputs NaN-poisoned, against the float64
  reference under the error model and bit for bit against the interpreter;
- block patterns with real clustered empty blocks: whole 8 x 32 blocks and whole K vectors
  of a simdgroup's rows empty, their codes decode to exactly 0, and the patterns are unread;
- the cost model against the first-generation Metal kernels (pinned);
- the tuned schedule and layer layout on Metal pick the stream; CUDA's stream and multistage
  kernels of the same layout on the CUDA CPU harness."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from functools import partial

import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl import CUDA, METAL, DoubleBuffered, FusedDequant, Gemm, Schedule, StripedKParallel
from marlin_dsl.checks.error_model import compare, kernel_weights
from marlin_dsl.checks.format_check import sample_weights
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.cost.model import kernel_cost, storage_per_weight
from marlin_dsl.formats.bitstream import unpack_bits
from marlin_dsl.ir.interpret import run_kernel
from marlin_dsl.kernel_args import gemm_buffers, read_output
from marlin_dsl.layouts.weight_stream import VECTOR_WORDS, StreamLayout, stream_arrays, stream_layout
from marlin_dsl.targets.metal.cpu_harness import compile_metal, find_compiler
from marlin_dsl.machine.metal import STREAM_LAYOUT
from marlin_dsl.targets.metal.printer import print_metal
from marlin_dsl.targets.metal.runtime import RUNTIME, stream_schedule
from marlin_dsl.targets.metal.tuning import multistage_schedule

from lazy_builds import LazyBuilds

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _example(file: str, name: str) -> md.Format:
    spec = importlib.util.spec_from_file_location(f"widths_{Path(file).stem}", EXAMPLES / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return getattr(module, name)


INT3_ZP = _example("int3_zero_point.py", "int3_zp")
BLOCKS = _example("block_pattern.py", "fp4_blocks_g128")
FORMATS = {
    "int3_zp": INT3_ZP,
    "fp4_blocks_g128": BLOCKS,
    # per-column scales: the K shuffle over the 160-wide chunk, the scale on the sums
    "int3_col": md.Format("int3_col", md.IntEncoding(3, offset=4), md.GroupScale("K")),
    # groups of one vector: K is whole vectors, loads clamped instead of predicated
    "int3_g160": md.Format("int3_g160", md.IntEncoding(3, offset=4), md.GroupScale(160)),
    "int5_zp_g32": md.Format("int5_zp_g32", md.IntEncoding(5), md.GroupScale(32), md.ZeroPoint("u8")),
    "int6_g64": md.Format("int6_g64", md.IntEncoding(6, offset=32), md.GroupScale(64)),
    "fp6_e3m2_g32": md.Format("fp6_e3m2_g32", md.FloatEncoding(bits=6, exp_bits=3, man_bits=2, bias=3),
                              md.GroupScale(32)),
}
#: (format, activation, tuned-for M) of the harness kernels: the examples at the small-M and
#: the 32-row schedule in f16 and small-M in bf16; the other widths at small M.
CASES = ([(name, "f16", m) for name in ("int3_zp", "fp4_blocks_g128") for m in (1, 65)]
         + [(name, "bf16", 1) for name in ("int3_zp", "fp4_blocks_g128", "int3_g160", "int5_zp_g32")]
         + [(name, "f16", 1) for name in ("int3_col", "int3_g160", "int5_zp_g32", "int6_g64", "fp6_e3m2_g32")])

needs_gxx = pytest.mark.skipif(
    find_compiler() is None,
    reason="g++ is not installed: the Metal CPU harness compiles the emitted Metal as C++20 with it")


# ----- the layout -------------------------------------------------------------------------------

@pytest.mark.parametrize("name, target, tiles, chunk", [
    ("int3_zp", METAL, 20, 160), ("int3_zp", CUDA, 5, 80), ("int5_zp_g32", METAL, 12, 96),
    ("int6_g64", METAL, 8, 64), ("fp6_e3m2_g32", METAL, 8, 64), ("fp4_blocks_g128", METAL, 16, 128)])
def test_tiles_follow_from_the_pairs_a_vector_holds(name: str, target, tiles: int, chunk: int) -> None:
    fmt = FORMATS[name]
    layout = stream_layout(fmt, target)
    bits = fmt.element.bits
    assert (layout.per_half, layout.tiles, layout.dense_chunk) == (16 // bits, tiles, chunk)
    assert layout.bit_order.spare == 16 % bits
    # a step of the tuned Metal schedule is one vector
    if target is METAL:
        assert RUNTIME.tuned_schedule(fmt, 1).tile_k == chunk


def test_a_fragment_whose_pairs_do_not_fill_the_vector_is_refused() -> None:
    """The design covers every width 1..8 on Metal and CUDA; a target whose A fragment gives a
    lane 3 pairs a K tile would not fill 16 pairs of 4-bit codes (or 20 of 3-bit) with whole
    tiles: a ScheduleError that says so."""
    import dataclasses

    lane = np.arange(32)[:, None]
    rows, cols = lane // 2 + 0 * np.arange(6)[None], (lane % 2) * 6 + np.arange(6)[None]
    odd = dataclasses.replace(CUDA, name="odd", mma=(16, 8, 12), lane_tables={("a", 16, 12): (rows, cols)})
    for fmt in (md.builtin_format("fp4"), INT3_ZP):
        with pytest.raises(md.ScheduleError, match="do not fill whole K tiles of odd's A fragment"):
            stream_layout(fmt, odd)


def _read_back(layout: StreamLayout, words: np.ndarray, ks: int, n: int) -> np.ndarray:
    """The codes [stored K, N] an independent reader finds in the words: bit by bit from each
    pair's slot, through the lane table and the inverse K shuffle."""
    nt, kv = -(-n // layout.tile_rows), -(-ks // layout.chunk)
    w = words.reshape(nt, kv, layout.lanes, VECTOR_WORDS).astype(np.int64)
    pairs = layout.tiles * layout.per_lane // 2
    codes = np.zeros((nt, kv, layout.lanes, pairs, 2), np.int64)
    for j in range(pairs):
        word, slot = layout.pair_slot(j)
        for i, pos in enumerate(layout.bit_order.positions[slot]):
            codes[..., j, 0] |= ((w[..., word] >> pos) & 1) << i
            codes[..., j, 1] |= ((w[..., word] >> (16 + pos)) & 1) << i
    elems = codes.reshape(nt, kv, layout.lanes, layout.tiles, layout.per_lane)
    padded = np.zeros((kv * layout.chunk, nt * layout.tile_rows), np.int64)
    perm = layout.k_perm if layout.k_perm is not None else np.arange(layout.chunk)
    for s in range(layout.tiles):
        k = np.arange(kv)[:, None, None] * layout.chunk + perm[s * layout.tile_cols + layout.cols][None]
        for t in range(nt):
            padded[k, t * layout.tile_rows + layout.rows[None]] = elems[t, :, :, s, :]
    return padded[:ks, :n]


@pytest.mark.parametrize("name", ["int3_zp", "int3_col", "int5_zp_g32", "int6_g64", "fp6_e3m2_g32"])
@pytest.mark.parametrize("target", [METAL, CUDA], ids=["metal", "cuda"])
def test_layout_round_trips_with_spare_bits_zero(name: str, target) -> None:
    fmt = FORMATS[name]
    layout = stream_layout(fmt, target)
    k, n = 352 if fmt.scale.group_size != 64 else 384, 40  # a K tail: not whole vectors
    packed = md.pack(fmt, sample_weights(fmt, k, n, np.random.default_rng(7)))
    words = stream_arrays(fmt, target, packed)["qweight"]
    assert words.size == layout.words(k, n)
    codes = unpack_bits(np.asarray(packed.arrays["qweight"]), fmt.element.bits, fmt.packing.word_bits)
    np.testing.assert_array_equal(_read_back(layout, words, k, n), codes)
    used = sum(1 << p for slot in layout.bit_order.positions for p in slot) * 0x00010001
    assert not (words & np.uint32(~used & 0xFFFFFFFF)).any(), "spare bits must stay 0"
    g = fmt.scale.group_size  # the K shuffle where groups hold whole chunks (per-column: int3_col)
    assert (layout.k_perm is not None) == (g == "K" or int(g) % layout.chunk == 0)


# ----- kernels on the CPU harness and in the interpreter ----------------------------------------

def _shapes(fmt: md.Format, m_tuned: int) -> list[tuple[int, int, int]]:
    """(M, N, K): M = 1, 3, 65, 129 (the 32-row schedule: 65, 129), N tails, K tails below one
    vector, past two, and whole vectors (groups of one vector: whole vectors only)."""
    chunk = stream_layout(fmt, METAL).dense_chunk
    g = fmt.scale.group_size
    unit = fmt.k_granule if g == "K" else int(np.lcm(fmt.k_granule, int(g)))
    whole = int(np.lcm(unit, chunk))
    tails = [unit, 2 * chunk + unit, whole]
    if g != "K" and int(g) % chunk == 0:
        tails = [whole, 3 * whole]
    ms = (1, 3, 65, 129) if m_tuned == 1 else (65, 129)
    ns = (40, 136, 24, 8)
    return [(m, ns[i], tails[i % len(tails)]) for i, m in enumerate(ms)]


def case_gemm(name: str, act: str, m: int) -> Gemm:
    """A case's GEMM; its kernel is compile_gemm(gemm, METAL).kernel (tests/test_harness_coverage.py
    reads its ops)."""
    fmt = FORMATS[name]
    return Gemm(f"mw_{name}_{act}_{m}", fmt, RUNTIME.tuned_schedule(fmt, m), act)


@pytest.fixture(scope="module")
def built():
    if find_compiler() is None:
        pytest.skip("g++ is not installed")
    def make(name: str, act: str, m: int) -> tuple:
        gemm = case_gemm(name, act, m)
        kernel = compile_gemm(gemm, METAL).kernel
        return gemm, kernel, compile_metal(print_metal(kernel))

    return LazyBuilds({case: partial(make, *case) for case in CASES})  # each built on first use


def _run_and_check(gemm: Gemm, kernel, compiled, packed: md.PackedWeights, x: np.ndarray, seed: int,
                   interpret: bool) -> np.ndarray:
    m, k = x.shape
    n = packed.shape[1]
    bufs, scalars = gemm_buffers(kernel, packed, x)  # y: NaN
    out = compiled.run(bufs, scalars, seed=seed)
    y = read_output(out, m, n).astype(np.float64)
    xs = bufs["x"].astype(np.float64).reshape(m, k)  # as the kernel read them
    w = md.dequantize(packed)
    check = compare(y, xs @ w, xs, w, gemm.activation, kernel_weights(packed, gemm.activation))
    assert check.ok, f"{gemm.name} M={m} N={n} K={k}: {check.summary()}"
    if interpret:  # the interpreter runs the same IR: the same bits
        theirs = run_kernel(kernel, bufs, scalars)
        np.testing.assert_array_equal(out["y"], theirs["y"], err_msg=f"{gemm.name} M={m}")
    return out["y"]


@needs_gxx
@pytest.mark.sweep
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-m{c[2]}")
def test_stream_kernel_on_harness_matches_reference(built, case) -> None:
    name, act, m_tuned = case
    gemm, kernel, compiled = built[case]
    fmt = FORMATS[name]
    # the tuned kernel: the stream up to 32 rows, the multistage pipeline above (both read the layout)
    assert kernel.attrs["weight_layout"] == STREAM_LAYOUT
    assert kernel.attrs["pipeline"] == ("weight_stream" if m_tuned <= 32 else "multistage")
    for seed, (m, n, k) in enumerate(_shapes(fmt, m_tuned)):
        rng = np.random.default_rng(100 + seed)
        packed = md.pack(fmt, sample_weights(fmt, k, n, rng))
        _run_and_check(gemm, kernel, compiled, packed, rng.standard_normal((m, k)), seed + 1, m <= 3)


def _clustered_blocks(k: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Weights with the zeros block patterns are for: pruned input channels (whole K rows),
    whole 8 x 32 blocks, and whole 128-K vectors of a 32-column block (every row a simdgroup
    streams there empty), the rest dense."""
    w = rng.standard_normal((k, n))
    w[rng.random(k) < 0.2] = 0.0  # pruned input channels
    blocks = rng.random((k // 8, -(-n // 32))) < 0.3
    w[np.repeat(np.repeat(blocks, 8, axis=0), 32, axis=1)[:, :n]] = 0.0
    w[128:256, :32] = 0.0  # one whole K vector of the first column block
    return w


@needs_gxx
@pytest.mark.parametrize("case", [("fp4_blocks_g128", "f16", 1), ("fp4_blocks_g128", "bf16", 1),
                                  ("fp4_blocks_g128", "f16", 65)], ids=lambda c: f"{c[1]}-m{c[2]}")
def test_block_patterns_with_empty_blocks(built, case) -> None:
    """Real empty blocks: the patterns hold empty and partly empty bytes, every K position a
    pattern marks empty holds codes that decode to exactly 0, the kernel agrees with the
    reference, and patterns that claim everything empty change nothing (it reads none)."""
    gemm, kernel, compiled = built[case]
    sp = BLOCKS.sparsity
    for seed, (m, n, k) in enumerate([(1, 72, 384), (3, 136, 512), (65, 40, 256), (129, 8, 384)][:2 if case[2] == 1 else 4]):
        rng = np.random.default_rng(200 + seed)
        packed = md.pack(BLOCKS, _clustered_blocks(k, n, rng))
        patterns = packed.arrays["patterns"]
        assert (patterns == 0).any() and ((patterns != 0) & (patterns != 0xFF)).any() and (patterns == 0xFF).any()
        empty = ~np.repeat(np.unpackbits(patterns[:, None, :], axis=1, bitorder="little")[:, :sp.block_k],
                           sp.block_n, axis=2).reshape(k, -1)[:, :n].astype(bool)
        w = md.dequantize(packed)
        assert empty.any() and (w[empty] == 0.0).all()  # what a skip would have left out is 0
        codes = unpack_bits(np.asarray(packed.arrays["qweight"]), 4, 32)
        assert (BLOCKS.element.table()[codes[empty]] == 0.0).all()  # +0 or -0: exact in any decode
        x = rng.standard_normal((m, k))
        y = _run_and_check(gemm, kernel, compiled, packed, x, seed + 1, m <= 3)
        blind = md.PackedWeights(BLOCKS, packed.shape, {**packed.arrays, "patterns": np.zeros_like(patterns)})
        bufs, scalars = gemm_buffers(kernel, blind, x)
        np.testing.assert_array_equal(compiled.run(bufs, scalars, seed=seed + 1)["y"], y)
    assert "patterns" not in {op.attrs.get("buffer") for op in kernel.walk()}


# ----- the cost model against the first generation ----------------------------------------------

FIRST_GENERATION = {
    "double_buffered": Schedule("db_64x64x32", pipeline=DoubleBuffered()),
    "fused_dequant": Schedule("fused_64x64x32", pipeline=FusedDequant()),
    "striped": Schedule("striped_64x64x32_p4", pipeline=StripedKParallel(parallel=4, groups=16)),
}
#: `marlin-dsl compile examples/*.py --cost --cost-m 1` at this commit: (requested B/w, lane
#: instructions/w, unique B/w) of the stream and of the example's first-generation kernel.
PINNED = {
    "int3_zp": {"stream": (1.775, 7.19, 0.516), "fused_dequant": (2.94, 46.3, 0.500)},
    "fp4_blocks_g128": {"stream": (1.56, 4.53, 0.531), "double_buffered": (2.88, 50.9, 0.551)},
}


def _cost(fmt: md.Format, schedule: Schedule):
    gemm = Gemm(f"c_{schedule.name}", fmt, schedule, "f16")
    return kernel_cost(compile_gemm(gemm, METAL).kernel, gemm, m=1)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_stream_costs_less_than_first_generation_pinned(name: str) -> None:
    fmt = FORMATS[name]
    costs = {"stream": _cost(fmt, RUNTIME.tuned_schedule(fmt, 1))}
    costs |= {kind: _cost(fmt, s) for kind, s in FIRST_GENERATION.items()}
    new = costs["stream"]
    for kind, cost in costs.items():
        if kind != "stream":
            assert new.requested_bytes_per_weight < cost.requested_bytes_per_weight, kind
            assert new.instructions_per_weight < cost.instructions_per_weight / 5, kind
    for kind, (req, instr, unique) in PINNED[name].items():
        got = costs[kind]
        assert got.requested_bytes_per_weight == pytest.approx(req, rel=5e-3), kind
        assert got.instructions_per_weight == pytest.approx(instr, rel=5e-3), kind
        assert got.unique_bytes_per_weight == pytest.approx(unique, rel=5e-3), kind
    # int3: the layout's 3.2 bits a code and K padded to 160 (4160 / 4096) are counted in the
    # stream's unique bytes, honestly above the format's 3 bits; block patterns: the stream
    # reads no patterns, so they are not among its bytes
    stored = storage_per_weight(fmt)["qweight"]
    want = {"int3_zp": 3.25 / 8, "fp4_blocks_g128": stored}[name]
    assert new.unique_bytes["qweight"] == pytest.approx(want) and "patterns" not in new.unique_bytes


# ----- tuned schedules and layers --------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(FORMATS))
def test_metal_layers_pick_the_stream(name: str) -> None:
    fmt = FORMATS[name]
    chunk = stream_layout(fmt, METAL).dense_chunk
    for m, tile_m in ((1, 8), (9, 16), (17, 32)):
        s = stream_schedule(fmt, m, 4096, 4096)
        assert s is not None and (s.tile_m, s.tile_k, s.pipeline.kind) == (tile_m, chunk, "weight_stream")
    # above 32 rows the multistage pipeline on the same layout, where its buffer fits
    large = stream_schedule(fmt, 4096, 4096, 4096)
    wanted = (64, "multistage") if multistage_schedule(fmt, 4096) is not None else (32, "weight_stream")
    assert large is not None and (large.tile_m, large.pipeline.kind) == wanted
    assert RUNTIME.layer_layout(fmt, 4096 if name != "int3_g160" else 4000, 64) == STREAM_LAYOUT


# ----- CUDA: the same layout on its stream and multistage kernels -------------------------------

@pytest.mark.parametrize("name", ["int3_zp", "fp4_blocks_g128", "int5_zp_g32"])
def test_cuda_stream_and_multistage_on_cpu_harness(name: str) -> None:
    from marlin_dsl.checks.kernel_check import check_kernel
    from marlin_dsl.targets.cuda.cpu_harness import cuda_cpu_executor, find_compiler as find_cxx
    from marlin_dsl.targets.cuda.tuning import tuned_schedule

    if find_cxx() is None:
        pytest.skip("no C++ compiler for the CUDA CPU harness")
    fmt = FORMATS[name]
    chunk = stream_layout(fmt, CUDA).dense_chunk
    unit = int(np.lcm(fmt.k_granule, int(fmt.scale.group_size)))
    k_tail = (2 * chunk // unit + 1) * unit  # past two vectors: a tail where the group allows it
    executor = cuda_cpu_executor()
    for m_tuned, shapes in ((1, [(1, 40, k_tail), (3, 24, unit)]), (256, [(65, 136, k_tail)])):
        schedule = tuned_schedule(fmt, m_tuned, CUDA, 4096, 4096)  # stream_m8, multistage_small
        gemm = Gemm(f"cw_{name}_{m_tuned}", fmt, schedule, "f16")
        kernel = compile_gemm(gemm, CUDA).kernel
        for shape in shapes:
            result = check_kernel(gemm, kernel, shape, np.random.default_rng(shape[0]), executor)
            assert result.ok, f"{name} {schedule.name} {shape}: {result.summary()}"


def test_cuda_warpgroup_takes_block_patterns_not_int3() -> None:
    """On Hopper (M > 128) CUDA's tuned schedule is the warpgroup pipeline where the format
    takes it: block patterns now do (dense values, in the interpreter here; the first
    generation's CUDA kernels are unchanged); a 3-bit vector (80 K on CUDA) does not fill a
    128-byte swizzled row, so int3 keeps the multistage kernel."""
    from marlin_dsl import Warpgroup
    from marlin_dsl.targets.cuda.tuning import tuned_schedule
    from kernel_asserts import assert_matches

    assert tuned_schedule(BLOCKS, 2048, CUDA, 4096, 4096, warpgroup=True).pipeline.kind == "warpgroup"
    assert tuned_schedule(INT3_ZP, 2048, CUDA, 4096, 4096, warpgroup=True).pipeline.kind == "multistage"
    schedule = Schedule("wg_blocks", tile_m=32, tile_n=64, tile_k=64, warps_m=1, warps_n=4,
                        pipeline=Warpgroup(stages=3))
    gemm = Gemm("wg_blocks", BLOCKS, schedule, "f16")
    assert_matches(gemm, compile_gemm(gemm, CUDA).kernel, [(3, 72, 256), (33, 64, 384)], seed=3)
