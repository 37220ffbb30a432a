"""The CUDA backend without a GPU: `print_cuda`, the device prelude, and the MLX launcher.

Every built-in format x pipeline (double-buffered, fused-dequant, striped) x activation
(f16, bf16) is compiled for the CUDA target, printed, and compiled with nvcc to cubins for
sm_80 and sm_90 (so NVVM and ptxas check the text, the inline mma.sync PTX included): several
kernels per nvcc run, two runs at a time, cached by a hash of the text. MLX's exact generated
translation unit is compiled too for a few kernels (against a stand-in for MLX's device header).
Structural checks compare the text with the IR (one `mdsl::mma` per mma op, one
`__syncthreads()` per threadgroup barrier, ...). The fragment layouts of the prelude are
checked against the PTX ISA's formulas by building the prelude for the host with g++ and
emulating the 32 lanes of a warp. The launcher's conventions (input order, dims, grid in
threads, outputs poisoned, counters passed zeroed and left zeroed) are checked with an
`mx.fast.cuda_kernel` stand-in that runs the kernel's IR in the interpreter.
Running the kernels on a GPU is `bench/gpu_correctness.py`'s job (and the `gpu` test below).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl import CUDA, DoubleBuffered, FusedDequant, Gemm, Schedule, StripedKParallel
from marlin_dsl.targets.cuda import printer as cuda_backend
from marlin_dsl.targets.cuda.printer import CudaSource, print_cuda
from marlin_dsl.targets.cuda.nvcc import find_nvcc, nvcc_check
from marlin_dsl.targets.cuda.launch import build_cuda_kernel, cuda_executor, gemm_inout_inputs
from marlin_dsl.targets.cuda.launch_text import expand
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.errors import CompileError
from marlin_dsl.ir import (BF16, BOOL, F16, F32, I32, OPS, U8, U16, U32, BufferParam, Builder, ConstTable,
                           FragmentType, GridDim, Kernel, Op, ScalarParam, ScalarType, SharedArray, Value,
                           VectorType, verify)
from marlin_dsl.ir.types import SCALAR_NAMES
from marlin_dsl.ir.interpret import launch_size, run_kernel

ROOT = Path(__file__).resolve().parents[1]
NVCC = find_nvcc()
needs_nvcc = pytest.mark.skipif(
    NVCC is None, reason="nvcc (the CUDA toolkit) is not installed: the printed CUDA is compile-checked "
                         "with nvcc for sm_80 and sm_90")
GXX = shutil.which(os.environ.get("CXX") or "g++")
CUDA_INCLUDE = next((p for p in ("/usr/local/cuda/include",) if Path(p, "cuda_fp16.h").exists()), None)
if NVCC is not None and CUDA_INCLUDE is None:
    cand = Path(NVCC).resolve().parents[1] / "include"
    CUDA_INCLUDE = str(cand) if (cand / "cuda_fp16.h").exists() else None

FORMATS = list(md.BUILTIN_FORMATS)
PIPELINES = {"double_buffered": DoubleBuffered, "fused_dequant": FusedDequant, "striped": StripedKParallel}
ACTIVATIONS = ("f16", "bf16")
ARCHS = ("sm_80", "sm_90")
FORMAT_WORDS = (*FORMATS, "2of4", "blockpattern", "nf4", "e2m1", "qweight")
#: Buffers that only some formats have: the printer and launcher must not name them.
FORMAT_BUFFERS = ("scales", "zeros", "meta", "patterns")


def _gemm(fmt: str, pipeline: str, act: str) -> Gemm:
    return Gemm(f"g_{fmt}_{pipeline}_{act}", md.builtin_format(fmt),
                Schedule("s", pipeline=PIPELINES[pipeline]()), activation=act)


@pytest.fixture(scope="module")
def printed() -> dict[tuple[str, str, str], tuple[Kernel, CudaSource]]:
    """Every built-in format x pipeline x activation, compiled for CUDA and printed."""
    out = {}
    for fmt in FORMATS:
        for pl in PIPELINES:
            for act in ACTIVATIONS:
                kernel = compile_gemm(_gemm(fmt, pl, act), CUDA).kernel
                out[(fmt, pl, act)] = (kernel, print_cuda(kernel, inout_inputs=gemm_inout_inputs(kernel)))
    return out


# ----- nvcc -------------------------------------------------------------------------------------

@pytest.mark.slow  # an nvcc/ptxas sweep: CI runs it (-m slow)
@needs_nvcc
def test_nvcc_compiles_every_kernel_for_sm80_and_sm90(printed, tmp_path_factory):
    sources = [src for _, src in printed.values()]
    t = time.perf_counter()
    results = nvcc_check(sources, archs=ARCHS, jobs=2)
    wall = time.perf_counter() - t
    failed = [r for r in results if not r.ok]
    assert not failed, "\n\n".join(f"{r.summary()}\n{r.log}" for r in failed)
    assert {(n, r.arch) for r in results for n in r.names} == {(s.name, a) for s in sources for a in ARCHS}
    print(f"\nnvcc: {len(sources)} kernels x {len(ARCHS)} archs in {len(results)} runs, {wall:.1f} s wall")
    for r in results:
        print("  " + r.summary())


@needs_nvcc
def test_nvcc_compiles_mlx_generated_translation_unit(printed):
    """MLX's own text (default header, namespace, `custom_kernel_<name>` signature)."""
    picks = [printed[("nf4", "striped", "bf16")][1], printed[("fp4_blockpattern", "fused_dequant", "f16")][1]]
    results = nvcc_check(picks, archs=("sm_90",), jobs=2, form="mlx")
    failed = [r for r in results if not r.ok]
    assert not failed, "\n\n".join(f"{r.summary()}\n{r.log}" for r in failed)


