"""The warpgroup pipeline (Hopper's wgmma, issue 15): kernels checked in the interpreter against
the float64 reference (both A sources, every 4-bit built-in format and MLX's modes, f16 and
bf16, M/N/K tails), the interpreter's model of the asynchronous ops (each hazard a mutation of
the lowering introduces is caught), the verifier's rules for in-flight accumulators, schedule
errors, the schedules the CUDA tuning picks, the swizzled rows against the hardware-checked
tables of wgmma_layout.py, the printed CUDA and its sm_90a compile (nvcc)."""
from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl import CUDA, METAL, Gemm, Schedule, Warpgroup
from kernel_asserts import assert_matches
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.errors import ScheduleError
from marlin_dsl.ir import F16, F32, Builder, BufferParam, FragmentType, GridDim, Kernel, SharedArray, VectorType
from marlin_dsl.ir.interpret import InterpreterError, run_kernel
from marlin_dsl.ir.verify import VerifyError, verify
from marlin_dsl.lowering import warpgroup as wg_lowering
from marlin_dsl.lowering.parts.swizzled_stages import copy_granule, k_positions
from marlin_dsl.machine.cuda import wgmma_layout as wl
from marlin_dsl.targets.cuda.nvcc import find_nvcc, nvcc_check
from marlin_dsl.targets.cuda.printer import print_cuda
from marlin_dsl.targets.cuda.tuning import WARPGROUP_MIN_M, tuned_schedule, warpgroup_schedule

FORMATS = ("fp4", "int4", "uint4_zp", "nf4")
SPARSE_FORMATS = ("fp4_2of4", "int4_2of4")  # the sparse wgmma (k32, A compressed, metadata)


def wg_schedule(tile_m: int = 32, warps_n: int = 4, stages: int = 3, depth: int = 1,
                a_source: str = "shared", tile_k: int = 64, sparse_pass: int = 2,
                decode_ahead: bool = False) -> Schedule:
    return Schedule("wg_test", tile_m=tile_m, tile_n=16 * warps_n, tile_k=tile_k, warps_m=1, warps_n=warps_n,
                    pipeline=Warpgroup(stages=stages, depth=depth, a_source=a_source, sparse_pass=sparse_pass,
                                       decode_ahead=decode_ahead))


def compiled(fmt_name: str = "fp4", act: str = "f16", **kw) -> tuple[Gemm, Kernel]:
    if fmt_name in SPARSE_FORMATS:
        kw.setdefault("tile_k", 128)  # a 2:4 K vector: 64 stored weights, 128 activations
    gemm = Gemm(f"wg_{fmt_name}", md.builtin_format(fmt_name), wg_schedule(**kw), act)
    return gemm, compile_gemm(gemm, CUDA).kernel


# ----- kernels in the interpreter ---------------------------------------------------------------

@pytest.mark.sweep
@pytest.mark.parametrize("fmt_name", FORMATS + SPARSE_FORMATS)
@pytest.mark.parametrize("act", ["f16", "bf16"])
@pytest.mark.parametrize("a_source", ["shared", "registers"])
def test_kernels_match_the_reference(fmt_name: str, act: str, a_source: str) -> None:
    # M = 1, 3, 65, 129 (rows past M in a tile), N tails (tiles past N), K of 4 to 6 steps
    gemm, kernel = compiled(fmt_name, act, a_source=a_source)
    assert_matches(gemm, kernel, [(1, 64, 256), (3, 72, 384), (65, 136, 256), (129, 64, 384)])


@pytest.mark.parametrize("fmt_name, group, act, depth", [("fp4", 128, "f16", 1), ("uint4_zp", 128, "bf16", 2),
                                                          ("nf4", 64, "f16", 2), ("int4", 32, "bf16", 1)])
