"""The static cost model (issue 16, marlin_dsl/cost/): exact counts on small hand-built kernels,
sanity relations on the real ones (formats, pipelines, targets), an anchor against the SASS
counts of bench/results/issue15_decode_notes.md, and `marlin-dsl compile --cost`."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import marlin_dsl as md
from marlin_dsl.cli import main
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.cost import (count_loop, cost_from_counts, find_k_loop, kernel_cost, live_registers,
                             registers_of, storage_per_weight)
from marlin_dsl.errors import CompileError
from marlin_dsl.ir.text import print_kernel
from marlin_dsl.ir.text.parser import parse_kernels
from marlin_dsl.ir.types import parse_type
from marlin_dsl.source import suspended_declarations
from marlin_dsl.spec import load_spec
from marlin_dsl.machine import TARGETS
from marlin_dsl.targets.cuda.tuning import tuned_schedule, warpgroup_schedule

ROOT = Path(__file__).resolve().parent.parent

# Two warps; one K-loop iteration: per thread a packed word, a scale and two activations
# from device memory, a decode, a store to threadgroup memory, a barrier, two fragment loads
# and an MMA; a loop-invariant multiply; a guarded block (the heavier arm counts).
LOOP_KERNEL = """
kernel @hand {
  attrs {target=metal, pipeline=double_buffered}
  threads 64
  grid [1, 1, 1]
  scalar @K
  buffer @x : f16 read
  buffer @qweight : u32 read
  buffer @scales : f16 read
  buffer @y : f32 write
  shared @a_s : f16[64]
  shared @b_s : f16[128]
  body {
    %tid = index[kind=tid]() : u32
    %warp = index[kind=warp]() : u32
    %c0 = const[value=0]() : u32
    %c1 = const[value=1]() : u32
    %c4 = const[value=4]() : u32
    %k = scalar[name=@K]() : u32
    %acc0 = frag_zero() : frag<c, f32, 8x8>
    %accN = for(%c0, %k, %c1, %acc0) : frag<c, f32, 8x8> {
    ^(%i: u32, %acc: frag<c, f32, 8x8>):
      %c15 = const[value=15]() : u32
      %inv = mul(%tid, %warp) : u32
      %word = load[buffer=@qweight](%tid) : u32
      %scale = load[buffer=@scales](%tid) : f16
      %xv = vload[buffer=@x, size=2](%c0) : vec<f16, 2>
      %code = and(%word, %c15) : u32
      %hi = shr(%word, %c4) : u32
      %codef = cast[to=f16](%code) : f16
      %w = mul(%codef, %scale) : f16
      %pair = bitcast[to="vec<f16, 2>"](%hi) : vec<f16, 2>
      %xs = fma(%xv, %pair, %xv) : vec<f16, 2>
      %x0 = extract[index=0](%xs) : f16
      store[buffer=@b_s](%tid, %w)
      %more = lt(%i, %k) : bool
      if(%more) {
        %t0 = add(%i, %c1) : u32
        %t1 = add(%t0, %inv) : u32
        yield()
      } {
        yield()
      }
      barrier[scope=threadgroup]()
      %fa = frag_load[buffer=@a_s, ld=8](%c0) : frag<a, f16, 8x8>
      %fb = frag_load[buffer=@b_s, ld=8](%c0) : frag<b, f16, 8x8>
      %acc1 = mma(%fa, %fb, %acc) : frag<c, f32, 8x8>
      yield(%acc1)
    }
    frag_store[buffer=@y, ld=8](%accN, %c0)
  }
}
"""


def _kernel(text: str):
    return parse_kernels(text, "test_cost_model")[0]


def test_hand_kernel_counts_exactly() -> None:
    kernel = _kernel(LOOP_KERNEL)
    counts = count_loop(kernel)
    per_thread = counts.tally.counts
    # int: and, shr, the invariant mul, lt, the if's two adds, the loop's add and compare
    assert per_thread == {"int": 8, "float": 2, "cvt": 1, "ld.dev": 3, "ld.shared": 2,
                          "ld.const": 0, "st.shared": 1, "st.dev": 0, "shfl": 0, "mma": 1, "sync": 1,
                          "move": 1, "other": 2}
    assert counts.tally.invariant == 1  # %inv: a compiler hoists it
    assert counts.tally.device_read == {"qweight": 4, "scales": 2, "x": 4}
    assert counts.tally.shared_read == 8  # two 8x8 f16 fragments: 128 bytes / 32 lanes each
    assert counts.tally.shared_written == 2
    assert counts.tally.barriers == {"threadgroup": 1}
    # 512 weights per iteration over 64 threads: one thread's count x 64 / 512 per weight
    cost = cost_from_counts(kernel, counts, 512, tile=(8, 64, 8), m=8)
    assert cost.per_weight["int"] == 1.0 and cost.per_weight["mma"] == 0.125
    assert cost.instructions_per_weight == 22 / 8
    assert cost.requested_bytes == {"qweight": 0.5, "scales": 0.25, "x": 0.5}
    assert cost.unique_bytes == {"x": 8 * 2 / 64}  # M x 2 bytes over tile_n columns
    assert cost.shared_traffic == (1.0, 0.25)
    assert cost.barriers_per_step == {"threadgroup": 1.0}
    assert cost.shared_bytes == 64 * 2 + 128 * 2


REGISTER_KERNEL = """
kernel @regs {
  threads 32
  grid [1, 1, 1]
  buffer @w : u32 read
  buffer @y : f32 write
  body {
    %c0 = const[value=0]() : u32
    %c1 = const[value=1]() : u32
    %c8 = const[value=8]() : u32
    %base = index[kind=tid]() : u32
    %z = const[value=0.0]() : f32
    %sum = for(%c0, %c8, %c1, %z) : f32 {
    ^(%i: u32, %acc: f32):
      %a = add(%base, %i) : u32
      %v = vload[buffer=@w, size=4](%a) : vec<u32, 4>
      %e0 = extract[index=0](%v) : u32
      %e1 = extract[index=1](%v) : u32
      %s = add(%e0, %e1) : u32
      %sf = cast[to=f32](%s) : f32
      %acc1 = add(%acc, %sf) : f32
      yield(%acc1)
    }
    store[buffer=@y](%base, %sum)
  }
}
"""


def test_registers_are_the_most_values_live_at_once() -> None:
    """acc (1) + the vector (4; its lanes share its registers) at the peak, and %base, read
    from outside the loop, live throughout (1)."""
    kernel = _kernel(REGISTER_KERNEL)
    assert live_registers(kernel, find_k_loop_any(kernel)) == (6, 1)
    for text, regs in (("u32", 1), ("f16", 1), ("bool", 1), ("vec<f16, 2>", 1), ("vec<f16, 16>", 8),
                       ("frag<c, f32, 8x8>", 2), ("frag<a, f16, 16x16>", 4),
                       ("frag<c, f32, 16x256>", 128)):
        assert registers_of(parse_type(text)) == regs, text


def find_k_loop_any(kernel):
    """The kernel's only loop (the register kernel has no MMA: find_k_loop refuses it)."""
    return next(op for op in kernel.walk() if op.name == "for")


