"""The warpgroup pipeline with warp roles (`Warpgroup(producers=P)`, issue 15): producer warps
copy and decode, consumer warpgroups issue the wgmmas, and they meet at mbarriers. Kernels
checked in the interpreter against the float64 reference (its roles run apart, the mbarriers
order memory), the protocol's hazards as mutations of the lowering (each caught), schedule
errors, the printed CUDA (role branches, launch bounds, the mbarrier calls), and nvcc's sm_90a
compile with ptxas keeping the consumers' wgmmas pipelined (no C7514 serialisation) and within
the block's registers."""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace

import pytest

import marlin_dsl as md
from marlin_dsl import CUDA, Gemm, Schedule, Warpgroup
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.errors import CompileError, ScheduleError
from marlin_dsl.ir import Kernel
from marlin_dsl.targets.cuda.nvcc import find_nvcc
from marlin_dsl.targets.cuda.printer import print_cuda
from marlin_dsl.targets.cuda.print_sync import base_registers
from marlin_dsl.ir.interpret import InterpreterError
from marlin_dsl.lowering import warpgroup_roles as roles_lowering
from kernel_asserts import assert_matches

FORMATS = ("fp4", "int4", "uint4_zp", "nf4")


def roles_schedule(tile_m: int = 32, warps_n: int = 8, stages: int = 4, depth: int = 1, producers: int = 1,
                   a_stages: int = 2, tile_k: int = 64, copies: str = "producers") -> Schedule:
    return Schedule("ws_test", tile_m=tile_m, tile_n=16 * warps_n, tile_k=tile_k, warps_m=1, warps_n=warps_n,
                    pipeline=Warpgroup(stages=stages, depth=depth, producers=producers, a_stages=a_stages,
                                       copies=copies))


def compiled(fmt_name: str = "fp4", act: str = "f16", **kw) -> tuple[Gemm, Kernel]:
    gemm = Gemm(f"ws_{fmt_name}", md.builtin_format(fmt_name), roles_schedule(**kw), act)
    return gemm, compile_gemm(gemm, CUDA).kernel


# ----- kernels in the interpreter (the roles run apart, the mbarriers order memory) ---------------

@pytest.mark.sweep
@pytest.mark.parametrize("fmt_name", FORMATS)
@pytest.mark.parametrize("act", ["f16", "bf16"])
@pytest.mark.parametrize("copies", ["producers", "consumers"])
def test_kernels_match_the_reference(fmt_name: str, act: str, copies: str) -> None:
    # M = 1, 3, 65 (rows past M in a tile), N tails (tiles past N), K of 4 to 8 steps: more
    # steps than slots, so every ring wraps and every parity is waited for
    gemm, kernel = compiled(fmt_name, act, copies=copies)
    assert_matches(gemm, kernel, [(1, 128, 256), (3, 136, 384), (65, 264, 512)])


@pytest.mark.parametrize("kw", [dict(producers=2, copies="consumers"), dict(stages=5, a_stages=3, depth=2),
                                dict(stages=3, a_stages=4, copies="consumers", tile_m=64),
                                dict(warps_n=4, producers=1, tile_m=16)])
def test_schedule_variants(kw) -> None:
    gemm, kernel = compiled(**kw)
    s = gemm.schedule  # a partial tile in M and N, ten steps of K
    assert_matches(gemm, kernel, [(s.tile_m + 3, s.tile_n + 8, 640)], seed=len(kw))


def run_mutated(monkeypatch: pytest.MonkeyPatch, copies: str = "producers") -> InterpreterError | None:
    """The roles kernel built under a mutation of its lowering, run by the interpreter: the
    error it raises (None: it ran)."""
    gemm, kernel = compiled(copies=copies)
    try:
        assert_matches(gemm, kernel, [(33, 136, 384)])
    except InterpreterError as err:
        return err
    return None