def test_decode_ahead_matches_the_reference(fmt_name: str, group: int, act: str, depth: int) -> None:
    # the 64-K steps in pairs, then a lone last one where their count is odd (groups of 64 or
    # less): 1 step (no pair), 5 (two pairs and one), 6, 2
    fmt = md.builtin_format(fmt_name, group)
    gemm = Gemm(f"wg_{fmt_name}", fmt, wg_schedule(a_source="registers", decode_ahead=True, depth=depth, stages=4),
                act)
    kernel = compile_gemm(gemm, CUDA).kernel
    shapes = [(65, 136, 384), (3, 72, 128)] + ([(1, 64, 64), (33, 72, 320)] if group <= 64 else [])
    assert_matches(gemm, kernel, shapes, seed=depth)


def test_decode_ahead_decodes_between_the_commit_and_the_wait() -> None:
    def batches(body: str) -> list[int]:
        """per committed batch: lines between its commit and the next wait"""
        lines = body.splitlines()
        commits = [i for i, line in enumerate(lines) if "wgmma.commit_group" in line]
        waits = [i for i, line in enumerate(lines) if "wgmma.wait_group" in line]
        return [min(w for w in waits if w > c) - c for c in commits]

    plain = batches(print_cuda(compiled(tile_m=64, a_source="registers")[1]).body)
    ahead = batches(print_cuda(compiled(tile_m=64, a_source="registers", decode_ahead=True)[1]).body)
    # the wait soon after the commit (the scheduling pass moves a few independent lines up)
    assert len(plain) == 1 and plain[0] < 40
    # the pair's two batches each wait after the next step's decode; the lone last step soon
    assert len(ahead) == 3 and min(ahead[:2]) > 150 and ahead[2] < 40


@pytest.mark.parametrize("tile_m, warps_n, stages, depth, tile_k", [(8, 4, 3, 1, 64), (64, 8, 5, 2, 64),
                                                                      (128, 8, 4, 2, 64), (256, 8, 4, 2, 64),
                                                                      (32, 4, 3, 2, 128), (128, 8, 4, 1, 128)])
def test_schedule_variants(tile_m: int, warps_n: int, stages: int, depth: int, tile_k: int) -> None:
    # tile_k = 128: two K vectors a step (two swizzle atoms of activations and decoded weights)
    gemm, kernel = compiled(tile_m=tile_m, warps_n=warps_n, stages=stages, depth=depth, tile_k=tile_k)
    # whole tiles (the copies without predicates) and partial ones, K one step and several
    assert_matches(gemm, kernel, [(tile_m, 16 * warps_n, 256), (tile_m + 3, 16 * warps_n + 8, 128),
                                  (2 * tile_m, 16 * warps_n, 512)], seed=tile_m)


@pytest.mark.parametrize("mode, bits, group, dtype", [("affine", 4, 64, "float16"), ("mxfp4", 4, 32, None),
                                                      ("nvfp4", 4, 16, None)])
def test_mlx_modes(mode: str, bits: int, group: int, dtype: str | None) -> None:
    mx = pytest.importorskip("mlx.core")
    from marlin_dsl.layers.interop import mlx_format

    fmt = mlx_format(mode, bits, group, getattr(mx, dtype) if dtype else None)
    gemm = Gemm(f"wg_{mode}", fmt, warpgroup_schedule(fmt, 512), "f16")
    # groups smaller than a K step (32, 16): group parameters per K tile; K = 288 leaves a tail
    assert_matches(gemm, compile_gemm(gemm, CUDA).kernel, [(3, 136, 288 if group <= 32 else 256), (257, 128, 384)])


def test_two_vector_steps_in_both_a_sources() -> None:
    for a_source in ("shared", "registers"):
        gemm, kernel = compiled(a_source=a_source, tile_k=128)
        assert_matches(gemm, kernel, [(65, 72, 512), (3, 64, 256)])
    with pytest.raises(ScheduleError, match="cover whole steps"):  # nf4's groups of 64
        compiled("nf4", tile_k=128)