def test_a_kernel_without_an_mma_loop_is_refused() -> None:
    with pytest.raises(CompileError, match="has no K loop"):
        find_k_loop(_kernel(REGISTER_KERNEL))


NESTED_KERNEL = """
kernel @nested {
  attrs {target=metal}
  threads 32
  grid [1, 1, 1]
  scalar @K
  buffer @y : f32 write
  shared @a_s : f16[64]
  body {
    %c0 = const[value=0]() : u32
    %c1 = const[value=1]() : u32
    %c2 = const[value=2]() : u32
    %c4 = const[value=4]() : u32
    %k = scalar[name=@K]() : u32
    %acc0 = frag_zero() : frag<c, f32, 8x8>
    %r = for(%c0, %c2, %c1, %acc0) : frag<c, f32, 8x8> {
    ^(%u: u32, %accu: frag<c, f32, 8x8>):
      %inner = for(%c0, %k, %c1, %accu) : frag<c, f32, 8x8> {
      ^(%i: u32, %acc: frag<c, f32, 8x8>):
        for(%c0, %c4, %c1) {
        ^(%j: u32):
          %t = add(%i, %j) : u32
          yield()
        }
        switch[cases=[0, 1]](%i) {
          %s0 = add(%i, %c1) : u32
          yield()
        } {
          %s1 = add(%i, %c1) : u32
          %s2 = add(%s1, %c1) : u32
          %s3 = add(%s2, %c1) : u32
          yield()
        } {
          yield()
        }
        %fa = frag_load[buffer=@a_s, ld=8](%c0) : frag<a, f16, 8x8>
        %fb = frag_load[buffer=@a_s, ld=8](%c0) : frag<b, f16, 8x8>
        %acc1 = mma(%fa, %fb, %acc) : frag<c, f32, 8x8>
        yield(%acc1)
      }
      yield(%inner)
    }
    frag_store[buffer=@y, ld=8](%r, %c0)
  }
}
"""


