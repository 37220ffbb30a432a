"""The weight-stream pipeline: the CUDA layout chosen at pack time, the lowering (checked in the
interpreter against the float64 reference, tails included), the sparse MMA path for 2:4, the
schedule's errors, and nvcc compiles of the printed kernels."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl import CUDA, METAL, Gemm, Schedule, WeightStream
from marlin_dsl.machine.cuda import sparse_layout as sl
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.errors import ScheduleError
from marlin_dsl.formats.bitstream import unpack_bits
from marlin_dsl.formats.packing import metadata_positions
from marlin_dsl.ir.text import assert_round_trip
from marlin_dsl.checks.kernel_check import check_kernel
from marlin_dsl.layouts.weight_stream import VECTOR_WORDS, stream_arrays, stream_layout
from marlin_dsl.checks.format_check import sample_weights

STREAM_FORMATS = ("fp4", "int4", "uint4_zp", "nf4", "fp4_2of4", "int4_2of4")


def small_schedule(fmt, tile_m: int = 8, warps_n: int = 2, k_warps: int = 2, depth: int = 2) -> Schedule:
    tile_k = stream_layout(fmt, CUDA).dense_chunk  # one vector per step
    return Schedule("ws_test", tile_m=tile_m, tile_n=16 * warps_n, tile_k=tile_k, warps_m=1,
                    warps_n=warps_n, pipeline=WeightStream(k_warps=k_warps, depth=depth))


# ----- layout ---------------------------------------------------------------------------------

def _lane_codes(layout, words: np.ndarray, nt: int, kv: int) -> np.ndarray:
    """Independent reading of the layout: codes[n_tile, k_vector, lane, tile, element]."""
    w = words.reshape(nt, kv, layout.lanes, VECTOR_WORDS)
    pairs = layout.tiles * layout.per_lane // 2
    out = np.zeros((nt, kv, layout.lanes, pairs, 2), np.int64)
    positions = layout.bit_order.positions  # [slot][code bit] -> bit of a 16-bit half
    for j in range(pairs):
        word, slot = divmod(j, 16 // layout.bits)
        for i, pos in enumerate(positions[slot]):  # one bit at a time, independent of pack()
            out[..., j, 0] |= ((w[..., word].astype(np.int64) >> pos) & 1) << i
            out[..., j, 1] |= ((w[..., word].astype(np.int64) >> (16 + pos)) & 1) << i
    return out.reshape(nt, kv, layout.lanes, layout.tiles, layout.per_lane)


@pytest.mark.parametrize("shape", [(128, 32), (192, 40), (64, 16)])
def test_every_code_lands_where_its_lane_reads_it(shape) -> None:
    layout = stream_layout(md.builtin_format("fp4"), CUDA)
    rng = np.random.default_rng(1)
    ks, n = shape
    codes = rng.integers(0, 16, size=shape)
    words = layout.pack(codes)
    nt, kv = -(-n // 16), -(-ks // layout.chunk)
    assert words.dtype == np.uint32 and words.size == layout.words(ks, n)
    got = _lane_codes(layout, words, nt, kv)
    padded = np.zeros((kv * layout.chunk, nt * 16), np.int64)
    padded[:ks, :n] = codes
    # lane L, tile s, element e of (nt, kv) is W^T[row, col] = codes[kv*chunk + 16 s + col, 16 nt + row]
    t_idx, k_idx = np.meshgrid(np.arange(nt), np.arange(kv), indexing="ij")
    perm = layout.k_perm if layout.k_perm is not None else np.arange(layout.chunk)
    for s in range(layout.tiles):
        k = k_idx[..., None, None] * layout.chunk + perm[16 * s + layout.cols][None, None]
        col = t_idx[..., None, None] * 16 + layout.rows[None, None]
        np.testing.assert_array_equal(got[:, :, :, s, :], padded[k, col])


def test_k_shuffle_gives_each_lane_one_contiguous_run() -> None:
    """With the K shuffle, lane L's B elements of tiles 0..3 are original K offsets
    x_run0[L] + 0 .. 15, in tile-major order: one 32-byte run of activations per chunk."""
    from marlin_dsl.layouts.weight_stream import activation_permutation

    layout = stream_layout(md.builtin_format("fp4"), CUDA)
    b_k, _ = CUDA.lane_elements("b", 16, 8)
    perm, start = activation_permutation(b_k, layout.tiles, 16)
    assert np.array_equal(perm, layout.k_perm) and layout.x_run == 16
    for lane in range(32):
        got = [perm[16 * s + b_k[lane, e]] for s in range(4) for e in range(4)]
        assert got == list(range(start[lane], start[lane] + 16))
    # groups smaller than a chunk keep the identity order (a tile must sit in one group)
    assert stream_layout(md.builtin_format("fp4", 32), CUDA).k_perm is None
    assert stream_layout(md.builtin_format("fp4_2of4"), CUDA).k_perm is None


def test_layout_covers_a_tile_once_per_lane_table() -> None:
    layout = stream_layout(md.builtin_format("int4"), CUDA)
    seen = np.zeros((16, 16), int)
    np.add.at(seen, (layout.rows, layout.cols), 1)
    assert (seen == 1).all() and layout.tiles == 4 and layout.chunk == 64


def test_sparse_metadata_decodes_to_the_format_positions() -> None:
    fmt = md.builtin_format("fp4_2of4")
    rng = np.random.default_rng(3)
    k, n = 256, 48
    packed = md.pack(fmt, sample_weights(fmt, k, n, rng))
    layout = stream_layout(fmt, CUDA)
    assert layout.sparse and layout.tile_cols == 16 and layout.meta_words == 2
    arrays = stream_arrays(fmt, CUDA, packed)
    positions = metadata_positions(packed.arrays["meta"], fmt.sparsity, 32)  # [K/4, 2, N]
    nt, kv = n // 16, k // 2 // layout.chunk
    meta = arrays["meta"].reshape(nt, kv, 32, layout.meta_words)
    for t in range(nt):
        for v in range(kv):
            for tile in range(layout.tiles):
                got = sl.unpack_metadata(meta[t, v, :, tile // 2], tile % 2)  # [16 rows, 8 groups, 2]
                blocks = (v * layout.tiles + tile) * 8 + np.arange(8)
                want = positions[blocks][:, :, t * 16:(t + 1) * 16].transpose(2, 0, 1)
                np.testing.assert_array_equal(got, want)


def test_stream_values_are_the_stored_codes() -> None:
    fmt = md.builtin_format("int4_2of4")
    packed = md.pack(fmt, sample_weights(fmt, 128, 32, np.random.default_rng(4)))
    layout = stream_layout(fmt, CUDA)
    stored = unpack_bits(packed.arrays["qweight"], 4, 32)
    np.testing.assert_array_equal(stream_arrays(fmt, CUDA, packed)["qweight"], layout.pack(stored))


# ----- kernels in the interpreter ---------------------------------------------------------------

@pytest.mark.parametrize("fmt_name", STREAM_FORMATS)
@pytest.mark.parametrize("act", ["f16", "bf16"])
def test_stream_kernel_matches_reference(fmt_name: str, act: str) -> None:
    fmt = md.builtin_format(fmt_name)
    gemm = Gemm(f"ws_{fmt_name}", fmt, small_schedule(fmt), act)
    kernel = compile_gemm(gemm, CUDA).kernel
    rng = np.random.default_rng(11)
    k = 2 * stream_layout(fmt, CUDA).dense_chunk if fmt.scale.group_size == "K" else 256
    for shape in [(1, 33, k), (3, 40, k), (65, 49, k)]:  # M = 1, 3, 65; N tails
        result = check_kernel(gemm, kernel, shape, rng)
        assert result.untouched_poison == 0, shape
        assert result.rel_error <= result.tolerance, (shape, result.rel_error)


@pytest.mark.parametrize("fmt_name", ["fp4", "fp4_2of4"])
def test_k_tail_shorter_than_a_vector(fmt_name: str) -> None:
    """Group size 32: K = 96 (dense) / 160 (2:4) is not a multiple of the vector chunk; the
    padded codes are masked by the activation loads and the scales' K predicate."""
    fmt = md.builtin_format(fmt_name, 32)
    gemm = Gemm("ws_tail", fmt, small_schedule(fmt, depth=1), "f16")
    kernel = compile_gemm(gemm, CUDA).kernel
    k = 96 if fmt_name == "fp4" else 160
    result = check_kernel(gemm, kernel, (5, 20, k), np.random.default_rng(2))
    assert result.ok, result