def test_sparse_selectors_and_metadata_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    # the interpreter rebuilds each warp's dense A from its lanes' metadata words for the
    # selector (Target.sparse_metadata): a lowering that gives a tile the other selector (the
    # other lane pair's word) computes a different, wrong product
    original = wg_lowering.WarpgroupLowering.wgmma

    def swapped(self, operands, meta, tile, attrs):
        return original(self, operands, meta, tile ^ 1, attrs)

    monkeypatch.setattr(wg_lowering.WarpgroupLowering, "wgmma", swapped)
    gemm, kernel = compiled("fp4_2of4")
    with pytest.raises(AssertionError):
        assert_matches(gemm, kernel, [(65, 136, 256)])


def test_a_sparse_wgmma_left_in_flight_across_steps_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # the H100 reads a sparse wgmma's metadata register when it executes; a loop step that
    # lets its wgmmas run on (pending 1) rewrites that register under them
    # (bench/results/issue15_h100_2026-11-25d/sparse_wgmma/run3_race_diagnosis.log)
    def pending_one(self, name, operands=(), result_types=(), attrs=None, regions=None, hint="v"):
        if name == "wgmma_wait" and not result_types and attrs == {"pending": 0}:
            attrs = {"pending": 1}
        return builder_op(self, name, operands, result_types, attrs, regions, hint)

    builder_op = Builder.op
    monkeypatch.setattr(Builder, "op", pending_one)
    with pytest.raises(VerifyError, match="metadata register"):
        compiled("fp4_2of4")


@pytest.mark.parametrize("sparse_pass", [1, 2])
def test_sparse_passes(sparse_pass: int) -> None:
    # K steps 1, 5, 8 and 7: whole passes, leftover steps, no whole pass at all
    gemm, kernel = compiled("fp4_2of4", sparse_pass=sparse_pass, stages=4, depth=2)
    assert_matches(gemm, kernel, [(5, 64, 128), (33, 72, 640), (65, 64, 1024), (3, 64, 896)])
    waits = [op for op in kernel.walk() if op.name == "wgmma_wait" and not op.results]
    kept = max(len(op.operands) for op in waits)
    assert kept == (sparse_pass - 1) * 2  # the earlier steps' metadata words (2 a step) at the pass's end


def test_a_sparse_step_left_in_flight_keeps_its_metadata_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    # the pair's second wait retires the first step's wgmmas and holds their metadata words
    def drop_kept(self, name, operands=(), result_types=(), attrs=None, regions=None, hint="v"):
        if name == "wgmma_wait" and not result_types:
            operands = ()
        return builder_op(self, name, operands, result_types, attrs, regions, hint)

    builder_op = Builder.op
    monkeypatch.setattr(Builder, "op", drop_kept)
    with pytest.raises(VerifyError, match="does not keep its metadata word"):
        compiled("fp4_2of4")


def test_a_batch_of_wgmmas_stays_together_after_the_passes() -> None:
    """Between a wgmma_fence and its commit only the wgmmas and their offsets (the schedule
    fences keep the next step's decode out: ptxas serialises a batch with other work in it)."""
    for tile_k in (64, 128):
        _, kernel = compiled(tile_m=128, warps_n=8, tile_k=tile_k)
        loop = next(op for op in kernel.walk() if op.name == "for" and any(
            o.name == "wgmma" for o in op.regions[0].ops))
        ops = loop.regions[0].ops
        start = next(i for i, o in enumerate(ops) if o.name == "wgmma_fence")
        end = next(i for i, o in enumerate(ops) if o.name == "wgmma_commit")
        inside = {o.name for o in ops[start + 1:end]}
        assert inside <= {"wgmma", "add", "mul", "rem", "const"}, inside
        assert sum(o.name == "wgmma" for o in ops[start:end]) == 4 * tile_k // 64


