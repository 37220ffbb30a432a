"""The precompiled launch path (targets/cuda/launch_precompiled.py) without a GPU: which kernels
take it (an architecture-specific `cuda_arch`, or all under $MARLIN_DSL_CUDA_LAUNCH), the
architecture each is compiled for, and the exact arguments handed to
`mx.fast.precompiled_cuda_kernel`, checked against a stand-in that runs the kernel's IR in the
interpreter with the inputs in the order they arrive (so a misordered argument gives a wrong
product) and against what the `mx.fast.cuda_kernel` path hands MLX for the same launch. NVRTC is
a recording stand-in here (tests/test_nvrtc.py compiles for real); the dry run of
bench/probes/launch_path_bench.py compiles for real where libnvrtc is installed."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl import CUDA, Gemm, Schedule, StripedKParallel
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.errors import CompileError, EnvironmentUnavailable, MarlinDSLError
from marlin_dsl.ir.interpret import launch_size, run_kernel
from marlin_dsl.targets.cuda import launch_precompiled as lp
from marlin_dsl.targets.cuda.launch import CudaLaunch, build_cuda_kernel, mlx_kernel
from marlin_dsl.targets.cuda.printer import print_cuda

mx = pytest.importorskip("mlx.core")
ROOT = Path(__file__).resolve().parent.parent
NAN = float("nan")


class _Recorder:
    """Stand-ins for NVRTC, mx.fast.precompiled_cuda_kernel and mx.fast.cuda_kernel."""

    def __init__(self) -> None:
        self.compiles: list[tuple[str, str, str]] = []
        self.precompiled: list[dict] = []
        self.cuda_kernel: list[dict] = []
        self.kernels: dict[str, object] = {}  # launch name -> IR kernel run by the interpreter
        self.sources: dict[str, object] = {}  # launch name -> the CudaSource compiled under it

    def compile(self, text: str, name: str, arch: str) -> bytes:
        self.compiles.append((text, name, arch))
        return f"CUBIN {name} {arch}".encode()

    def _outputs(self, name, input_names, output_names, inputs, output_shapes, output_dtypes, init_value):
        kernel = self.kernels.get(name)
        if kernel is None:
            return [mx.zeros(s, dtype=d) for s, d in zip(output_shapes, output_dtypes)]
        buffers = {n: np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a).ravel()
                   for n, a in zip(input_names, inputs)}
        scalars = dict(zip("MNK", (int(v) for v in buffers.pop("dims"))))
        for n, shape in zip(output_names, output_shapes):
            buffers[n] = np.full(math.prod(shape), NAN if init_value is None else init_value, np.float32)
        out = run_kernel(kernel, buffers, scalars)
        return [mx.array(out[n][: math.prod(s)]).reshape(s).astype(d)
                for n, s, d in zip(output_names, output_shapes, output_dtypes)]

    def precompiled_cuda_kernel(self, *, name, compiled_source, inputs, output_shapes, output_dtypes, scalars,
                                grid, threadgroup, shared_memory=0, init_value=None, ensure_row_contiguous=False,
                                stream=None):
        """MLX's signature: keyword-only, as the 0.32.4 binding declares it."""
        call = dict(name=name, compiled_source=compiled_source, inputs=list(inputs),
                    output_shapes=[tuple(s) for s in output_shapes], output_dtypes=list(output_dtypes),
                    scalars=list(scalars), grid=tuple(grid), threadgroup=tuple(threadgroup),
                    shared_memory=shared_memory, init_value=init_value,
                    ensure_row_contiguous=ensure_row_contiguous, stream=stream)
        self.precompiled.append(call)
        src = self.sources[name]
        return self._outputs(name, src.input_names, src.output_names, inputs, output_shapes, output_dtypes,
                             init_value)

    def make_cuda_kernel(self, name, input_names, output_names, source, header, **opts):
        def launch(*, inputs, output_shapes, output_dtypes, grid, threadgroup, init_value=None, verbose=False,
                   template=None, stream=None):
            self.cuda_kernel.append(dict(name=name, inputs=list(inputs), output_shapes=[tuple(s) for s in output_shapes],
                                         output_dtypes=list(output_dtypes), grid=tuple(grid),
                                         threadgroup=tuple(threadgroup), init_value=init_value,
                                         shared_memory=opts.get("shared_memory", 0)))
            return self._outputs(name, input_names, output_names, inputs, output_shapes, output_dtypes, init_value)
        return launch


