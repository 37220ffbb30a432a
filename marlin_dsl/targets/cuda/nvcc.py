"""nvcc compile checks of printed CUDA (no GPU needed): the printed text of `targets/cuda/printer.py`
compiled to a cubin per architecture (the ones asked for, or the one a kernel's `cuda_arch`
attribute names), several kernels per translation unit, cached."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from .source import CudaSource

# No GPU is needed: nvcc compiles the printed text to a cubin per architecture, so the front end,
# NVVM and ptxas (the PTX of the inline mma.sync included) all check it. Several kernels go in one
# translation unit (each in its own namespace; the prelude is guarded), `jobs` nvcc processes at
# a time, and results are cached by a hash of the text, flags and nvcc version.

#: Flags close to NVRTC's defaults under MLX (C++17, optimised, no fast-math).
NVCC_FLAGS = ("-std=c++17",)

#: A stand-in for MLX's `mlx/backend/cuda/device/utils.cuh` (which is not installed with MLX's
#: CPU wheels): what the generated signature relies on, so that `mlx_source()` compiles too.
MLX_UTILS_STUB = """// Stand-in for MLX's device/utils.cuh (written by marlin_dsl.targets.cuda.nvcc for nvcc checks).
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/array>
#include <cuda/std/limits>
#include <cuda/std/tuple>
namespace mlx::core::cu {
using Shape = cuda::std::array<int32_t, 10>;
using Strides = cuda::std::array<int64_t, 10>;
}  // namespace mlx::core::cu
"""


def find_nvcc() -> str | None:
    """$NVCC, else nvcc on PATH, else /usr/local/cuda/bin/nvcc; None when there is none."""
    import os
    import shutil

    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


@dataclass
class NvccResult:
    """One nvcc invocation: some kernels, one architecture."""

    names: list[str]
    arch: str
    ok: bool
    seconds: float
    cached: bool
    log: str = ""
    output: str = ""

    def summary(self) -> str:
        state = "ok" if self.ok else "FAILED"
        how = "cached" if self.cached else f"{self.seconds:.1f} s"
        return f"{self.arch} [{', '.join(self.names)}]: {state} ({how})"


_NVCC_VERSION: dict[str, str] = {}


def _nvcc_version(nvcc: str) -> str:
    import subprocess

    if nvcc not in _NVCC_VERSION:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True)
        _NVCC_VERSION[nvcc] = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else nvcc
    return _NVCC_VERSION[nvcc]


def _cache_dir(cache_dir: str | Path | None) -> Path:
    """`cache_dir`, else $MARLIN_NVCC_CACHE, else the per-user cache's nvcc/ (marlin_dsl/cache.py)."""
    import os

    from ...cache import cache_dir as user_cache_dir

    explicit = cache_dir or os.environ.get("MARLIN_NVCC_CACHE")
    if not explicit:
        return user_cache_dir("nvcc")
    d = Path(explicit)
    d.mkdir(parents=True, exist_ok=True)
    return d


def kernel_archs(source: CudaSource, default: Iterable[str]) -> tuple[str, ...]:
    """The architectures to check `source` for: the one its `cuda_arch` attribute names (a
    kernel written for sm_90a uses instructions that plain sm_80 / sm_90 lack), else `default`."""
    arch = source.attrs.get("cuda_arch")
    return (str(arch),) if arch else tuple(default)


def gencode(arch: str) -> list[str]:
    """nvcc flags for a cubin of exactly `arch` ("sm_80", "sm_90a", ...): real code for that
    target and nothing else (`-arch=sm_90a` would also ask for compute_90a PTX)."""
    if not arch.startswith("sm_"):
        raise ValueError(f"nvcc checks compile cubins: architecture {arch!r} is not sm_<cc>")
    cc = arch[len("sm_"):]
    return [f"-gencode=arch=compute_{cc},code=sm_{cc}"]


def _balanced(sources: list[CudaSource], bins: int) -> list[list[CudaSource]]:
    """Longest-first greedy split by body length (compile time follows it closely)."""
    bins = max(1, min(bins, len(sources)))
    groups: list[list[CudaSource]] = [[] for _ in range(bins)]
    load = [0] * bins
    for s in sorted(sources, key=lambda s: (-len(s.body), s.name)):
        i = load.index(min(load))
        groups[i].append(s)
        load[i] += len(s.body) + 20000  # + the fixed cost of a kernel
    return [sorted(g, key=lambda s: s.name) for g in groups if g]


