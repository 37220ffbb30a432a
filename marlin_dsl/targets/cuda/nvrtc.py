"""NVRTC through ctypes: CUDA C++ text to a cubin (or PTX) for one architecture, cached.

Why: MLX's `mx.fast.cuda_kernel` compiles with NVRTC for the device's plain `sm_<cc>`
(mlx/backend/cuda/jit_module.cpp), so a kernel that needs an architecture-specific target
(`sm_90a`: Hopper's `wgmma`) cannot go through it. MLX's `mx.fast.precompiled_cuda_kernel`
loads bytes we compile here instead (targets/cuda/launch_precompiled.py).

No new dependency: the library MLX's CUDA wheels already bring (`nvidia-cuda-nvrtc`) is found
in this order: $MARLIN_DSL_NVRTC (a path); a libnvrtc already loaded in this process (MLX's
CUDA backend loads one: the same compiler MLX uses); site-packages `nvidia/cu13/lib` and
`nvidia/cuda_nvrtc/lib` (the pip wheels); $CUDA_HOME, $CUDA_PATH, /usr/local/cuda `lib64`;
`ctypes.util.find_library("nvrtc")`. Headers (cuda_fp16.h, cuda_bf16.h, cuda/std/...) are
looked for where MLX looks: MLX's bundled CCCL (`mlx/include/cccl`, $MLX_CCCL_DIR), the CUDA
toolkit's include folder (and its `cccl/`, CUDA 13), and site-packages `nvidia/cu13/include`.

Options are MLX's (`--gpu-architecture` and include paths; NVRTC's defaults otherwise: full
optimisation, no fast math, FMA contraction on) plus `--std=c++17`, NVRTC's default, pinned
so that a newer NVRTC does not change the language under us. Results are cached in the
per-user build cache (`nvrtc/`, marlin_dsl/cache.py) keyed by a hash of the source, the
architecture, the options (include paths included) and the NVRTC version.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import hashlib
import importlib.util
import os
import sys
from pathlib import Path

from ...cache import cache_dir, prune, write_atomic
from ...errors import CompileError, EnvironmentUnavailable

__all__ = ["CACHE_PART", "NVRTC_OPTIONS", "compile_cuda", "cuda_include_paths", "find_nvrtc",
           "nvrtc_version"]

#: The cache part holding compiled cubins and PTX (cache.py).
CACHE_PART = "nvrtc"
#: Options beyond the architecture and the include paths (see the module docstring).
NVRTC_OPTIONS: tuple[str, ...] = ("--std=c++17",)

_NVRTC_SUCCESS = 0
_LIB: ctypes.CDLL | None = None
_LIB_PATH: str | None = None
#: cache key -> compiled bytes, so a process reads each from disk once
_MEMO: dict[str, bytes] = {}


# ----- finding the library --------------------------------------------------------------------

def _site_dirs() -> list[Path]:
    return [Path(p) for p in dict.fromkeys(sys.path) if p and Path(p).is_dir()]


def _cuda_homes() -> list[Path]:
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    return [Path(h) for h in dict.fromkeys(homes) if h]


def _loaded_nvrtc() -> str | None:
    """A libnvrtc this process has already mapped (MLX's CUDA backend links one)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:  # address perms offset device inode [path]
                fields = line.split(maxsplit=5)
                path = fields[5].strip() if len(fields) == 6 else ""
                if os.path.basename(path).startswith("libnvrtc.so") and os.path.isfile(path):
                    return path
    except OSError:  # not Linux
        pass
    return None


def _candidates() -> list[tuple[str, str]]:
    """(where, path pattern) in search order; patterns may hold a glob."""
    out: list[tuple[str, str]] = []
    env = os.environ.get("MARLIN_DSL_NVRTC")
    if env:
        return [("$MARLIN_DSL_NVRTC", env)]  # an explicit choice: nothing else is tried
    loaded = _loaded_nvrtc()
    out.append(("loaded in this process", loaded or "(none)"))
    for site in _site_dirs():
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"):
            out.append(("site-packages", str(site / sub / "libnvrtc.so*")))
    for home in _cuda_homes():
        out.append(("CUDA toolkit", str(home / "lib64" / "libnvrtc.so*")))
    out.append(("ctypes.util.find_library", ctypes.util.find_library("nvrtc") or "(none)"))
    return out


def find_nvrtc() -> str:
    """The path (or soname) of the libnvrtc to load; EnvironmentUnavailable naming every place
    looked in when there is none."""
    looked = []
    for where, pattern in _candidates():
        looked.append(f"{where}: {pattern}")
        if pattern == "(none)":
            continue
        if where == "$MARLIN_DSL_NVRTC":
            if not os.path.isfile(pattern):
                raise EnvironmentUnavailable(f"nvrtc: $MARLIN_DSL_NVRTC={pattern!r} is not a file")
            return pattern
        if where == "ctypes.util.find_library":
            return pattern  # a soname the dynamic loader resolves
        # the versioned names (libnvrtc.so.13) first: the bare .so is a development link
        hits = sorted((p for p in glob.glob(pattern) if os.path.isfile(p)), key=lambda p: (p.endswith(".so"), p))
        if hits:
            return hits[0]
    raise EnvironmentUnavailable(
        "nvrtc: no libnvrtc found (it compiles CUDA kernels for mx.fast.precompiled_cuda_kernel); "
        "install it with `pip install 'nvidia-cuda-nvrtc==13.*'` (MLX's CUDA wheels bring it) or "
        "set $MARLIN_DSL_NVRTC to the library. Looked in: " + "; ".join(looked))


def _lib() -> ctypes.CDLL:
    global _LIB, _LIB_PATH
    path = find_nvrtc()
    if _LIB is not None and _LIB_PATH == path:
        return _LIB
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise EnvironmentUnavailable(f"nvrtc: cannot load {path}: {e}") from None
    c_int_p, c_size_p = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_size_t)
    prog_p = ctypes.POINTER(ctypes.c_void_p)
    for fn, args in {
        "nvrtcVersion": (c_int_p, c_int_p),
        "nvrtcCreateProgram": (prog_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                               ctypes.c_void_p, ctypes.c_void_p),
        "nvrtcCompileProgram": (ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
        "nvrtcDestroyProgram": (prog_p,),
        "nvrtcGetProgramLogSize": (ctypes.c_void_p, c_size_p),
        "nvrtcGetProgramLog": (ctypes.c_void_p, ctypes.c_char_p),
        "nvrtcGetCUBINSize": (ctypes.c_void_p, c_size_p),
        "nvrtcGetCUBIN": (ctypes.c_void_p, ctypes.c_char_p),
        "nvrtcGetPTXSize": (ctypes.c_void_p, c_size_p),
        "nvrtcGetPTX": (ctypes.c_void_p, ctypes.c_char_p),
    }.items():
        f = getattr(lib, fn)
        f.argtypes, f.restype = list(args), ctypes.c_int
    lib.nvrtcGetErrorString.argtypes, lib.nvrtcGetErrorString.restype = [ctypes.c_int], ctypes.c_char_p
    _LIB, _LIB_PATH = lib, path
    return lib


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the libnvrtc `find_nvrtc` picks."""
    lib = _lib()
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion", "")
    return major.value, minor.value


def _check(lib: ctypes.CDLL, result: int, call: str, name: str) -> None:
    if result != _NVRTC_SUCCESS:
        what = (lib.nvrtcGetErrorString(result) or b"?").decode()
        raise CompileError(f"nvrtc: {call} failed ({what})" + (f" for kernel {name}" if name else ""))


# ----- headers --------------------------------------------------------------------------------

def _mlx_cccl() -> list[Path]:
    """MLX's bundled CCCL (next to libmlx.so: mlx/include/cccl) and $MLX_CCCL_DIR; found
    without importing mlx."""
    out = []
    try:
        spec = importlib.util.find_spec("mlx")
    except (ImportError, ValueError):  # a broken or blocked mlx: no bundled headers from it
        spec = None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        out.append(Path(loc) / "include" / "cccl")
    if os.environ.get("MLX_CCCL_DIR"):
        out.append(Path(os.environ["MLX_CCCL_DIR"]))
    return out


def cuda_include_paths() -> list[str]:
    """Folders for `--include-path`: one with cuda_fp16.h and one with cuda/std/ (CCCL), in
    MLX's order (CCCL first). EnvironmentUnavailable naming the folders looked in when either
    header is missing."""
    cccl = _mlx_cccl()
    headers: list[Path] = []
    for home in _cuda_homes():
        headers.append(home / "include")
        cccl.append(home / "include" / "cccl")  # CUDA 13 keeps CCCL there
        cccl.append(home / "include")  # CUDA 12 beside the other headers
    for site in _site_dirs():
        headers.append(site / "nvidia" / "cu13" / "include")
        cccl.append(site / "nvidia" / "cu13" / "include" / "cccl")
        headers.append(site / "nvidia" / "cuda_runtime" / "include")
    fp16 = next((d for d in headers if (d / "cuda_fp16.h").is_file()), None)
    std = next((d for d in cccl if (d / "cuda" / "std" / "cstdint").is_file()), None)
    missing = [(h, looked) for h, found, looked in (("cuda_fp16.h", fp16, headers), ("cuda/std/cstdint", std, cccl))
               if found is None]
    if missing:
        raise EnvironmentUnavailable("nvrtc: CUDA headers not found: " + "; ".join(
            f"{h} (looked in {', '.join(str(d) for d in dict.fromkeys(looked))})" for h, looked in missing)
            + ". Set $CUDA_HOME to a CUDA toolkit.")
    return [str(p) for p in dict.fromkeys((std, fp16))]


# ----- compiling --------------------------------------------------------------------------------

def _output_kind(arch: str) -> str:
    """"cubin" for sm_XY[a|f], "ptx" for compute_XY[a|f] (what NVRTC can give for each)."""
    if arch.startswith("sm_"):
        return "cubin"
    if arch.startswith("compute_"):
        return "ptx"
    raise CompileError(f"nvrtc: architecture {arch!r}: expected sm_<cc> (a cubin) or compute_<cc> (PTX)")


def _nvrtc_compile(source: str, name: str, arch: str, options: list[str]) -> bytes:
    """One NVRTC run: the cubin (arch sm_*) or PTX (compute_*), or CompileError with the
    program log."""
    lib = _lib()
    prog = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name}.cu".encode(), 0, None, None),
           "nvrtcCreateProgram", name)
    try:
        argv = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
        result = lib.nvrtcCompileProgram(prog, len(options), argv)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(max(size.value, 1))
        lib.nvrtcGetProgramLog(prog, log)
        if result != _NVRTC_SUCCESS:
            what = (lib.nvrtcGetErrorString(result) or b"?").decode()
            text = log.value.decode(errors="replace").strip()
            raise CompileError(f"nvrtc: kernel {name} does not compile for {arch} ({what}):\n{text[:8000]}")
        ptx = _output_kind(arch) == "ptx"
        get_size, get = (lib.nvrtcGetPTXSize, lib.nvrtcGetPTX) if ptx else (lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN)
        _check(lib, get_size(prog, ctypes.byref(size)), get_size.__name__, name)
        buf = ctypes.create_string_buffer(size.value)
        _check(lib, get(prog, buf), get.__name__, name)
        return buf.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def cache_key(source: str, arch: str, options: list[str], version: tuple[int, int]) -> str:
    """The cache key of one compilation: source, architecture, options, NVRTC version."""
    h = hashlib.sha256()
    for part in (source, arch, *options, f"nvrtc {version[0]}.{version[1]}"):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def compile_cuda(source: str, name: str, arch: str, options: tuple[str, ...] = NVRTC_OPTIONS,
                 cache: bool = True) -> bytes:
    """`source` (a complete translation unit) compiled by NVRTC for `arch`: a cubin for
    "sm_80", "sm_90", "sm_90a"...; PTX for "compute_90a"... `name` names the kernel in errors
    and the cache. Cached per user (module docstring); `cache=False` always compiles.

    Errors: EnvironmentUnavailable without libnvrtc or the CUDA headers, CompileError with
    NVRTC's log when the text does not compile."""
    kind = _output_kind(arch)
    full = [f"--gpu-architecture={arch}", *(f"--include-path={p}" for p in cuda_include_paths()), *options]
    key = cache_key(source, arch, full, nvrtc_version())
    if cache and key in _MEMO:
        return _MEMO[key]
    path = None
    if cache:
        try:
            folder = cache_dir(CACHE_PART)
            path = folder / f"{key}-{arch}.{kind}"
            if path.is_file():
                data = path.read_bytes()
                if data:
                    os.utime(path)  # recently used: pruned last
                    _MEMO[key] = data
                    return data
        except OSError:  # an unwritable cache only costs the compile
            path = None
    data = _nvrtc_compile(source, name, arch, full)
    if cache:
        _MEMO[key] = data
        if path is not None:
            try:
                write_atomic(path, data)
                prune(path.parent, keep=(path,))
            except OSError:
                pass
    return data