@pytest.fixture
def rec(monkeypatch) -> _Recorder:
    r = _Recorder()
    real = lp.PrecompiledKernel.__init__

    def init(self, source, name, arch):  # remember what each launch name runs
        real(self, source, name, arch)
        r.sources[name] = source

    monkeypatch.setattr(lp.PrecompiledKernel, "__init__", init)
    monkeypatch.setattr(lp, "compile_cuda", r.compile)
    monkeypatch.setattr(lp, "device_arch", lambda: "sm_90")
    monkeypatch.setattr(mx.fast, "precompiled_cuda_kernel", r.precompiled_cuda_kernel)
    monkeypatch.setattr(mx.fast, "cuda_kernel", r.make_cuda_kernel)
    monkeypatch.delenv("MARLIN_DSL_CUDA_LAUNCH", raising=False)
    return r


def _striped() -> md.Gemm:
    return Gemm("pc_int4_striped", md.builtin_format("int4"), Schedule("s", pipeline=StripedKParallel()), "f16")


def _arch_kernel(arch: str):
    """A GEMM kernel (128 threads: no launch bounds of its own) marked as written for `arch`
    (as the lead's wgmma kernels will be)."""
    fmt = md.builtin_format("fp4")
    kernel = compile_gemm(Gemm("pc_fp4_marked", fmt, md.tuned_schedule(fmt, 1, k=256, n=4096)), CUDA).kernel
    kernel.attrs["cuda_arch"] = arch
    return kernel


# ----- the arguments handed to MLX -----------------------------------------------------------------

def test_gemm_launch_arguments_are_exact(rec, monkeypatch):
    """Striped int4: x, qweight, scales, counters (zeroed input), dims -> partials, y."""
    from marlin_dsl.checks.format_check import sample_weights
    from marlin_dsl.ir.numerics import round_to_activation

    monkeypatch.setenv("MARLIN_DSL_CUDA_LAUNCH", "precompiled")
    kernel = compile_gemm(_striped(), CUDA).kernel
    gemm = build_cuda_kernel(kernel)
    rec.kernels[gemm.name] = kernel
    s = gemm.source
    rng = np.random.default_rng(3)
    m, n, k = 3, 80, 256
    fmt = md.builtin_format("int4")
    packed = md.pack(fmt, sample_weights(fmt, k, n, rng))
    weights = gemm.weights(packed)
    x = rng.standard_normal((m, k))
    y = gemm(weights, x)

    # compiled once, for the device, the extern "C" text of the compact source named as launched
    ((text, name, arch),) = rec.compiles
    assert (name, arch) == (gemm.name, "sm_90") and text == s.compact().precompiled_source(gemm.name)
    params = ",\n".join(f"    {p}" for p in s.parameters())
    assert f'extern "C" __global__ void {gemm.name}(\n{params}) {{' in text
    assert s.input_names == ["x", "qweight", "scales", "counters", "dims"] and s.output_names == ["partials", "y"]

    (call,) = rec.precompiled
    assert call["name"] == gemm.name and call["compiled_source"] == f"CUBIN {gemm.name} sm_90".encode()
    assert call["scalars"] == [] and call["ensure_row_contiguous"] is True and call["stream"] is None
    (gx, gy, gz), threads = launch_size(kernel, {"M": m, "N": n, "K": k})  # the interpreter's own count
    assert call["grid"] == (gx * threads, gy, gz) and call["threadgroup"] == (threads, 1, 1)  # in threads
    assert call["shared_memory"] == s.dynamic_shared_bytes == 0
    assert call["init_value"] is not None and math.isnan(call["init_value"])  # outputs poisoned
    assert call["output_shapes"] == [(gemm.sizes(m, n, k)["partials"],), (m, n)]
    assert call["output_dtypes"] == [mx.float32, mx.float16]
    got = dict(zip(s.input_names, call["inputs"]))
    assert got["qweight"] is weights.arrays["qweight"] and got["scales"] is weights.arrays["scales"]
    assert np.array(got["dims"]).tolist() == [m, n, k] and got["dims"].dtype == mx.uint32
    assert not np.array(got["counters"]).any() and got["x"].dtype == mx.float16

    # the product: the interpreter read the inputs in the order they were handed over
    ref = md.reference_matmul(round_to_activation(x, "f16").astype(np.float64), packed)
    out = np.array(y.astype(mx.float32)).astype(np.float64)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-3

    gemm(weights, x, poison=False)
    assert rec.precompiled[-1]["init_value"] is None


