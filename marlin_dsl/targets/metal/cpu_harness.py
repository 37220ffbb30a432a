"""Run the Metal text `marlin_dsl.targets.metal.printer` emits on the CPU, on Linux, without a GPU.

The exact kernel text MLX would compile (header + MLX-style signature + body, see
`MetalSource.full_source`) is compiled by g++ as C++20 against `codegen/metal_shim.h`, with a
small generated launcher appended, into a shared library (cached by a hash of everything
that goes into it), loaded with ctypes and executed by the shim's runtime:

- every threadgroup runs all its threads concurrently as user-level threads (fibers) of the
  calling OS thread, switched at every synchronisation point to a thread chosen at random
  (seeded) under a policy picked by `seed % 4`: uniformly random, or random simdgroup
  priorities (one simdgroup runs ahead of the others from barrier to barrier, which is what
  exposes a missing barrier: it reads threadgroup memory before the others wrote it, or
  overwrites it before they read it) with no / rare / frequent random demotions. Run a kernel
  under several seeds to cover several interleavings. Threadgroups run one after another, in
  a random order;
- `threadgroup_barrier` is a real barrier of the group's threads (divergent barriers,
  deadlocks and threads exiting before a barrier are errors);
- simdgroup-matrix operations and `simdgroup_barrier` are real rendezvous of the 32 lanes of
  a simdgroup; the last lane to arrive performs the operation for all of them, and every lane
  holds only its own two elements of each matrix (Apple's lane layout);
- threadgroup memory is poisoned (0xFF bytes: NaN for half/float) at the start of every group;
- write-only outputs are poisoned (0xFF bytes) before the launch; every buffer sits between
  guard regions of poison bytes that must come back untouched (so nothing outside
  `y[:M*N]` may be written);
- faults (segmentation faults, integer division by zero, fiber stack overflow) and a timeout
  are reported as `MetalCPUError` instead of killing the process.

See the comment at the top of codegen/metal_shim.h for the details of the emulation.
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
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from .printer import DIMS_NAME, MetalSource, print_metal
from ...errors import MarlinDSLError
from ..harness_buffers import GuardedBuffer
from ...ir.core import Kernel

__all__ = ["CompiledMetal", "MetalCPUError", "compile_many", "compile_metal", "find_compiler",
           "run_metal_cpu", "shim_path", "DEFAULT_FLAGS", "SHIM_FILES"]

#: g++ flags: C++20 for std::source_location; -fwrapv because Metal integers wrap; no
#: contraction or fast math so float ops round as the IR says; no _FORTIFY_SOURCE (its
#: longjmp check rejects the fiber switches). $MARLIN_METAL_CPU_OPT replaces -O1.
DEFAULT_FLAGS = ("-std=c++20", os.environ.get("MARLIN_METAL_CPU_OPT", "-O1"), "-fPIC", "-shared", "-pthread",
                 "-fwrapv", "-fno-strict-aliasing", "-ffp-contract=off", "-fno-fast-math", "-U_FORTIFY_SOURCE",
                 "-w")

#: The shim's headers, under codegen/ (all of them go into the cache key): the Metal shim and
#: the runtime it shares with the CUDA shim.
SHIM_FILES = ("metal_shim.h", "shim_runtime.h")

_KERNEL_NAME = "marlin_metal_cpu_kernel"
_STATUS = {1: "error", 2: "fault", 3: "timeout", 4: "input"}

#: numpy storage dtype per MLX dtype string (bfloat16 is stored as its bits).
_STORAGE = {"float16_t": np.float16, "bfloat16_t": np.uint16, "float": np.float32, "uint32_t": np.uint32,
            "uint16_t": np.uint16, "uint8_t": np.uint8, "int32_t": np.int32, "bool": np.bool_}
_CPP_TYPE = {"float16_t": "float16_t", "bfloat16_t": "bfloat16_t", "float": "float", "uint32_t": "uint32_t",
             "uint16_t": "uint16_t", "uint8_t": "uint8_t", "int32_t": "int32_t", "bool": "bool"}


class MetalCPUError(MarlinDSLError):
    """The CPU execution of a Metal kernel failed.

    `kind`: compile (g++ rejected the text), error (divergent barrier, deadlock, divergent
    simdgroup operation...), fault (segmentation fault, division by zero, stack overflow),
    timeout, guard (a write outside a buffer), input (bad arguments), unavailable (no g++)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def shim_path() -> Path:
    """The installed codegen/metal_shim.h."""
    return Path(str(resources.files("marlin_dsl.codegen").joinpath("metal_shim.h")))


