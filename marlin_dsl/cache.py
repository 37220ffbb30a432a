"""Where marlin-dsl keeps files between runs, per user, following the XDG convention:
$MARLIN_DSL_CACHE, else $XDG_CACHE_HOME/marlin_dsl, else ~/.cache/marlin_dsl.

- `metal_cpu/`: shared libraries of emitted Metal text built by g++ for the CPU harness
  (targets/metal/cpu_harness.py), keyed by a hash of the text, shim, flags and compiler;
- `cuda_cpu/`: shared libraries of printed CUDA text built by g++ for the CUDA CPU harness
  (targets/cuda/cpu_harness.py), keyed by a hash of the text, shim, flags and compiler;
- `metal/`: generated Metal launchers of `quantized_linear` (targets/metal/runtime.py);
- `nvcc/`: cubins of nvcc compile checks of printed CUDA (targets/cuda/nvcc.py, the tests);
- `cuda_text/`: the text of CUDA kernels launched through MLX, which MLX's compiler reads by
  `#include` (targets/cuda/launch_text.py says why), keyed by a hash of the text.
- `nvrtc/`: cubins (and PTX) compiled by NVRTC for precompiled launches
  (targets/cuda/nvrtc.py, targets/cuda/launch_precompiled.py), keyed by a hash of the source,
  architecture, options and NVRTC version.

Each part is bounded: after a write, the least recently used files go until the part is under
$MARLIN_DSL_CACHE_MAX_MB (default 512 MB). `marlin-dsl cache` shows the folders and their
sizes; `marlin-dsl cache --clear` empties them. Deleting the folder by hand is safe too.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

DEFAULT_MAX_MB = 512


def cache_root() -> Path:
    explicit = os.environ.get("MARLIN_DSL_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "marlin_dsl"


def cache_dir(part: str) -> Path:
    """The folder of one part of the cache (created)."""
    folder = cache_root() / part
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def max_bytes() -> int:
    try:
        return max(0, int(float(os.environ.get("MARLIN_DSL_CACHE_MAX_MB", DEFAULT_MAX_MB)) * 2**20))
    except ValueError:
        return DEFAULT_MAX_MB * 2**20


def _files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


def size_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in _files(folder)) if folder.exists() else 0


def prune(folder: Path, limit: int | None = None, keep: tuple[Path, ...] = ()) -> int:
    """Remove the least recently used files of `folder` (never those in `keep`) until it holds
    at most `limit` bytes (default: max_bytes()); returns the bytes removed. Files vanishing
    meanwhile (another process pruning) are skipped."""
    limit = max_bytes() if limit is None else limit
    entries = []
    for p in folder.iterdir() if folder.exists() else ():  # builds; sub-folders (headers) stay
        if not p.is_file() or p in keep:
            continue
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        entries.append((max(st.st_atime, st.st_mtime), st.st_size, p))
    total = sum(size for _, size, _ in entries) + sum(p.stat().st_size for p in keep if p.exists())
    removed = 0
    for _, size, path in sorted(entries, key=lambda e: e[0]):
        if total - removed <= limit:
            break
        try:
            path.unlink()
            removed += size
        except FileNotFoundError:
            continue
    return removed


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename: other processes may be
    reading the same entry (a build from the same text, a compiled kernel)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp_", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def clear() -> int:
    """Empty the whole cache; returns the bytes it held."""
    root = cache_root()
    held = size_bytes(root)
    if root.exists():
        shutil.rmtree(root)
    return held


__all__ = ["cache_dir", "cache_root", "clear", "max_bytes", "prune", "size_bytes"]