@pytest.mark.parametrize("case", ["striped", "multistage"])
def test_both_paths_hand_mlx_the_same_launch(rec, monkeypatch, case):
    """Same inputs, shapes, dtypes, grid, threadgroup, fill value and dynamic shared memory
    (multistage fp4 at M = 256: above 48 KB) through either path."""
    fmt = md.builtin_format("fp4" if case == "multistage" else "int4")
    gemm_decl = _striped() if case == "striped" else Gemm("pc_fp4_ms", fmt, md.multistage_schedule(fmt, 256, None, 4096, 4096))
    kernel = compile_gemm(gemm_decl, CUDA).kernel
    m, n, k = 5, 256, 256
    packed = md.pack(fmt, np.random.default_rng(0).standard_normal((k, n)))
    x = mx.array(np.random.default_rng(1).standard_normal((m, k)).astype(np.float16))
    calls = {}
    for path in ("cuda_kernel", "precompiled"):
        gemm = build_cuda_kernel(kernel, path=path)
        state = {name: mx.zeros((size,), dtype=mx.uint32) for name, size in gemm.sizes(m, n, k).items()
                 if name in gemm.source.inout_inputs}
        gemm(gemm.weights(packed), x, state=state)
        calls[path] = (rec.cuda_kernel if path == "cuda_kernel" else rec.precompiled)[-1]
    a, b = calls["cuda_kernel"], calls["precompiled"]
    for key in ("output_shapes", "output_dtypes", "grid", "threadgroup", "shared_memory"):
        assert a[key] == b[key], key
    assert math.isnan(a["init_value"]) and math.isnan(b["init_value"])
    assert len(a["inputs"]) == len(b["inputs"])
    for u, v in zip(a["inputs"], b["inputs"]):
        assert u.dtype == v.dtype and np.array_equal(np.array(u), np.array(v))
    if case == "multistage":
        assert b["shared_memory"] == print_cuda(kernel).dynamic_shared_bytes > 48000


def test_kernel_launch_of_an_activation_kernel(rec, monkeypatch):
    """CudaLaunch (any kernel: the activation sparsify) takes the precompiled path too."""
    from marlin_dsl.activation import kernels
    from marlin_dsl.formats.activation_spec import SparsifySpec

    x = mx.array(np.random.default_rng(2).standard_normal((16, 64)).astype(np.float16))
    calls = {}
    for path in ("cuda_kernel", "precompiled"):
        monkeypatch.setenv("MARLIN_DSL_CUDA_LAUNCH", path)
        kernels._sparsify_launch.cache_clear()
        kernels.sparsify(x, SparsifySpec("top2"), 0, "cuda", init_value=7)
        calls[path] = (rec.cuda_kernel if path == "cuda_kernel" else rec.precompiled)[-1]
    kernels._sparsify_launch.cache_clear()
    a, b = calls["cuda_kernel"], calls["precompiled"]
    assert b["name"].startswith("sparsify") and b["name"] == rec.compiles[-1][1]
    for key in ("output_shapes", "output_dtypes", "grid", "threadgroup", "init_value"):
        assert a[key] == b[key], key
    assert b["init_value"] == 7.0 and b["scalars"] == []


# ----- which path, which architecture ----------------------------------------------------------------

