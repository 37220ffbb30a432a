"""The 2:4 sparse MMA op `mma_sp`: target tables, verifier, interpreter, CUDA printer (compiled
with nvcc for sm_80 and sm_90, no GPU) and the textual IR.

The kernels are bench/probes/mma_sp_ir_probe.py's (`build_kernel`, `make_case`): every lane loads its
own compressed A, B and metadata word, builds fragments with `frag_build` (or `frag_load` for
B), and runs mma_sp with selector 0 and then 1 on one shared metadata register. The buffers
come from machine/cuda/sparse_layout.py, the model of the instruction checked on an H100;
running the printed kernel on a GPU is the probe's job.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from marlin_dsl.machine.cuda import sparse_layout as sl
from marlin_dsl.targets.cuda.printer import cuda_type, prelude, print_cuda
from marlin_dsl.targets.cuda.nvcc import find_nvcc, nvcc_check
from marlin_dsl.errors import CompileError
from marlin_dsl.ir import (BF16, BOOL, F16, F32, U32, Builder, BufferParam, FragmentType, GridDim, Kernel,
                           VerifyError, verify)
from marlin_dsl.ir.interpret import InterpreterError, run_kernel
from marlin_dsl.ir.text import assert_round_trip, kernels_equal, parse_kernel, print_kernel
from marlin_dsl.machine import CUDA, METAL, TARGETS

ROOT = Path(__file__).resolve().parents[1]


def _load_probe():
    spec = importlib.util.spec_from_file_location("mma_sp_ir_probe", ROOT / "bench" / "probes" / "mma_sp_ir_probe.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


probe = _load_probe()
CASES = [(e, f) for e in ("f16", "bf16") for f in ("build", "load")]
NVCC = find_nvcc()


# ----- target tables ----------------------------------------------------------------------------

# Expected lane positions written by hand from the PTX ISA's fragment rules (quoted in the
# docstring of marlin_dsl/machine/cuda/sparse_layout.py; g = lane >> 2, t = lane & 3), for a
# few lanes, not computed by the module under test: the tables the packer, the lowering and
# the interpreter all read must agree with these (issue 17: the old test compared the Target
# tables with the functions that build them).
#   A (compressed 16x16): reg0 = (g, 2t..2t+1), reg1 = (g+8, 2t..), reg2 = (g, 2t+8..), reg3 = (g+8, 2t+8..)
HAND_A = {
    0: [(0, 0), (0, 1), (8, 0), (8, 1), (0, 8), (0, 9), (8, 8), (8, 9)],
    5: [(1, 2), (1, 3), (9, 2), (9, 3), (1, 10), (1, 11), (9, 10), (9, 11)],
    31: [(7, 6), (7, 7), (15, 6), (15, 7), (7, 14), (7, 15), (15, 14), (15, 15)],
}
#   B (32x8, k x n): register r, half h of lane L = (k = 2t + 8r + h, n = g)
HAND_B = {
    0: [(0, 0), (1, 0), (8, 0), (9, 0), (16, 0), (17, 0), (24, 0), (25, 0)],
    6: [(4, 1), (5, 1), (12, 1), (13, 1), (20, 1), (21, 1), (28, 1), (29, 1)],
    31: [(6, 7), (7, 7), (14, 7), (15, 7), (22, 7), (23, 7), (30, 7), (31, 7)],
}
#   C / D (16x8 f32): c0, c1 = (g, 2t), (g, 2t+1); c2, c3 = (g+8, 2t), (g+8, 2t+1)
HAND_C = {
    0: [(0, 0), (0, 1), (8, 0), (8, 1)],
    5: [(1, 2), (1, 3), (9, 2), (9, 3)],
    31: [(7, 6), (7, 7), (15, 6), (15, 7)],
}
#   Metadata, selector F: lane 4g + 2F + h holds row g (bits 15:0) and row g + 8 (bits 31:16)
#   of groups 4h .. 4h+3; group j's nibble at 16*(row >= 8) + 4*(j & 3), slot s 2 bits up.
#   (selector, row, group, slot) -> (lane, bit offset)
HAND_META = {
    (0, 0, 0, 0): (0, 0), (0, 0, 0, 1): (0, 2), (0, 0, 5, 1): (1, 6), (0, 9, 2, 0): (4, 24),
    (0, 15, 7, 1): (29, 30), (0, 3, 3, 1): (12, 14),
    (1, 0, 0, 0): (2, 0), (1, 15, 7, 1): (31, 30), (1, 8, 4, 0): (3, 16), (1, 6, 6, 1): (27, 10),
}


def _pairs(table: tuple[np.ndarray, np.ndarray], lane: int) -> list[tuple[int, int]]:
    return [(int(r), int(c)) for r, c in zip(table[0][lane], table[1][lane])]


def test_target_sparse_shape_and_tables():
    assert CUDA.sparse_mma == (16, 8, 32)
    assert METAL.sparse_mma is None and METAL.sparse_metadata(0) is None
    assert METAL.lane_elements("b", 32, 8) is None
    b = CUDA.lane_elements("b", 32, 8)
    a = CUDA.lane_elements("a", 16, 16)
    c = CUDA.lane_elements("c", 16, 8)
    assert b[0].shape == b[1].shape == (32, 8) and a[0].shape == (32, 8) and c[0].shape == (32, 4)
    for lane, want in HAND_A.items():
        assert _pairs(a, lane) == want, lane
    for lane, want in HAND_B.items():
        assert _pairs(b, lane) == want, lane
    for lane, want in HAND_C.items():
        assert _pairs(c, lane) == want, lane
    # each table covers its tile exactly once
    for (rows, cols), shape in ((a, (16, 16)), (b, (32, 8)), (c, (16, 8))):
        count = np.zeros(shape, int)
        np.add.at(count, (rows.ravel(), cols.ravel()), 1)
        assert np.all(count == 1)
    # the dense B 16x8 is unchanged: the first two registers of the 32x8 one
    k16, n16 = CUDA.lane_elements("b", 16, 8)
    assert k16.shape == (32, 4) and np.array_equal(k16, b[0][:, :4]) and np.array_equal(n16, b[1][:, :4])


@pytest.mark.parametrize("selector", [0, 1])
def test_target_sparse_metadata(selector):
    fields = CUDA.sparse_metadata(selector)
    where = {(int(r), int(j), int(s)): (int(lane), int(bit)) for lane, bit, r, j, s in
             zip(fields.lanes, fields.bit_offsets, fields.rows, fields.groups, fields.slots)}
    assert len(where) == 16 * 8 * 2  # every (row, group, slot) once
    for (sel, row, group, slot), want in HAND_META.items():
        if sel == selector:
            assert where[(row, group, slot)] == want, (row, group, slot)
    # only the selector's lane pair of each group of four is read; no bit is read twice
    assert set(int(x) for x in fields.lanes) == {4 * g + 2 * selector + h for g in range(8) for h in (0, 1)}
    assert len(set(where.values())) == len(where)
    with pytest.raises(ValueError):
        CUDA.sparse_metadata(2)


# ----- verifier -----------------------------------------------------------------------------------

A = FragmentType("a", F16, 16, 16)
B32 = FragmentType("b", F16, 32, 8)
C = FragmentType("c", F32, 16, 8)


def _sp_kernel(a=A, b=B32, c=C, meta=U32, attrs=None, target="cuda", result=None, order=None) -> Kernel:
    bb = Builder()
    zero = bb.const(0)
    fa = bb.value("frag_load", [zero], a, {"buffer": f"in_{a.elem}", "ld": a.cols})
    fb = bb.value("frag_load", [zero], b, {"buffer": f"in_{b.elem}", "ld": b.cols})
    fc = bb.value("frag_zero", [], c)
    e = bb.load(f"in_{meta}", bb.index("lane"), meta)
    operands = [fa, fb, fc, e]
    if order is not None:
        operands = [operands[i] for i in order]
    d = bb.value("mma_sp", operands, result or c, {"selector": 0} if attrs is None else attrs)
    if d.type.role == "c" and d.type.elem == F32:
        bb.op("frag_store", [d, zero], attrs={"buffer": "y", "ld": 8})
    names = {"f16", "bf16", "f32", "u32"}
    buffers = [BufferParam(f"in_{n}", {"f16": F16, "bf16": BF16, "f32": F32, "u32": U32}[n], "read")
               for n in sorted(names)] + [BufferParam("y", F32, "write")]
    kernel = Kernel("sp", 32, (GridDim(None),) * 3, bb.block, buffers=buffers,
                    attrs={} if target is None else {"target": target})
    return kernel


@pytest.mark.parametrize("elem", [F16, BF16])
@pytest.mark.parametrize("selector", [0, 1])
def test_verifier_accepts(elem, selector):
    verify(_sp_kernel(FragmentType("a", elem, 16, 16), FragmentType("b", elem, 32, 8),
                      attrs={"selector": selector}))


@pytest.mark.parametrize("kwargs, message", [
    (dict(b=FragmentType("b", F16, 16, 8)), "shapes do not chain"),
    (dict(a=FragmentType("a", F16, 16, 32)), "shapes do not chain"),
    (dict(c=FragmentType("c", F32, 16, 16)), "shapes do not chain"),
    (dict(c=FragmentType("c", F32, 8, 8)), "shapes do not chain"),
    (dict(a=FragmentType("a", BF16, 16, 16)), "share one element type"),
    (dict(a=FragmentType("a", F32, 16, 16), b=FragmentType("b", F32, 32, 8)), "f16 or bf16"),
    (dict(c=FragmentType("c", F16, 16, 8)), "f32 accumulator"),
    (dict(a=FragmentType("a", F16, 8, 4), b=FragmentType("b", F16, 8, 8), c=FragmentType("c", F32, 8, 8)),
     "m8n8k8 needs a target"),
    (dict(meta=F32), "metadata must be u32"),
    (dict(attrs={"selector": 2}), "selector must be 0 or 1"),
    (dict(attrs={"selector": -1}), "selector must be 0 or 1"),
    (dict(attrs={"selector": True}), "selector must be 0 or 1"),
    (dict(attrs={"selector": "0"}), "selector must be 0 or 1"),
    (dict(attrs={}), "missing attributes \\['selector'\\]"),
    (dict(attrs={"selector": 0, "sel": 1}), "unknown \\['sel'\\]"),
    (dict(target="metal"), "target 'metal' has None"),
    (dict(target=None), "target None has None"),
    (dict(result=FragmentType("c", F32, 16, 16)), "result must have the accumulator's type"),
    (dict(order=(1, 0, 2, 3)), "operands are \\(a, b, c\\)"),
    (dict(order=(0, 1, 3, 2)), "takes \\(a, b, c\\) fragments"),
])
def test_verifier_rejects(kwargs, message):
    with pytest.raises(VerifyError, match=message):
        verify(_sp_kernel(**kwargs))


def test_op_definition():
    from marlin_dsl.ir import OPS

    d = OPS["mma_sp"]
    assert d.operands == (4, 4) and d.attrs == ("selector",) and d.collective and d.pure


# ----- interpreter ----------------------------------------------------------------------------------

def _run(kernel, buffers, scalars):
    return probe.run_interpreter(kernel, buffers, scalars)


@pytest.mark.parametrize("elem, b_from", CASES)
def test_interpreter_equals_dense_product(elem, b_from):
    kernel = probe.build_kernel(elem, b_from)
    rng = np.random.default_rng(CASES.index((elem, b_from)))
    for _ in range(3):
        buffers, scalars, want = probe.make_case(rng, warps=4, b_from=b_from)  # 2 groups x 2 warps
        got = _run(kernel, buffers, scalars)
        assert got.dtype == np.float32 and not np.isnan(got).any()
        assert np.array_equal(got, want)
        # the expected values are the dense products: tile 0 = A0 @ B, tile 1 = A0 @ B + A1 @ B
        assert np.abs(want).max() > 0


def _single_kernel(selector: int, elem=F16) -> Kernel:
    """One warp, one mma_sp with a nonzero accumulator loaded with frag_load."""
    b = Builder()
    lane = b.index("lane")
    base = b.binary("mul", lane, 8)
    elems = [b.load("a", b.binary("add", base, e), elem) for e in range(8)]
    fa = b.value("frag_build", elems, FragmentType("a", elem, 16, 16))
    fb = b.value("frag_load", [b.const(0)], FragmentType("b", elem, 32, 8), {"buffer": "b", "ld": 8})
    c = b.value("frag_zero", [], C)
    meta = b.load("meta", lane, U32)  # d = A @ B, then d + A @ B: the accumulator is used
    d = b.value("mma_sp", [fa, fb, c, meta], C, {"selector": selector})
    d = b.value("mma_sp", [fa, fb, d, meta], C, {"selector": selector})
    b.op("frag_store", [d, b.const(0)], attrs={"buffer": "y", "ld": 8})
    k = Kernel(f"single{selector}", 32, (GridDim(None),) * 3, b.block,
               buffers=[BufferParam("a", elem, "read"), BufferParam("b", elem, "read"),
                        BufferParam("meta", U32, "read"), BufferParam("y", F32, "write")],
               attrs={"target": "cuda"})
    verify(k)
    return k


@pytest.mark.parametrize("selector", [0, 1])
def test_interpreter_ignores_the_other_lanes(selector):
    """Words of the lanes a selector does not read may hold anything, unordered fields too."""
    rng = np.random.default_rng(20 + selector)
    a = sl.random_2of4(rng, allow_fewer=False)
    bm = rng.integers(-4, 5, size=(32, 8)).astype(np.float64)
    vals, pos = sl.compress_2of4(a)
    meta = sl.pack_metadata(pos, selector)
    ignored = np.setdiff1d(np.arange(32), sl.metadata_lanes(selector))
    assert np.all(meta[ignored] == 0)  # 0: every field "unordered" if it were read
    meta[ignored[::2]] = 0x11111111
    bufs = {"a": sl.a_lane_values(vals).ravel().astype(np.float16), "b": bm.ravel().astype(np.float16),
            "meta": meta, "y": np.full(128, np.nan, np.float32)}
    y = run_kernel(_single_kernel(selector), bufs, {})["y"]
    assert np.array_equal(y.reshape(16, 8), 2 * (a @ bm))
    # the model of the instruction agrees
    ref = sl.mma_sp_reference(sl.a_lane_values(vals), meta, sl.b_lane_values(bm), selector)
    assert np.array_equal(ref, a @ bm)


@pytest.mark.parametrize("lane, word, selector_hit", [
    (5, None, 0),          # lane 5 = 4*1 + 1: read by selector 0; a nibble with equal indices
    (6, 0x11111111, 1),    # lane 6 = 4*1 + 2: read by selector 1; decreasing indices
])
def test_interpreter_rejects_unordered_metadata(lane, word, selector_hit):
    kernel = probe.build_kernel("f16", "build")
    rng = np.random.default_rng(4)
    buffers, scalars, _ = probe.make_case(rng, warps=4)
    meta = buffers["meta"]
    gw = 3  # group 1, warp 1
    if word is None:  # row g + 8 = 9, group 4h + 2 = 6 (h = 1): nibble at bit 16 + 8 -> 0b0101
        word = (int(meta[gw * 32 + lane]) & ~(0xF << 24)) | (0b0101 << 24)
    meta[gw * 32 + lane] = word
    with pytest.raises(InterpreterError) as info:
        _run(kernel, buffers, scalars)
    err = info.value
    assert err.kind == "metadata"
    assert err.group == (1, 0, 0) and err.warp == 1 and err.thread == 32 + lane
    assert err.index == word
    msg = str(err)
    assert f"lane {lane}'s word" in msg and f"selector {selector_hit}" in msg and "not ordered" in msg
    assert f"%d{selector_hit}" in msg  # names the op's result
    if lane == 5:
        assert "row 9 group 6" in msg


def test_interpreter_needs_whole_warps():
    """mma_sp is collective: executed by half a warp (divergent `if`) it is an error."""
    kernel = probe.build_kernel("f16", "build")
    ops = kernel.body.ops
    i = next(k for k, op in enumerate(ops) if op.name == "mma_sp")
    first = ops[i]
    b = Builder()
    lane = b.value("index", [], U32, {"kind": "lane"}, hint="xlane")
    cond = b.value("lt", [lane, b.value("const", [], U32, {"value": 16}, hint="xc")], BOOL, hint="xcond")
    with b.region() as then:
        b.yield_(b.value("mma_sp", first.operands, C, {"selector": 0}, hint="xd"))
    with b.region() as else_:
        b.yield_(first.operands[2])
    acc = b.op("if", [cond], [C], regions=[then, else_], hint="xacc").result
    first.operands[2] = acc
    ops[i:i] = b.block.ops
    verify(kernel)
    buffers, scalars, _ = probe.make_case(np.random.default_rng(1), warps=2)
    with pytest.raises(InterpreterError) as info:
        _run(kernel, buffers, scalars)
    assert info.value.kind == "collective" and "partially active warp" in str(info.value)


# ----- CUDA printer --------------------------------------------------------------------------------

def test_cuda_spelling():
    assert cuda_type(FragmentType("b", F16, 32, 8)) == "mdsl::frag_b32<__half>"
    assert cuda_type(FragmentType("b", BF16, 32, 8)) == "mdsl::frag_b32<__nv_bfloat16>"
    assert cuda_type(FragmentType("b", F16, 16, 8)) == "mdsl::frag_b<__half>"
    with pytest.raises(CompileError, match="32x8"):
        cuda_type(FragmentType("b", F32, 32, 8))
    with pytest.raises(CompileError):
        cuda_type(FragmentType("a", F16, 16, 32))
    text = prelude()
    for ty in ("f16", "bf16"):
        assert f"mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.{ty}.{ty}.f32 " in text
    assert '"n"(SEL)' in text and "struct frag_b32" in text and "uint32_t x[4];" in text
    guard = text.index("#ifndef MDSL_HOST_LAYOUT_CHECK")
    assert guard < text.index("mma_sp(") < text.index("#endif  // MDSL_HOST_LAYOUT_CHECK")


@pytest.mark.parametrize("elem, b_from", CASES)
def test_printed_text(elem, b_from):
    src = print_cuda(probe.build_kernel(elem, b_from))
    ct = {"f16": "__half", "bf16": "__nv_bfloat16"}[elem]
    assert len(re.findall(r"mdsl::mma_sp<0>\(v_\w+, v_fb0, v_acc0, v_meta0\)", src.body)) == 1
    assert len(re.findall(r"mdsl::mma_sp<1>\(v_\w+, v_fb0, v_d0, v_meta0\)", src.body)) == 1
    assert f"mdsl::frag_b32<{ct}> v_fb0" in src.body
    if b_from == "build":
        assert all(f"v_fb0.x[{r}] = mdsl::pair_bits(" in src.body for r in range(4))
    else:
        assert "mdsl::load_b32<8, false>(b + " in src.body
    assert src.input_names == ["a0", "a1", "b", "meta", "dims"] and src.output_names == ["y"]


needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc (the CUDA toolkit) is not installed: the "
                                                     "printed mma_sp kernels are compile-checked with nvcc")


@pytest.mark.slow  # an nvcc/ptxas sweep: CI runs it (-m slow)
@needs_nvcc
def test_nvcc_compiles_for_sm80_and_sm90():
    sources = [print_cuda(probe.build_kernel(e, f)) for e, f in CASES]
    results = nvcc_check(sources, archs=("sm_80", "sm_90"), jobs=2)
    failed = [r for r in results if not r.ok]
    assert not failed, "\n\n".join(f"{r.summary()}\n{r.log}" for r in failed)
    assert {(n, r.arch) for r in results for n in r.names} == {(s.name, a) for s in sources
                                                              for a in ("sm_80", "sm_90")}
    # MLX's own translation unit too
    (mlx,) = nvcc_check(sources[:1], archs=("sm_90",), jobs=1, form="mlx")
    assert mlx.ok, mlx.log


@needs_nvcc
def test_nvcc_selector_is_an_immediate(tmp_path):
    """The PTX carries the selector as the literal 0 / 1 (ptxas rejects a register there)."""
    cu = tmp_path / "k.cu"
    cu.write_text(print_cuda(probe.build_kernel("bf16", "load")).full_source())
    proc = subprocess.run([NVCC, "-std=c++17", "-arch=sm_90", "-ptx", "-o", str(tmp_path / "k.ptx"), str(cu)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ptx = (tmp_path / "k.ptx").read_text()
    found = re.findall(r"mma\.sp::ordered_metadata\.sync\.aligned\.m16n8k32\.row\.col\.f32\.bf16\.bf16\.f32"
                       r" [^;]*, %r\d+, (\d);", ptx)
    assert found == ["0", "1"]


GXX = shutil.which(os.environ.get("CXX") or "g++")
CUDA_INCLUDE = next((p for p in ("/usr/local/cuda/include",) if Path(p, "cuda_fp16.h").exists()), None)
if CUDA_INCLUDE is None and NVCC is not None:
    _cand = Path(NVCC).resolve().parents[1] / "include"
    CUDA_INCLUDE = str(_cand) if (_cand / "cuda_fp16.h").exists() else None

_HOST_PROGRAM = r"""
#define MDSL_HOST_LAYOUT_CHECK
#define __device__
#define __forceinline__ inline
#include <cstdint>
#include <cstdio>
struct mdsl_dim3 { unsigned x, y, z; };
static mdsl_dim3 threadIdx;
#include "cuda_prelude.cuh"