def test_the_decoded_weights_are_stored_in_the_activations_k_order() -> None:
    # shared A: the activations are copied in their own K order, 16 bytes at a time, and each
    # lane stores its decoded weights in 16-byte runs; with A in registers they follow the
    # weight layout's K shuffle in 4-byte pieces
    _, shared = compiled(a_source="shared")
    _, regs = compiled(a_source="registers")
    sizes = lambda k, name: {int(op.attrs["size"]) for op in k.walk() if op.name == name}  # noqa: E731
    assert sizes(shared, "async_copy") == {8} and sizes(shared, "vstore") == {8}
    assert sizes(regs, "async_copy") == {2} and not sizes(regs, "vstore")


# ----- the asynchronous model: hazards the interpreter catches -------------------------------------

def run_mutated(monkeypatch: pytest.MonkeyPatch) -> InterpreterError | None:
    gemm, kernel = compiled(stages=3)
    try:
        assert_matches(gemm, kernel, [(65, 72, 512)])
    except InterpreterError as e:
        return e
    return None


def test_unmutated_kernel_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_mutated(monkeypatch) is None


def _step_ready(fence: bool = True, barrier: bool = True, extra_pending: int = 0):
    def ready(self, pending: int) -> None:
        self.b.op("async_wait", attrs={"pending": pending + extra_pending})
        if fence:
            self.b.op("fence", attrs={"scope": "async_proxy"})
        if barrier:
            self.b.barrier()
    return ready


@pytest.mark.parametrize("mutation, kind, words", [
    (dict(fence=False), "async", "fence async_proxy"),
    (dict(barrier=False), "race", "data race"),
    (dict(extra_pending=1), "async", "async_copy has not been retired"),
])
def test_step_hazards_are_caught(monkeypatch: pytest.MonkeyPatch, mutation, kind, words) -> None:
    monkeypatch.setattr(wg_lowering.WarpgroupLowering, "step_ready", _step_ready(**mutation))
    err = run_mutated(monkeypatch)
    assert err is not None and err.kind == kind and words in str(err), err


def _rewrite_ops(monkeypatch: pytest.MonkeyPatch, edit) -> None:
    """Rewrite ops as the lowering emits them: edit(name, operands, attrs) -> (operands, attrs)
    or None to drop the op."""
    from marlin_dsl.ir import builder

    original = builder.Builder.op

    def op(self, name, operands=(), result_types=(), attrs=None, regions=None, hint="v"):
        changed = edit(name, list(operands), dict(attrs or {}))
        if changed is None:
            return None
        operands, attrs = changed
        return original(self, name, operands, result_types, attrs, regions, hint=hint)

    monkeypatch.setattr(builder.Builder, "op", op)


def test_retiring_too_little_lets_a_copy_overwrite_what_a_wgmma_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    _rewrite_ops(monkeypatch, lambda n, o, a: (o, {"pending": 2}) if n == "wgmma_wait" and a.get("pending") == 1
                 and not o else (o, a))
    err = run_mutated(monkeypatch)
    assert err is not None and err.kind == "async" and "a wgmma in flight reads" in str(err)


def test_a_batch_without_its_fence_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    _rewrite_ops(monkeypatch, lambda n, o, a: None if n == "wgmma_fence" else (o, a))
    err = run_mutated(monkeypatch)
    assert err is not None and err.kind == "async" and "wgmma_fence" in str(err)


def test_an_uncommitted_batch_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    _rewrite_ops(monkeypatch, lambda n, o, a: None if n == "wgmma_commit" else (o, a))
    err = run_mutated(monkeypatch)
    assert err is not None and err.kind == "async"


def test_two_a_buffers_are_enough_in_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    # a warp only rewrites its own rows of an A buffer, after its own wait retired their
    # reader: two buffers are race-free in the model (three are kept: docs/DECISIONS.md)
    monkeypatch.setattr(wg_lowering, "A_BUFFERS", 2)
    assert run_mutated(monkeypatch) is None