def test_nested_loops_and_switches() -> None:
    """The K loop is the innermost loop holding the MMAs (the outer one walks work units, as
    StripedKParallel's does); a constant-trip loop inside counts its body that many times; a
    switch counts its most expensive case, and says so."""
    kernel = _kernel(NESTED_KERNEL)
    loop = find_k_loop(kernel)
    assert loop.regions[0].args[0].name == "i"
    counts = count_loop(kernel)
    # 4 x (add + the inner loop's add and compare) + the case of 3 adds + the K loop's 2
    assert counts.tally.counts["int"] == 4 * 3 + 3 + 2
    assert counts.tally.counts["other"] == 4 + 1 + 1  # branches: inner loop, switch, K loop
    assert any("most expensive case" in note for note in counts.notes)


# ----- real kernels -----------------------------------------------------------------------------

CUDA, METAL = TARGETS["cuda"], TARGETS["metal"]


def _cost(fmt_name: str, schedule, target, m: int | None = None):
    with suspended_declarations():
        fmt = md.builtin_format(fmt_name)
        gemm = md.Gemm(f"{fmt_name}_{schedule.name}", fmt, schedule)
        return kernel_cost(compile_gemm(gemm, target).kernel, gemm, m)


def _stream(fmt_name: str, m: int, k: int = 4096, n: int = 14336):
    return tuned_schedule(md.builtin_format(fmt_name), m, CUDA, k, n)


def _first_generation(fmt_name: str):
    return md.Schedule("db", tile_k=32, pipeline=md.DoubleBuffered())


@pytest.mark.parametrize("fmt_name", ["fp4", "int4", "uint4_zp", "fp4_2of4"])
def test_each_packed_word_is_loaded_once_per_threadgroup(fmt_name: str) -> None:
    """The loop's qweight loads ask for exactly the format's storage per weight on the CUDA
    pipelines (weight stream at M = 1, 16; multistage): each word is fetched once, so the
    weights per iteration (tile x K warps) are right; at least that on the Metal kernels."""
    storage = storage_per_weight(md.builtin_format(fmt_name))
    for schedule in (_stream(fmt_name, 1), _stream(fmt_name, 16), _stream(fmt_name, 2048, 4096, 4096)):
        cost = _cost(fmt_name, schedule, CUDA)
        assert cost.requested_bytes["qweight"] == pytest.approx(storage["qweight"]), schedule.name
    metal = _cost(fmt_name, _first_generation(fmt_name), METAL)
    assert metal.requested_bytes["qweight"] >= storage["qweight"]


def test_warpgroup_reads_each_word_once_too() -> None:
    cost = _cost("fp4", warpgroup_schedule(md.builtin_format("fp4"), 2048, CUDA), CUDA)
    assert cost.requested_bytes["qweight"] == pytest.approx(0.5)
    assert cost.per_weight["mma"] > 0 and cost.barriers_per_step == {"threadgroup": 1.0}


def test_two_of_four_moves_fewer_bytes_per_dense_weight() -> None:
    """fp4 2:4 stores 2 codes (8 bits) and 4 metadata bits per 4 dense weights: 3 bits per
    dense weight against dense fp4's 4, both with fp16 scales per 128 (0.125 bits)."""
    for schedule in (_stream("fp4", 1), _first_generation("fp4")):
        target = CUDA if schedule.pipeline.kind == "weight_stream" else METAL
        dense = _cost("fp4", schedule, target)
        sparse = _cost("fp4_2of4", _stream("fp4_2of4", 1) if target is CUDA else schedule, target)
        weights = {k: v for k, v in sparse.unique_bytes.items() if k != "x"}
        assert sum(weights.values()) == pytest.approx((3 + 0.125) / 8)
        assert sum(weights.values()) < dense.unique_bytes_per_weight - dense.unique_bytes["x"]