def _shim_text() -> str:
    """The text of every header of the shim (what a build depends on)."""
    return "\0".join((shim_path().parent / f).read_text() for f in SHIM_FILES)


def find_compiler() -> str | None:
    """$CXX, else g++ on PATH; None when there is none."""
    cxx = os.environ.get("CXX")
    if cxx and shutil.which(cxx):
        return shutil.which(cxx)
    return shutil.which("g++")


def _cache_dir() -> Path:
    """$MARLIN_METAL_CPU_CACHE, else the per-user cache's metal_cpu/ (marlin_dsl/cache.py)."""
    explicit = os.environ.get("MARLIN_METAL_CPU_CACHE")
    if explicit:
        d = Path(explicit)
        d.mkdir(parents=True, exist_ok=True)
        return d
    from ...cache import cache_dir

    return cache_dir("metal_cpu")


_VERSION_CACHE: dict[str, str] = {}


def _compiler_version(cxx: str) -> str:
    if cxx not in _VERSION_CACHE:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True)
        _VERSION_CACHE[cxx] = out.stdout.splitlines()[0] if out.stdout else cxx
    return _VERSION_CACHE[cxx]


def launcher_source(src: MetalSource, kernel_name: str = _KERNEL_NAME) -> str:
    """C++ appended after the kernel: calls it for each thread from the shim's runtime."""
    args = []
    for i, n in enumerate(src.input_names):
        args.append(f"(const {_CPP_TYPE[src.dtypes[n]]}*)b[{i}]")
    for j, n in enumerate(src.output_names):
        args.append(f"({_CPP_TYPE[src.dtypes[n]]}*)b[{len(src.input_names) + j}]")
    args += [f"ids.{a}" for _, a in src.attributes]
    call = f"{kernel_name}(\n      " + ",\n      ".join(args) + ")"
    return f"""
// ----- marlin_dsl.targets.metal.cpu_harness launcher -----
namespace mtl_launcher {{
static void run(void* ctx, const mtl_rt::Ids& ids) {{
  void** b = (void**)ctx;
  {call};
}}
}}  // namespace mtl_launcher
extern "C" int mtl_cpu_launch(void** bufs, unsigned gx, unsigned gy, unsigned gz, unsigned threads,
                              unsigned long long seed, double timeout_s, unsigned long stack_bytes,
                              char* err, unsigned long errlen) {{
  return mtl_rt::launch(&mtl_launcher::run, bufs, gx, gy, gz, threads, seed, timeout_s, stack_bytes, err, errlen);
}}
extern "C" unsigned long mtl_cpu_threadgroup_bytes() {{ return mtl_rt::threadgroup_memory_bytes(); }}
extern "C" int mtl_cpu_native_half() {{ return MTL_SHIM_NATIVE_HALF; }}
"""


