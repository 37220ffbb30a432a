"""The printed CUDA executed on the CPU (issue 17): `marlin_dsl.targets.cuda.cpu_harness`
compiles each kernel's exact text with g++ against codegen/cuda_shim.h and runs it with block
and warp semantics; the outputs are checked against the float64 reference of the format.

- Every GEMM kernel kind the suite builds but the sparse warpgroup: the seed
  pipelines (double-buffered, fused-dequant, striped) for the 7 built-in formats, the
  weight-stream and multistage pipelines for the 6 stream formats, the dense warpgroup pipeline
  (wgmma, A from shared memory or registers) and its warp roles (mbarriers:
  codegen/cuda_shim_wgmma.h), f16 and bf16; M = 1, 3, 65 with N tails, K tails, the
  unrolled stream loop, the stream's shared ring (`WeightStream(stages)`), 2..4 stages, guarded copies and the tuned schedules (the activation
  sparsify kernels and the sparse GEMM: test_cuda_cpu_activation.py; the formats MLX's layers
  load, affine with f16/bf16/f32 scales and biases, mxfp4, nvfp4, mxfp8, in every pipeline:
  test_cuda_cpu_mlx_formats.py; what all of them execute against what the printer prints:
  test_harness_coverage.py).
- Mutations the interpreter cannot see fail here: `__hsub2` printed as `__hadd2`, the mma.sp
  metadata slots or thread pairs swapped in the Target table (which the packer and the
  interpreter share), a barrier or a cp.async wait removed (multistage, the stream's ring).
- The shim's MMAs on probe kernels equal the exact products; unordered metadata, shared memory
  nobody wrote, writes outside a buffer and the sparse wgmma are reported; a wgmma descriptor
  off by one swizzle chunk fails, warp roles without their mbarrier waits fail and without an
  arrival deadlock (reported).
The shim's number formats are tested in test_cuda_cpu_shim.py.
"""
from __future__ import annotations

import dataclasses
import importlib.util
from functools import partial
from math import lcm
from pathlib import Path

import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl import (CUDA, DoubleBuffered, FusedDequant, Gemm, Multistage, Schedule, StripedKParallel, Warpgroup,
                        WeightStream)
from marlin_dsl.checks.kernel_check import check_kernel, check_shapes
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.ir import F16, F32, BF16, Builder, BufferParam, FragmentType, GridDim, Kernel, SharedArray, verify
from marlin_dsl.layouts.weight_stream import stream_layout
from marlin_dsl.targets.cuda.cpu_harness import (CudaCPUError, compile_cuda_cpu, cuda_cpu_executor,
                                                 find_compiler, run_cuda_cpu)
from marlin_dsl.targets.cuda.printer import print_cuda
from marlin_dsl.targets.cuda.tuning import skip_schedule, warpgroup_roles_schedule, warpgroup_schedule

from lazy_builds import LazyBuilds

pytestmark = pytest.mark.skipif(
    find_compiler() is None,
    reason="no C++ compiler (g++ / $CXX): the CUDA CPU harness compiles the printed CUDA as C++20")

ROOT = Path(__file__).resolve().parents[1]
STREAM_FORMATS = ("fp4", "int4", "uint4_zp", "nf4", "fp4_2of4", "int4_2of4")
SEED_PIPELINES = {"db": DoubleBuffered, "fd": FusedDequant, "striped": StripedKParallel}
ACTS = ("f16", "bf16")


# ----- the kernels: (gemm, shapes) by name ------------------------------------------------------

def ws_schedule(fmt, tile_m: int = 8, warps_n: int = 2, k_warps: int = 2, depth: int = 2, unroll: int = 1,
                vectors: int = 1, stages: int = 0, x_ahead: int = 0) -> Schedule:
    chunk = stream_layout(fmt, CUDA).dense_chunk
    return Schedule("ws_cpu", tile_m=tile_m, tile_n=16 * warps_n, tile_k=vectors * chunk, warps_m=1,
                    warps_n=warps_n, pipeline=WeightStream(k_warps=k_warps, depth=depth, unroll=unroll,
                                                           stages=stages, x_ahead=x_ahead))