def test_int4_decodes_with_floats_fp4_with_bits() -> None:
    """On the weight stream, INT4 places codes under 0x6400 and subtracts in half2 (more float,
    fewer integer ops per weight than FP4, whose decode is bit moves)."""
    fp4, int4 = _cost("fp4", _stream("fp4", 1), CUDA), _cost("int4", _stream("int4", 1), CUDA)
    assert fp4.per_weight["int"] > int4.per_weight["int"]
    assert int4.per_weight["float"] > fp4.per_weight["float"]


def test_metal_first_generation_against_the_cuda_weight_stream() -> None:
    """At small M the first-generation Metal kernel (64x64x32 tiles, weights dequantised into
    threadgroup memory) runs many times the CUDA weight stream's instructions per weight, asks
    for more bytes, stores to threadgroup memory and waits at barriers; the stream does none."""
    metal = _cost("fp4", _first_generation("fp4"), METAL, m=1)
    stream = _cost("fp4", _stream("fp4", 1), CUDA, m=1)
    assert metal.instructions_per_weight > 5 * stream.instructions_per_weight
    assert metal.requested_bytes_per_weight > stream.requested_bytes_per_weight
    assert metal.per_weight["st.shared"] > 0 and stream.per_weight["st.shared"] == 0
    assert metal.barriers_per_step["threadgroup"] >= 1 and not stream.barriers_per_step
    assert metal.m == stream.m == 1 and metal.unique_bytes["x"] == 2 / 64


def test_anchor_against_sass() -> None:
    """bench/results/issue15_decode_notes.md: ptxas's K loop for fp4 at M = 1 (4096 x 14336,
    tuned schedule) is 68.5 SASS instructions per lane and 32 weights. The IR count without
    register moves lands within -20%..+30% of it (ptxas merges an AND and an OR into LOP3)."""
    cost = _cost("fp4", _stream("fp4", 1), CUDA)
    per_32 = (cost.instructions_per_weight - cost.per_weight["move"]) * 32
    assert 0.8 * 68.5 <= per_32 <= 1.3 * 68.5


def test_costing_leaves_the_kernel_unchanged() -> None:
    with suspended_declarations():
        fmt = md.builtin_format("fp4")
        gemm = md.Gemm("fp4_db", fmt, _first_generation("fp4"))
        kernel = compile_gemm(gemm, METAL).kernel
    before = print_kernel(kernel)
    kernel_cost(kernel, gemm)
    assert print_kernel(kernel) == before


# ----- the command line -------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["metal", "cuda"])
def test_compile_cost_prints_tables_and_json(target: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    spec = ROOT / "examples" / "dense_fp4.py"
    out = tmp_path / "cost.json"
    assert main(["compile", str(spec), "--no-check", "--target", target, "--cost",
                 "--cost-json", str(out)]) == 0
    text = capsys.readouterr().out
    assert max(len(line) for line in text.splitlines()) <= 100
    gemms = [g.name for g in load_spec(spec).gemms]
    cost_part = text[re.search(r"\ngemm +target", text).start():]
    for name in gemms:
        assert f"\n{name} " in cost_part
    assert "lane instructions per weight" in cost_part and "regs" in cost_part
    doc = json.loads(out.read_text())
    assert [d["gemm"] for d in doc] == gemms
    assert {"per_weight", "requested_bytes", "unique_bytes", "registers", "barriers_per_step",
            "totals", "units"} <= set(doc[0])
    assert doc[0]["m"] == 64 and doc[0]["target"] == target


def test_cost_m_sets_the_activation_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cost.json"
    assert main(["compile", str(ROOT / "examples" / "dense_fp4.py"), "--no-check",
                 "--cost-json", str(out), "--cost-m", "1"]) == 0
    doc = json.loads(out.read_text())
    assert all(d["m"] == 1 and d["unique_bytes"]["x"] == 2 / d["tile"][1] for d in doc)  # / tile_n
    assert "\ngemm              target" not in capsys.readouterr().out  # JSON only: no tables


def test_cost_json_into_a_folder_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", str(ROOT / "examples" / "dense_fp4.py"), "--no-check",
                 "--cost-json", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--cost-json" in err and "Traceback" not in err