def test_an_sm90a_kernel_always_launches_precompiled_for_sm90a(rec, monkeypatch):
    kernel = _arch_kernel("sm_90a")
    src = print_cuda(kernel)
    assert src.attrs["cuda_arch"] == "sm_90a"  # the printer copies it
    for env in ("", "cuda_kernel", "precompiled"):
        monkeypatch.setenv("MARLIN_DSL_CUDA_LAUNCH", env)
        assert lp.launch_path(src) == "precompiled"
    gemm = build_cuda_kernel(kernel)
    assert isinstance(gemm.kernel, lp.PrecompiledKernel) and gemm.kernel.arch == "sm_90a"
    assert rec.compiles[-1][2] == "sm_90a" and not rec.cuda_kernel
    with pytest.raises(CompileError, match="sm_90a.*mx.fast.cuda_kernel cannot compile"):
        mlx_kernel(src.compact(), "x", path="cuda_kernel")
    monkeypatch.setattr(lp, "device_arch", lambda: "sm_100")
    with pytest.raises(EnvironmentUnavailable, match="written for sm_90a; this GPU is sm_100"):
        build_cuda_kernel(kernel).kernel


def test_other_kernels_follow_the_environment(rec, monkeypatch):
    kernel = _arch_kernel("sm_80")  # a plain architecture: MLX's JIT (the device's sm_<cc>) serves it
    assert lp.launch_path(print_cuda(kernel)) == "cuda_kernel"
    build_cuda_kernel(kernel).kernel
    assert rec.cuda_kernel == [] and rec.compiles == []  # the cuda_kernel object is made, not launched
    monkeypatch.setenv("MARLIN_DSL_CUDA_LAUNCH", "precompiled")
    pre = build_cuda_kernel(kernel).kernel
    assert isinstance(pre, lp.PrecompiledKernel) and pre.arch == "sm_90"  # the device's, not sm_80
    monkeypatch.setenv("MARLIN_DSL_CUDA_LAUNCH", "nvcc")
    with pytest.raises(MarlinDSLError, match="MARLIN_DSL_CUDA_LAUNCH='nvcc': expected one of cuda_kernel, precompiled"):
        build_cuda_kernel(kernel).kernel
    with pytest.raises(MarlinDSLError, match="launch path 'jit'"):
        mlx_kernel(print_cuda(kernel), "x", path="jit")


def test_layer_kernels_take_the_selected_path(rec, monkeypatch):
    from marlin_dsl.targets.cuda import runtime

    monkeypatch.setenv("MARLIN_DSL_CUDA_LAUNCH", "precompiled")
    runtime.cuda_gemm.cache_clear()
    try:
        lk = runtime.RUNTIME.layer_kernel(md.builtin_format("fp4"), "f16", 1, 256, 256)
    finally:
        runtime.cuda_gemm.cache_clear()
    assert isinstance(lk.kernel, lp.PrecompiledKernel) and lk.kernel.name == rec.compiles[-1][1]
    x = mx.zeros((1, 256), dtype=mx.float16)
    weights = [mx.zeros((8,), dtype=mx.uint32)] * (len(lk.input_names) - 2)
    (y,) = lk.kernel(inputs=[x, *weights, mx.array(lk.dims, dtype=mx.uint32)], output_shapes=[(1, 256)],
                     output_dtypes=[mx.float16], grid=lk.grid, threadgroup=lk.threadgroup, init_value=NAN)
    assert tuple(y.shape) == (1, 256) and rec.precompiled[-1]["grid"] == lk.grid


def test_arch_rules():
    assert [lp.arch_specific(a) for a in ("sm_90a", "sm_100f", "compute_90a", "sm_90", "sm_80", None, "")] == \
        [True, True, True, False, False, False, False]
    src = print_cuda(_arch_kernel("sm_90a"))
    assert lp.kernel_arch(src, "sm_90") == "sm_90a"
    plain = print_cuda(_arch_kernel("sm_80"))
    assert lp.kernel_arch(plain, "sm_90") == "sm_90" and lp.kernel_arch(plain, "sm_120") == "sm_120"


def test_device_arch_reads_mlx(monkeypatch):
    monkeypatch.setattr(mx, "device_info", lambda: {"architecture": "sm_90", "device_name": "H100"}, raising=False)
    assert lp.device_arch() == "sm_90"
    monkeypatch.setattr(mx, "device_info", lambda: {"architecture": "?", "compute_capability_major": 8,
                                                    "compute_capability_minor": 6}, raising=False)
    assert lp.device_arch() == "sm_86"
    monkeypatch.setattr(mx, "device_info", lambda: {"architecture": "x86_64", "device_name": "AMD EPYC"},
                        raising=False)
    with pytest.raises(EnvironmentUnavailable, match="needs MLX's CUDA backend"):
        lp.device_arch()