@dataclass
class CompiledMetal:
    """A kernel compiled for the CPU: `run(buffers, scalars)` executes it."""

    source: MetalSource
    path: Path
    text: str = field(repr=False)
    _lib: ctypes.CDLL | None = field(default=None, repr=False)

    @property
    def lib(self) -> ctypes.CDLL:
        if self._lib is None:
            self._lib = _load(self.path)
        return self._lib

    @property
    def native_half(self) -> bool:
        return bool(self.lib.mtl_cpu_native_half())

    def run(self, buffers: dict[str, np.ndarray], scalars: dict[str, int],
            grid: Sequence[int] | None = None, threads: int | None = None, *, seed: int = 0,
            guard: int = 64, timeout: float = 120.0, stack_bytes: int = 256 * 1024) -> dict[str, np.ndarray]:
        """Execute the kernel; return its output buffers (copies, in the interpreter's holding
        dtypes: bf16 as float32). Write-only outputs are poisoned before the launch, readwrite
        ones start from the given contents."""
        src = self.source
        sizes = {k: int(v) for k, v in scalars.items()}
        for name in src.scalar_names:
            if name not in sizes:
                raise MetalCPUError(f"launch scalar {name} not given (have {sorted(sizes)})", "input")
            if not 0 <= sizes[name] < 2 ** 32:
                raise MetalCPUError(f"launch scalar {name} = {sizes[name]} is not a u32", "input")
        if grid is None:
            grid = tuple(d.evaluate(sizes) for d in src.grid)
        gx, gy, gz = (int(v) for v in grid)
        threads = src.threads if threads is None else int(threads)
        arrays: list[GuardedBuffer] = []
        for name in src.input_names:
            if name == DIMS_NAME:
                data = src.dims(sizes)
            elif name not in buffers:
                raise MetalCPUError(f"buffer {name} not given (have {sorted(buffers)})", "input")
            else:
                data = buffers[name]
            arrays.append(_guarded(name, src.dtypes[name], data, guard, poison=False))
        for name in src.output_names:
            if src.access.get(name) == "readwrite":
                if name not in buffers:
                    raise MetalCPUError(f"readwrite buffer {name} not given", "input")
                arrays.append(_guarded(name, src.dtypes[name], buffers[name], guard, poison=False))
            else:
                if name not in buffers:
                    raise MetalCPUError(f"output buffer {name} not given (its size is taken from it)", "input")
                arrays.append(_guarded(name, src.dtypes[name], buffers[name], guard, poison=True))
        if 0 in (gx, gy, gz):
            return {a.name: a.result() for a in arrays[len(src.input_names):]}
        ptrs = (ctypes.c_void_p * len(arrays))(*[a.pointer() for a in arrays])
        err = ctypes.create_string_buffer(4096)
        lib = self.lib
        # One launch at a time in the process: threadgroup memory is static per library, and the
        # fault/timeout signal handlers a launch installs are process-wide.
        with _RUN_LOCK:
            status = lib.mtl_cpu_launch(ptrs, gx, gy, gz, threads, ctypes.c_ulonglong(seed & (2 ** 64 - 1)),
                                        ctypes.c_double(timeout), ctypes.c_ulong(stack_bytes), err, len(err))
        if status:
            message = err.value.decode(errors="replace")
            raise MetalCPUError(f"kernel {src.name}: {message}{self._context(message)}",
                                _STATUS.get(status, "error"))
        for a in arrays:
            a.check_guards(src.name)
        return {a.name: a.result() for a in arrays[len(src.input_names):]}


    def _context(self, message: str) -> str:
        """The source lines a runtime message names (`line N:C` refers to the compiled text)."""
        lines = self.text.splitlines()
        shown = []
        for n in dict.fromkeys(int(m) for m in re.findall(r"line (\d+):\d+", message)):
            if 1 <= n <= len(lines):
                shown.append(f"\n  line {n}: {lines[n - 1].strip()}")
        return "".join(shown) + f"\n  (compiled text: {self.path.with_suffix('.cpp')})"


def _guarded(name: str, dtype: str, data: np.ndarray, guard: int, poison: bool) -> GuardedBuffer:
    """A guarded host buffer (`targets/harness_buffers.py`) of Metal type `dtype`, aligned to 64 bytes."""
    return GuardedBuffer(name, np.dtype(_STORAGE[dtype]), data, guard, poison, bf16=dtype == "bfloat16_t",
                         error=MetalCPUError, align=64, what=dtype)


_LIBS: dict[Path, ctypes.CDLL] = {}
_GLOBAL = threading.Lock()
_RUN_LOCK = threading.Lock()


def _load(path: Path) -> ctypes.CDLL:
    with _GLOBAL:
        lib = _LIBS.get(path)
        if lib is None:
            lib = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)
            lib.mtl_cpu_launch.restype = ctypes.c_int
            lib.mtl_cpu_launch.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                                           ctypes.c_uint, ctypes.c_ulonglong, ctypes.c_double, ctypes.c_ulong,
                                           ctypes.c_char_p, ctypes.c_ulong]
            lib.mtl_cpu_threadgroup_bytes.restype = ctypes.c_ulong
            lib.mtl_cpu_native_half.restype = ctypes.c_int
            _LIBS[path] = lib
        return lib


def _as_source(source: MetalSource | Kernel) -> MetalSource:
    return print_metal(source) if isinstance(source, Kernel) else source


