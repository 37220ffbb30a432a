"""The multistage pipeline (large M): kernels checked in the interpreter against the float64
reference (tails, K shorter than a step, guarded copies, 2..4 stages), the schedules
`multistage_schedule` / `tuned_schedule` pick, schedule errors, the printed CUDA (dynamic
shared memory above 48 KB, cp.async) and nvcc compiles of it; and the IR ops the pipeline
added: async_copy / async_commit / async_wait (the interpreter's in-flight model) and
frag_elems."""
from __future__ import annotations

import re
from math import lcm

import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl import CUDA, METAL, Gemm, Multistage, Schedule
from marlin_dsl.targets.cuda.printer import DYNAMIC_SHARED_NAME, STATIC_SHARED_BYTES, CudaSource, print_cuda
from marlin_dsl.targets.cuda.nvcc import find_nvcc, nvcc_check
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.errors import CompileError, ScheduleError
from marlin_dsl.ir import (F16, F32, U32, BufferParam, Builder, FragmentType, GridDim, Kernel,
                           SharedArray, Value, VectorType)
from marlin_dsl.ir.interpret import InterpreterError, run_kernel
from marlin_dsl.ir.text import assert_round_trip
from marlin_dsl.ir.verify import VerifyError, verify
from kernel_asserts import assert_matches

STREAM_FORMATS = ("fp4", "int4", "uint4_zp", "nf4", "fp4_2of4", "int4_2of4")
ASYNC_OPS = {"async_copy", "async_commit", "async_wait", "frag_elems"}


def step_k(fmt) -> int:
    """The dense K of one multistage step (the layout's vector chunk)."""
    return md.multistage_schedule(fmt, 2048).tile_k


def ms_schedule(fmt, stages: int = 3, tile_m: int = 32, tile_n: int = 64, warps_m: int = 2,
                warps_n: int = 2) -> Schedule:
    return Schedule("ms_test", tile_m=tile_m, tile_n=tile_n, tile_k=step_k(fmt), warps_m=warps_m,
                    warps_n=warps_n, pipeline=Multistage(stages))


