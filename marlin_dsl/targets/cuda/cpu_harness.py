"""Run the CUDA text `marlin_dsl.targets.cuda.printer` prints on the CPU, without a GPU or the
CUDA toolkit: the executed oracle of the printed CUDA (issue 17), as
`targets/metal/cpu_harness.py` is for the printed Metal.

The kernel's complete translation unit (`CudaSource.full_source()`: the prelude
codegen/cuda_prelude.cuh, the constant tables and the `__global__` function, byte for byte)
is compiled by g++ as C++20 between `codegen/cuda_shim.h` (CUDA's vocabulary: the 16-bit float
types and intrinsics, thread indices, barriers, `__shared__`) and `codegen/cuda_shim_ptx.h`
(the PTX the prelude wraps: mma.sync m16n8k16, mma.sp::ordered_metadata m16n8k32 and
cp.async, written from the PTX ISA's fragment rules, not from marlin_dsl's Target tables),
with a small launcher appended, into a shared library cached by a hash of everything that
goes into it, loaded with ctypes and run by the shim's runtime (codegen/shim_runtime.h, shared
with the Metal harness, and CUDA's part of it, codegen/cuda_shim_runtime.h):

- blocks run one after another in a random (seeded) order; every thread of a block is a fiber,
  all concurrent, switched at every synchronisation point under a seeded random policy
  (`seed % 4`, as the Metal harness: uniform, or one warp running ahead of the others);
- `__syncthreads` is a real barrier, `mma`/`mma_sp`/`__syncwarp` are rendezvous of a warp's
  32 lanes: the last lane computes the warp's product from every lane's registers;
- shared memory is poisoned (0xFF: NaN) before every block; a cp.async fills its destination
  with poison when issued and lands when its thread's `cp.async.wait_group` retires it;
- outputs are poisoned (NaN) before the launch, every buffer sits between guard regions that
  must come back untouched, read-only inputs must come back unchanged;
- faults, unordered mma.sp metadata, misaligned cp.async, divergent barriers, deadlocks and a
  timeout are `CudaCPUError`s instead of a crash.

The warpgroup pipeline's inline PTX (the dense wgmma.mma_async, its fences, the async-proxy
fence, setmaxnreg) is rewritten into calls of codegen/cuda_shim_wgmma.h (`cpu_harness_ptx.py`),
which also holds the warp roles' mbarriers (waits are fiber waits, woken by the phase's last
arrival); the rest of the text compiles as printed. Not emulated: the sparse wgmma: such
kernels are refused with kind "unsupported" before compiling.
The shim's comments (codegen/cuda_shim.h) list exactly what is shimmed.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from ...ir.core import Kernel
from .cpu_harness_buffers import CudaCPUError, GuardedBuffer, guarded_buffer
from .cpu_harness_ptx import rewrite_asm
from .launch import gemm_inout_inputs
from .print_shared import DYNAMIC_SHARED_NAME
from .printer import print_cuda
from .source import CudaSource

__all__ = ["CompiledCudaCPU", "CudaCPUError", "DEFAULT_FLAGS", "SHIM_FILES", "compile_cuda_cpu", "compile_many",
           "cuda_cpu_executor", "find_compiler", "refuse_unsupported", "run_cuda_cpu", "shimmed_source",
           "translation_unit"]

#: g++ flags: C++20 (std::source_location); -fwrapv (CUDA's unsigned arithmetic wraps, and the
#: printer wraps signed arithmetic itself); no contraction or fast math, so float operations
#: round as the intrinsics say; no _FORTIFY_SOURCE (its longjmp check rejects fiber switches).
#: $MARLIN_CUDA_CPU_OPT replaces -O1.
DEFAULT_FLAGS = ("-std=c++20", os.environ.get("MARLIN_CUDA_CPU_OPT", "-O1"), "-fPIC", "-shared", "-pthread",
                 "-fwrapv", "-fno-strict-aliasing", "-ffp-contract=off", "-fno-fast-math", "-U_FORTIFY_SOURCE",
                 "-w")

#: The shim's headers, under codegen/ (all of them go into the cache key).
SHIM_FILES = ("cuda_shim.h", "cuda_shim_half.h", "cuda_shim_runtime.h", "shim_runtime.h", "cuda_shim_ptx.h",
              "cuda_shim_wgmma.h")

_KERNEL_NAME = "mdsl_cuda_cpu_kernel"
_ASM = re.compile(r"\basm\b")
_STATUS = {1: "error", 2: "fault", 3: "timeout", 4: "input"}

Executor = Callable[[Kernel, dict[str, np.ndarray], dict[str, int]], dict[str, np.ndarray]]


def find_compiler() -> str | None:
    """$CXX, else g++ on PATH; None when there is none."""
    cxx = os.environ.get("CXX")
    if cxx and shutil.which(cxx):
        return shutil.which(cxx)
    return shutil.which("g++")


def _codegen_dir() -> Path:
    return Path(str(resources.files("marlin_dsl.codegen").joinpath("cuda_shim.h"))).parent


def _cache_dir() -> Path:
    """$MARLIN_CUDA_CPU_CACHE, else the per-user cache's cuda_cpu/ (marlin_dsl/cache.py)."""
    explicit = os.environ.get("MARLIN_CUDA_CPU_CACHE")
    if explicit:
        d = Path(explicit)
        d.mkdir(parents=True, exist_ok=True)
        return d
    from ...cache import cache_dir

    return cache_dir("cuda_cpu")


