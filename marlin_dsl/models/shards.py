"""The safetensors shards of a model directory, read from their headers only (no tensor data):
which file holds which tensor, and whether the files are complete and belong together.

Why: mlx-lm loads every `model*.safetensors` of a directory. A truncated file fails inside
MLX with "[read] Unable to read 6 bytes from file." naming no file, and a shard left over from
an earlier model in the same directory is loaded beside the new ones. Both are found here,
before loading, with a message naming the file.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import MarlinDSLError

INDEX = "model.safetensors.index.json"
#: A header larger than this is not a safetensors header (the format caps it at 100 MB).
_MAX_HEADER = 100 << 20


def shard_files(directory: Path) -> list[Path]:
    """The shards mlx-lm would load: model*.safetensors, sorted."""
    return sorted(directory.glob("model*.safetensors"))


def read_header(path: Path) -> dict[str, dict]:
    """{tensor name: {"dtype", "shape", "data_offsets"}} of one safetensors file, or
    MarlinDSLError naming the file when it is not one or is shorter than its header says."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            length = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 0 < length <= min(size - 8, _MAX_HEADER):
                raise MarlinDSLError(f"{path}: not a safetensors file, or truncated ({size} bytes)")
            header = json.loads(f.read(length))
    except OSError as err:
        raise MarlinDSLError(f"{path}: cannot be read ({err.strerror or err})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise MarlinDSLError(f"{path}: not a safetensors file (its header is not JSON: {err})") from None
    if not isinstance(header, dict):
        raise MarlinDSLError(f"{path}: not a safetensors file (its header is not a JSON object)")
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    try:
        end = max((int(v["data_offsets"][1]) for v in tensors.values()), default=0)
    except (TypeError, KeyError, IndexError, ValueError):
        raise MarlinDSLError(f"{path}: not a safetensors file (a header entry has no data_offsets)") from None
    if 8 + length + end > size:
        raise MarlinDSLError(f"{path}: truncated: its header lists {end} bytes of tensors, the file "
                             f"holds {size - 8 - length} (an interrupted copy or conversion?)")
    return tensors


def tensor_files(directory: Path) -> dict[str, str]:
    """{tensor name: the name of the shard file holding it} for every shard of `directory`,
    after checking that each shard is complete, that no tensor is in two shards, and, where
    the directory has an index, that it lists exactly the shards present. MarlinDSLError
    naming the file otherwise."""
    files = shard_files(directory)
    if not files:
        raise MarlinDSLError(f"{directory}: no model*.safetensors files")
    index = directory / INDEX
    if index.exists():
        try:
            listed = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise MarlinDSLError(f"{index}: not a safetensors index ({err})") from None
        present = {p.name for p in files}
        if present - listed:
            raise MarlinDSLError(f"{directory}: {sorted(present - listed)} not listed in {INDEX} (left over "
                                 "from another model? remove them)")
        if listed - present:
            raise MarlinDSLError(f"{directory}: {INDEX} lists {sorted(listed - present)}, which are missing")
    where: dict[str, str] = {}
    for path in files:
        for name in read_header(path):
            if name in where:
                raise MarlinDSLError(f"{directory}: tensor {name!r} is in both {where[name]} and {path.name} "
                                     "(a shard left over from another model?)")
            where[name] = path.name
    return where


__all__ = ["INDEX", "read_header", "shard_files", "tensor_files"]