# ----- the verifier's rules ---------------------------------------------------------------------

WIDE = FragmentType("c", F32, 16, 64)
FRAG_A = FragmentType("a", F16, 16, 16)


def _wg_kernel(body, align: int = 1024, target: str = "cuda", threads: int = 128) -> Kernel:
    b = Builder()
    body(b)
    return Kernel("k", threads=threads, grid=(GridDim(None), GridDim(None), GridDim(None)), body=b.block,
                  buffers=[BufferParam("y", F32, "write")], scalars=[], warp_size=32,
                  shared=[SharedArray("w_s", F16, 8192, align=align)], attrs={"target": target})


def _issue(b: Builder, read=None, keep: bool = True):
    zero = b.const(0)
    a = b.value("frag_build", [b.value("vec", [b.const(1.0, F16)] * 8, VectorType(F16, 8))], FRAG_A)
    acc = b.value("frag_zero", [], WIDE)
    b.op("wgmma_fence", [a, acc])
    out = b.value("wgmma", [a, zero, acc], WIDE, {"smem": "w_s"})
    b.op("wgmma_commit")
    if read is not None:
        read(b, out)
    return b.value("wgmma_wait", [out, a] if keep else [out], WIDE, {"pending": 0})


def test_reading_an_accumulator_in_flight_is_refused() -> None:
    kernel = _wg_kernel(lambda b: _issue(b, read=lambda b, v: b.value("frag_elems", [v], VectorType(F32, 32))))
    with pytest.raises(VerifyError, match="undefined until then"):
        verify(kernel)


def test_a_wait_must_keep_register_a_alive() -> None:
    with pytest.raises(VerifyError, match="does not keep"):
        verify(_wg_kernel(lambda b: _issue(b, keep=False)))
    verify(_wg_kernel(lambda b: _issue(b)))


@pytest.mark.parametrize("kw, words", [(dict(align=16), "aligned to 1024"), (dict(target="metal"), "warpgroup MMA"),
                                       (dict(threads=96), "warpgroups of 128")])
def test_wgmma_needs_its_target_alignment_and_warpgroups(kw, words) -> None:
    def body(b: Builder) -> None:  # A from shared memory: no fragment but the accumulator
        acc = b.value("frag_zero", [], WIDE)
        b.op("wgmma_fence", [acc])
        out = b.value("wgmma", [b.const(0), b.const(0), acc], WIDE, {"smem": "w_s", "smem_a": "w_s"})
        b.op("wgmma_commit")
        b.value("wgmma_wait", [out], WIDE, {"pending": 0})
    verify(_wg_kernel(body))
    with pytest.raises(VerifyError, match=words):
        verify(_wg_kernel(body, **kw))


def test_a_readable_wait_waits_for_everything() -> None:
    def body(b: Builder) -> None:
        v = _issue(b)
        b.value("wgmma_wait", [v], WIDE, {"pending": 1})
    with pytest.raises(VerifyError, match="pending 0"):
        verify(_wg_kernel(body))


# ----- the shared-memory layout against the hardware-checked tables -------------------------------

def test_swizzled_rows_are_wgmma_layouts_128_byte_swizzle() -> None:
    layout = CUDA.warpgroup_b_layout
    rows, cols = np.meshgrid(np.arange(64), np.arange(64), indexing="ij")
    ours = layout.element(rows, cols, 2) * 2
    checked = wl.offset_swizzle128(rows, cols)  # checked on an H100 (bench/probes/wgmma_probe.py)
    assert np.array_equal(ours, checked)