int main() {
  static __half mem[2048];
  for (int i = 0; i < 2048; ++i) mem[i] = __ushort_as_half((unsigned short)i);
  for (unsigned lane = 0; lane < 32; ++lane) {
    threadIdx.x = 32 + lane;
    auto b0 = mdsl::load_b32<12, false>(mem + 7);
    auto b1 = mdsl::load_b32<40, true>(mem + 10);   // 32-bit reads
    auto b2 = mdsl::load_b32<40, true>(mem + 11);   // 16-bit reads
    printf("B0 %u %u %u %u %u\n", lane, b0.x[0], b0.x[1], b0.x[2], b0.x[3]);
    printf("B1 %u %u %u %u %u\n", lane, b1.x[0], b1.x[1], b1.x[2], b1.x[3]);
    printf("B2 %u %u %u %u %u\n", lane, b2.x[0], b2.x[1], b2.x[2], b2.x[3]);
  }
  return 0;
}
"""


@pytest.mark.skipif(GXX is None or CUDA_INCLUDE is None,
                    reason="needs g++ and the CUDA headers to build the prelude for the host")
def test_prelude_load_b32_layout(tmp_path):
    """load_b32 fills each lane's registers with the elements Target.lane_elements("b", 32, 8)
    names (which frag_build and the interpreter use), transposed or not."""
    src = tmp_path / "b32.cpp"
    src.write_text(_HOST_PROGRAM)
    exe = tmp_path / "b32"
    proc = subprocess.run([GXX, "-std=c++17", "-O1", f"-I{ROOT / 'codegen'}", f"-I{CUDA_INCLUDE}",
                           "-o", str(exe), str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()
    loads = {"B0": (7, 12, False), "B1": (10, 40, True), "B2": (11, 40, True)}
    ks, ns = CUDA.lane_elements("b", 32, 8)
    seen = 0
    for line in out:
        what, lane, *regs = line.split()
        lane, regs = int(lane), [int(r) for r in regs]
        base, ld, trans = loads[what]
        for e in range(8):
            k, n = int(ks[lane, e]), int(ns[lane, e])
            want = base + (n * ld + k if trans else k * ld + n)
            assert (regs[e // 2] >> (16 * (e % 2))) & 0xFFFF == want, (what, lane, e)
        seen += 1
    assert seen == 3 * 32


# ----- textual IR --------------------------------------------------------------------------------

@pytest.mark.parametrize("elem, b_from", CASES)
def test_ir_text_round_trip(elem, b_from):
    kernel = probe.build_kernel(elem, b_from)
    parsed = assert_round_trip(kernel)
    assert kernels_equal(kernel, parsed)
    text = print_kernel(kernel)
    assert "mma_sp[selector=0](%fa0_0, %fb0, %acc0, %meta0) : frag<c, f32, 16x8>" in text
    assert f"frag<b, {elem}, 32x8>" in text
    ops = [op for op in parsed.walk() if op.name == "mma_sp"]
    assert [op.attrs["selector"] for op in ops] == [0, 1] and type(ops[0].attrs["selector"]) is int
    # the parsed kernel runs the same
    buffers, scalars, want = probe.make_case(np.random.default_rng(8), warps=2, b_from=b_from)
    assert np.array_equal(_run(parsed, buffers, scalars), want)


def test_ir_text_rejects_bad_selector():
    text = print_kernel(probe.build_kernel("f16", "build")).replace("mma_sp[selector=1]", "mma_sp[selector=3]")
    with pytest.raises(Exception, match="selector must be 0 or 1"):
        parse_kernel(text)


def test_targets_registry():
    assert TARGETS["cuda"] is CUDA and TARGETS["metal"] is METAL
