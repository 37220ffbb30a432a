"""One layer's checkpoint tensors into its kernel format (`MarlinLinear.from_checkpoint`):
argument checks that name what is wrong, then the checkpoint format's derived reader
(formats/checkpoint/layout.py)."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import ShapeError
from ..formats.checkpoint import CheckpointFormat, Imported


def read_checkpoint(tensors: Mapping[str, object], format: object, shape: tuple[int, int],
                    name: str = "") -> Imported:
    """The imported weight (kernel-format codes and parameters, and an input order) of one
    layer; `name` prefixes the tensor names in errors ("model.layers.0.mlp.up_proj.")."""
    if not isinstance(format, CheckpointFormat):
        raise ShapeError(f"format: expected a marlin_dsl.formats.checkpoint.CheckpointFormat (gptq(), awq(), "
                         f"bnb(), gguf_format(...)), got {type(format).__name__}")
    if not isinstance(tensors, Mapping):
        raise ShapeError(f"tensors: expected a mapping of tensor names to arrays, got {type(tensors).__name__}")
    if (not isinstance(shape, (tuple, list)) or len(shape) != 2
            or not all(isinstance(d, (int, np.integer)) and d > 0 for d in shape)):
        raise ShapeError(f"shape: expected (K, N), two positive integers, got {shape!r}")
    prefix = f"{name}." if name and not name.endswith(".") else name
    unknown = sorted(set(tensors) - set(format.names))
    if unknown:
        raise ShapeError(f"{prefix}{unknown[0]}: not a tensor of checkpoint format {format.name!r} "
                         f"(it stores {format.names})")
    host = {k: np.asarray(v) for k, v in tensors.items()}
    return format.read(host, (int(shape[0]), int(shape[1])), prefix)