def test_interpreter_wgmma_against_numpy() -> None:
    """A and B written to shared memory in the swizzled rows, one wgmma each way: D = A @ B."""
    rng = np.random.default_rng(4)
    a = rng.integers(-4, 5, (64, 16)).astype(np.float64)  # exact in f16 and in the f32 sums
    bm = rng.integers(-4, 5, (16, 32)).astype(np.float64)
    layout = CUDA.warpgroup_b_layout
    img = np.zeros(2 * 4096)
    r, c = np.meshgrid(np.arange(64), np.arange(16), indexing="ij")
    img[layout.element(r, c, 2)] = a  # A tile at element 0
    r, c = np.meshgrid(np.arange(32), np.arange(16), indexing="ij")
    img[4096 + layout.element(r, c, 2)] = bm.T  # B^T tile (one row per column of B) at 4096

    def body(b: Builder, smem_a: bool) -> None:
        tid, zero = b.index("tid"), b.const(0)

        def copy(i: int) -> None:
            idx = b.binary("add", tid, i * 128)
            b.store("s", idx, b.load("img", idx, F16))
        for i in range(64):
            copy(i)
        b.op("fence", attrs={"scope": "async_proxy"})
        b.barrier()
        acc = b.value("frag_zero", [], FragmentType("c", F32, 16, 32))
        if smem_a:
            b.op("wgmma_fence", [acc])
            out = b.value("wgmma", [zero, b.const(4096), acc], acc.type, {"smem": "s", "smem_a": "s"})
            keep = []
        else:  # each thread's A fragment registers from device memory (8 elements a thread)
            fa = b.value("frag_build", [b.load("a", b.binary("add", b.binary("mul", tid, 8), e), F16)
                                        for e in range(8)], FRAG_A)
            b.op("wgmma_fence", [fa, acc])
            out = b.value("wgmma", [fa, b.const(4096), acc], acc.type, {"smem": "s"})
            keep = [fa]
        b.op("wgmma_commit")
        done = b.value("wgmma_wait", [out, *keep], acc.type, {"pending": 0})
        el = b.value("frag_elems", [done], VectorType(F32, 16))
        for e in range(16):
            b.store("y", b.binary("add", b.binary("mul", tid, 16), e), b.value("extract", [el], F32, {"index": e}))

    # the A fragment per thread in the register layout (wgmma_layout.a_lane_values, checked)
    a_regs = wl.a_lane_values(a).astype(np.float16).reshape(-1)
    for smem_a in (True, False):
        b = Builder()
        body(b, smem_a)
        kernel = Kernel("k", threads=128, grid=(GridDim(None), GridDim(None), GridDim(None)), body=b.block,
                        buffers=[BufferParam("img", F16, "read"), BufferParam("a", F16, "read"),
                                 BufferParam("y", F32, "write")], scalars=[], warp_size=32,
                        shared=[SharedArray("s", F16, 8192, align=1024)], attrs={"target": "cuda"})
        out = run_kernel(kernel, {"img": img.astype(np.float16), "a": a_regs,
                                  "y": np.full(128 * 16, np.nan, np.float32)}, {})
        d = wl.d_from_lane_values(out["y"].reshape(128, 16), 32)  # the checked D layout
        assert np.array_equal(d, a @ bm), smem_a


# ----- small parts ------------------------------------------------------------------------------

def test_copy_granule_and_positions() -> None:
    assert copy_granule(k_positions(None, 64), 8) == 8
    fmt = md.builtin_format("fp4")
    from marlin_dsl.layouts.weight_stream import stream_layout

    lay = stream_layout(fmt, CUDA)
    pos = k_positions(lay.k_perm, 64)
    assert sorted(pos) == list(range(64)) and np.array_equal(np.asarray(lay.k_perm)[pos], np.arange(64))
    assert copy_granule(pos, 8) == 2  # Marlin's K shuffle keeps pairs together, not more