def refuse_unsupported(src: CudaSource) -> None:
    """Raise CudaCPUError (kind "unsupported") for a kernel the shim would not run faithfully:
    inline PTX the harness does not emulate (`cpu_harness_ptx.py`: the dense wgmma, its
    fences, the async-proxy fence and setmaxnreg are emulated; the sparse wgmma is not)."""
    shimmed_source(src)


def shimmed_source(src: CudaSource) -> CudaSource:
    """`src` with its inline PTX rewritten into the shim's calls (`rewrite_asm`); the rest of
    the text as printed. CudaCPUError (unsupported) where the shim lacks something."""
    if not (_ASM.search(src.body) or _ASM.search(src.declarations)):
        return src
    return replace(src, body=rewrite_asm(src.body, f"kernel {src.name}"),
                   declarations=rewrite_asm(src.declarations, f"kernel {src.name}"))


def translation_unit(src: CudaSource) -> str:
    """The C++ g++ compiles: the shim, the printed text as `full_source` gives it (its inline
    PTX rewritten into the shim's calls: `shimmed_source`), the shim's PTX, a launcher. Only
    the kernel's name is ours (the MLX launch names it too)."""
    src = shimmed_source(src)
    cpp = src.dtypes
    args = [f"(const {cpp[n]}*)b[{i}]" for i, n in enumerate(src.input_names)]
    args += [f"({cpp[n]}*)b[{len(src.input_names) + j}]" for j, n in enumerate(src.output_names)]
    dynamic = ""
    if src.dynamic_shared_bytes:  # `extern __shared__ ... mdsl_smem[]` declares this one
        dynamic = (f"thread_local __attribute__((aligned(128))) unsigned char "
                   f"{DYNAMIC_SHARED_NAME}[{src.dynamic_shared_bytes}];\n")
    call = f"{_KERNEL_NAME}(\n      " + ",\n      ".join(args) + ")"
    return f"""#include "cuda_shim.h"
{dynamic}// ----- the printed kernel (CudaSource.full_source) -----
{src.full_source(name=_KERNEL_NAME)}
// ----- end of the printed kernel -----
#include "cuda_shim_ptx.h"
static void mdsl_cpu_thunk(void** b) {{
  {call};
}}
extern "C" int mdsl_cpu_launch(void** bufs, unsigned gx, unsigned gy, unsigned gz, unsigned threads,
                               unsigned long long seed, double timeout_s, unsigned long stack_bytes,
                               char* err, unsigned long errlen) {{
  return mdsl_cpu::launch(&mdsl_cpu_thunk, bufs, &mdsl_cpu_tls_anchor, gx, gy, gz, threads, seed, timeout_s,
                          stack_bytes, err, errlen);
}}
"""


