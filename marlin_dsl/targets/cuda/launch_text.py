"""The strings handed to `mx.fast.cuda_kernel`: two `#include` lines of files that hold the kernel.

Why: MLX builds a custom kernel's whole source string on every call, copies it into the graph
node and hashes it when the node is evaluated (mlx/backend/cuda/custom_kernel.cpp, MLX 0.32),
so a launch's host cost grows with the text (bench/results/issue12_h100_2026-11-24/
launch_overhead.log: 5.8 us per launch at 1 KB, 12.8 at 8 KB, 19.9 at 32 KB). Our compact
decode kernels are 16-18 KB: 6-10 us more per layer call than a built-in op, which made a
converted model decode slower than mlx-lm's 4-bit layers although each kernel is faster.

NVRTC, which MLX compiles with, reads `#include` files from the file system. So the header
MLX gets is `#include "<cache>/cuda_text/<file>.cuh"` and the body `#include "<...>.body.cuh"`:
about 200 bytes per call. The two files hold exactly the compact text (`CudaSource.compact`),
so after preprocessing NVRTC compiles the same translation unit as with the text inline: the
text that runs is the text checked and shipped. File names carry a hash of their content, and
MLX keys its compiled modules (in memory, and its PTX cache on disk) by a hash of the string
it is given, which holds that file name: a module can never be paired with other text.

`MARLIN_DSL_CUDA_TEXT=inline` hands MLX the text itself (slower per call; for a read-only
cache folder, or to compare). Where the cache folder cannot be written, the text goes inline
with a warning naming the folder.
"""
from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

from ...cache import cache_dir, prune, write_atomic
from ...errors import MarlinDSLError

#: The cache part holding kernel text files (cache.py).
CACHE_PART = "cuda_text"
MODES = ("include", "inline")


def text_mode() -> str:
    """"include" (the default) or "inline", from $MARLIN_DSL_CUDA_TEXT."""
    mode = os.environ.get("MARLIN_DSL_CUDA_TEXT", "include").strip().lower() or "include"
    if mode not in MODES:
        raise MarlinDSLError(f"MARLIN_DSL_CUDA_TEXT={mode!r}: expected one of {', '.join(MODES)}")
    return mode


def text_files(name: str, header: str, body: str) -> tuple[str, str]:
    """(header file name, body file name) for this text: the kernel's name and a content hash."""
    h = hashlib.sha256()
    for part in (header, body):
        h.update(part.encode())
        h.update(b"\0")
    stem = f"{name}_{h.hexdigest()[:16]}"
    return f"{stem}.cuh", f"{stem}.body.cuh"


def _write(path: Path, text: str) -> None:
    """Write `text` to `path` unless it already holds it; atomically (other processes may
    be compiling from the same file)."""
    try:
        if path.read_text() == text:
            return
    except (OSError, UnicodeDecodeError):
        pass
    write_atomic(path, text.encode())


def _include(path: Path) -> str:
    text = str(path.resolve())
    if any(c in text for c in '"\n\r\\'):
        raise OSError(f"cache path {text!r} cannot be written in an #include line")
    return f'#include "{text}"\n'


def mlx_strings(name: str, header: str, body: str, mode: str | None = None) -> tuple[str, str]:
    """(header, source) for `mx.fast.cuda_kernel`: include lines of files holding `header`
    and `body` (written here), or the text itself in "inline" mode or where no file can be
    written."""
    mode = mode or text_mode()
    if mode == "inline":
        return header, body
    try:
        folder = cache_dir(CACHE_PART)
        header_file, body_file = (folder / f for f in text_files(name, header, body))
        _write(header_file, header)
        _write(body_file, body)
        prune(folder, keep=(header_file, body_file))
        return _include(header_file), _include(body_file)
    except OSError as e:
        warnings.warn(f"marlin_dsl: cannot write CUDA kernel text under the cache folder ({e}); "
                      f"handing MLX the text inline (a slower launch)", RuntimeWarning, stacklevel=2)
        return header, body


def expand(text: str) -> str:
    """`text` with every `#include "<absolute path>"` line replaced by that file's content:
    the text NVRTC compiles after preprocessing the strings `mlx_strings` hands MLX."""
    out = []
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if stripped.startswith('#include "/') and stripped.endswith('"'):
            out.append(Path(stripped[len('#include "'):-1]).read_text())
        else:
            out.append(line)
    return "".join(out)


__all__ = ["CACHE_PART", "expand", "mlx_strings", "text_files", "text_mode"]