def test_vstore_and_vector_concatenation() -> None:
    b = Builder()
    tid = b.index("tid")
    x = b.value("vload", [b.binary("mul", tid, 2)], VectorType(F16, 2), {"buffer": "x", "size": 2})
    v = b.value("vec", [x, x], VectorType(F16, 4))
    b.op("vstore", [b.binary("mul", tid, 4), v], attrs={"buffer": "s", "size": 4})
    b.barrier()
    for i in range(4):
        idx = b.binary("add", b.binary("mul", tid, 4), i)
        b.store("y", idx, b.load("s", idx, F16))
    kernel = Kernel("k", threads=32, grid=(GridDim(None), GridDim(None), GridDim(None)), body=b.block,
                    buffers=[BufferParam("x", F16, "read"), BufferParam("y", F16, "write")], scalars=[],
                    warp_size=32, shared=[SharedArray("s", F16, 128)], attrs={"target": "cuda"})
    x_in = np.arange(64, dtype=np.float16)
    out = run_kernel(kernel, {"x": x_in, "y": np.zeros(128, np.float16)}, {})["y"]
    assert np.array_equal(out.reshape(32, 4), np.concatenate([x_in.reshape(32, 2)] * 2, axis=1))
    text = print_cuda(kernel).body
    assert "*reinterpret_cast<mdsl::vec<__half, 4>*>(&s[" in text


# ----- schedules ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, words", [
    (dict(warps_n=6), "whole number of warpgroups"),
    (dict(tile_m=264), "multiple of 8 up to 256"),
    (dict(stages=2), "at least 3"),
    (dict(tile_k=32), "tile_k=64"),
    (dict(sparse_pass=3), "sparse_pass must be 1 or 2"),
    (dict(decode_ahead=True), "a_source must be 'registers'"),
    (dict(decode_ahead=1, a_source="registers"), "decode_ahead must be True or False"),
])
def test_schedule_errors(kw, words) -> None:
    with pytest.raises(ScheduleError, match=words):
        compiled(**kw)


def test_refused_formats_and_targets() -> None:
    with pytest.raises(ScheduleError, match="decode_ahead takes dense formats"):
        compiled("fp4_2of4", a_source="registers", decode_ahead=True)
    with pytest.raises(ScheduleError, match="no sparse warpgroup MMA"):
        replace(wg_schedule(tile_k=128)).check(md.builtin_format("fp4_2of4"), replace(CUDA, warpgroup_sparse_k=None))
    with pytest.raises(ScheduleError, match="tile_k=128"):  # a 2:4 step is whole vectors of 128
        compiled("fp4_2of4", tile_k=64)
    with pytest.raises(ScheduleError, match="warpgroup MMA"):
        compile_gemm(Gemm("x", md.builtin_format("fp4"), wg_schedule()), METAL)
    bad = replace(wg_schedule(), tile_n=128)
    with pytest.raises(ScheduleError, match="tile_n must be"):
        bad.check(md.builtin_format("fp4"), CUDA)


def test_tuned_schedules_on_hopper() -> None:
    fp4 = md.builtin_format("fp4")
    assert tuned_schedule(fp4, 2048, CUDA, 4096, 4096, warpgroup=True).pipeline.kind == "warpgroup"
    assert tuned_schedule(fp4, WARPGROUP_MIN_M, CUDA, 4096, 4096, warpgroup=True).pipeline.kind != "warpgroup"
    assert tuned_schedule(fp4, 2048, CUDA, 4096, 4096).pipeline.kind == "multistage"  # no wgmma on the device
    two_four = md.builtin_format("fp4_2of4")
    sparse = tuned_schedule(two_four, 2048, CUDA, 4096, 4096, warpgroup=True)
    assert sparse.pipeline.kind == "warpgroup" and sparse.tile_m == 192  # 256-row stages of 2:4 do not fit
    assert tuned_schedule(two_four, 200, CUDA, 4096, 4096, warpgroup=True).tile_m == 128
    assert tuned_schedule(two_four, 2048, CUDA, 4096, 4096).pipeline.kind == "multistage"


# ----- the printed CUDA ---------------------------------------------------------------------------