def compile_metal(source: MetalSource | Kernel, *, flags: Iterable[str] = DEFAULT_FLAGS,
                  extra_flags: Iterable[str] = (), cache_dir: Path | str | None = None,
                  shipped_text: str | None = None) -> CompiledMetal:
    """Compile the kernel's full MLX-style text with g++ against the shim (cached).

    `shipped_text` is the content of a generated `.metal` file: it is compiled as it is (it
    must hold the source's header and body verbatim and MLX's kernel name), so the check runs
    on the exact text that ships rather than on a reprint of it."""
    src = _as_source(source)
    cxx = find_compiler()
    if cxx is None:
        raise MetalCPUError("no C++ compiler: install g++ (or set $CXX) to run Metal kernels on the CPU",
                            "unavailable")
    if shipped_text is None:
        text = src.full_source(name=_KERNEL_NAME) + launcher_source(src)
    else:
        name = src.mlx_kernel_name()
        if src.header not in shipped_text or src.body not in shipped_text or f" {name}(" not in shipped_text:
            raise MetalCPUError(f"the shipped text of kernel {src.name} does not hold its header, "
                                f"body and kernel name {name}", "input")
        text = shipped_text + launcher_source(src, name)
    all_flags = [*flags, *extra_flags]
    key = hashlib.sha256("\0".join([text, _shim_text(), *all_flags, cxx, _compiler_version(cxx)])
                         .encode()).hexdigest()[:32]
    root = Path(cache_dir) if cache_dir is not None else _cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    so = root / f"{src.name}-{key}.so"
    if so.exists():
        return CompiledMetal(src, so, text)
    include = _include_dir(root, cxx, all_flags)
    cpp = root / f"{src.name}-{key}.cpp"
    unique = f"{os.getpid()}.{threading.get_ident()}"
    tmp_cpp = root / f"{src.name}-{key}.{unique}.cpp"  # private copies: concurrent compiles stay apart
    tmp = root / f"{src.name}-{key}.{unique}.so"
    tmp_cpp.write_text(text)
    cmd = [cxx, *all_flags, f"-I{include}", "-o", str(tmp), str(tmp_cpp), "-lrt"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    os.replace(tmp_cpp, cpp)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise MetalCPUError(f"g++ rejected the Metal text of kernel {src.name} ({cpp}):\n{proc.stderr[:6000]}",
                            "compile")
    os.replace(tmp, so)
    from ...cache import prune

    prune(root, keep=(so, cpp))  # bounded: least recently used builds go first
    return CompiledMetal(src, so, text)


def _include_dir(root: Path, cxx: str, flags: list[str]) -> Path:
    """A directory whose `metal_stdlib` includes the shim, with a precompiled header of it
    (built once per shim text, compiler and flags; compiles work without it too)."""
    shim = shim_path()
    tag = hashlib.sha256("\0".join([str(shim), _shim_text(), cxx, _compiler_version(cxx), *flags])
                         .encode()).hexdigest()[:16]
    include = root / f"include-{tag}"
    stdlib = include / "metal_stdlib"
    with _INCLUDE_LOCK:
        if not stdlib.exists():
            _build_include(include, stdlib, shim, cxx, flags)
    return include


_INCLUDE_LOCK = threading.Lock()


def _build_include(include: Path, stdlib: Path, shim: Path, cxx: str, flags: list[str]) -> None:
    include.mkdir(exist_ok=True)
    unique = f"{os.getpid()}.{threading.get_ident()}"
    tmp = include / f"metal_stdlib.{unique}"
    tmp.write_text(f'#include "{shim}"\n')
    pch_flags = [f for f in flags if f != "-shared"]
    tmp_gch = include / f"metal_stdlib.{unique}.gch"
    proc = subprocess.run([cxx, *pch_flags, "-x", "c++-header", str(tmp), "-o", str(tmp_gch)],
                          capture_output=True, text=True)
    if proc.returncode == 0:
        os.replace(tmp_gch, include / "metal_stdlib.gch")
    else:
        tmp_gch.unlink(missing_ok=True)
    os.replace(tmp, stdlib)  # last: its existence means the directory is complete


def compile_many(sources: Sequence[MetalSource | Kernel], jobs: int | None = None,
                 **kwargs) -> list[CompiledMetal]:
    """compile_metal for several kernels, `jobs` g++ processes at a time (default: CPU count)."""
    jobs = jobs or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(lambda s: compile_metal(s, **kwargs), sources))


def run_metal_cpu(source: MetalSource | Kernel | CompiledMetal, buffers: dict[str, np.ndarray],
                  scalars: dict[str, int], grid: Sequence[int] | None = None, threads: int | None = None,
                  **kwargs) -> dict[str, np.ndarray]:
    """Compile (cached) and execute a Metal kernel on the CPU; return its outputs.

    `buffers` holds every kernel buffer by name, flat (as `marlin_dsl.kernel_args.gemm_buffers`
    builds them); `scalars` the launch scalars (passed to the kernel in its `dims` input);
    `grid` the threadgroup counts (default: from the kernel's grid and the scalars), `threads`
    the threads per threadgroup (default: the kernel's). Keyword arguments go to
    `CompiledMetal.run` (seed, guard, timeout, stack_bytes)."""
    compiled = source if isinstance(source, CompiledMetal) else compile_metal(source)
    return compiled.run(buffers, scalars, grid, threads, **kwargs)