def ms_schedule(fmt, stages: int = 3, tile_m: int = 32, tile_n: int = 64, warps_m: int = 2,
                warps_n: int = 2) -> Schedule:
    step = md.multistage_schedule(fmt, 2048).tile_k
    return Schedule("ms_cpu", tile_m=tile_m, tile_n=tile_n, tile_k=step, warps_m=warps_m, warps_n=warps_n,
                    pipeline=Multistage(stages))


def ms_k(fmt, steps: int) -> int:
    """The smallest K of at least `steps` multistage steps that the format and its group take."""
    step, g = md.multistage_schedule(fmt, 2048).tile_k, fmt.scale.group_size
    unit = lcm(step, fmt.k_granule, *([] if g == "K" else [int(g)]))
    return -(-steps * step // unit) * unit


def _cases() -> dict[str, tuple[Gemm, list[tuple[int, int, int]]]]:
    cases: dict[str, tuple[Gemm, list[tuple[int, int, int]]]] = {}

    def add(name: str, fmt, sched: Schedule, act: str, shapes) -> None:
        cases[name] = (Gemm(name, fmt, sched, act), list(shapes))

    for fname in md.BUILTIN_FORMATS:  # the seed pipelines: M = 1, 3, 65, N = tile + 17, K two units
        for pl, cls in SEED_PIPELINES.items():
            for act in ACTS:
                gemm = Gemm(f"{fname}_{pl}_{act}", md.builtin_format(fname), Schedule("s", pipeline=cls()), act)
                cases[gemm.name] = (gemm, check_shapes(gemm))
    for fname in STREAM_FORMATS:
        fmt = md.builtin_format(fname)
        for act in ACTS:
            k = 2 * stream_layout(fmt, CUDA).dense_chunk if fmt.scale.group_size == "K" else 256
            add(f"ws_{fname}_{act}", fmt, ws_schedule(fmt), act, [(1, 33, k), (3, 40, k), (65, 49, k)])
            k = ms_k(fmt, 3)
            add(f"ms_{fname}_{act}", fmt, ms_schedule(fmt), act, [(1, 40, k), (3, 72, k), (65, 40, k), (65, 72, k)])
    for fname, k in (("fp4", 96), ("fp4_2of4", 160)):  # K tails inside a vector / a step (group 32)
        fmt = md.builtin_format(fname, 32)
        add(f"ws_ktail_{fname}", fmt, ws_schedule(fmt, depth=1), "f16", [(5, 20, k)])
        add(f"ms_ktail_{fname}", fmt, ms_schedule(fmt), "f16", [(5, 20, k), (65, 72, k)])
    for fname, group, unroll, depth, vectors in (("uint4_zp", 256, 2, 2, 2), ("fp4", 32, 3, 1, 1),
                                                 ("fp4_2of4", 256, 2, 1, 1)):
        fmt = md.builtin_format(fname, group)
        sched = ws_schedule(fmt, k_warps=4, depth=depth, unroll=unroll, vectors=vectors)
        chunk = stream_layout(fmt, CUDA).dense_chunk
        k = -(-6 * sched.tile_k // group) * group if group >= 128 else 7 * chunk - 32
        add(f"ws_unroll_{fname}_{group}_{unroll}{depth}{vectors}", fmt, sched, "f16", [(3, 40, k)])
    for fname, group, act, stages, unroll, vectors in (  # the weight words through a shared ring
            ("fp4", 128, "f16", 3, 1, 1), ("uint4_zp", 256, "bf16", 4, 2, 2), ("fp4_2of4", 128, "f16", 2, 1, 1),
            ("int4_2of4", 256, "bf16", 4, 1, 2), ("fp4", 32, "f16", 3, 1, 1), ("fp4_2of4", 32, "f16", 4, 2, 1)):
        fmt = md.builtin_format(fname, group)
        sched = ws_schedule(fmt, tile_m=16, k_warps=4, depth=1, unroll=unroll, vectors=vectors, stages=stages)
        chunk = stream_layout(fmt, CUDA).dense_chunk
        k = -(-7 * sched.tile_k // group) * group if group >= 128 else 7 * chunk - 32  # group 32: a K tail
        add(f"ws_ring_{fname}_{group}_{act}_s{stages}", fmt, sched, act, [(1, 33, k), (17, 40, k)])
    for fname in ("fp4_2of4", "int4_2of4"):  # the tuned 2:4 schedules: B fragments a step ahead
        fmt = md.builtin_format(fname)
        for m in (1, 16):
            for act in ACTS:
                add(f"ws_ahead_{fname}_{act}_m{m}", fmt, md.tuned_schedule(fmt, m, None, 4096, 4096), act,
                    [(m, 40, 768), (m + 2, 33, 768)])
    for fname, group, act, lanes, ahead, tile_m, unroll in (  # activations shared by shuffles (2:4)
            ("fp4_2of4", 128, "f16", 4, 1, 8, 1), ("int4_2of4", 128, "bf16", 2, 0, 16, 2),
            ("fp4_2of4", 32, "bf16", 4, 0, 16, 1), ("int4_2of4", 256, "f16", 4, 1, 16, 2)):
        fmt = md.builtin_format(fname, group)
        chunk = stream_layout(fmt, CUDA).dense_chunk
        sched = Schedule("ws_shfl", tile_m=tile_m, tile_n=32, tile_k=chunk, warps_m=1, warps_n=1,
                         pipeline=WeightStream(k_warps=4, depth=2, unroll=unroll, x_ahead=ahead, x_shuffle=lanes))
        k = -(-6 * chunk // group) * group if group >= 128 else 7 * chunk - 32  # group 32: predicated, a K tail
        add(f"ws_shfl{lanes}_{fname}_{group}_{act}_a{ahead}_m{tile_m}", fmt, sched, act,
            [(1, 40, k), (tile_m + 3, 33, k)])
    for fname, act, m in (("fp4", "f16", 2048), ("uint4_zp", "bf16", 2048), ("nf4", "bf16", 200),
                          ("int4", "f16", 200)):  # the warpgroup MMA (wgmma, cuda_shim_wgmma.h), tuned
        fmt = md.builtin_format(fname)
        sched = warpgroup_schedule(fmt, m, CUDA)
        add(f"wg_tuned_{fname}_{act}_m{m}", fmt, sched, act, [(3, 136, 512), (sched.tile_m + 44, 128, 384)])
    for fname, act in (("fp4", "f16"), ("uint4_zp", "bf16")):  # warp roles: producers, consumers, mbarriers
        fmt = md.builtin_format(fname)
        add(f"wg_roles_{fname}_{act}", fmt, warpgroup_roles_schedule(fmt, 2048, CUDA), act,
            [(3, 136, 512), (300, 128, 384)])
    for fname, act in (("fp4", "f16"), ("uint4_zp", "bf16")):  # A from registers
        fmt = md.builtin_format(fname)
        sched = Schedule("wg_regs", tile_m=256, tile_n=128, tile_k=stream_layout(fmt, CUDA).dense_chunk, warps_m=1,
                         warps_n=8, pipeline=Warpgroup(stages=4, depth=2, a_source="registers"))
        add(f"wg_regs_{fname}_{act}", fmt, sched, act, [(1, 136, 512), (260, 72, 256)])
        ahead = dataclasses.replace(sched, pipeline=dataclasses.replace(sched.pipeline, decode_ahead=True))  # odd K
        add(f"wg_ahead_{fname}_{act}", fmt, ahead, act, [(3, 136, 384), (257, 72, 256)])
    fmt = md.builtin_format("nf4")  # groups of 64: an odd number of steps, the last one alone
    sched = Schedule("wg_ahead", tile_m=64, tile_n=64, tile_k=64, warps_m=1, warps_n=4,
                     pipeline=Warpgroup(stages=3, depth=1, a_source="registers", decode_ahead=True))
    add("wg_ahead_nf4_bf16", fmt, sched, "bf16", [(3, 72, 320), (65, 64, 192)])
    fmt = md.builtin_format("fp4", 32)  # the lookahead predicated, with a K tail, unrolled
    add("ws_ahead_ktail_fp4", fmt, ws_schedule(fmt, k_warps=4, depth=1, unroll=2, x_ahead=1), "bf16",
        [(3, 20, 7 * stream_layout(fmt, CUDA).dense_chunk - 32)])
    fmt = md.builtin_format("fp4_blockpattern")  # skipping empty blocks: a loop over stored vectors
    for act, tile_m, k_warps, depth, unroll in (("f16", 8, 4, 2, 1), ("bf16", 16, 8, 1, 1), ("f16", 16, 4, 2, 2)):
        sched = Schedule("ws_skip", tile_m=tile_m, tile_n=32, tile_k=64, warps_m=1, warps_n=1,
                         pipeline=WeightStream(k_warps=k_warps, depth=depth, unroll=unroll, skip_empty=True))
        add(f"ws_skip_fp4_blockpattern_{act}_m{tile_m}" + (f"_u{unroll}" if unroll > 1 else ""), fmt, sched, act,
            [(1, 70, 1024), (tile_m + 1, 40, 768)])
    for m in (1, 16):  # what layers run for decode rows (targets/cuda/tuning.skip_schedule)
        add(f"ws_skip_tuned_m{m}", fmt, skip_schedule(fmt, m, CUDA, 640), "f16", [(m, 40, 640), (3, 33, 640)])
    fmt = md.builtin_format("uint4_zp")
    for m in (1, 16, 40, 70):  # the tuned weight-stream schedules
        add(f"ws_tuned_m{m}", fmt, md.tuned_schedule(fmt, m), "f16", [(m, 24, 512)])
    for fname, act in (("fp4", "f16"), ("uint4_zp", "bf16"), ("fp4_2of4", "f16")):
        fmt = md.builtin_format(fname)
        for stages in (2, 4):
            k = ms_k(fmt, stages + 2)
            add(f"ms_stages{stages}_{fname}_{act}", fmt, ms_schedule(fmt, stages=stages), act, [(3, 40, k), (65, 72, k)])
    for fname, (tm, tn, wm, wn) in (("fp4", (24, 64, 1, 4)), ("int4", (16, 16, 2, 1)), ("fp4_2of4", (16, 16, 2, 1)),
                                    ("fp4_2of4", (8, 128, 1, 8))):  # copies under an `if`
        fmt = md.builtin_format(fname)
        k = ms_k(fmt, 4)
        add(f"ms_guarded_{fname}_{tm}x{tn}", fmt, ms_schedule(fmt, tile_m=tm, tile_n=tn, warps_m=wm, warps_n=wn),
            "f16", [(1, 40, k), (65, 72, k)])
    for fname, act, widths in (("fp4", "f16", (40, 9, 15)), ("int4", "bf16", (17, 16)),
                               ("fp4_2of4", "f16", (16, 33))):  # Y's columns as parts (Gemm.outputs)
        fmt = md.builtin_format(fname)
        for m in (1, 16):
            n = sum(widths)
            cases[f"ws_parts_{fname}_{act}_m{m}"] = (
                Gemm(f"ws_parts_{fname}_{act}_m{m}", fmt, md.tuned_schedule(fmt, m), act, outputs=widths),
                [(1, n, 512), (3, n, 512), (m + 4, n, 512)])
    for fname in ("fp4", "fp4_2of4"):  # the multistage schedules the library picks
        fmt = md.builtin_format(fname)
        for m in (256, 2048):
            sched = md.multistage_schedule(fmt, m, None, 4096, 4096)
            k = ms_k(fmt, sched.pipeline.stages + 1)
            add(f"ms_default_{fname}_m{m}", fmt, sched, "f16", [(70, 136, k), (130, 264, k)])
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def built() -> LazyBuilds:
    """Each case lowered for CUDA, printed and compiled for the CPU when a test first asks."""
    def make(name: str) -> tuple[Gemm, Kernel, object]:
        gemm = CASES[name][0]
        kernel = compile_gemm(gemm, CUDA).kernel
        return gemm, kernel, compile_cuda_cpu(kernel)

    return LazyBuilds({name: partial(make, name) for name in CASES})


def _case_axes(params: dict) -> tuple[str, str, str]:
    """A case's (family, format, activation) from its name, the axes its sweep covers: the
    first-generation pipelines (db, fd, striped), the weight stream's and multistage's
    variants (ws_ring, ms_guarded, ...)."""
    name = params["name"]
    parts = name.split("_")
    family = "_".join(parts[:2]) if parts[0] in ("ws", "ms", "wg") else next(p for p in ("db", "fd", "striped") if p in parts)
    fmt = max((f for f in md.BUILTIN_FORMATS if f in name), key=len, default="-")
    act = "bf16" if "bf16" in parts else "f16"
    return family, fmt, act


def check_printed(gemm: Gemm, kernel: Kernel, compiled, shapes, seed: int = 0) -> list:
    """check_kernel on the CPU harness for every shape; also returns nothing unwritten."""
    outs: list[dict] = []
    execute = cuda_cpu_executor(seed=seed, compiled={id(kernel): compiled})

    def recording(k, buffers, scalars):
        outs.append(execute(k, buffers, scalars))
        return outs[-1]

    rng = np.random.default_rng(seed)
    results = [check_kernel(gemm, kernel, shape, rng, execute=recording) for shape in shapes]
    for out in outs:  # the striped pipeline's arrival counters are left as they were found
        assert "counters" not in out or not out["counters"].any()
    return results


@pytest.mark.sweep(axes=_case_axes)
@pytest.mark.parametrize("name", list(CASES))
def test_printed_cuda_matches_the_reference(built, name: str) -> None:
    gemm, kernel, compiled = built[name]
    seed = list(CASES).index(name) % 4  # the four scheduling policies across the cases
    for result in check_printed(gemm, kernel, compiled, CASES[name][1], seed):
        assert result.untouched_poison == 0, (name, result)
        assert result.ok, (name, result)


# ----- mutations the interpreter does not see ----------------------------------------------------

def _mutant(compiled, name: str, old: str, new: str, count: int | None = None):
    src = compiled.source
    assert old in src.body, f"{src.name}: the mutation site {old!r} is not in the text"
    body = src.body.replace(old, new) if count is None else src.body.replace(old, new, count)
    return compile_cuda_cpu(dataclasses.replace(src, name=f"{src.name}_{name}", body=body))


@pytest.mark.parametrize("case", ["ws_int4_f16", "ms_int4_f16", "ws_uint4_zp_f16", "ms_int4_2of4_f16"])
def test_hsub2_printed_as_hadd2_fails(built, case: str) -> None:
    """The mutation that survived the whole suite before issue 17 (the INT4 magic-number
    subtraction of the half2 decode)."""
    gemm, kernel, compiled = built[case]
    assert "__hsub2(" in compiled.source.body
    mutant = _mutant(compiled, "hadd", "__hsub2(", "__hadd2(")
    results = check_printed(gemm, kernel, mutant, CASES[case][1])
    assert not any(r.ok for r in results), results


def _mutated_metadata(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """Change CUDA's mma.sp metadata table consistently for the packer, the lowering and the
    interpreter (they all read it); only the shim reads the PTX rules instead."""
    for sel, fields in dict(CUDA.metadata_tables).items():
        if how == "slots":  # each group's two 2-bit indices trade places
            mutated = fields._replace(slots=1 - fields.slots)
        else:  # the two lanes of each thread pair trade their chunks
            mutated = fields._replace(lanes=fields.lanes ^ 1)
        monkeypatch.setitem(CUDA.metadata_tables, sel, mutated)


@pytest.mark.parametrize("pipeline", ["ws", "ms"])
def test_swapped_metadata_slots_fail(monkeypatch: pytest.MonkeyPatch, pipeline: str) -> None:
    _mutated_metadata(monkeypatch, "slots")
    fmt = md.builtin_format("fp4_2of4")
    gemm = Gemm(f"{pipeline}_slots", fmt, ws_schedule(fmt) if pipeline == "ws" else ms_schedule(fmt), "f16")
    kernel = compile_gemm(gemm, CUDA).kernel
    shape = (3, 40, 256)
    assert check_kernel(gemm, kernel, shape, np.random.default_rng(0)).ok  # the interpreter agrees with itself
    with pytest.raises(CudaCPUError, match="the two indices must increase") as info:
        check_kernel(gemm, kernel, shape, np.random.default_rng(0), execute=cuda_cpu_executor())
    assert info.value.kind == "error"


@pytest.mark.parametrize("pipeline", ["ws", "ms"])
def test_swapped_metadata_thread_pairs_fail(monkeypatch: pytest.MonkeyPatch, pipeline: str) -> None:
    _mutated_metadata(monkeypatch, "pairs")
    fmt = md.builtin_format("fp4_2of4")
    gemm = Gemm(f"{pipeline}_pairs", fmt, ws_schedule(fmt) if pipeline == "ws" else ms_schedule(fmt), "f16")
    kernel = compile_gemm(gemm, CUDA).kernel
    shape = (3, 40, 256)
    assert check_kernel(gemm, kernel, shape, np.random.default_rng(0)).ok
    assert not check_kernel(gemm, kernel, shape, np.random.default_rng(0), execute=cuda_cpu_executor()).ok


@pytest.mark.parametrize("case, line", [("fp4_db_f16", 0), ("fp4_db_f16", 1), ("ms_fp4_f16", 0)])
def test_missing_barrier_fails(built, case: str, line: int) -> None:
    gemm, kernel, compiled = built[case]
    body = compiled.source.body
    at = [i for i, text in enumerate(body.split("\n")) if text.strip() == "__syncthreads();"][line]
    lines = body.split("\n")
    mutant = compile_cuda_cpu(dataclasses.replace(compiled.source, name=f"{compiled.source.name}_nobar{line}",
                                                  body="\n".join(lines[:at] + lines[at + 1:])))
    assert not all(r.ok for r in check_printed(gemm, kernel, mutant, CASES[case][1]))


def test_missing_cp_async_waits_fail(built) -> None:
    """Without the loop's wait a stage is read while in flight (poison); without the drain wait
    copies would land after the block, in the next block's shared memory."""
    gemm, kernel, compiled = built["ms_fp4_f16"]
    shapes = CASES["ms_fp4_f16"][1]
    loop_wait = _mutant(compiled, "noloopwait", "mdsl::cp_async_wait<1>();", "")
    assert not any(r.ok for r in check_printed(gemm, kernel, loop_wait, shapes))
    drain = _mutant(compiled, "nodrain", "mdsl::cp_async_wait<0>();", "")
    with pytest.raises(CudaCPUError, match="copies in flight"):
        check_printed(gemm, kernel, drain, shapes)


def test_missing_ring_wait_fails(built) -> None:
    """The weight stream's ring: without the loop's wait a lane decodes its slot while the
    copy is in flight (poison in the shim)."""
    name = "ws_ring_fp4_128_f16_s3"
    gemm, kernel, compiled = built[name]
    mutant = _mutant(compiled, "noringwait", "mdsl::cp_async_wait<2>();", "")
    assert not any(r.ok for r in check_printed(gemm, kernel, mutant, CASES[name][1]))


# ----- the shim's MMAs and runtime on small kernels -------------------------------------------------

def _load_probe():
    spec = importlib.util.spec_from_file_location("mma_sp_ir_probe", ROOT / "bench" / "probes" / "mma_sp_ir_probe.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


probe = _load_probe()


@pytest.mark.parametrize("elem", ["f16", "bf16"])
@pytest.mark.parametrize("b_from", ["build", "load"])
def test_mma_sp_probe_is_exact(elem: str, b_from: str) -> None:
    """bench/probes/mma_sp_ir_probe.py's kernel (selector 0 then 1 on one metadata register): the
    shim's mma.sp equals the dense products exactly."""
    kernel = probe.build_kernel(elem, b_from)
    buffers, scalars, want = probe.make_case(np.random.default_rng(3), warps=4, b_from=b_from)
    got = run_cuda_cpu(kernel, buffers, scalars)["y"]
    assert np.array_equal(got, want)


def test_unordered_metadata_is_an_error() -> None:
    kernel = probe.build_kernel("f16", "build")
    buffers, scalars, _ = probe.make_case(np.random.default_rng(4), warps=4)
    buffers["meta"][3 * 32 + 6] = 0x11111111  # lane 6 of warp 3: read by selector 1, indices 1, 0
    with pytest.raises(CudaCPUError, match=r"lane 6's metadata .*\(indices 1, 0\)") as info:
        run_cuda_cpu(kernel, buffers, scalars)
    assert info.value.kind == "error" and "selector 1" in str(info.value)


def _dense_mma_kernel(elem) -> Kernel:
    """One warp: A (16 x 16) and B (16 x 8, k x n) from memory, d = A B, then d + A B."""
    b = Builder()
    zero = b.const(0)
    fa = b.value("frag_load", [zero], FragmentType("a", elem, 16, 16), {"buffer": "a", "ld": 16})
    fb = b.value("frag_load", [zero], FragmentType("b", elem, 16, 8), {"buffer": "b", "ld": 8})
    d = b.value("mma", [fa, fb, b.value("frag_zero", [], FragmentType("c", F32, 16, 8))], FragmentType("c", F32, 16, 8))
    d = b.value("mma", [fa, fb, d], FragmentType("c", F32, 16, 8))
    b.op("frag_store", [d, zero], attrs={"buffer": "y", "ld": 8})
    k = Kernel(f"dense_mma_{elem}", 32, (GridDim(None),) * 3, b.block,
               buffers=[BufferParam("a", elem, "read"), BufferParam("b", elem, "read"), BufferParam("y", F32, "write")],
               attrs={"target": "cuda"})
    verify(k)
    return k


@pytest.mark.parametrize("elem", [F16, BF16])
def test_dense_mma_is_exact(elem) -> None:
    rng = np.random.default_rng(5)
    a = rng.integers(-8, 9, size=(16, 16)).astype(np.float32)
    bm = rng.integers(-8, 9, size=(16, 8)).astype(np.float32)
    y = run_cuda_cpu(_dense_mma_kernel(elem), {"a": a.ravel(), "b": bm.ravel(), "y": np.zeros(128, np.float32)}, {})["y"]
    assert np.array_equal(y.reshape(16, 8), 2 * (a.astype(np.float64) @ bm))


def _copy_kernel(src: str, offset: int = 0, write_first: bool = True) -> Kernel:
    """y[tid + offset] = src[tid] for 64 threads; src is the input x or a shared array s of
    which thread 0 writes only element 0 (x[0]) before a barrier (or nothing)."""
    b = Builder()
    tid = b.index("tid")
    if src == "s" and write_first:
        b.store("s", tid, b.load("x", tid, F16), b.binary("eq", tid, 0))
        b.barrier()
    v = b.load(src, tid, F16)
    b.store("y", b.binary("add", tid, offset) if offset else tid, v)
    shared = [SharedArray("s", F16, 64)] if src == "s" else []
    k = Kernel(f"copy_{src}_{offset}_{int(write_first)}", 64, (GridDim(None),) * 3, b.block, shared=shared,
               buffers=[BufferParam("x", F16, "read"), BufferParam("y", F16, "write")], attrs={"target": "cuda"})
    verify(k)
    return k


def test_unwritten_shared_memory_reads_nan() -> None:
    x = np.arange(1, 65, dtype=np.float16)
    assert np.array_equal(run_cuda_cpu(_copy_kernel("x"), {"x": x, "y": np.zeros(64, np.float16)}, {})["y"], x)
    for seed in range(2):  # two blocks' worth of launches: poisoned again every time
        y = run_cuda_cpu(_copy_kernel("s"), {"x": x, "y": np.zeros(64, np.float16)}, {}, seed=seed)["y"]
        assert y[0] == x[0] and np.isnan(y[1:]).all()  # the block's shared memory starts poisoned
    y = run_cuda_cpu(_copy_kernel("s", write_first=False), {"x": x, "y": np.zeros(64, np.float16)}, {})["y"]
    assert np.isnan(y).all()  # an array nobody writes too (g++ must not fold its reads to zero)


def test_write_past_the_end_is_reported() -> None:
    with pytest.raises(CudaCPUError, match="wrote outside buffer y") as info:
        run_cuda_cpu(_copy_kernel("x", offset=1), {"x": np.ones(64, np.float16), "y": np.zeros(64, np.float16)}, {})
    assert info.value.kind == "guard"


def test_sparse_warpgroup_is_refused() -> None:
    """The harness runs the dense warpgroup kernels and the warp roles (`wg_*` cases above);
    the sparse wgmma is not emulated, and it says so instead of running it."""
    sparse = md.builtin_format("fp4_2of4")
    kernel = compile_gemm(Gemm("wg_sp_cpu", sparse, warpgroup_schedule(sparse, 2048, CUDA), "f16"), CUDA).kernel
    with pytest.raises(CudaCPUError, match=r"does not emulate the inline PTX `.*wgmma\.mma_async\.sp") as info:
        compile_cuda_cpu(print_cuda(kernel))
    assert info.value.kind == "unsupported"


def _roles_kernel():
    fmt = md.builtin_format("fp4")
    gemm = Gemm("wg_roles_mut", fmt, warpgroup_roles_schedule(fmt, 2048, CUDA), "f16")
    return gemm, compile_gemm(gemm, CUDA).kernel


def test_warp_roles_without_their_waits_fail() -> None:
    """The shim's mbarriers order the roles: with the waits printed away the consumers read
    stages the producers have not filled (poisoned shared memory) and the output is wrong."""
    gemm, kernel = _roles_kernel()
    src = print_cuda(kernel)
    assert src.body.count("mdsl::mbar_wait(") >= 3
    bad = dataclasses.replace(src, body=src.body.replace("mdsl::mbar_wait(", "(void)("))
    for seed in (0, 1):
        assert not check_printed(gemm, kernel, compile_cuda_cpu(bad), [(3, 136, 512)], seed)[0].ok


def test_warp_roles_without_an_arrival_deadlock() -> None:
    """A phase that never completes is a deadlock the harness names, not a hang."""
    gemm, kernel = _roles_kernel()
    src = print_cuda(kernel)
    bad = dataclasses.replace(src, body=src.body.replace("mdsl::mbar_arrive(&a_full", "(void)(&a_full"))
    with pytest.raises(CudaCPUError, match="deadlock.*mbarrier.try_wait.parity"):
        check_printed(gemm, kernel, compile_cuda_cpu(bad), [(3, 136, 512)])


def test_wgmma_swizzle_and_layout_matter() -> None:
    """The shim's wgmma reads what the kernel wrote where the PTX ISA says: a kernel whose B
    descriptor is off by one 16-byte chunk (its swizzle then picks other K positions) fails."""
    fmt = md.builtin_format("fp4")
    gemm = Gemm("wg_bad", fmt, warpgroup_schedule(fmt, 200, CUDA), "f16")
    kernel = compile_gemm(gemm, CUDA).kernel
    src = print_cuda(kernel)
    assert "wgmma_desc_sw128<1024u>(&x_s[" in src.body
    bad = dataclasses.replace(src, body=src.body.replace("wgmma_desc_sw128<1024u>(&x_s[", "wgmma_desc_sw128<1024u>(8 + &x_s["))
    results = check_printed(gemm, kernel, compile_cuda_cpu(bad), [(3, 136, 256)])
    assert not results[0].ok


def test_compile_table_runs_the_printed_cuda(tmp_path, capsys) -> None:
    """`marlin-dsl compile --target cuda` checks every kernel's printed text on the harness
    (the `.cu` column), the dense warpgroup kernel's too; a sparse warpgroup kernel's column
    reads "-" (the sparse wgmma is not emulated)."""
    from marlin_dsl.cli import main

    spec = tmp_path / "wg_spec.py"
    spec.write_text("from marlin_dsl import Gemm, Schedule, Warpgroup, builtin_format\n"
                    "wg = Schedule('wg', tile_m=32, tile_n=64, tile_k=64, warps_m=1, warps_n=4,\n"
                    "              pipeline=Warpgroup(stages=3, depth=1))\n"
                    "Gemm('fp4_wg', builtin_format('fp4'), wg)\n"
                    "Gemm('fp4_db', builtin_format('fp4'), Schedule('db'))\n"
                    "wgs = Schedule('wgs', tile_m=64, tile_n=64, tile_k=128, warps_m=1, warps_n=4,\n"
                    "               pipeline=Warpgroup(stages=3, depth=1))\n"
                    "Gemm('fp4_2of4_wg', builtin_format('fp4_2of4'), wgs)\n")
    assert main(["compile", str(spec), "--target", "cuda"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()
            if line.startswith("fp4_") and line.split()[-1] == "PASS"}
    assert float(rows["fp4_wg"][-2]) < 2e-3 and float(rows["fp4_db"][-2]) < 2e-3
    assert rows["fp4_2of4_wg"][-2] == "-"
