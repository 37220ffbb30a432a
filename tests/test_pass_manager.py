"""PassManager: the verifier runs after every pass (a broken pass is named), the dump callback
sees every intermediate kernel, the registry builds pipelines; and the whole default pipeline
keeps a kernel's meaning (interpreted before and after every pass)."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from marlin_dsl.errors import MarlinDSLError
from marlin_dsl.ir import F16, F32, U32, Builder, BufferParam, GridDim, Kernel, ScalarParam, Value, verify
from marlin_dsl.passes import (
    DEFAULT_PIPELINE, PASSES, FoldPass, Pass, PassError, PassManager, UnrollPass, build_pipeline,
)

try:
    from marlin_dsl.ir.interpret import run_kernel
except ImportError:
    run_kernel = None

try:
    from marlin_dsl.ir.text import assert_round_trip
except ImportError:
    assert_round_trip = None


def make_kernel(b: Builder, buffers=(), scalars=()) -> Kernel:
    return Kernel("k", 32, (GridDim(None), GridDim(None), GridDim(None)), b.block,
                  buffers=list(buffers), scalars=[ScalarParam(s) for s in scalars])


def small_kernel() -> Kernel:
    b = Builder()
    tid = b.index("tid")
    b.store("y", tid, b.binary("add", tid, b.binary("mul", b.const(2), b.const(3))))
    return make_kernel(b, [BufferParam("y", U32, "write")])


class UndefinedOperand(Pass):
    """Deliberately broken: makes the store read a value that is defined nowhere."""

    name = "broken"

    def run(self, kernel, log):
        store = kernel.body.ops[-1]
        store.operands[1] = Value("ghost0", U32)
        log.append("broken: did it")


class Crashes(Pass):
    name = "crashes"

    def run(self, kernel, log):
        raise RuntimeError("boom")


def test_registry_and_default_pipeline():
    assert DEFAULT_PIPELINE == ["specialise", "unroll", "fold", "cse", "dce", "interleave"]
    assert set(DEFAULT_PIPELINE) <= set(PASSES)
    assert [p.name for p in build_pipeline()] == DEFAULT_PIPELINE
    assert [p.name for p in build_pipeline(["fold", "cse"])] == ["fold", "cse"]
    custom = UnrollPass(max_trip=4)
    assert build_pipeline(["fold", custom])[1] is custom
    with pytest.raises(ValueError, match="unknown pass 'nope'"):
        build_pipeline(["nope"])


def test_broken_pass_is_reported_by_name():
    k = small_kernel()
    with pytest.raises(PassError, match=r"pass broken left invalid IR: .*%ghost0 is not defined") as info:
        PassManager(["fold", UndefinedOperand(), "dce"]).run(k)
    assert info.value.pass_name == "broken"
    assert isinstance(info.value, MarlinDSLError)


def test_verification_can_be_switched_off():
    k = small_kernel()
    log = PassManager([UndefinedOperand()], verify_each=False).run(k)
    assert log == ["broken: did it"]


def test_crashing_pass_is_reported_by_name():
    with pytest.raises(PassError, match="pass crashes failed on kernel k: RuntimeError: boom"):
        PassManager(["fold", Crashes()]).run(small_kernel())


def test_invalid_input_is_not_blamed_on_a_pass():
    k = small_kernel()
    k.body.ops[-1].operands[1] = Value("ghost0", U32)
    with pytest.raises(PassError, match="input of the pass pipeline does not verify"):
        PassManager(["fold"]).run(k)


def test_verifier_runs_after_each_pass(monkeypatch):
    import marlin_dsl.passes.manager as manager
    calls = []
    real = manager.verify
    monkeypatch.setattr(manager, "verify", lambda kernel: (calls.append(kernel.name), real(kernel)))
    PassManager(["fold", "cse", "dce"]).run(small_kernel())
    assert len(calls) == 1 + 3  # the input, then after every pass


def test_dump_is_called_after_every_pass_with_its_notes():
    seen = []

    def dump(name, kernel, notes):
        verify(kernel)
        seen.append((name, list(notes), [op.name for op in kernel.body.ops]))

    log = PassManager(None, dump=dump).run(small_kernel())
    assert [s[0] for s in seen] == DEFAULT_PIPELINE
    assert seen[2][1] == ["fold: 1 ops folded to constants, 0 identities, 0 if/switch inlined"]
    assert seen[4][2].count("const") == 1  # the folded constant; 2 and 3 are dead after dce
    assert log == [note for s in seen for note in s[1]]


# ----- the default pipeline keeps meaning, pass by pass ------------------------------------------

def decode_gemv_kernel() -> Kernel:
    """A small seed-000/003-like kernel: per thread, a dynamic number (<= 3) of packed words,
    each decoded with a constant inner loop over 4 nibbles (int) and dequantised (f16 -> f32)."""
    b = Builder()
    tid = b.index("tid")
    words = b.binary("rem", tid, b.const(4))   # 0..3 words for this thread: dynamic trip count
    scale = b.cast(b.load("scale", tid, F16), F32)
    w = b.fresh("w", U32)
    acc = b.fresh("acc", F32)
    with b.region([w, acc]) as outer:
        word = b.load("q", b.binary("add", b.binary("mul", tid, b.const(3)), w), U32)
        n = b.fresh("n", U32)
        acc_in = b.fresh("acc", F32)
        with b.region([n, acc_in]) as inner:
            shift = b.binary("mul", n, b.const(4))
            code = b.binary("and", b.binary("shr", word, shift), b.const(0xF))
            centred = b.binary("sub", b.cast(code, F32), b.const(8.0, F32))
            xk = b.load("x", b.binary("add", b.binary("mul", w, b.const(4)), n), F32)
            unused = b.binary("mul", xk, b.const(1.0, F32))  # noqa: F841  (identity, then dead)
            b.yield_(b.value("fma", [b.binary("mul", centred, scale), xk, acc_in], F32))
        part = b.op("for", [b.const(0), b.const(4), b.const(1), acc], [F32], regions=[inner], hint="p")
        b.yield_(part.result)
    total = b.op("for", [b.const(0), words, b.const(1), b.const(0.0, F32)], [F32],
                 {"specialise": 3}, regions=[outer], hint="t")
    b.store("y", tid, total.result)
    return make_kernel(b, [BufferParam("q", U32, "read"), BufferParam("x", F32, "read"),
                           BufferParam("scale", F16, "read"), BufferParam("y", F32, "write")])


def gemv_inputs():
    rng = np.random.default_rng(1)
    return {"q": rng.integers(0, 2**32, 96, dtype=np.uint32),
            "x": rng.normal(size=16).astype(np.float32),
            "scale": rng.uniform(0.5, 2, 32).astype(np.float16),
            "y": np.full(32, np.nan, np.float32)}


def test_default_pipeline_keeps_the_kernel_meaning_after_every_pass():
    k = decode_gemv_kernel()
    verify(k)
    want = run_kernel(copy.deepcopy(k), gemv_inputs(), {})["y"] if run_kernel else None
    after = []

    def dump(name, kernel, notes):
        after.append(name)
        if run_kernel:
            got = run_kernel(kernel, gemv_inputs(), {})["y"]
            assert got.tobytes() == want.tobytes(), f"after {name}"
        if assert_round_trip:
            assert_round_trip(kernel)

    log = PassManager(None, dump=dump).run(k)
    assert after == DEFAULT_PIPELINE
    names = [op.name for op in k.walk()]
    # every case of the dispatch is straight-line; only the default keeps the dynamic loop
    switch = next(op for op in k.body.ops if op.name == "switch")
    for region in switch.regions[:-1]:
        assert "for" not in [op.name for op in region.walk()]
    assert names.count("for") == 1  # the default region keeps the dynamic loop (its inner one unrolled)
    assert any(note.startswith("interleave: block body.switch0.case3:") for note in log)


def test_fold_alone_can_be_rerun_to_a_fixed_point():
    k = decode_gemv_kernel()
    PassManager(["specialise", "unroll", "fold", "cse", "dce"]).run(k)
    snapshot = [(op.name, dict(op.attrs), [v.name for v in op.operands]) for op in k.walk()]
    log = PassManager([FoldPass(), "cse", "dce"]).run(k)
    assert log[0] == "fold: 0 ops folded to constants, 0 identities, 0 if/switch inlined"
    assert [(op.name, dict(op.attrs), [v.name for v in op.operands]) for op in k.walk()] == snapshot


# ----- lowered GEMMs of the examples ---------------------------------------------------------------

@pytest.mark.skipif(run_kernel is None, reason="needs marlin_dsl.ir.interpret")
@pytest.mark.parametrize("target", ["metal", "cuda"])
@pytest.mark.parametrize("example, gemm", [("block_pattern.py", "fp4_blocks_db"),
                                           ("sparse_2of4.py", "int4_2of4_striped"),
                                           ("int4_zero_point.py", "uint4_zp_fused")])
def test_default_pipeline_on_lowered_example_gemms(example, gemm, target):
    """Every pass keeps the bits of a lowered GEMM (M, N, K tails included); the block-pattern
    kernel exercises specialise (seed 003's dispatch on the pattern count)."""
    import runpy
    from pathlib import Path

    import marlin_dsl as md
    try:
        from marlin_dsl.lowering.pipelines import lower_gemm
        from marlin_dsl.kernel_args import gemm_buffers
        from marlin_dsl.machine import TARGETS
        g = runpy.run_path(str(Path(__file__).resolve().parents[1] / "examples" / example))[gemm]
        kernel = lower_gemm(g, TARGETS[target])
    except Exception as e:  # the lowering is not this file's subject
        pytest.skip(f"cannot lower {gemm}: {e}")
    rng = np.random.default_rng(3)
    K, N, M = 256, 72, 9
    w = rng.normal(size=(K, N))
    if isinstance(g.format.sparsity, md.BlockPatternSparsity):
        w[rng.random(K) < 0.4, :] = 0  # clustered zeros (whole K rows): blocks of every count
        w[rng.random((K, N)) < 0.5] = 0
    buffers, scalars = gemm_buffers(kernel, md.pack(g.format, w), rng.normal(size=(M, K)))
    want = run_kernel(kernel, {n: a.copy() for n, a in buffers.items()}, scalars)
    notes = {}

    def dump(name, k, pass_notes):
        notes[name] = pass_notes
        got = run_kernel(k, {n: a.copy() for n, a in buffers.items()}, scalars)
        for n in want:
            assert want[n].tobytes() == got[n].tobytes(), f"{n} differs after {name}"

    PassManager(None, dump=dump).run(kernel)
    if gemm == "fp4_blocks_db":
        assert notes["specialise"][-1].startswith("specialise: 2 loops dispatched")