def k_for(fmt, steps: int) -> int:
    """The smallest K >= steps K steps that is a multiple of the step, the format's K granule
    and its scale group."""
    g = fmt.scale.group_size
    unit = lcm(step_k(fmt), fmt.k_granule, *([] if g == "K" else [int(g)]))
    return -(-steps * step_k(fmt) // unit) * unit


def guarded_copies(kernel: Kernel) -> dict[str, int]:
    """async_copy ops inside an `if` (threads past the end of a copy issue nothing), by dst."""
    out: dict[str, int] = {}
    for op in kernel.walk():
        if op.name == "if":
            for region in op.regions:
                for inner in region.walk():
                    if inner.name == "async_copy":
                        out[str(inner.attrs["dst"])] = out.get(str(inner.attrs["dst"]), 0) + 1
    return out


def compile_ms(fmt_name: str, sched: Schedule, act: str = "f16", group=None) -> tuple[Gemm, Kernel]:
    fmt = md.builtin_format(fmt_name) if group is None else md.builtin_format(fmt_name, group)
    gemm = Gemm(f"ms_{fmt_name}", fmt, sched, act)
    return gemm, compile_gemm(gemm, CUDA).kernel


# ----- kernels in the interpreter ---------------------------------------------------------------

@pytest.mark.parametrize("fmt_name", STREAM_FORMATS)
@pytest.mark.parametrize("act", ["f16", "bf16"])
def test_multistage_kernel_matches_reference(fmt_name: str, act: str) -> None:
    fmt = md.builtin_format(fmt_name)
    gemm, kernel = compile_ms(fmt_name, ms_schedule(fmt), act)
    assert kernel.attrs["pipeline"] == "multistage" and kernel.attrs["stages"] == 3
    assert kernel.attrs["weight_layout"] == "lane_stream"
    names = {op.name for op in kernel.walk()}
    assert ASYNC_OPS <= names
    assert ("mma_sp" in names) == (fmt.sparsity is not None)
    k = k_for(fmt, 4)  # more K steps than stages: the slots wrap around
    assert k // step_k(fmt) > 3
    # M = 1, 3, 65 (three 32-row tiles, the last with one row); N tails of 40 and 72
    assert_matches(gemm, kernel, [(1, 40, k), (3, 72, k), (65, 40, k), (65, 72, k)], seed=11)


@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("fmt_name,act", [("fp4", "f16"), ("uint4_zp", "bf16"), ("fp4_2of4", "f16")])
def test_stage_counts(fmt_name: str, act: str, stages: int) -> None:
    fmt = md.builtin_format(fmt_name)
    gemm, kernel = compile_ms(fmt_name, ms_schedule(fmt, stages=stages), act)
    waits = [op.attrs["pending"] for op in kernel.walk() if op.name == "async_wait"]
    assert waits == [stages - 2, 0]  # the loop's wait, then the drain before the epilogue
    # the prologue commits stages-1 groups, the loop one per step
    assert sum(op.name == "async_commit" for op in kernel.walk()) == stages
    k = k_for(fmt, stages + 2)
    assert_matches(gemm, kernel, [(3, 40, k), (65, 72, k)], seed=stages)


@pytest.mark.parametrize("fmt_name,tile,guarded", [
    ("fp4", (24, 64, 1, 4), {"x_s"}),             # 24 rows x 8 pieces = 192 over 128 threads
    ("int4", (16, 16, 2, 1), {"w_s"}),            # 1 N tile x 32 lanes over 64 threads
    ("fp4_2of4", (16, 16, 2, 1), {"w_s", "meta_s"}),
    ("fp4_2of4", (8, 128, 1, 8), {"x_s"}),        # 8 rows x 16 pieces over 256 threads
])
def test_guarded_copies(fmt_name: str, tile, guarded) -> None:
    """Copies whose pieces are not a multiple of the threads: the last round runs under an
    `if`, so threads past the end issue nothing."""
    fmt = md.builtin_format(fmt_name)
    tm, tn, wm, wn = tile
    gemm, kernel = compile_ms(fmt_name, ms_schedule(fmt, tile_m=tm, tile_n=tn, warps_m=wm, warps_n=wn))
    assert set(guarded_copies(kernel)) == guarded
    k = k_for(fmt, 4)
    assert_matches(gemm, kernel, [(1, 40, k), (65, 72, k)], seed=5)


@pytest.mark.parametrize("fmt_name,k", [("fp4", 96), ("fp4_2of4", 160)])
def test_k_tail_shorter_than_a_step(fmt_name: str, k: int) -> None:
    """Group size 32: K = 96 (dense) / 160 (2:4) is not a multiple of the step; the copies
    zero-fill activations past K and the scales are read per K tile (no prefetch)."""
    fmt = md.builtin_format(fmt_name, 32)
    assert k % step_k(fmt)
    gemm, kernel = compile_ms(fmt_name, ms_schedule(fmt), "f16", group=32)
    assert_matches(gemm, kernel, [(5, 20, k), (65, 72, k)], seed=2)


@pytest.mark.parametrize("fmt_name", ["fp4", "fp4_2of4"])
@pytest.mark.parametrize("m", [256, 2048])
def test_default_multistage_schedules_run(fmt_name: str, m: int) -> None:
    """The schedules the library picks (multistage_small / _large) on shapes with tails."""
    fmt = md.builtin_format(fmt_name)
    sched = md.multistage_schedule(fmt, m, None, 4096, 4096)
    gemm = Gemm("ms_default", fmt, sched, "f16")
    kernel = compile_gemm(gemm, CUDA).kernel
    k = k_for(fmt, sched.pipeline.stages + 1)
    assert_matches(gemm, kernel, [(70, 136, k), (130, 264, k)], seed=m)


# ----- schedule choice ----------------------------------------------------------------------

@pytest.mark.parametrize("fmt_name", ["fp4", "fp4_2of4"])
def test_schedule_choice(fmt_name: str) -> None:
    fmt = md.builtin_format(fmt_name)
    for m in (65, 256, 2048):
        sched = md.tuned_schedule(fmt, m)
        assert isinstance(sched.pipeline, Multistage), (m, sched)
        assert sched.tile_k == step_k(fmt)
    for m in (1, 16, 64):
        assert not isinstance(md.tuned_schedule(fmt, m).pipeline, Multistage)
    assert md.tuned_schedule(fmt, 65, None, 4096, 4096) == md.multistage_schedule(fmt, 65, None, 4096, 4096)
    assert md.multistage_schedule(fmt, 256, None, 4096, 4096).name == "multistage_small"
    assert md.multistage_schedule(fmt, 2048, None, 4096, 4096).name == "multistage_large"
    assert md.multistage_schedule(fmt, 256, None, 4096, 14336).name == "multistage_large"
    large = md.multistage_schedule(fmt, 2048, None, 4096, 4096)
    small = md.multistage_schedule(fmt, 256, None, 4096, 4096)
    assert (large.tile_m, large.tile_n, large.warps_m, large.warps_n, large.pipeline.stages) == (128, 256, 2, 4, 3)
    assert (small.tile_m, small.tile_n, small.warps_m, small.warps_n, small.pipeline.stages) == (64, 128, 2, 2, 4)


@pytest.mark.parametrize("fmt_name", ["fp4", "fp4_2of4"])
@pytest.mark.parametrize("m,n", [(256, 4096), (2048, 4096), (256, 14336)])
def test_default_schedules_print_dynamic_shared_memory(fmt_name: str, m: int, n: int) -> None:
    fmt = md.builtin_format(fmt_name)
    sched = md.multistage_schedule(fmt, m, None, 4096, n)
    kernel = compile_gemm(Gemm(f"ms_{fmt_name}", fmt, sched, "f16"), CUDA).kernel
    assert STATIC_SHARED_BYTES < kernel.shared_bytes <= CUDA.max_shared_bytes
    if fmt_name == "fp4_2of4" and sched.name == "multistage_large":
        # 3 stages x (128 rows x (128 + 8 pad) f16 + 16 tiles x 32 lanes x (16 + 8) bytes)
        assert kernel.shared_bytes == 3 * (128 * 136 * 2 + 16 * 32 * 24) == 141312
    src = print_cuda(kernel)
    assert src.dynamic_shared_bytes >= kernel.shared_bytes and src.dynamic_shared_bytes % 16 == 0
    assert src.shared_memory_kwargs == {"shared_memory": src.dynamic_shared_bytes}
    assert f"extern __shared__ __align__(16) unsigned char {DYNAMIC_SHARED_NAME}[];" in src.body
    assert not re.search(r"^\s*__shared__", src.body, re.M)  # no static arrays besides
    for s in kernel.shared:
        assert f"* {s.name} = reinterpret_cast<" in src.body
    assert "cp.async" in src.full_source() and "mdsl::cp_async<16>(" in src.body
    assert "mdsl::cp_async_commit();" in src.body
    assert f"mdsl::cp_async_wait<{sched.pipeline.stages - 2}>();" in src.body


def test_small_schedule_prints_static_shared_arrays() -> None:
    fmt = md.builtin_format("fp4")
    kernel = compile_gemm(Gemm("ms_static", fmt, ms_schedule(fmt), "f16"), CUDA).kernel
    assert kernel.shared_bytes <= STATIC_SHARED_BYTES
    src = print_cuda(kernel)
    assert src.dynamic_shared_bytes == 0 and src.shared_memory_kwargs == {}
    assert "extern __shared__" not in src.body
    for s in kernel.shared:
        assert re.search(rf"^\s*__shared__ __align__\(16\) \w+ {s.name}\[{s.size}\];", src.body, re.M)
    assert "mdsl::cp_async<16>(" in src.body
    data = src.to_json()
    assert "dynamic_shared_bytes" not in data
    assert CudaSource.from_json(data).dynamic_shared_bytes == 0


def test_json_round_trips_dynamic_shared_bytes() -> None:
    import json

    fmt = md.builtin_format("fp4_2of4")
    kernel = compile_gemm(Gemm("ms_json", fmt, md.multistage_schedule(fmt, 2048, None, 4096, 4096), "f16"),
                          CUDA).kernel
    src = print_cuda(kernel)
    assert src.dynamic_shared_bytes > STATIC_SHARED_BYTES
    data = json.loads(json.dumps(src.to_json()))
    assert data["dynamic_shared_bytes"] == src.dynamic_shared_bytes
    back = CudaSource.from_json(data)
    assert back.dynamic_shared_bytes == src.dynamic_shared_bytes
    assert back.shared_memory_kwargs == src.shared_memory_kwargs
    assert back.body == src.body and back.to_json() == src.to_json()


def test_multistage_kernel_text_round_trips() -> None:
    for fmt_name in ("fp4", "fp4_2of4"):
        fmt = md.builtin_format(fmt_name)
        kernel = compile_gemm(Gemm("ms_rt", fmt, ms_schedule(fmt, tile_m=16, tile_n=16, warps_m=2, warps_n=1),
                                   "f16"), CUDA).kernel
        assert guarded_copies(kernel)
        parsed = assert_round_trip(kernel)
        assert ASYNC_OPS <= {op.name for op in parsed.walk()}


# ----- schedule errors ----------------------------------------------------------------------

@pytest.mark.parametrize("stages", [1, 9, 0, True, 2.5])
def test_stage_count_range(stages) -> None:
    with pytest.raises(ScheduleError, match="stages must be an integer 2..8"):
        Schedule("bad", tile_m=32, tile_n=64, tile_k=64, warps_m=2, warps_n=2, pipeline=Multistage(stages))


def test_stage_count_limits_accepted() -> None:
    """2 and 8 stages (the range's ends) are accepted, kept, and compile into kernels whose
    shared memory holds that many stages: 8 stages take 4x the buffers of 2."""
    fmt = md.builtin_format("fp4")
    shared = {}
    for stages in (2, 8):
        sched = Schedule("ok", tile_m=32, tile_n=64, tile_k=64, warps_m=2, warps_n=2, pipeline=Multistage(stages))
        assert sched.pipeline.stages == stages
        kernel = compile_gemm(Gemm("ms_ok", fmt, sched, "f16"), CUDA).kernel
        assert kernel.attrs["pipeline"] == "multistage"
        shared[stages] = kernel.shared_bytes
    assert shared[8] == 4 * shared[2] > 0


def test_warp_m_rows_must_fill_mma_n() -> None:
    fmt = md.builtin_format("fp4")
    sched = ms_schedule(fmt, tile_m=8, warps_m=2)  # 4 M rows per warp
    with pytest.raises(ScheduleError, match="tile_m/warps_m = 4 M rows, not a multiple of cuda's MMA N 8"):
        compile_gemm(Gemm("ms_bad", fmt, sched, "f16"), CUDA)


def test_warp_n_rows_must_fill_mma_m() -> None:
    fmt = md.builtin_format("fp4")
    sched = ms_schedule(fmt, tile_n=32, warps_n=4)  # 8 N rows per warp
    with pytest.raises(ScheduleError, match="tile_n/warps_n = 8 N rows, not a multiple of cuda's MMA M 16"):
        compile_gemm(Gemm("ms_bad", fmt, sched, "f16"), CUDA)


@pytest.mark.parametrize("fmt_name,want", [("fp4", 64), ("fp4_2of4", 128)])
def test_tile_k_must_be_the_step(fmt_name: str, want: int) -> None:
    """tile_k is the layout's vector chunk, or a multiple of it inside one scale group (the
    group of 128 holds two fp4 vectors, one 2:4 vector)."""
    fmt = md.builtin_format(fmt_name)
    sched = Schedule("bad", tile_m=32, tile_n=64, tile_k=32, warps_m=2, warps_n=2, pipeline=Multistage())
    with pytest.raises(ScheduleError, match=rf"multistage .*set tile_k={want} \(or a multiple inside one "
                                            r"scale group\), not 32"):
        compile_gemm(Gemm("ms_bad", fmt, sched, "f16"), CUDA)
    sched = Schedule("two", tile_m=32, tile_n=64, tile_k=2 * want, warps_m=2, warps_n=2, pipeline=Multistage())
    if fmt_name == "fp4":
        gemm = Gemm("ms_two", fmt, sched, "f16")
        kernel = compile_gemm(gemm, CUDA).kernel  # two vectors a step
        assert_matches(gemm, kernel, [(3, 40, 384), (65, 72, 256)], seed=3)
    else:
        with pytest.raises(ScheduleError, match="scale groups that cover whole steps"):
            compile_gemm(Gemm("ms_bad", fmt, sched, "f16"), CUDA)


def test_too_much_shared_memory() -> None:
    fmt = md.builtin_format("fp4_2of4")
    # the large tiles with 4 stages: 4 x 47104 bytes > 163 KB
    sched = Schedule("huge", tile_m=128, tile_n=256, tile_k=128, warps_m=2, warps_n=4, pipeline=Multistage(4))
    with pytest.raises(CompileError, match="shared memory") as e:
        compile_gemm(Gemm("ms_huge", fmt, sched, "f16"), CUDA)
    assert str(4 * 47104) in str(e.value) and str(163 * 1024) in str(e.value)
    assert not isinstance(e.value, ScheduleError)
    # one stage fewer fits
    compile_gemm(Gemm("ms_fits", fmt, Schedule("fits", tile_m=128, tile_n=256, tile_k=128, warps_m=2,
                                                warps_n=4, pipeline=Multistage(3))), CUDA)


def test_metal_multistage_stages_through_registers() -> None:
    """Metal has the stream layout but no asynchronous copies (issue 16): its multistage
    kernels stage through registers (tests/test_metal_multistage.py), with 2 or 3 stages."""
    fmt = md.builtin_format("fp4")
    sched = Schedule("ms_metal", tile_m=32, tile_n=64, tile_k=128, warps_m=2, warps_n=2, pipeline=Multistage(2))
    kernel = compile_gemm(Gemm("ms_metal", fmt, sched, "f16"), METAL).kernel
    assert "async_copy" not in {op.name for op in kernel.walk()}
    with pytest.raises(ScheduleError, match="metal has no asynchronous copies"):
        compile_gemm(Gemm("ms_metal", fmt, ms_schedule(fmt, stages=4), "f16"), METAL)


# ----- async copies in the interpreter ----------------------------------------------------------

def _kernel(b: Builder, threads: int, buffers=(), shared=(), name: str = "k") -> Kernel:
    return Kernel(name, threads, (GridDim(None),) * 3, b.block, buffers=list(buffers),
                  shared=list(shared), attrs={"target": "cuda"})


def _copy(b: Builder, dst: Value, src: Value, size: int, pred: Value | None = None,
          shared: str = "s", buffer: str = "x") -> None:
    b.op("async_copy", [dst, src] + ([pred] if pred is not None else []),
         attrs={"dst": shared, "src": buffer, "size": size})


def _commit(b: Builder) -> None:
    b.op("async_commit")


def _wait(b: Builder, pending: int) -> None:
    b.op("async_wait", attrs={"pending": pending})


def _store_run(b: Builder, shared_base: Value, out_base: Value, n: int, elem, shared: str = "s") -> None:
    """out[out_base + i] = shared[shared_base + i] for i < n."""
    for i in range(n):
        off = (lambda v: b.binary("add", v, i) if i else v)
        b.store("out", off(out_base), b.load(shared, off(shared_base), elem))


T = 64  # two warps


@pytest.mark.parametrize("elem,size", [(U32, 1), (U32, 2), (U32, 4), (F16, 2), (F16, 8)])
def test_async_copy_lands_after_wait_and_barrier(elem, size: int) -> None:
    """Each thread copies `size` elements from a rotated source; thread 5's predicate is
    false (its destination is zero-filled); after wait(0) and a barrier every thread reads
    the run its partner in the other warp copied."""
    b = Builder()
    tid = b.index("tid")
    dst = b.binary("mul", tid, size)
    src = b.binary("mul", b.binary("rem", b.binary("add", tid, 3), T), size)
    _copy(b, dst, src, size, b.binary("ne", tid, 5))
    _commit(b)
    _wait(b, 0)
    b.barrier()
    partner = b.binary("xor", tid, 32)
    _store_run(b, b.binary("mul", partner, size), b.binary("mul", tid, size), size, elem)
    dtype = np.uint32 if elem == U32 else np.float16
    k = _kernel(b, T, [BufferParam("x", elem, "read"), BufferParam("out", elem, "write")],
                [SharedArray("s", elem, T * size)])
    x = (np.arange(T * size) * 7 + 1).astype(dtype)
    out = run_kernel(k, {"x": x, "out": np.zeros(T * size, dtype)}, {})["out"].reshape(T, size)
    rows = x.reshape(T, size)
    for t in range(T):
        p = t ^ 32
        want = np.zeros(size, dtype) if p == 5 else rows[(p + 3) % T]
        np.testing.assert_array_equal(out[t], want, err_msg=f"thread {t}")


def test_false_predicate_does_not_read_the_source() -> None:
    """With a false predicate the source index is neither checked for bounds nor alignment."""
    b = Builder()
    tid = b.index("tid")
    first = b.binary("lt", tid, 4)
    src = b.select(first, b.binary("mul", tid, 4), b.const(1000001))  # misaligned, far out of bounds
    _copy(b, b.binary("mul", tid, 4), src, 4, first)
    _commit(b)
    _wait(b, 0)
    _store_run(b, b.binary("mul", tid, 4), b.binary("mul", tid, 4), 4, U32)
    k = _kernel(b, 32, [BufferParam("x", U32, "read"), BufferParam("out", U32, "write")],
                [SharedArray("s", U32, 128)])
    x = np.arange(16, dtype=np.uint32) + 100
    out = run_kernel(k, {"x": x, "out": np.full(128, 7, np.uint32)}, {})["out"]
    np.testing.assert_array_equal(out[:16], x)
    assert (out[16:] == 0).all()


def _read_before(retire: str) -> Kernel:
    """Copy, then (depending on `retire`) commit / wait, then read the destination."""
    b = Builder()
    tid = b.index("tid")
    dst = b.binary("mul", tid, 4)
    _copy(b, dst, dst, 4)
    if retire in ("commit", "commit_wait1", "commit_wait0"):
        _commit(b)
    if retire == "commit_wait1":
        _wait(b, 1)  # one group committed: waiting for all but 1 retires nothing
    if retire in ("wait0_uncommitted", "commit_wait0"):
        _wait(b, 0)
    if retire == "write":
        b.store("s", dst, tid)
    else:
        b.store("out", tid, b.load("s", dst, U32))
    return _kernel(b, 32, [BufferParam("x", U32, "read"), BufferParam("out", U32, "write")],
                   [SharedArray("s", U32, 128)])


@pytest.mark.parametrize("retire", ["none", "commit", "commit_wait1", "wait0_uncommitted", "write"])
def test_access_before_retire_is_an_error(retire: str) -> None:
    x = np.arange(128, dtype=np.uint32)
    with pytest.raises(InterpreterError) as e:
        run_kernel(_read_before(retire), {"x": x, "out": np.zeros(32, np.uint32)}, {})
    err = e.value
    assert err.kind == "async" and err.thread == 0 and err.index == 0
    assert "@s" in str(err) and ("writes" if retire == "write" else "reads") in str(err)


def test_commit_then_wait0_retires() -> None:
    x = np.arange(128, dtype=np.uint32) * 3
    out = run_kernel(_read_before("commit_wait0"), {"x": x, "out": np.zeros(32, np.uint32)}, {})["out"]
    np.testing.assert_array_equal(out, x[::4])


def _two_groups(read: str, then_wait0: bool = False) -> Kernel:
    """Group 0 copies x[4t..] to s[4t..], group 1 copies x[128 + 4t..] to s[128 + 4t..];
    wait(pending=1); then read the older ("old") or the newer ("new") destination."""
    b = Builder()
    tid = b.index("tid")
    lo = b.binary("mul", tid, 4)
    hi = b.binary("add", lo, 128)
    _copy(b, lo, lo, 4)
    _commit(b)
    _copy(b, hi, hi, 4)
    _commit(b)
    _wait(b, 1)
    if then_wait0:
        _wait(b, 0)
    _store_run(b, lo if read == "old" else hi, lo, 4, U32)
    return _kernel(b, 32, [BufferParam("x", U32, "read"), BufferParam("out", U32, "write")],
                   [SharedArray("s", U32, 256)])


def test_wait_pending_one_retires_only_the_older_group() -> None:
    x = np.arange(256, dtype=np.uint32) + 1000
    bufs = {"x": x, "out": np.zeros(128, np.uint32)}
    out = run_kernel(_two_groups("old"), dict(bufs), {})["out"]
    np.testing.assert_array_equal(out, x[:128])
    with pytest.raises(InterpreterError) as e:
        run_kernel(_two_groups("new"), dict(bufs), {})
    assert e.value.kind == "async" and e.value.index == 128
    out = run_kernel(_two_groups("new", then_wait0=True), dict(bufs), {})["out"]
    np.testing.assert_array_equal(out, x[128:])


def _partner_read(partner_xor: int, sync: str, waiters: str = "all") -> Kernel:
    """Every thread copies its own run, commits and waits (only warp 0 waits when `waiters`
    is "warp0"), then, after `sync` (none / simdgroup / threadgroup), reads its partner's."""
    b = Builder()
    tid = b.index("tid")
    dst = b.binary("mul", tid, 4)
    _copy(b, dst, dst, 4)
    _commit(b)
    if waiters == "all":
        _wait(b, 0)
    else:
        op = b.op("if", [b.binary("lt", tid, 32)], [])
        with b.region() as then:
            _wait(b, 0)
            b.yield_()
        with b.region() as other:
            b.yield_()
        op.regions += [then, other]
    if sync != "none":
        b.barrier(sync)
    _store_run(b, b.binary("mul", b.binary("xor", tid, partner_xor), 4), dst, 4, U32)
    return _kernel(b, T, [BufferParam("x", U32, "read"), BufferParam("out", U32, "write")],
                   [SharedArray("s", U32, 4 * T)])


def test_retired_copies_are_writes_of_the_issuing_thread() -> None:
    x = np.arange(4 * T, dtype=np.uint32) * 5
    bufs = {"x": x, "out": np.zeros(4 * T, np.uint32)}
    for partner_xor, sync in ((32, "threadgroup"), (1, "simdgroup"), (1, "threadgroup")):
        out = run_kernel(_partner_read(partner_xor, sync), dict(bufs), {})["out"].reshape(T, 4)
        np.testing.assert_array_equal(out, x.reshape(T, 4)[np.arange(T) ^ partner_xor])
    for partner_xor, sync in ((32, "none"), (32, "simdgroup")):  # no barrier orders the two warps
        with pytest.raises(InterpreterError) as e:
            run_kernel(_partner_read(partner_xor, sync), dict(bufs), {})
        assert e.value.kind == "race" and e.value.thread == 0 and "thread 32" in str(e.value)
        assert "async_copy" in str(e.value)


def test_wait_retires_only_the_waiting_threads_copies() -> None:
    """Only warp 0 waits: after the barrier warp 1's copies are still in flight."""
    x = np.arange(4 * T, dtype=np.uint32)
    with pytest.raises(InterpreterError) as e:
        run_kernel(_partner_read(32, "threadgroup", waiters="warp0"),
                   {"x": x, "out": np.zeros(4 * T, np.uint32)}, {})
    assert e.value.kind == "async" and e.value.thread == 0 and e.value.index == 4 * 32


def test_copy_onto_an_in_flight_destination_is_an_error() -> None:
    """A second copy may not target elements an unretired copy is still writing."""
    b = Builder()
    tid = b.index("tid")
    dst = b.binary("mul", tid, 4)
    _copy(b, dst, dst, 4)
    _commit(b)
    _copy(b, dst, b.binary("add", dst, 128), 4)
    _commit(b)
    k = _kernel(b, 32, [BufferParam("x", U32, "read")], [SharedArray("s", U32, 128)])
    with pytest.raises(InterpreterError) as e:
        run_kernel(k, {"x": np.zeros(256, np.uint32)}, {})
    assert e.value.kind == "async" and "writes" in str(e.value) and e.value.index == 0


def test_copies_in_flight_at_kernel_end_are_dropped() -> None:
    b = Builder()
    tid = b.index("tid")
    dst = b.binary("mul", tid, 4)
    _copy(b, dst, dst, 4)
    _commit(b)
    _copy(b, b.binary("add", dst, 128), dst, 4)  # never committed
    b.store("out", tid, tid)
    k = _kernel(b, 32, [BufferParam("x", U32, "read"), BufferParam("out", U32, "write")],
                [SharedArray("s", U32, 256)])
    out = run_kernel(k, {"x": np.zeros(128, np.uint32), "out": np.zeros(32, np.uint32)}, {})["out"]
    np.testing.assert_array_equal(out, np.arange(32))


@pytest.mark.parametrize("which,offset", [("shared", 1), ("shared", 2), ("device", 2), ("device", 3)])
def test_misaligned_copy(which: str, offset: int) -> None:
    b = Builder()
    tid = b.index("tid")
    base = b.binary("mul", tid, 8)
    moved = b.select(b.binary("eq", tid, 3), b.binary("add", base, offset), base)
    _copy(b, moved if which == "shared" else base, moved if which == "device" else base, 4)
    k = _kernel(b, 32, [BufferParam("x", U32, "read")], [SharedArray("s", U32, 8 * 32)])
    with pytest.raises(InterpreterError) as e:
        run_kernel(k, {"x": np.zeros(8 * 32, np.uint32)}, {})
    err = e.value
    assert err.kind == "misaligned" and err.thread == 3 and err.index == 24 + offset
    assert which in str(err)


@pytest.mark.parametrize("which", ["shared", "device"])
def test_out_of_bounds_copy(which: str) -> None:
    b = Builder()
    tid = b.index("tid")
    idx = b.binary("mul", tid, 4)
    _copy(b, idx, idx, 4)
    n_shared, n_device = (124, 128) if which == "shared" else (128, 124)
    k = _kernel(b, 32, [BufferParam("x", U32, "read")], [SharedArray("s", U32, n_shared)])
    with pytest.raises(InterpreterError) as e:
        run_kernel(k, {"x": np.zeros(n_device, np.uint32)}, {})
    assert e.value.kind == "bounds" and e.value.thread == 31 and e.value.index == 124


# ----- verifier ---------------------------------------------------------------------------------

def _verify_copy(size: int, dst_elem=F16, src_elem=F16, dst: str = "s", src: str = "x",
                 pred: bool = True) -> None:
    b = Builder()
    tid = b.index("tid")
    _copy(b, tid, tid, size, b.binary("lt", tid, 4) if pred else None, shared=dst, buffer=src)
    verify(_kernel(b, 32, [BufferParam("x", src_elem, "read"), BufferParam("y", F16, "write")],
                   [SharedArray("s", dst_elem, 64)]))


def test_verifier_accepts_4_8_16_byte_copies() -> None:
    for size in (2, 4, 8):
        _verify_copy(size)
    _verify_copy(4, pred=False)
    _verify_copy(1, U32, U32)


@pytest.mark.parametrize("kwargs,match", [
    ({"size": 3}, "4, 8 or 16 bytes: size 3 of f16"),
    ({"size": 1}, "4, 8 or 16 bytes: size 1 of f16"),
    ({"size": 16}, "4, 8 or 16 bytes: size 16 of f16"),
    ({"size": 4, "src_elem": U32}, "element types differ"),
    ({"size": 4, "dst": "y"}, "writes a shared array"),
    ({"size": 4, "src": "s"}, "reads a device buffer"),
    ({"size": 4, "src": "nope"}, "unknown memory @nope"),
])
def test_verifier_rejects_bad_copies(kwargs, match: str) -> None:
    with pytest.raises(VerifyError, match=match):
        _verify_copy(**kwargs)


@pytest.mark.parametrize("pending", [-1, 8, True, 1.0])
def test_verifier_rejects_bad_wait(pending) -> None:
    b = Builder()
    _wait(b, pending)
    with pytest.raises(VerifyError, match="async_wait pending must be an integer 0..7"):
        verify(_kernel(b, 32))


def test_verifier_checks_frag_elems_type() -> None:
    def build(result, target="cuda"):
        b = Builder()
        z = b.value("frag_zero", [], FragmentType("c", F32, 16, 8))
        b.value("frag_elems", [z], result)
        k = _kernel(b, 32)
        k.attrs["target"] = target
        return k

    verify(build(VectorType(F32, 4)))
    with pytest.raises(VerifyError, match="gives vec<f32, 4>"):
        verify(build(VectorType(F32, 2)))
    with pytest.raises(VerifyError, match="declares none"):
        verify(build(VectorType(F32, 4), target="metal"))


# ----- frag_elems -------------------------------------------------------------------------------

def _frag_elems_kernel(zero: bool) -> Kernel:
    """Warp w: C = A_w @ B (or a zero fragment); out[tid * 4 + e] = frag_elems(C)[e]."""
    b = Builder()
    tid, warp = b.index("tid"), b.index("warp")
    fc = FragmentType("c", F32, 16, 8)
    acc = b.value("frag_zero", [], fc)
    if not zero:
        a = b.value("frag_load", [b.binary("mul", warp, 256)], FragmentType("a", F16, 16, 16),
                    {"buffer": "A", "ld": 16})
        bf = b.value("frag_load", [b.const(0)], FragmentType("b", F16, 16, 8), {"buffer": "B", "ld": 8})
        acc = b.value("mma", [a, bf, acc], fc)
    elems = b.value("frag_elems", [acc], VectorType(F32, 4))
    for e in range(4):
        b.store("out", b.binary("add", b.binary("mul", tid, 4), e), b.value("extract", [elems], F32, {"index": e}))
    return _kernel(b, 64, [BufferParam("A", F16, "read"), BufferParam("B", F16, "read"),
                           BufferParam("out", F32, "write")])


def test_frag_elems_follows_the_lane_table() -> None:
    rng = np.random.default_rng(7)
    A = rng.integers(-4, 5, size=(2, 16, 16)).astype(np.float16)
    B = rng.integers(-4, 5, size=(16, 8)).astype(np.float16)
    bufs = {"A": A.ravel(), "B": B.ravel(), "out": np.full(64 * 4, np.nan, np.float32)}
    out = run_kernel(_frag_elems_kernel(False), bufs, {})["out"].reshape(2, 32, 4)
    rows, cols = CUDA.lane_elements("c", 16, 8)
    for w in range(2):
        C = A[w].astype(np.float64) @ B.astype(np.float64)
        np.testing.assert_array_equal(out[w], C[rows, cols])
        # every element of the tile exactly once
        seen = np.zeros((16, 8), int)
        np.add.at(seen, (rows, cols), 1)
        assert (seen == 1).all()
    zero = run_kernel(_frag_elems_kernel(True), bufs, {})["out"]
    np.testing.assert_array_equal(zero, np.zeros(256, np.float32))


def test_frag_elems_prints_for_c_fragments_only() -> None:
    src = print_cuda(_frag_elems_kernel(False))
    assert all(f".x[{i}]" in src.body for i in range(4))
    b = Builder()
    a = b.value("frag_load", [b.const(0)], FragmentType("a", F16, 16, 16), {"buffer": "A", "ld": 16})
    b.value("frag_elems", [a], VectorType(F16, 8))
    k = _kernel(b, 32, [BufferParam("A", F16, "read")])
    verify(k)
    with pytest.raises(CompileError, match="frag_elems"):
        print_cuda(k)


# ----- text and CUDA of the new ops -------------------------------------------------------------

def _all_new_ops_kernel() -> Kernel:
    b = Builder()
    tid = b.index("tid")
    dst = b.binary("mul", tid, 8)
    _copy(b, dst, dst, 8, b.binary("lt", tid, 16))
    _commit(b)
    _copy(b, b.binary("add", dst, 256), dst, 4)
    _commit(b)
    _wait(b, 1)
    _wait(b, 0)
    b.barrier()
    acc = b.value("frag_zero", [], FragmentType("c", F32, 16, 8))
    elems = b.value("frag_elems", [acc], VectorType(F32, 4))
    b.store("out", tid, b.value("extract", [elems], F32, {"index": 1}))
    return _kernel(b, 32, [BufferParam("x", F16, "read"), BufferParam("out", F32, "write")],
                   [SharedArray("s", F16, 512)], name="all_new")


def test_new_ops_text_round_trip() -> None:
    kernel = _all_new_ops_kernel()
    parsed = assert_round_trip(kernel)
    copies = [op for op in parsed.walk() if op.name == "async_copy"]
    assert [(op.attrs["dst"], op.attrs["src"], op.attrs["size"], len(op.operands)) for op in copies] == \
        [("s", "x", 8, 3), ("s", "x", 4, 2)]
    assert [op.attrs["pending"] for op in parsed.walk() if op.name == "async_wait"] == [1, 0]
    out = run_kernel(parsed, {"x": np.ones(512, np.float16), "out": np.full(32, np.nan, np.float32)}, {})
    np.testing.assert_array_equal(out["out"], np.zeros(32, np.float32))


def test_new_ops_print_as_cp_async() -> None:
    src = print_cuda(_all_new_ops_kernel())
    body = src.body
    assert body.count("mdsl::cp_async<16>(") == 1 and body.count("mdsl::cp_async<8>(") == 1
    assert body.count("mdsl::cp_async_commit();") == 2
    assert "mdsl::cp_async_wait<1>();" in body and "mdsl::cp_async_wait<0>();" in body
    assert body.index("mdsl::cp_async_wait<1>();") < body.index("mdsl::cp_async_wait<0>();")
    assert ", true);" in body  # the unpredicated copy
    assert src.dynamic_shared_bytes == 0


# ----- nvcc -------------------------------------------------------------------------------------

@pytest.mark.slow  # an nvcc/ptxas sweep: CI runs it (-m slow)
def test_multistage_kernels_compile_with_nvcc() -> None:
    if find_nvcc() is None:
        pytest.skip("nvcc not found: the CUDA compile check needs the CUDA toolkit")
    sources = []
    for fmt_name in ("fp4", "fp4_2of4"):
        fmt = md.builtin_format(fmt_name)
        for m in (256, 2048):  # multistage_small, multistage_large (dynamic shared memory)
            sched = md.multistage_schedule(fmt, m, None, 4096, 4096)
            for act in ("f16", "bf16"):
                gemm = Gemm(f"ms_{fmt_name}_{sched.name}_{act}", fmt, sched, act)
                sources.append(print_cuda(compile_gemm(gemm, CUDA).kernel))
        gemm = Gemm(f"ms_{fmt_name}_guarded", fmt, ms_schedule(fmt, tile_m=16, tile_n=16, warps_m=2, warps_n=1))
        sources.append(print_cuda(compile_gemm(gemm, CUDA).kernel))  # static shared, guarded copies
    assert sum(s.dynamic_shared_bytes > 0 for s in sources) == 8
    results = nvcc_check(sources, archs=("sm_80", "sm_90"))
    failed = [r.summary() + "\n" + r.log for r in results if not r.ok]
    assert not failed, "\n".join(failed)
    assert sorted(n for r in results for n in r.names) == sorted(2 * [s.name for s in sources])
    # MLX's generated translation unit (the body inside its kernel function) for a kernel
    # with dynamic shared memory
    large = [s for s in sources if "multistage_large" in s.name and "2of4" in s.name][:1]
    results = nvcc_check(large, archs=("sm_80",), form="mlx")
    failed = [r.summary() + "\n" + r.log for r in results if not r.ok]
    assert not failed, "\n".join(failed)
