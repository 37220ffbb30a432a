"""NVRTC through ctypes (marlin_dsl/targets/cuda/nvrtc.py): finding the library (an explicit
path, one already loaded, the pip wheels, a toolkit), a clear error naming where it looked,
real printed kernels compiled to cubins for sm_80 and sm_90a (and PTX whose target says
sm_90a), compile errors with NVRTC's log and the kernel's name, and the per-user cache.

The compiling tests need libnvrtc and the CUDA headers (`pip install 'nvidia-cuda-nvrtc==13.*'`,
which the test extra brings on Linux x86_64, and a CUDA toolkit's include folder) and are
skipped with the reason otherwise; discovery and the cache are tested everywhere."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import marlin_dsl as md
from marlin_dsl.cli import exit_code
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.errors import CompileError, EnvironmentUnavailable
from marlin_dsl.targets.cuda import nvrtc
from marlin_dsl.targets.cuda.printer import CudaSource, print_cuda

ROOT = Path(__file__).resolve().parent.parent


def _nvrtc_ready() -> str | None:
    """None when libnvrtc and the headers are there, else why not."""
    try:
        nvrtc.nvrtc_version()
        nvrtc.cuda_include_paths()
    except EnvironmentUnavailable as e:
        return str(e)
    return None


WHY_NOT = _nvrtc_ready()
needs_nvrtc = pytest.mark.skipif(WHY_NOT is not None, reason=f"NVRTC compiles need libnvrtc and the CUDA "
                                                              f"headers: {WHY_NOT}")

#: One inline-PTX instruction that only the architecture-specific sm_90a target has.
WGMMA_SOURCE = """extern "C" __global__ void wgmma_fence_probe(unsigned* y) {
  asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");
  y[0] = 1u;
}
"""


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MARLIN_DSL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(nvrtc, "_MEMO", {})
    return tmp_path / "cache" / nvrtc.CACHE_PART


@pytest.fixture(scope="module")
def fp4_stream() -> CudaSource:
    """The fp4 weight-stream GEMM a layer runs at M = 1, printed."""
    fmt = md.builtin_format("fp4")
    return print_cuda(compile_gemm(md.Gemm("fp4_m1", fmt, md.tuned_schedule(fmt, 1)), md.CUDA).kernel)


# ----- finding the library ----------------------------------------------------------------------

def _nowhere(monkeypatch, tmp_path: Path) -> None:
    """Every place find_nvrtc looks made empty (tmp folders)."""
    monkeypatch.delenv("MARLIN_DSL_NVRTC", raising=False)
    monkeypatch.setattr(nvrtc, "_loaded_nvrtc", lambda: None)
    monkeypatch.setattr(nvrtc, "_site_dirs", lambda: [tmp_path / "site"])
    monkeypatch.setattr(nvrtc, "_cuda_homes", lambda: [tmp_path / "cuda"])
    monkeypatch.setattr(nvrtc.ctypes.util, "find_library", lambda name: None)


def test_absent_library_names_every_place_looked(tmp_path, monkeypatch):
    _nowhere(monkeypatch, tmp_path)
    with pytest.raises(EnvironmentUnavailable) as err:
        nvrtc.find_nvrtc()
    text = str(err.value)
    for place in (tmp_path / "site" / "nvidia" / "cu13" / "lib", tmp_path / "site" / "nvidia" / "cuda_nvrtc" / "lib",
                  tmp_path / "cuda" / "lib64", "loaded in this process", "ctypes.util.find_library",
                  "nvidia-cuda-nvrtc", "MARLIN_DSL_NVRTC"):
        assert str(place) in text, place
    assert exit_code(err.value) == 4  # the CLI's "missing GPU or compiler"


def test_wheel_layout_is_found_and_builtins_are_not_the_library(tmp_path, monkeypatch):
    _nowhere(monkeypatch, tmp_path)
    lib = tmp_path / "site" / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    for name in ("libnvrtc-builtins.so.13.5", "libnvrtc.so", "libnvrtc.so.13"):
        (lib / name).write_bytes(b"")
    assert nvrtc.find_nvrtc() == str(lib / "libnvrtc.so.13")  # the versioned name, not the dev link
    toolkit = tmp_path / "cuda" / "lib64"
    toolkit.mkdir(parents=True)
    (toolkit / "libnvrtc.so.12").write_bytes(b"")
    assert nvrtc.find_nvrtc() == str(lib / "libnvrtc.so.13")  # site-packages before the toolkit
    monkeypatch.setattr(nvrtc, "_loaded_nvrtc", lambda: str(toolkit / "libnvrtc.so.12"))
    assert nvrtc.find_nvrtc() == str(toolkit / "libnvrtc.so.12")  # the process's own (MLX's) first


def test_env_override_wins_and_a_bad_one_is_named(tmp_path, monkeypatch):
    fake = tmp_path / "my_nvrtc.so"
    fake.write_bytes(b"")
    monkeypatch.setenv("MARLIN_DSL_NVRTC", str(fake))
    assert nvrtc.find_nvrtc() == str(fake)
    monkeypatch.setenv("MARLIN_DSL_NVRTC", str(tmp_path / "missing.so"))
    with pytest.raises(EnvironmentUnavailable, match="MARLIN_DSL_NVRTC=.*missing.so.*is not a file"):
        nvrtc.find_nvrtc()
    monkeypatch.setenv("MARLIN_DSL_NVRTC", str(fake))  # a file that is no library
    monkeypatch.setattr(nvrtc, "_LIB", None)
    with pytest.raises(EnvironmentUnavailable, match="cannot load"):
        nvrtc.nvrtc_version()


def test_missing_headers_are_named(tmp_path, monkeypatch):
    monkeypatch.setattr(nvrtc, "_site_dirs", lambda: [tmp_path / "site"])
    monkeypatch.setattr(nvrtc, "_cuda_homes", lambda: [tmp_path / "cuda"])
    monkeypatch.setattr(nvrtc, "_mlx_cccl", lambda: [])
    with pytest.raises(EnvironmentUnavailable, match=r"cuda_fp16\.h \(looked in .*cuda/include") as err:
        nvrtc.cuda_include_paths()
    assert "cuda/std/cstdint" in str(err.value)
    (tmp_path / "cuda" / "include" / "cccl" / "cuda" / "std").mkdir(parents=True)
    (tmp_path / "cuda" / "include" / "cccl" / "cuda" / "std" / "cstdint").write_text("")
    (tmp_path / "cuda" / "include" / "cuda_fp16.h").write_text("")
    assert nvrtc.cuda_include_paths() == [str(tmp_path / "cuda" / "include" / "cccl"),
                                          str(tmp_path / "cuda" / "include")]


@needs_nvrtc
def test_a_library_loaded_in_the_process_is_found(monkeypatch):
    """What MLX's CUDA backend loads is what we compile with: read from /proc/self/maps."""
    monkeypatch.delenv("MARLIN_DSL_NVRTC", raising=False)
    nvrtc.nvrtc_version()  # loads it
    loaded = nvrtc._loaded_nvrtc()
    assert loaded is not None and os.path.realpath(loaded) == os.path.realpath(nvrtc._LIB_PATH)
    assert nvrtc.find_nvrtc() == loaded
    assert nvrtc.nvrtc_version() >= (12, 0)