@dataclass
class CompiledCudaCPU:
    """A printed CUDA kernel compiled for the CPU: `run(buffers, scalars)` executes it."""

    source: CudaSource
    path: Path
    text: str = field(repr=False)
    _lib: ctypes.CDLL | None = field(default=None, repr=False)

    @property
    def lib(self) -> ctypes.CDLL:
        if self._lib is None:
            self._lib = _load(self.path)
        return self._lib

    def run(self, buffers: dict[str, np.ndarray], scalars: dict[str, int], grid: Sequence[int] | None = None,
            *, seed: int = 0, guard: int = 64, timeout: float = 120.0,
            stack_bytes: int = 256 * 1024) -> dict[str, np.ndarray]:
        """Execute the kernel; return its outputs and its read-write inputs (copies, bf16 as
        float32). `buffers` holds every buffer but `dims` by name, flat (outputs give their
        size; write-only ones are poisoned), `scalars` the launch scalars; `grid` the blocks
        (default: the kernel's grid over the scalars)."""
        src = self.source
        sizes = {k: int(v) for k, v in scalars.items()}
        for name in src.scalar_names:
            if name not in sizes:
                raise CudaCPUError(f"launch scalar {name} not given (have {sorted(sizes)})", "input")
            if not 0 <= sizes[name] < 2 ** 32:
                raise CudaCPUError(f"launch scalar {name} = {sizes[name]} is not a u32", "input")
        gx, gy, gz = (int(v) for v in (grid if grid is not None else src.groups(sizes)))
        arrays = [self._buffer(name, buffers, sizes, guard) for name in (*src.input_names, *src.output_names)]
        returned = [a for a in arrays if a.name in src.output_names or a.name in src.inout_inputs]
        if 0 not in (gx, gy, gz):
            ptrs = (ctypes.c_void_p * len(arrays))(*[a.pointer() for a in arrays])
            err = ctypes.create_string_buffer(4096)
            with _RUN_LOCK:  # one launch at a time: the runtime's state and signal handlers are global
                status = self.lib.mdsl_cpu_launch(ptrs, gx, gy, gz, src.threads, ctypes.c_ulonglong(seed % 2 ** 64),
                                                  ctypes.c_double(timeout), ctypes.c_ulong(stack_bytes), err, len(err))
            if status:
                raise CudaCPUError(f"kernel {src.name}: {err.value.decode(errors='replace')}\n  (compiled text: "
                                   f"{self.path.with_suffix('.cpp')})", _STATUS.get(status, "error"))
            for a in arrays:
                a.check_guards(src.name)
                if src.access.get(a.name) == "read" and a.name not in src.inout_inputs:
                    a.check_unchanged(src.name)
        return {a.name: a.result() for a in returned}

    def _buffer(self, name: str, buffers: dict[str, np.ndarray], sizes: dict[str, int], guard: int) -> GuardedBuffer:
        src = self.source
        elem = src.elems[name]
        if name == "dims":
            return guarded_buffer(name, elem, src.dims(sizes), guard, poison=False)
        if name not in buffers:
            raise CudaCPUError(f"kernel {src.name}: buffer {name} not given (have {sorted(buffers)})", "input")
        poison = name in src.output_names and src.access.get(name) != "readwrite"
        return guarded_buffer(name, elem, buffers[name], guard, poison=poison)


_LIBS: dict[Path, ctypes.CDLL] = {}
_LOAD_LOCK = threading.Lock()
_RUN_LOCK = threading.Lock()
_VERSIONS: dict[str, str] = {}


def _load(path: Path) -> ctypes.CDLL:
    with _LOAD_LOCK:
        lib = _LIBS.get(path)
        if lib is None:
            lib = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)
            lib.mdsl_cpu_launch.restype = ctypes.c_int
            lib.mdsl_cpu_launch.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                                            ctypes.c_uint, ctypes.c_ulonglong, ctypes.c_double, ctypes.c_ulong,
                                            ctypes.c_char_p, ctypes.c_ulong]
            _LIBS[path] = lib
        return lib


def _compiler_version(cxx: str) -> str:
    if cxx not in _VERSIONS:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True)
        _VERSIONS[cxx] = out.stdout.splitlines()[0] if out.stdout else cxx
    return _VERSIONS[cxx]


def _as_source(source: CudaSource | Kernel) -> CudaSource:
    """A kernel printed as the MLX launcher prints it (the striped counters as inputs)."""
    return print_cuda(source, inout_inputs=gemm_inout_inputs(source)) if isinstance(source, Kernel) else source