@needs_nvcc
def test_nvcc_reports_errors(tmp_path):
    kernel = _tiny_kernel()
    src = print_cuda(kernel)
    broken = CudaSource(**{**src.__dict__, "name": "broken", "body": src.body + "  undefined_thing();\n"})
    (result,) = nvcc_check([broken], archs=("sm_80",), jobs=1, cache_dir=tmp_path)
    assert not result.ok and "undefined_thing" in result.log


# ----- structure of the printed text ---------------------------------------------------------------

def _ops(kernel: Kernel, name: str, **attrs) -> int:
    return sum(1 for op in kernel.walk() if op.name == name and all(op.attrs.get(k) == v for k, v in attrs.items()))


@pytest.mark.parametrize("pipeline", list(PIPELINES))
@pytest.mark.parametrize("fmt", FORMATS)
def test_text_matches_ir(printed, fmt, pipeline):
    for act in ACTIVATIONS:
        kernel, src = printed[(fmt, pipeline, act)]
        body = src.body
        assert body.count("mdsl::mma(") == _ops(kernel, "mma") > 0
        assert body.count("__syncthreads();") == _ops(kernel, "barrier", scope="threadgroup") > 0
        assert body.count("__syncwarp();") == _ops(kernel, "barrier", scope="simdgroup")
        assert body.count("__threadfence();") == _ops(kernel, "fence", scope="device")
        assert body.count("atomicAdd(") == _ops(kernel, "atomic_add")
        assert body.count("mdsl::load_a<") + body.count("mdsl::load_b<") == _ops(kernel, "frag_load")
        assert body.count("mdsl::store_c<") == _ops(kernel, "frag_store")
        assert body.count("mdsl::zero_c()") == _ops(kernel, "frag_zero")
        elem = "__half" if act == "f16" else "__nv_bfloat16"
        other = "__nv_bfloat16" if act == "f16" else "__half"
        assert f"mdsl::frag_a<{elem}>" in body and f"mdsl::frag_a<{other}>" not in body
        assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in src.header
        assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in src.header
        for s in kernel.shared:
            ctype = cuda_backend._SCALAR[s.elem.name]
            assert f"__shared__ __align__(16) {ctype} {s.name}[{s.size}];" in body
        for t in kernel.tables:
            decl = re.search(rf"static __device__ const \w+ tbl_{t.name}\[(\d+)\] = \{{(.*?)\}};",
                             src.declarations, re.S)
            assert decl and int(decl.group(1)) == len(t.values)
            assert decl.group(2).count(",") == len(t.values)
        # MLX's parameter list: read buffers, the zeroed counters, dims; then the outputs
        reads = [b.name for b in kernel.buffers if b.access == "read"]
        expect_in = reads + (["counters"] if pipeline == "striped" else []) + ["dims"]
        assert src.input_names == expect_in
        assert src.output_names == (["partials", "y"] if pipeline == "striped" else ["y"])
        assert "uint32_t* counters_rw = const_cast<uint32_t*>(counters);" in body or pipeline != "striped"
        sig = src.signature()
        assert sig.startswith('extern "C" __global__ void custom_kernel_')
        assert f"const {elem}* x," in sig and f"    {elem}* y) {{" in sig and "const uint32_t* dims," in sig
        for suffix in ("_shape", "_strides", "_ndim"):  # MLX would add parameters for these
            assert not any(n + suffix in body for n in src.input_names)