@pytest.mark.parametrize("unroll,depth,vectors", [(1, 1, 1), (2, 1, 1), (2, 2, 1), (3, 1, 1), (1, 1, 2), (2, 2, 2)])
@pytest.mark.parametrize("fmt_name,group", [("fp4", 128), ("fp4", 32), ("uint4_zp", 256), ("fp4_2of4", 256)])
def test_unrolled_k_loop_and_its_remainder(fmt_name: str, group: int, unroll: int, depth: int, vectors: int) -> None:
    """Warps with different step counts (0 .. 3 steps: 6 or 7 steps over 4 K warps) run the
    unrolled loop, its remainder or neither; steps of 1 or 2 vectors (tile_k = 2 chunks: one
    scale group per step); group >= 128 reads clamped, unpredicated loads (K whole vectors),
    group 32 predicated ones with a K tail (and one vector per step)."""
    if group == 32 and vectors > 1:
        pytest.skip("group 32: one vector per step (test_multi_vector_steps_need_whole_groups)")
    fmt = md.builtin_format(fmt_name, group)
    chunk = stream_layout(fmt, CUDA).dense_chunk
    sched = Schedule("ws_unroll", tile_m=8, tile_n=32, tile_k=vectors * chunk, warps_m=1,
                     warps_n=2, pipeline=WeightStream(k_warps=4, depth=depth, unroll=unroll))
    gemm = Gemm("ws_unroll", fmt, sched, "f16")
    kernel = compile_gemm(gemm, CUDA).kernel
    k = 6 * sched.tile_k if group >= 128 else 7 * chunk - 32  # group 32: a K tail in the last vector
    k = -(-k // group) * group if group >= 128 else k  # K a multiple of the group: 6 or 7 steps
    loads = [op for op in kernel.walk() if op.name in ("vload", "load") and op.attrs["buffer"] in ("x", "qweight")]
    assert all(len(op.operands) == 1 for op in loads) == (group >= 128)  # no predicate where K is whole
    scale_loads = [op for op in kernel.walk() if op.name == "load" and op.attrs["buffer"] == "scales"]
    weight_loads = [op for op in kernel.walk() if op.name == "vload" and op.attrs["buffer"] == "qweight"]
    if group >= 128:  # per N tile: `vectors` weight vectors, the scales of the lane's 2 rows once
        assert 2 * len(weight_loads) == vectors * len(scale_loads)
    result = check_kernel(gemm, kernel, (3, 40, k), np.random.default_rng(unroll * 10 + depth))
    assert result.ok, result


def test_multi_vector_steps_need_whole_groups() -> None:
    fmt = md.builtin_format("fp4", 64)  # a group of one vector: a step of two would span two
    sched = Schedule("ws_two", tile_m=8, tile_n=16, tile_k=128, warps_m=1, warps_n=1,
                     pipeline=WeightStream(k_warps=4))
    with pytest.raises(ScheduleError, match="scale groups that cover whole steps"):
        compile_gemm(Gemm("ws_two", fmt, sched, "f16"), CUDA)
    with pytest.raises(ScheduleError, match="tile_k=64"):
        compile_gemm(Gemm("ws_odd", fmt, dataclasses.replace(sched, tile_k=96), "f16"), CUDA)


def test_default_stream_schedules_run() -> None:
    fmt = md.builtin_format("uint4_zp")
    rng = np.random.default_rng(8)
    for m in (1, 16, 40, 70):
        sched = md.tuned_schedule(fmt, m)
        gemm = Gemm("ws_default", fmt, sched, "f16")
        kernel = compile_gemm(gemm, CUDA).kernel
        assert kernel.attrs["weight_layout"] == "lane_stream"
        result = check_kernel(gemm, kernel, (m, 24, 512), rng)
        assert result.ok, (m, result)


def test_tuned_schedule_buckets() -> None:
    fmt = md.builtin_format("fp4")
    names = [md.tuned_schedule(fmt, m).name for m in (1, 8, 9, 16, 17, 64, 65, 2048)]
    assert names == ["stream_m8", "stream_m8", "stream_m16", "stream_m16", "stream_m32", "stream_m32",
                     "multistage_small", "multistage_large"]
    # N > K from 17 rows: the multistage pipeline's small tiles (faster there on the H100)
    assert md.tuned_schedule(fmt, 64, None, 4096, 14336).name == "multistage_small"
    assert md.tuned_schedule(fmt, 32, None, 4096, 14336).name == "multistage_small"
    assert md.tuned_schedule(fmt, 64, None, 14336, 4096).name == "stream_m32"
    assert md.tuned_schedule(md.builtin_format("fp4_2of4"), 1).tile_k == 128
    # the H100 sweep (bench/results/issue15_h100_2026-11-25c/decode): two K vectors per step
    # and depth 2 at M <= 8, one vector at M = 16; 8 warps split K where N > K, else 16
    m1, m16 = md.tuned_schedule(fmt, 1, None, 14336, 4096), md.tuned_schedule(fmt, 16, None, 14336, 4096)
    assert (m1.tile_k, m1.pipeline.depth, m1.pipeline.k_warps) == (128, 2, 16)
    assert (m16.name, m16.tile_k, m16.pipeline.k_warps) == ("stream_m16", 64, 16)
    assert md.tuned_schedule(fmt, 16, None, 4096, 14336).pipeline.k_warps == 8


def test_stream_kernel_text_round_trips() -> None:
    fmt = md.builtin_format("fp4_2of4")
    kernel = compile_gemm(Gemm("ws_rt", fmt, small_schedule(fmt), "bf16"), CUDA).kernel  # bf16: pairs as vec
    assert_round_trip(kernel)
    names = {op.name for op in kernel.walk()}
    assert {"mma_sp", "frag_build", "vload", "vec"} <= names and "mma" not in names


def test_stream_formats_have_even_k() -> None:
    """The kernel reads activations in (k, k+1) pairs: every format the layout accepts has an
    even K granule, so K is always even (kernel_args.physical_arrays relies on it). Every code
    width streams: those that do not divide 16 with spare bits (floor(16 / bits) codes a half)."""
    for fmt_name in STREAM_FORMATS:
        assert md.builtin_format(fmt_name).k_granule % 2 == 0
    for bits in range(1, 9):
        fmt = md.Format(name=f"int{bits}", element=md.IntEncoding(bits), scale=md.GroupScale(96), packing=md.Packing())
        layout = stream_layout(fmt, CUDA)
        assert fmt.k_granule % 2 == 0 and layout.tiles * layout.per_lane == 2 * VECTOR_WORDS * (16 // bits)


# ----- schedule errors ------------------------------------------------------------------------

def test_block_patterns_stream_as_dense_values() -> None:
    """Block patterns store every value (`BlockPatternSparsity.values_dense`): the stream lays
    them out as the dense format's and never reads the patterns."""
    fmt = md.builtin_format("fp4_blockpattern")
    ours, dense = stream_layout(fmt, CUDA), stream_layout(md.builtin_format("fp4"), CUDA)
    assert (ours.chunk, ours.bit_order, ours.sparse) == (dense.chunk, dense.bit_order, False)
    assert np.array_equal(ours.k_perm, dense.k_perm)
    kernel = compile_gemm(Gemm("ws_bp", fmt, small_schedule(fmt), "f16"), CUDA).kernel
    assert "patterns" not in {op.attrs.get("buffer") for op in kernel.walk()}


def test_wrong_tile_k_names_the_right_one() -> None:
    fmt = md.builtin_format("fp4")
    sched = Schedule("bad", tile_m=8, tile_n=16, tile_k=32, warps_m=1, warps_n=1, pipeline=WeightStream())
    with pytest.raises(ScheduleError, match="set tile_k=64"):
        compile_gemm(Gemm("ws_bad", fmt, sched, "f16"), CUDA)


def test_warps_m_must_be_one() -> None:
    with pytest.raises(ScheduleError, match="warps_m must be 1"):
        Schedule("bad", tile_m=16, tile_n=16, tile_k=64, warps_m=2, warps_n=1, pipeline=WeightStream())


def test_target_without_lane_tables_is_refused() -> None:
    """A target that keeps its MMA lanes opaque has no weight-stream layout (Metal declares
    its simdgroup tables: tests/test_metal_stream.py)."""
    fmt = md.builtin_format("fp4")
    opaque = dataclasses.replace(METAL, name="opaque", lane_tables={})
    with pytest.raises(ScheduleError, match="lane layout of opaque's MMA A operand"):
        stream_layout(fmt, opaque)


def test_non_2of4_sparsity_is_refused() -> None:
    from marlin_dsl import Format, NMSparsity

    fmt4of8 = md.builtin_format("fp4_2of4")
    fmt = Format(name="fp4_4of8", element=fmt4of8.element, scale=fmt4of8.scale,
                 sparsity=NMSparsity(4, 8), packing=fmt4of8.packing)
    with pytest.raises(ScheduleError, match="only for 2:4"):
        stream_layout(fmt, CUDA)


# ----- nvcc -------------------------------------------------------------------------------------

def test_stream_kernels_compile_with_nvcc() -> None:
    from marlin_dsl.targets.cuda.printer import print_cuda
    from marlin_dsl.targets.cuda.nvcc import find_nvcc, nvcc_check

    if find_nvcc() is None:
        pytest.skip("nvcc not found: the CUDA compile check needs the CUDA toolkit")
    sources = []
    for fmt_name in STREAM_FORMATS:
        fmt = md.builtin_format(fmt_name)
        for act in ("f16", "bf16"):
            for m in (1, 64):
                gemm = Gemm(f"ws_{fmt_name}_{act}_{m}", fmt, md.tuned_schedule(fmt, m), act)
                sources.append(print_cuda(compile_gemm(gemm, CUDA).kernel))
    for fmt_name, act in (("fp4", "f16"), ("int4", "bf16")):  # Y's columns as parts (Gemm.outputs)
        fmt = md.builtin_format(fmt_name)
        gemm = Gemm(f"ws_parts_{fmt_name}_{act}", fmt, md.tuned_schedule(fmt, 1), act, outputs=(64, 16, 24))
        sources.append(print_cuda(compile_gemm(gemm, CUDA).kernel))
    results = nvcc_check(sources, archs=("sm_80", "sm_90"))
    failed = [r.summary() for r in results if not r.ok]
    assert not failed, "\n".join(failed)


def test_compile_cli_writes_the_cuda_layout_in_the_manifest(tmp_path, capsys) -> None:
    """`marlin-dsl compile --target cuda -o`: the manifest says which physical layout the
    kernel reads and how to make it; the verification table checks the kernel on it."""
    import json

    from marlin_dsl.targets.cuda.printer import CudaSource
    from marlin_dsl.cli import main

    spec = tmp_path / "ws.py"
    spec.write_text('from marlin_dsl import Gemm, builtin_format, tuned_schedule\n'
                    'fmt = builtin_format("int4_2of4")\n'
                    'ws = Gemm("ws_int4_2of4", fmt, tuned_schedule(fmt, 1))\n')
    assert main(["compile", str(spec), "--target", "cuda", "-o", str(tmp_path / "out")]) == 0
    assert "PASS" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "out" / "ws" / "ws_int4_2of4" / "manifest.json").read_text())
    assert manifest["weight_layout"] == "lane_stream" and "to_kernel_layout" in manifest["weights"]
    src = CudaSource.from_json(manifest["source"])
    assert src.input_names == ["x", "qweight", "scales", "meta", "dims"]
    fmt = md.builtin_format("int4_2of4")
    packed = md.pack(fmt, sample_weights(fmt, 256, 32, np.random.default_rng(0)))
    from marlin_dsl.kernel_args import to_kernel_layout

    phys = to_kernel_layout(src.attrs, packed)
    assert phys.layout == "lane_stream" and phys.arrays["qweight"].shape == (2 * 2 * 32 * 4,)  # 2 N tiles x 2 vectors of 64 stored K


@pytest.mark.parametrize("group,size", [(128, 16), ("K", 8), (32, 2)])
def test_activation_run_in_one_vload_where_k_is_whole(group, size: int) -> None:
    """A lane's 16 activations of a vector step are one 32-byte vload where K is a multiple of
    the group (every row's run stays aligned), printed as one access from one address (two
    128-bit loads); 8 at a time with per-column scales (rows only K-granule aligned); pairs
    without the K shuffle (groups smaller than a vector)."""
    from marlin_dsl.targets import emit

    fmt = md.builtin_format("fp4", group)
    kernel = compile_gemm(Gemm("ws_run", fmt, md.tuned_schedule(fmt, 1), "f16"), CUDA).kernel
    sizes = {op.attrs["size"] for op in kernel.walk() if op.name == "vload" and op.attrs["buffer"] == "x"}
    assert sizes == {size}
    body = emit(kernel, CUDA).body
    spelled = "__half2" if size == 2 else f"mdsl::vec<__half, {size}>"
    assert f"*reinterpret_cast<const {spelled}*>(&x[" in body