def compile_cuda_cpu(source: CudaSource | Kernel, *, flags: Iterable[str] = DEFAULT_FLAGS,
                     extra_flags: Iterable[str] = (), cache_dir: Path | str | None = None) -> CompiledCudaCPU:
    """Compile the kernel's printed text with g++ against the shim (cached by a hash of the
    translation unit, the shim's headers, the flags and the compiler)."""
    src = _as_source(source)
    refuse_unsupported(src)
    cxx = find_compiler()
    if cxx is None:
        raise CudaCPUError("no C++ compiler: install g++ (or set $CXX) to run CUDA kernels on the CPU",
                           "unavailable")
    codegen = _codegen_dir()
    text = translation_unit(src)
    all_flags = [*flags, *extra_flags]
    shim = [(codegen / f).read_text() for f in SHIM_FILES]
    key = hashlib.sha256("\0".join([text, *shim, *all_flags, cxx, _compiler_version(cxx)]).encode()).hexdigest()[:32]
    root = Path(cache_dir) if cache_dir is not None else _cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    so = root / f"{src.name}-{key}.so"
    if so.exists():
        return CompiledCudaCPU(src, so, text)
    cpp = root / f"{src.name}-{key}.cpp"
    unique = f"{os.getpid()}.{threading.get_ident()}"
    tmp_cpp, tmp = root / f"{src.name}-{key}.{unique}.cpp", root / f"{src.name}-{key}.{unique}.so"
    tmp_cpp.write_text(text)
    include = _include_dir(root, cxx, all_flags, key_parts=shim)
    proc = subprocess.run([cxx, *all_flags, f"-I{include}", f"-I{codegen}", "-o", str(tmp), str(tmp_cpp), "-ldl",
                           "-lrt"], capture_output=True, text=True)
    os.replace(tmp_cpp, cpp)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise CudaCPUError(f"g++ rejected the CUDA text of kernel {src.name} ({cpp}):\n{proc.stderr[:6000]}",
                           "compile")
    os.replace(tmp, so)
    from ...cache import prune

    prune(root, keep=(so, cpp))  # bounded: least recently used builds go first
    return CompiledCudaCPU(src, so, text)


_INCLUDE_LOCK = threading.Lock()


def _include_dir(root: Path, cxx: str, flags: list[str], key_parts: list[str]) -> Path:
    """A folder whose `cuda_shim.h` includes the shim, with a precompiled header of it (built
    once per shim text, compiler and flags; about a third of a kernel's compile time). The
    builds work without it too: g++ then reads the headers."""
    tag = hashlib.sha256("\0".join([str(_codegen_dir()), *key_parts, cxx, _compiler_version(cxx), *flags])
                         .encode()).hexdigest()[:16]
    include = root / f"include-{tag}"
    header = include / "cuda_shim.h"
    with _INCLUDE_LOCK:
        if not header.exists():
            include.mkdir(exist_ok=True)
            unique = f"{os.getpid()}.{threading.get_ident()}"
            tmp, tmp_gch = include / f"cuda_shim.{unique}.h", include / f"cuda_shim.{unique}.h.gch"
            tmp.write_text(f'#include "{_codegen_dir() / "cuda_shim.h"}"\n')
            proc = subprocess.run([cxx, *[f for f in flags if f != "-shared"], "-x", "c++-header", str(tmp),
                                   "-o", str(tmp_gch)], capture_output=True, text=True)
            if proc.returncode == 0:
                os.replace(tmp_gch, include / "cuda_shim.h.gch")
            else:
                tmp_gch.unlink(missing_ok=True)
            os.replace(tmp, header)  # last: its existence means the folder is complete
    return include


def compile_many(sources: Sequence[CudaSource | Kernel], jobs: int | None = None, **kwargs) -> list[CompiledCudaCPU]:
    """compile_cuda_cpu for several kernels, `jobs` g++ processes at a time (default: CPU count)."""
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        return list(pool.map(lambda s: compile_cuda_cpu(s, **kwargs), sources))


def run_cuda_cpu(source: CudaSource | Kernel | CompiledCudaCPU, buffers: dict[str, np.ndarray],
                 scalars: dict[str, int], grid: Sequence[int] | None = None, **kwargs) -> dict[str, np.ndarray]:
    """Compile (cached) and execute a printed CUDA kernel on the CPU; return its outputs.
    Keyword arguments go to `CompiledCudaCPU.run` (seed, guard, timeout, stack_bytes)."""
    compiled = source if isinstance(source, CompiledCudaCPU) else compile_cuda_cpu(source)
    return compiled.run(buffers, scalars, grid, **kwargs)


def cuda_cpu_executor(seed: int = 0, compiled: dict[int, CompiledCudaCPU] | None = None, **kwargs) -> Executor:
    """An executor for `checks.kernel_check.check_kernel`: (Kernel, numpy buffers as
    `kernel_args.gemm_buffers` makes them, scalars) -> numpy outputs, the kernel's printed
    CUDA run on the CPU. `compiled` maps id(kernel) to builds made beforehand (compile_many)."""
    cache: dict[int, CompiledCudaCPU] = dict(compiled or {})

    def execute(kernel: Kernel, buffers: dict[str, np.ndarray], scalars: dict[str, int]) -> dict[str, np.ndarray]:
        build = cache.get(id(kernel))
        if build is None:
            build = cache[id(kernel)] = compile_cuda_cpu(kernel)
        return build.run(buffers, scalars, seed=seed, **kwargs)

    return execute