def test_printing_is_deterministic(printed):
    kernel, src = printed[("uint4_zp", "striped", "bf16")]
    assert print_cuda(kernel, inout_inputs=["counters"]).full_source() == src.full_source()
    again = compile_gemm(_gemm("uint4_zp", "striped", "bf16"), CUDA).kernel
    assert print_cuda(again, inout_inputs=["counters"]).full_source() == src.full_source()


def test_printer_knows_no_formats():
    """The printer, prelude and launcher are format-agnostic: no format names, no format imports."""
    for path in (ROOT / "marlin_dsl/targets/cuda/printer.py", ROOT / "marlin_dsl/targets/cuda/source.py",
                 ROOT / "codegen/cuda_prelude.cuh", ROOT / "marlin_dsl/targets/cuda/launch.py"):
        text = path.read_text().lower()
        for word in FORMAT_WORDS:
            assert not re.search(rf"\b{re.escape(word)}\b", text), f"{path.name} mentions {word!r}"
        for word in FORMAT_BUFFERS:
            assert not re.search(rf"[\"'@]{word}[\"']?", text), f"{path.name} names the buffer {word!r}"
        assert not re.search(r"from \.+(formats|lowering|schedule)\b|import marlin_dsl\.formats", text)


def test_manifest_round_trip(printed):
    _, src = printed[("fp4_2of4", "striped", "f16")]
    back = CudaSource.from_json(json.loads(json.dumps(src.to_json())))
    assert back.full_source() == src.full_source() and back.digest == src.digest
    assert back.launch_dims({"M": 65, "N": 200, "K": 256}) == src.launch_dims({"M": 65, "N": 200, "K": 256})
    assert back.attrs["tile"] == (64, 64, 32) and back.attrs["parallel"] == 2