def batch_source(sources: list[CudaSource]) -> str:
    """Several kernels as one translation unit (each in namespace `k_<name>`)."""
    return "".join(s.full_source(namespace=f"k_{s.name}") for s in sources)


def nvcc_check(sources: Iterable[CudaSource], archs: Iterable[str] = ("sm_80", "sm_90"), jobs: int = 2,
               batches: int | None = None, form: str = "full", flags: Iterable[str] = NVCC_FLAGS,
               cache_dir=None, nvcc: str | None = None) -> list[NvccResult]:
    """Compile printed kernels to cubins with nvcc, for every architecture in `archs`, or for
    the one a kernel's `cuda_arch` attribute names (`kernel_archs`).

    form "full": `full_source()`, `batches` translation units per architecture (default `jobs`);
    form "mlx": `mlx_source()` (MLX's exact generated text, against `MLX_UTILS_STUB`), one kernel
    per translation unit. Returns one `NvccResult` per nvcc run (cached runs included)."""
    import hashlib as _hashlib
    import os
    import subprocess
    import time
    from concurrent.futures import ThreadPoolExecutor

    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found (set $NVCC or put CUDA's bin on PATH)")
    sources = list(sources)
    archs = tuple(archs)
    by_arch: dict[str, list[CudaSource]] = {}
    for src in sources:
        for a in kernel_archs(src, archs):
            by_arch.setdefault(a, []).append(src)
    flags = list(flags)
    root = _cache_dir(cache_dir)
    version = _nvcc_version(nvcc)
    include: list[str] = []
    if form == "mlx":
        stub = root / "mlx_stub" / "mlx" / "backend" / "cuda" / "device" / "utils.cuh"
        if not stub.exists() or stub.read_text() != MLX_UTILS_STUB:
            stub.parent.mkdir(parents=True, exist_ok=True)
            tmp = stub.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(MLX_UTILS_STUB)
            os.replace(tmp, stub)
        include = [f"-I{root / 'mlx_stub'}"]
        work = [(([s], s.mlx_source()), a) for a, group in by_arch.items() for s in group]
    elif form == "full":
        work = [((g, batch_source(g)), a) for a, group in by_arch.items()
                for g in _balanced(group, batches or jobs)]
    else:
        raise ValueError(f"form must be 'full' or 'mlx', not {form!r}")

    def run(unit: tuple[list[CudaSource], str], arch: str) -> NvccResult:
        group, text = unit
        names = [s.name for s in group]
        cmd_flags = [*flags, *include, *gencode(arch), "-cubin"]
        key = _hashlib.sha256("\0".join([text, *cmd_flags, version, MLX_UTILS_STUB if include else ""])
                              .encode()).hexdigest()[:24]
        cubin = root / f"{key}-{arch}.cubin"
        if cubin.exists():
            return NvccResult(names, arch, True, 0.0, True, output=str(cubin))
        unique = f"{os.getpid()}-{time.monotonic_ns()}"
        cu = root / f"{key}-{arch}.{unique}.cu"
        tmp = root / f"{key}-{arch}.{unique}.cubin"
        cu.write_text(text)
        t = time.perf_counter()
        proc = subprocess.run([nvcc, *cmd_flags, "-o", str(tmp), str(cu)], capture_output=True, text=True)
        seconds = time.perf_counter() - t
        log = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            kept = root / f"{key}-{arch}.failed.cu"
            os.replace(cu, kept)
            return NvccResult(names, arch, False, seconds, False, f"{log[:8000]}\n(source: {kept})")
        cu.unlink(missing_ok=True)
        os.replace(tmp, cubin)
        return NvccResult(names, arch, True, seconds, False, log, str(cubin))

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(lambda w: run(*w), work))
    from ...cache import prune

    prune(root, keep=tuple(Path(r.output) for r in results if r.ok and r.output))  # bounded
    return results


__all__ = ["MLX_UTILS_STUB", "NVCC_FLAGS", "NvccResult", "batch_source", "find_nvcc", "gencode", "kernel_archs",
           "nvcc_check"]