@pytest.mark.parametrize("a_source", ["shared", "registers"])
def test_printed_cuda(a_source: str) -> None:
    _, kernel = compiled(tile_m=64, a_source=a_source)
    src = print_cuda(kernel)
    assert src.attrs["cuda_arch"] == "sm_90a"
    body = src.body
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16" in body
    assert "wgmma.fence.sync.aligned" in body and "wgmma.commit_group.sync.aligned" in body
    assert "fence.proxy.async.shared::cta" in body
    assert "mdsl::wgmma_desc_sw128<1024u>" in body
    # the chain of a batch updates one accumulator in place (references, no register copies)
    assert "mdsl::frag_cw<64>& " in body
    # the dynamic block's start aligned at run time for the swizzled tiles
    assert "& 1023u)) & 1023u)" in body and src.dynamic_shared_bytes % 16 == 0
    waits = [line for line in body.splitlines() if "wgmma.wait_group.sync.aligned" in line]
    assert waits and ("wait_group.sync.aligned 1" in " ".join(waits)) == (a_source == "shared")


@pytest.mark.parametrize("a_source", ["shared", "registers"])
def test_printed_sparse_wgmma(a_source: str) -> None:
    _, kernel = compiled("fp4_2of4", tile_m=64, a_source=a_source)
    body = print_cuda(kernel).body
    spelled = [line for line in body.splitlines() if "wgmma.mma_async.sp.sync.aligned.m64n64k32.f32.f16.f16" in line]
    # four k32 instructions a step (one 128-activation vector), tile pairs sharing a metadata
    # word with selectors 0 and 1 (an immediate after the word's operand); with A in shared
    # memory steps go in pairs (the first left in flight) plus a lone last step
    steps = 3 if a_source == "shared" else 1
    assert len(spelled) == 4 * steps
    selectors = [int(re.search(r", %\d+, (\d), p, 1, 1", line).group(1)) for line in spelled]
    assert selectors == [0, 1, 0, 1] * steps
    waits = [line for line in body.splitlines() if "wgmma.wait_group.sync.aligned" in line]
    assert ("wait_group.sync.aligned 1" in " ".join(waits)) == (a_source == "shared")


@pytest.mark.skipif(find_nvcc() is None, reason="needs nvcc (CUDA toolkit) to compile the printed text")
def test_nvcc_compiles_for_sm_90a() -> None:
    sources = []
    for a_source in ("shared", "registers"):
        for act in ("f16", "bf16"):
            for fmt_name in ("fp4", "fp4_2of4"):
                _, kernel = compiled(fmt_name, tile_m=128, warps_n=8, a_source=a_source, act=act)
                sources.append(replace(print_cuda(kernel), name=f"wg_{fmt_name}_{a_source}_{act}"))
    results = nvcc_check(sources, archs=["sm_90a"])
    assert all(r.ok for r in results), [r.log for r in results if not r.ok]


@pytest.mark.sweep
@pytest.mark.skipif(find_nvcc() is None, reason="needs nvcc (CUDA toolkit) to compile the printed text")
@pytest.mark.parametrize("fmt_name", ["fp4", "uint4_zp"])
@pytest.mark.parametrize("act", ["f16", "bf16"])
@pytest.mark.parametrize("decode_ahead", [False, True])
def test_ptxas_keeps_register_a_wgmmas_pipelined(tmp_path, fmt_name: str, act: str, decode_ahead: bool) -> None:
    """A in registers at 256 x 128 tiles: the decode moved under the wgmmas would have ptxas
    serialise them (C7513) if it wrote a register they read; with the steps in pairs it does
    not, and the kernel fits 255 registers without spilling."""
    from test_warpgroup_roles import _ptxas_report

    _, kernel = compiled(fmt_name, act, tile_m=256, warps_n=8, stages=4, depth=2, a_source="registers",
                         decode_ahead=decode_ahead)
    report = _ptxas_report(kernel, tmp_path)
    assert "serialized" not in report, report
    assert re.search(r"\b0 bytes spill stores", report), report