def _skip_wait(names: set[str]):
    original = roles_lowering.WarpgroupRolesLowering.wait

    def wait(self, name, slot, parity):
        if name not in names:
            original(self, name, slot, parity)
    return wait


@pytest.mark.parametrize("copies", ["producers", "consumers"])
def test_unmutated_kernel_runs(monkeypatch: pytest.MonkeyPatch, copies: str) -> None:
    assert run_mutated(monkeypatch, copies) is None


@pytest.mark.parametrize("copies, skipped, kind", [
    ("producers", {"full"}, "race"),           # the consumers read what the producers are still writing
    ("producers", {"x_free"}, "race"),         # the producers overwrite activations a wgmma read
    # ... decoded weights (with the producers copying, their x_free wait is for the same step and
    # orders A too). The interpreter runs a role until it blocks, so producers that never wait
    # lap the ring before any consumer reads: the a_full phases run ahead of the waits' parity
    ("consumers", {"a_free"}, "deadlock"),
    ("consumers", {"a_full"}, "race"),
    ("consumers", {"x_full"}, "race"),         # a consumer's wgmma reads another's copies unordered
])
def test_a_missing_wait_is_a_race(monkeypatch: pytest.MonkeyPatch, copies: str, skipped: set[str], kind: str) -> None:
    monkeypatch.setattr(roles_lowering.WarpgroupRolesLowering, "wait", _skip_wait(skipped))
    err = run_mutated(monkeypatch, copies)
    assert err is not None and err.kind in ({kind} | ({"async", "uninitialised"} if kind == "race" else set())), err


def test_the_wrong_parity_deadlocks(monkeypatch: pytest.MonkeyPatch) -> None:
    original = roles_lowering.WarpgroupRolesLowering.round_parity

    def round_parity(self, step, slots, before):  # the free slots waited for as if full
        return original(self, step, slots, False)
    monkeypatch.setattr(roles_lowering.WarpgroupRolesLowering, "round_parity", round_parity)
    err = run_mutated(monkeypatch)
    assert err is not None and err.kind == "deadlock", err


def test_a_short_count_deadlocks(monkeypatch: pytest.MonkeyPatch) -> None:
    original = roles_lowering.WarpgroupRolesLowering.barrier_rings

    def rings(self):  # every phase expects one arrival more than ever comes
        return [(name, count + 1, slots) for name, count, slots in original(self)]
    monkeypatch.setattr(roles_lowering.WarpgroupRolesLowering, "barrier_rings", rings)
    err = run_mutated(monkeypatch)
    assert err is not None and err.kind == "deadlock", err