def test_importing_needs_neither_mlx_nor_nvrtc():
    code = ("import sys; sys.modules['mlx'] = None\n"
            "import marlin_dsl.targets.cuda.nvrtc, marlin_dsl.targets.cuda.launch_precompiled\n"
            "import marlin_dsl.targets.cuda.launch\n"
            "print('OK', 'mlx.core' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["OK", "False"]


# ----- compiling --------------------------------------------------------------------------------

@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_printed_gemm_compiles_to_a_cubin(fp4_stream, cache, arch):
    name = f"{fp4_stream.name}_{fp4_stream.digest[:12]}"
    for src in (fp4_stream, fp4_stream.compact()):  # the launcher compiles the compact text
        text = src.precompiled_source(name)
        # 512 threads: the signature carries the block's register budget (print_sync.launch_bounds)
        assert f'extern "C" __global__ void __launch_bounds__(512, 1) {name}(' in text
        cubin = nvrtc.compile_cuda(text, name, arch)
        assert cubin[:4] == b"\x7fELF" and name.encode() in cubin  # the function MLX looks up by name
    assert len(list(cache.glob(f"*-{arch}.cubin"))) == 2


@needs_nvrtc
def test_ptx_names_the_architecture(fp4_stream, cache):
    ptx = nvrtc.compile_cuda(fp4_stream.precompiled_source("k"), "k", "compute_90a").decode()
    assert ".target sm_90a" in ptx and ".visible .entry k(" in ptx and "mma.sync.aligned.m16n8k16" in ptx


@needs_nvrtc
def test_wgmma_needs_sm90a(cache):
    """Why the precompiled path exists: plain sm_90 (what MLX's JIT targets) has no wgmma."""
    assert nvrtc.compile_cuda(WGMMA_SOURCE, "wgmma_fence_probe", "sm_90a")[:4] == b"\x7fELF"
    with pytest.raises(CompileError, match=r"(?s)kernel wgmma_fence_probe does not compile for sm_90 .*wgmma"):
        nvrtc.compile_cuda(WGMMA_SOURCE, "wgmma_fence_probe", "sm_90")


@needs_nvrtc
def test_compile_error_carries_the_log_and_the_kernel_name(fp4_stream, cache):
    broken = CudaSource(**{**fp4_stream.__dict__, "body": fp4_stream.body + "  undefined_thing();\n"})
    with pytest.raises(CompileError) as err:
        nvrtc.compile_cuda(broken.precompiled_source("broken_k"), "broken_k", "sm_90")
    text = str(err.value)
    assert "kernel broken_k" in text and "sm_90" in text and "undefined_thing" in text and "broken_k.cu(" in text
    assert not list(cache.glob("*.cubin"))  # nothing cached for a failure


def test_unknown_architecture_is_refused(cache):
    with pytest.raises(CompileError, match="architecture 'hopper'"):
        nvrtc.compile_cuda("", "k", "hopper")


# ----- the cache ---------------------------------------------------------------------------------

def test_cache_hits_and_misses(cache, monkeypatch):
    """Keyed by source, architecture, options and NVRTC version; on disk across processes (the
    in-process memo cleared), not at all with cache=False. No libnvrtc needed: the compiler is
    a stand-in that counts its runs."""
    runs: list[tuple[str, str]] = []

    def fake_compile(source: str, name: str, arch: str, options: list[str]) -> bytes:
        runs.append((name, arch))
        return b"CUBIN " + source.encode() + b" " + " ".join(options).encode()

    version = [(13, 5)]
    monkeypatch.setattr(nvrtc, "_nvrtc_compile", fake_compile)
    monkeypatch.setattr(nvrtc, "nvrtc_version", lambda: version[0])
    monkeypatch.setattr(nvrtc, "cuda_include_paths", lambda: ["/inc"])

    first = nvrtc.compile_cuda("src A", "a", "sm_90a")
    assert first.startswith(b"CUBIN src A --gpu-architecture=sm_90a --include-path=/inc --std=c++17")
    assert nvrtc.compile_cuda("src A", "a", "sm_90a") == first and len(runs) == 1  # memo
    nvrtc._MEMO.clear()
    assert nvrtc.compile_cuda("src A", "a", "sm_90a") == first and len(runs) == 1  # disk
    (entry,) = cache.glob("*-sm_90a.cubin")
    assert entry.read_bytes() == first
    nvrtc.compile_cuda("src B", "a", "sm_90a")
    nvrtc.compile_cuda("src A", "a", "sm_80")
    nvrtc.compile_cuda("src A", "a", "sm_90a", options=("--std=c++20",))
    version[0] = (13, 6)
    nvrtc.compile_cuda("src A", "a", "sm_90a")
    assert len(runs) == 5 and len(list(cache.iterdir())) == 5
    nvrtc.compile_cuda("src A", "a", "sm_90a", cache=False)
    assert len(runs) == 6
    ptx = nvrtc.compile_cuda("src A", "a", "compute_90a")
    assert len(list(cache.glob("*-compute_90a.ptx"))) == 1 and ptx.startswith(b"CUBIN")
    # a damaged (empty) entry is compiled again
    nvrtc._MEMO.clear()
    version[0] = (13, 5)
    entry.write_bytes(b"")
    assert nvrtc.compile_cuda("src A", "a", "sm_90a") == first and len(runs) == 8
    assert entry.read_bytes() == first
    assert not [p for p in cache.iterdir() if p.name.startswith(".tmp_")]


def test_unwritable_cache_still_compiles(tmp_path, monkeypatch):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    monkeypatch.setenv("MARLIN_DSL_CACHE", str(blocker))
    monkeypatch.setattr(nvrtc, "_MEMO", {})
    monkeypatch.setattr(nvrtc, "_nvrtc_compile", lambda source, name, arch, options: b"CUBIN")
    monkeypatch.setattr(nvrtc, "nvrtc_version", lambda: (13, 5))
    monkeypatch.setattr(nvrtc, "cuda_include_paths", lambda: ["/inc"])
    assert nvrtc.compile_cuda("src", "k", "sm_90") == b"CUBIN"