@pytest.mark.parametrize("pipeline", list(PIPELINES))
def test_launch_dims_are_threads_as_mlx_wants(printed, pipeline):
    kernel, src = printed[("int4", pipeline, "f16")]
    for m, n, k in ((1, 64, 128), (65, 200, 256), (7, 14336, 4096)):
        scalars = {"M": m, "N": n, "K": k}
        (gx, gy, gz), threads = launch_size(kernel, scalars)
        grid, tg = src.launch_dims(scalars)
        assert tg == (threads, 1, 1) and grid == (gx * threads, gy, gz)
        # MLX: block = min(threadgroup, grid), blocks = ceil(grid / threadgroup) per dimension
        assert tuple(-(-g // t) for g, t in zip(grid, tg)) == (gx, gy, gz) and grid[0] >= tg[0]
        assert list(src.dims(scalars)) == [m, n, k]


# ----- small kernels: every scalar rule, errors ------------------------------------------------------

def _tiny_kernel() -> Kernel:
    """A one-warp kernel mixing scalar types, rounding rules and a table."""
    b = Builder()
    tid = b.index("tid")
    n = b.scalar("N")
    pred = b.binary("lt", tid, n)
    xv = b.load("x", tid, F16, pred)
    wide = b.cast(xv, F32)
    bf = b.cast(wide, BF16)
    bf2 = b.binary("mul", bf, bf)
    back = b.cast(bf2, F16)
    s = b.binary("add", back, b.const(1.5, F16))
    s = b.value("fma", [s, s, b.const(-0.25, F16)], F16)
    bits = b.bitcast(s, U16)
    small = b.cast(b.binary("and", b.cast(bits, U32), 7), U8)
    idx = b.cast(small, U32)
    t = b.value("table", [idx], F32, {"name": "lut"})
    neg = b.cast(b.cast(t, I32), F16)
    total = b.binary("add", s, neg)
    ok = b.binary("ne", total, total)
    flag = b.select(ok, b.const(True, BOOL), b.binary("and", pred, b.const(True, BOOL)))
    b.store("y", tid, total, flag)
    kernel = Kernel("tiny", threads=32, grid=(GridDim("N", 32), GridDim(None), GridDim(None)),
                    body=b.blocks[0], buffers=[BufferParam("x", F16, "read"), BufferParam("y", F16, "write")],
                    scalars=[ScalarParam("N")], tables=[ConstTable("lut", F32, tuple(float(i) - 3.5 for i in range(8)))])
    verify(kernel)
    return kernel


def test_tiny_kernel_prints_rounding_intrinsics():
    kernel = _tiny_kernel()
    body = print_cuda(kernel).body
    for needle in ("__float2bfloat16_rn(__fmul_rn(__bfloat162float(", "__hadd_rn(", "__hfma(",
                   "__half_as_ushort(", "__float2int_rz(", "__int2half_rn(", "__hneu(", "tbl_lut[",
                   "__ushort_as_half((unsigned short)0x3e00u);  // 1.5", "((uint8_t)", "y[v_tid0] = "):
        assert needle in body, needle


@needs_nvcc
def test_tiny_kernel_compiles(tmp_path):
    kernel = _tiny_kernel()
    results = nvcc_check([print_cuda(kernel)], archs=("sm_80",), jobs=1, cache_dir=tmp_path)
    assert all(r.ok for r in results), results[0].log


def _every_scalar_rule_kernel() -> Kernel:
    """One kernel with every op the verifier accepts on every scalar type, every cast and
    bitcast, vectors, `if`/`switch` with results and a `for` carrying values."""
    types = [ScalarType(n) for n in SCALAR_NAMES]
    b = Builder()
    tid = b.index("tid")
    lane = b.index("lane")
    vals = {t: [b.load(f"in_{t}", tid, t), b.load(f"in_{t}", lane, t, b.binary("lt", lane, 3))] for t in types}
    slot = [0]

    def out(v: Value) -> None:
        b.store(f"out_{v.type}", b.const(slot[0]), v)
        slot[0] += 1

    for t in types:
        a, c = vals[t]
        for name in ("add", "sub", "mul", "min", "max", "div", "rem", "and", "or", "xor", "shl", "shr",
                     "lt", "le", "gt", "ge", "eq", "ne"):
            rtype = BOOL if name in ("lt", "le", "gt", "ge", "eq", "ne") else t
            op = Op(name, [a, c], [b.fresh("r", rtype)])
            if OPS[name].rule(op, _SINK_DECLS) is None:
                b.block.ops.append(op)
                out(op.result)
        if t.is_float:
            out(b.value("fma", [a, c, a], t))
        if t == U32:  # PTX lop3.b32 through the prelude's mdsl::lop3
            out(b.value("lop3", [a, c, a], t, {"lut": 0xEA}))
        out(b.select(b.binary("ne", tid, 0), a, c))
        for d in types:
            out(b.cast(a, d))
            if d != t and d.bits == t.bits:
                out(b.bitcast(a, d))
    vec = b.value("vload", [b.binary("mul", tid, 4), b.binary("lt", tid, 8)], VectorType(F16, 4),
                  {"buffer": "in_f16", "size": 4})
    out(b.value("extract", [vec], F16, {"index": 3}))
    sel = b.binary("and", tid, 3)
    sw = b.op("switch", [sel], [F32, U32], {"cases": (0, 2)})
    for case in range(3):
        with b.region() as region:
            sw.regions.append(region)
            b.yield_(b.const(float(case) + 0.5, F32), b.const(case))
    out(sw.results[0])
    cond = b.binary("gt", sw.results[1], 0)
    branch = b.op("if", [cond], [F16])
    for value in (1.0, -2.0):
        with b.region() as region:
            branch.regions.append(region)
            b.yield_(b.const(value, F16))
    out(branch.result)
    i, acc, prev = b.fresh("i", U32), b.fresh("acc", U32), b.fresh("prev", U32)
    loop = b.op("for", [b.const(0), sw.results[1], b.const(1), b.const(1), b.const(0)], [U32, U32])
    with b.region([i, acc, prev]) as body:
        loop.regions.append(body)
        b.yield_(prev, b.binary("add", acc, i))  # a swap: assignment through temporaries
    out(loop.results[0])
    out(b.value("atomic_add", [b.const(0), b.const(1)], U32, {"buffer": "out_u32"}))
    out(b.load("out_u32", b.const(1), U32))  # a readwrite buffer: read through L2
    b.op("fence", attrs={"scope": "threadgroup"})
    b.barrier("simdgroup")
    kernel = Kernel("every_rule", threads=64, grid=(GridDim(None, 1, 2), GridDim(None), GridDim(None)),
                    body=b.blocks[0], buffers=[*_SINK_DECLS.buffers], scalars=[])
    verify(kernel)
    return kernel


class _Decls:
    """The every-rule kernel's buffers, enough of a Kernel for the ops' type rules."""

    buffers = ([BufferParam(f"in_{n}", ScalarType(n), "read") for n in SCALAR_NAMES]
               + [BufferParam(f"out_{n}", ScalarType(n), "readwrite" if n == "u32" else "write")
                  for n in SCALAR_NAMES])

    def symbol(self, name):
        return next(b for b in self.buffers if b.name == name)


_SINK_DECLS = _Decls()


def test_every_scalar_rule_prints():
    src = print_cuda(_every_scalar_rule_kernel())
    for needle in ("__hmin(", "__hmax(", "fminf(", "__hsub_rn(", "__fsub_rn(", "__hfma(", "__fmaf_rn(",
                   "__uint_as_float(", "__float_as_uint(", "__ushort_as_bfloat16(", "__bfloat16_as_ushort(",
                   "__uint2bfloat16_rn(", "__ushort2half_rn(", "__float2uint_rz(", "(int32_t)((uint32_t)",
                   "((uint8_t)(", "switch (", "case 2u: {", "default: {", "_next = ", "__ldcg(&out_u32[",
                   "atomicAdd(&out_u32[", "__threadfence_block();", "__syncwarp();", ".v[3]"):
        assert needle in src.body, needle


@needs_nvcc
def test_every_scalar_rule_compiles(tmp_path):
    results = nvcc_check([print_cuda(_every_scalar_rule_kernel())], archs=("sm_80",), jobs=1, cache_dir=tmp_path)
    assert all(r.ok for r in results), results[0].log


def test_rejects_what_cuda_cannot_express():
    kernel = _tiny_kernel()
    kernel.buffers[1] = BufferParam("threadIdx", F16, "write")
    for op in kernel.walk():
        if op.attrs.get("buffer") == "y":
            op.attrs["buffer"] = "threadIdx"
    with pytest.raises(CompileError, match="threadIdx"):
        print_cuda(kernel)
    kernel = _tiny_kernel()
    with pytest.raises(CompileError, match="inout input"):
        print_cuda(kernel, inout_inputs=["y"])
    # an 8x8 fragment (Metal's shape) has no m16n8k16 spelling
    b = Builder()
    b.value("frag_zero", [], FragmentType("c", F32, 8, 8))
    k8 = Kernel("k8", threads=32, grid=(GridDim(None),) * 3, body=b.blocks[0],
                buffers=[BufferParam("y", F32, "write")])
    with pytest.raises(CompileError, match="m16n8k16"):
        print_cuda(k8)
    big = Kernel("big", threads=32, grid=(GridDim(None),) * 3, body=Builder().blocks[0],
                 buffers=[BufferParam("y", F32, "write")], shared=[SharedArray("s", F32, 64 * 1024)])
    with pytest.raises(CompileError, match="shared memory"):
        print_cuda(big)


# ----- the prelude's fragment layouts against the PTX ISA, on the host -------------------------------

# PTX ISA 9.7.14.5.8 (mma.m16n8k16, .f16/.bf16): g = lane >> 2, t = lane % 4.
def _ptx_a(lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane % 4
    row = g if (i < 2 or 4 <= i < 6) else g + 8
    col = t * 2 + (i & 1) + (8 if i >= 4 else 0)
    return row, col


def _ptx_b(lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane % 4
    return t * 2 + (i & 1) + (8 if i >= 2 else 0), g


def _ptx_c(lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane % 4
    return (g if i < 2 else g + 8), t * 2 + (i & 1)


#: Stand-ins for the cuda_fp16/cuda_bf16 pieces the prelude uses, for hosts without CUDA's headers
#: (g++ 12+ has _Float16 with round-to-nearest-even conversions).
_HOST_HALF_TYPES = r"""
#define MDSL_HOST_HALF_TYPES
#include <cstring>
struct __half { unsigned short x; };
struct __nv_bfloat16 { unsigned short x; };
inline unsigned short __half_as_ushort(__half v) { return v.x; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 v) { return v.x; }
inline __half __ushort_as_half(unsigned short x) { return {x}; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short x) { return {x}; }
struct __half2 { __half x, y; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
inline __half2 __halves2half2(__half a, __half b) { return {a, b}; }
inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return {a, b}; }
inline __half __float2half_rn(float f) {
  _Float16 h = (_Float16)f; __half r; std::memcpy(&r.x, &h, 2); return r;
}
inline float __half2float(__half v) { _Float16 h; std::memcpy(&h, &v.x, 2); return (float)h; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u; std::memcpy(&u, &f, 4); u += 0x7FFFu + ((u >> 16) & 1u); return {(unsigned short)(u >> 16)};
}
"""

_HOST_PROGRAM = r"""
#define MDSL_HOST_LAYOUT_CHECK
#define __device__
#define __forceinline__ inline
#include <cstdint>
#include <cstdio>
struct mdsl_dim3 { unsigned x, y, z; };
static mdsl_dim3 threadIdx;
/*HALF_TYPES*/
#include "cuda_prelude.cuh"

template <typename T> static void fill(T* p, int n) {
  for (int i = 0; i < n; ++i) p[i] = __ushort_as_half((unsigned short)i);
}
template <> void fill<__nv_bfloat16>(__nv_bfloat16* p, int n) {
  for (int i = 0; i < n; ++i) p[i] = __ushort_as_bfloat16((unsigned short)i);
}

template <typename T> static void run(const char* tag) {
  static T mem[4096];
  fill(mem, 4096);
  for (unsigned warp = 0; warp < 2; ++warp)
    for (unsigned lane = 0; lane < 32; ++lane) {
      threadIdx.x = warp * 32 + lane;
      auto a0 = mdsl::load_a<24, false>(mem + 50);   // 32-bit reads (even offset, even LD)
      auto a1 = mdsl::load_a<24, false>(mem + 51);   // 16-bit reads (odd offset)
      auto a2 = mdsl::load_a<20, true>(mem + 7);
      auto b0 = mdsl::load_b<40, false>(mem + 9);
      auto b1 = mdsl::load_b<18, true>(mem + 36);
      auto b2 = mdsl::load_b<18, true>(mem + 37);
      printf("%s %u %u A0 %u %u %u %u\n", tag, warp, lane, a0.x[0], a0.x[1], a0.x[2], a0.x[3]);
      printf("%s %u %u A1 %u %u %u %u\n", tag, warp, lane, a1.x[0], a1.x[1], a1.x[2], a1.x[3]);
      printf("%s %u %u A2 %u %u %u %u\n", tag, warp, lane, a2.x[0], a2.x[1], a2.x[2], a2.x[3]);
      printf("%s %u %u B0 %u %u\n", tag, warp, lane, b0.x[0], b0.x[1]);
      printf("%s %u %u B1 %u %u\n", tag, warp, lane, b1.x[0], b1.x[1]);
      printf("%s %u %u B2 %u %u\n", tag, warp, lane, b2.x[0], b2.x[1]);
    }
}

int main() {
  run<__half>("h");
  run<__nv_bfloat16>("b");
  // store_c: lane l's element i holds 1000 * l + i; C tile at offset 5, leading dimension 12
  static float cf[16 * 12 + 16];
  static __half ch[16 * 12 + 16];
  for (int i = 0; i < 16 * 12 + 16; ++i) { cf[i] = -1.0f; ch[i] = __float2half_rn(-1.0f); }
  for (unsigned lane = 0; lane < 32; ++lane) {
    threadIdx.x = 64 + lane;
    mdsl::frag_c f;
    for (int i = 0; i < 4; ++i) f.x[i] = float(1000 * lane + i);
    mdsl::store_c<12>(cf + 5, f);
    mdsl::frag_c small;
    for (int i = 0; i < 4; ++i) small.x[i] = float(8 * lane + i) + 0.25f;  // rounds to nearest even in f16
    mdsl::store_c<12>(ch + 5, small);
  }
  for (int i = 0; i < 16 * 12 + 16; ++i) printf("C %d %.2f %.4f\n", i, cf[i], __half2float(ch[i]));
  mdsl::frag_c z = mdsl::zero_c();
  printf("Z %g %g %g %g\n", z.x[0], z.x[1], z.x[2], z.x[3]);
  return 0;
}
"""


@pytest.mark.skipif(GXX is None, reason="needs g++ to build the prelude for the host")
@pytest.mark.parametrize("half_types", ["cuda", "stand-in"])
def test_prelude_fragment_layouts_match_ptx(tmp_path, half_types):
    """The registers each lane loads and stores, against the PTX ISA's formulas (both the
    32-bit and the 16-bit read paths, transposed and not, f16 and bf16)."""
    if half_types == "cuda" and CUDA_INCLUDE is None:
        pytest.skip("the CUDA headers (cuda_fp16.h) are not installed")
    src = tmp_path / "layout.cpp"
    src.write_text(_HOST_PROGRAM.replace("/*HALF_TYPES*/", _HOST_HALF_TYPES if half_types == "stand-in" else ""))
    exe = tmp_path / "layout"
    include = [f"-I{CUDA_INCLUDE}"] if half_types == "cuda" else []
    proc = subprocess.run([GXX, "-std=c++17", "-O1", f"-I{ROOT / 'codegen'}", *include, "-o", str(exe),
                           str(src)], capture_output=True, text=True)
    if proc.returncode != 0 and half_types == "stand-in" and "_Float16" in proc.stderr:
        pytest.skip("this g++ has no _Float16 for the half-type stand-ins")
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()
    # (base offset, leading dimension, transposed) of each load in the program
    loads = {"A0": (50, 24, False), "A1": (51, 24, False), "A2": (7, 20, True),
             "B0": (9, 40, False), "B1": (36, 18, True), "B2": (37, 18, True)}
    seen = set()
    for line in out:
        parts = line.split()
        if parts[0] not in ("h", "b"):
            continue
        tag, warp, lane, what, regs = parts[0], int(parts[1]), int(parts[2]), parts[3], [int(v) for v in parts[4:]]
        base, ld, trans = loads[what]
        layout = _ptx_a if what.startswith("A") else _ptx_b
        for i in range(2 * len(regs)):
            r, c = layout(lane, i)
            want = base + (c * ld + r if trans else r * ld + c)
            got = (regs[i // 2] >> (16 * (i % 2))) & 0xFFFF  # element 2j in the low half of register j
            assert got == want, (tag, warp, lane, what, i, got, want)
        seen.add((tag, what))
    assert len(seen) == 12
    cvals = {int(p[1]): (float(p[2]), float(p[3])) for p in (line.split() for line in out) if p[0] == "C"}
    expect_f = {i: -1.0 for i in cvals}
    expect_h = {i: -1.0 for i in cvals}
    for lane in range(32):
        for i in range(4):
            r, c = _ptx_c(lane, i)
            expect_f[5 + r * 12 + c] = 1000.0 * lane + i
            expect_h[5 + r * 12 + c] = float(np.float16(8 * lane + i + 0.25))
    assert {i: v[0] for i, v in cvals.items()} == expect_f
    assert {i: v[1] for i, v in cvals.items()} == expect_h
    assert any(line == "Z 0 0 0 0" for line in out)


# ----- the launcher, with an interpreter standing in for mx.fast.cuda_kernel -------------------------

class _InterpretedCudaKernel:
    """What `mx.fast.cuda_kernel(...)` returns, running the kernel's IR instead of its CUDA text."""

    calls: list[dict] = []

    def __init__(self, kernel: Kernel, name, input_names, output_names, source, header, **_):
        self.kernel, self.name = kernel, name
        self.input_names, self.output_names = list(input_names), list(output_names)
        # MLX is handed #include lines of files that hold the compact text (launch_text.py)
        assert len(source) < 300 and len(header) < 300 and source.startswith("#include")
        self.source, self.header = expand(source), expand(header)
        assert "mdsl::" in self.source and "namespace mdsl" in self.header

    def __call__(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup, init_value=None,
                 verbose=False, template=None, stream=None):
        import mlx.core as mx

        assert len(inputs) == len(self.input_names) and len(output_shapes) == len(self.output_names)
        arrays = {}
        for name, arr in zip(self.input_names, inputs):
            arrays[name] = np.array(arr.astype(mx.float32) if arr.dtype == mx.bfloat16 else arr).ravel()
        dims = arrays.pop("dims")
        assert dims.dtype == np.uint32
        scalars = dict(zip("MNK", (int(v) for v in dims)))
        (gx, gy, gz), threads = launch_size(self.kernel, scalars)
        assert tuple(threadgroup) == (threads, 1, 1) and tuple(grid) == (gx * threads, gy, gz)
        for name, shape, dtype in zip(self.output_names, output_shapes, output_dtypes):
            hold = np.float32 if dtype in (mx.float32, mx.bfloat16) else {mx.float16: np.float16,
                                                                          mx.uint32: np.uint32}[dtype]
            fill = np.nan if init_value is None else init_value
            arrays[name] = np.full(int(np.prod(shape)), fill, dtype=hold)
        assert init_value is not None and np.isnan(init_value)  # outputs poisoned
        out = run_kernel(self.kernel, arrays, scalars)
        self.calls.append({"inputs": self.input_names, "grid": grid, "scalars": scalars,
                           "state": {n: out[n] for n in out if n not in self.output_names}})
        return [mx.array(out[name][: int(np.prod(shape))]).astype(dtype).reshape(shape)  # the shape asked for
                for name, shape, dtype in zip(self.output_names, output_shapes, output_dtypes)]


@pytest.mark.parametrize("fmt,pipeline,act", [("int4", "striped", "f16"), ("nf4", "double_buffered", "bf16")])
def test_launcher_conventions_with_interpreted_kernel(printed, monkeypatch, fmt, pipeline, act):
    mx = pytest.importorskip("mlx.core")
    kernel, src = printed[(fmt, pipeline, act)]
    monkeypatch.setattr(mx.fast, "cuda_kernel", lambda **kw: _InterpretedCudaKernel(kernel, **kw))
    _InterpretedCudaKernel.calls.clear()
    rng = np.random.default_rng(7)
    m, n, k = 3, 80, 256
    from marlin_dsl.ir.numerics import round_to_activation
    from marlin_dsl.checks.format_check import sample_weights

    packed = md.pack(md.builtin_format(fmt), sample_weights(md.builtin_format(fmt), k, n, rng))
    gemm = build_cuda_kernel(kernel)
    assert gemm.source.full_source() == src.full_source()
    assert gemm.name.startswith(kernel.name + "_") and len(gemm.name) == len(kernel.name) + 13
    x = rng.standard_normal((m, k))
    xa = round_to_activation(x, act).astype(np.float32)
    y = gemm(packed, x)
    compact = gemm.source.compact()
    assert (gemm.kernel.source, gemm.kernel.header) == (compact.body, compact.header)
    assert tuple(y.shape) == (m, n) and y.dtype == (mx.float16 if act == "f16" else mx.bfloat16)
    got = np.array(y.astype(mx.float32)).astype(np.float64)
    ref = md.reference_matmul(xa.astype(np.float64), packed)
    assert not np.isnan(got).any()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < (2e-3 if act == "f16" else 1.6e-2)
    (call,) = _InterpretedCudaKernel.calls
    assert call["inputs"] == src.input_names and call["scalars"] == {"M": m, "N": n, "K": k}
    for name, state in call["state"].items():  # the counters came in zeroed and were left zeroed
        assert name == "counters" and state.size == 2 and not state.any()


def test_gpu_script_imports_without_compiler_dependencies(tmp_path):
    """On the GPU machine only numpy + mlx + marlin_dsl's numpy parts may be needed."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from prepare_gpu_kernels import prepare
    finally:
        sys.path.remove(str(ROOT / "bench"))
    prepare(tmp_path, ["int4"], ["striped"], ["f16"], list(ARCHS), check=False, jobs=1)
    code = f"""
import sys
sys.modules['networkx'] = None; sys.modules['lark'] = None
sys.path.insert(0, {str(ROOT / 'bench')!r})
import gpu_correctness as g
import argparse
log = g.Log(None)
args = argparse.Namespace(kernels={str(tmp_path)!r}, formats=None, pipelines=None, activations=None)
(e,) = g.load_kernels(args, log)
from marlin_dsl.targets.cuda.launch import build_cuda_kernel
gemm = build_cuda_kernel(e['source'])
assert gemm.sizes(3, 80, 256) == {{'partials': 2 * 2 * 64 * 64, 'y': 240, 'counters': 2}}, gemm.sizes(3, 80, 256)
print('OK', e['name'], sorted(m for m in sys.modules if m.startswith('marlin_dsl.')))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "\nOK gemm_int4_striped_f16" in proc.stdout
    assert "marlin_dsl.compiler" not in proc.stdout and "marlin_dsl.passes" not in proc.stdout


# ----- on a GPU (MLX with its CUDA backend) ------------------------------------------------------------

def _mlx_cuda() -> bool:
    try:
        import mlx.core as mx

        return bool(mx.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _mlx_cuda(), reason="needs MLX with its CUDA backend and an NVIDIA GPU")
@pytest.mark.parametrize("pipeline", list(PIPELINES))
@pytest.mark.parametrize("fmt", FORMATS)
def test_kernels_on_gpu(printed, fmt, pipeline):
    from marlin_dsl.checks.kernel_check import check_kernel, check_shapes

    execute = cuda_executor()
    for act in ACTIVATIONS:
        kernel, _ = printed[(fmt, pipeline, act)]
        gemm = _gemm(fmt, pipeline, act)
        for shape in check_shapes(gemm):
            result = check_kernel(gemm, kernel, shape, np.random.default_rng(0), execute=execute)
            assert result.ok, (act, result)


def test_compile_writes_a_cuda_translation_unit(tmp_path) -> None:
    """`marlin-dsl compile --target cuda -o DIR` writes each kernel's IR, a complete .cu file
    (the text nvcc checks) and its manifest, deterministic across runs."""
    from pathlib import Path

    from marlin_dsl.cli import main
    from marlin_dsl.spec import load_spec

    spec = Path(__file__).resolve().parent.parent / "examples" / "sparse_2of4.py"
    for out in (tmp_path / "a", tmp_path / "b"):
        assert main(["compile", str(spec), "--target", "cuda", "--no-check", "-o", str(out)]) == 0
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    gemms = len(load_spec(spec).gemms)  # (its first-generation and weight-stream kernels)
    assert {p.suffix for p in files} == {".cu", ".ir", ".json"} and len(files) == 3 * gemms
    for rel in files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()
    text = (tmp_path / "a" / "sparse_2of4" / "fp4_2of4_g128_db" / "fp4_2of4_g128_db.cu").read_text()
    assert "mma.sync.aligned.m16n8k16" in text and "__global__" in text