def test_a_missing_proxy_fence_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the producers' fence the wgmmas read decoded weights the async proxy may not
    see (on the H100 a probe without it gave wrong outputs: issue15_h100_2026-11-27/run2)."""
    from marlin_dsl.ir import builder

    original = builder.Builder.op

    def op(self, name, operands=(), result_types=(), attrs=None, regions=None, hint="v"):
        if name == "fence" and (attrs or {}).get("scope") == "async_proxy":
            return None
        return original(self, name, operands, result_types, attrs, regions, hint=hint)
    monkeypatch.setattr(builder.Builder, "op", op)
    err = run_mutated(monkeypatch)
    assert err is not None and err.kind == "async" and "fence async_proxy" in str(err), err


# ----- structure ------------------------------------------------------------------------------------

def roles_op(kernel: Kernel):
    (op,) = [op for op in kernel.body.ops if op.name == "warp_roles"]
    return op


@pytest.mark.parametrize("producers, warps", [(1, (4, 8)), (2, (8, 8))])
def test_roles_and_barriers(producers: int, warps: tuple[int, int]) -> None:
    _, kernel = compiled(producers=producers)
    assert kernel.threads == 32 * sum(warps)
    op = roles_op(kernel)
    assert op.attrs["warps"] == warps and "regs" not in op.attrs  # ptxas gives no role more (print_sync)
    producer, consumer = op.regions
    prod, cons = [o.name for o in _walk(producer)], [o.name for o in _walk(consumer)]
    # the producers copy, decode and signal; the consumers only multiply and release
    assert "async_copy" in prod and "vstore" in prod and "wgmma" not in prod
    assert "wgmma" in cons and "async_copy" not in cons and "vstore" not in cons and "load" not in cons
    assert {o.attrs["barriers"] for o in _walk(producer) if o.name == "mbarrier_wait"} == {"x_free", "a_free"}
    assert {o.attrs["barriers"] for o in _walk(producer) if o.name == "mbarrier_arrive"} == {"full"}
    assert {o.attrs["barriers"] for o in _walk(consumer) if o.name == "mbarrier_wait"} == {"full"}
    assert {o.attrs["barriers"] for o in _walk(consumer) if o.name == "mbarrier_arrive"} == {"x_free", "a_free"}
    counts = {o.attrs["barriers"]: o.attrs["count"] for o in kernel.walk() if o.name == "mbarrier_init"}
    assert counts == {"full": 32 * warps[0], "x_free": 32 * warps[1], "a_free": 32 * warps[1]}
    shared = {s.name: s.size for s in kernel.shared}
    assert shared["full"] == shared["x_free"] == 2 * 4 and shared["a_free"] == 2 * 2


def test_consumers_copying() -> None:
    _, kernel = compiled(copies="consumers", a_stages=4)
    producer, consumer = roles_op(kernel).regions
    prod, cons = [o.name for o in _walk(producer)], [o.name for o in _walk(consumer)]
    assert "async_copy" not in prod and "async_copy" in cons and "vstore" in prod
    counts = {o.attrs["barriers"]: o.attrs["count"] for o in kernel.walk() if o.name == "mbarrier_init"}
    assert counts == {"x_full": 256, "a_full": 128, "x_free": 256, "a_free": 256}
    # the consumers meet at x_full: each arrives, then waits
    x_full = [o.name for o in _walk(consumer) if o.attrs.get("barriers") == "x_full"]
    assert x_full == ["mbarrier_arrive", "mbarrier_wait"]


def _walk(block):
    for op in block.ops:
        yield op
        for region in op.regions:
            yield from _walk(region)


@pytest.mark.parametrize("kw, words", [
    (dict(producers=3), "dividing warps_n / 4"),
    (dict(a_stages=4, stages=4), "a_stages"),
    (dict(a_stages=1), "a_stages"),
    (dict(producers=2, tile_m=256), "smaller tile_m"),  # 512 threads: 128 registers, the accumulator 128
])
def test_schedule_errors(kw, words) -> None:
    with pytest.raises(ScheduleError, match=words):
        compiled(**kw)


def test_refused_formats() -> None:
    with pytest.raises(ScheduleError, match="dense formats"):
        compiled("fp4_2of4", tile_k=128)
    with pytest.raises(ScheduleError, match="a_source must be 'shared'"):
        replace(roles_schedule(), pipeline=Warpgroup(stages=4, producers=1, a_source="registers"))


def test_register_share() -> None:
    assert base_registers(384) == 168 and base_registers(512) == 128 and base_registers(256) == 248


# ----- the printed CUDA -----------------------------------------------------------------------------

def test_printed_cuda() -> None:
    _, kernel = compiled(tile_m=64)
    src = print_cuda(kernel)
    assert src.attrs["cuda_arch"] == "sm_90a" and src.attrs["launch_bounds"] == 384
    assert "__launch_bounds__(384, 1) " in src.full_source()
    body = src.body
    assert "if (threadIdx.x < 128u) {  // role 0: warps 0 .. 3" in body
    assert "} else {  // role 1: warps 4 .. 11" in body
    assert body.count("mdsl::mbar_init(") == 4 + 4 + 2
    assert "mdsl::mbar_wait(&full[2u * (" in body and "mdsl::mbar_arrive(&a_free[2u * (" in body
    assert "setmaxnreg" not in body


def test_register_counts_print_setmaxnreg() -> None:
    from marlin_dsl.ir import U32, Builder, BufferParam, GridDim, SharedArray

    b = Builder()
    # the producer gives registers back, the consumer takes them (from 128 at 512 threads)
    with b.region() as producer:
        b.yield_()
    with b.region() as consumer:
        b.yield_()
    b.op("warp_roles", [], attrs={"warps": (8, 8), "regs": (96, 160)}, regions=[producer, consumer])
    b.store("y", b.index("tid"), b.const(1))
    kernel = Kernel("roles", body=b.block, threads=512, grid=(GridDim(None), GridDim(None), GridDim(None)),
                    buffers=[BufferParam("y", U32, "write")], shared=[SharedArray("bars", U32, 2)])
    src = print_cuda(kernel)
    assert 'setmaxnreg.dec.sync.aligned.u32 96;' in src.body and 'setmaxnreg.inc.sync.aligned.u32 160;' in src.body
    assert src.attrs["cuda_arch"] == "sm_90a" and src.attrs["launch_bounds"] == 512
    with pytest.raises(CompileError, match="over the 65536"):
        bad = Kernel("roles", body=b.block, threads=512, grid=kernel.grid, buffers=kernel.buffers,
                     shared=kernel.shared)
        roles_op(bad).attrs["regs"] = (128, 160)
        print_cuda(bad)


def _ptxas_report(kernel: Kernel, tmp_path) -> str:
    nvcc = find_nvcc()
    src = print_cuda(kernel)
    cu = tmp_path / "k.cu"
    cu.write_text(src.full_source(name="k"))
    res = subprocess.run([nvcc, "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-cubin", "-o",
                          str(tmp_path / "k.cubin"), str(cu), "-Xptxas", "-v"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stderr


@pytest.mark.sweep
@pytest.mark.skipif(find_nvcc() is None, reason="needs nvcc (CUDA toolkit) to compile the printed text")
@pytest.mark.parametrize("tile_m, producers, stages, a_stages, copies", [
    (256, 1, 5, 3, "producers"), (256, 1, 4, 4, "consumers"), (192, 2, 6, 4, "consumers"), (128, 2, 6, 4, "producers")])
def test_ptxas_keeps_the_wgmmas_pipelined(tmp_path, tile_m: int, producers: int, stages: int, a_stages: int,
                                          copies: str) -> None:
    """Schedules timed on the H100 (the second is `warpgroup_roles_schedule`'s): ptxas compiles
    them within the block's register share and does not serialise the consumers' wgmmas
    (C7514: each wgmma waiting for the one before, seen when the stores of the accumulator
    shared the final wait's basic block)."""
    _, kernel = compiled(tile_m=tile_m, producers=producers, stages=stages, a_stages=a_stages, depth=2,
                         copies=copies)
    report = _ptxas_report(kernel, tmp_path)
    assert "serialized" not in report, report
    used = int(re.search(r"Used (\d+) registers", report).group(1))
    assert used <= base_registers(kernel.threads)


def test_the_roles_schedule() -> None:
    from marlin_dsl.targets.cuda.tuning import tuned_schedule, warpgroup_roles_schedule

    fp4 = md.builtin_format("fp4")
    s = warpgroup_roles_schedule(fp4, 2048)
    p = s.pipeline
    assert (s.tile_m, s.tile_n, p.producers, p.stages, p.a_stages, p.copies) == (256, 128, 1, 4, 4, "consumers")
    assert tuned_schedule(fp4, 2048, CUDA, 4096, 4096, warpgroup=True).pipeline.producers == 0  # slower: not picked
    with pytest.raises(ScheduleError, match="dense formats"):
        warpgroup_roles_schedule(md.builtin_format("fp4_2of4"), 2048)