def test_an_mlx_without_precompiled_kernels_is_named(monkeypatch):
    monkeypatch.delattr(mx.fast, "precompiled_cuda_kernel", raising=False)
    with pytest.raises(EnvironmentUnavailable, match="needs mx.fast.precompiled_cuda_kernel, which MLX .* lacks"):
        lp.precompiled_kernel(print_cuda(_arch_kernel("sm_90a")))


def test_template_arguments_are_refused(rec):
    pre = lp.precompiled_kernel(print_cuda(_arch_kernel("sm_90a")), "k1", "sm_90a")
    with pytest.raises(MarlinDSLError, match="precompiled: it takes no template"):
        pre(inputs=[], output_shapes=[], output_dtypes=[], grid=(1, 1, 1), threadgroup=(1, 1, 1),
            template=[("T", mx.float16)])


# ----- the benchmark's dry run ---------------------------------------------------------------------

def _bench(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "probes" / "launch_path_bench.py"), *args],
                          capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "MARLIN_DSL_CACHE": str(tmp_path / "cache"), **env})


def test_bench_dry_run_compiles_and_shows_the_launches(tmp_path):
    from marlin_dsl.targets.cuda import nvrtc

    try:
        nvrtc.nvrtc_version()
        nvrtc.cuda_include_paths()
    except EnvironmentUnavailable as e:
        pytest.skip(f"the dry run compiles through NVRTC, which needs libnvrtc and the CUDA headers: {e}")
    out = tmp_path / "dry.json"
    proc = _bench(tmp_path, "--dry-run", "--out", str(out), "--shapes", "256x256", "4096x14336")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dry run: 2 cases compiled through NVRTC for sm_90; nothing launched" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["dry_run"] is True and [(c["k"], c["n"], c["m"]) for c in doc["cases"]] == [(256, 256, 1), (4096, 14336, 1)]
    for case in doc["cases"]:
        assert case["arch"] == "sm_90" and case["cubin_bytes"] > 1000 and case["inputs"][-1] == "dims"
        assert case["grid"][0] % case["threadgroup"][0] == 0 and case["cuda_kernel_chars"] < 400
    assert list((tmp_path / "cache" / "nvrtc").glob("*-sm_90.cubin"))


def test_bench_without_nvrtc_exits_4(tmp_path):
    proc = _bench(tmp_path, "--dry-run", "--shapes", "256x256", MARLIN_DSL_NVRTC=str(tmp_path / "none.so"))
    assert proc.returncode == 4 and "MARLIN_DSL_NVRTC" in proc.stderr


def test_bench_measurement_loop_runs_with_stand_ins(rec, tmp_path, monkeypatch):
    """The GPU part of the benchmark (timing in turns, the nobytes probe, the checks, the table)
    run on the CPU with the stand-ins, so a GPU run does not die on a typo."""
    import importlib.util

    monkeypatch.setenv("MARLIN_DSL_CACHE", str(tmp_path / "cache"))
    spec = importlib.util.spec_from_file_location("launch_path_bench", ROOT / "bench" / "probes" / "launch_path_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    p = bench.plan("fp4", 256, 256, 1, "sm_90")
    rows = bench.run_case(p, mx, calls=3, repeats=2)
    assert [r["path"] for r in rows] == list(bench.PATHS)
    assert all(r["same_as_cuda_kernel"] and r["all_written"] and len(r["samples_us"]["call"]) == 2 for r in rows)
    nobytes = [c for c in rec.precompiled if c["compiled_source"] == b"\0"]
    assert nobytes and all(c["name"] == p["kernel"] for c in nobytes)
    rows.append(bench.builtin_row(mx, 1, 256, 256, calls=3, repeats=1))
    text = bench.table(rows)
    assert "precompiled_nobytes" in text and "mx.quantized_matmul" in text and "same, all written" in text
    if not mx.cuda.is_available():
        assert bench.main(["--shapes", "256x256"]) == 4
