"""What a converted directory's `marlin_dsl_model.py` imports, for mlx-lm's own loader.

mlx-lm builds a model from `config.json`: with a "model_file" key (and trust_remote_code) it
runs that file and calls `ModelArgs.from_dict(config)` and `Model(args)`. Here `ModelArgs`
keeps the whole config and `Model` builds mlx-lm's own class for the config's model_type with
MarlinLinear placeholders where the marlin_dsl section lists layers (as `models.load` does),
so that `mlx_lm.load(path, trust_remote_code=True)`, `mlx_lm.generate --model path
--trust-remote-code` and mlx-lm's server work on a converted model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import mlx.nn as nn

from .checkpoint import CONFIG, SECTION, read_section
from .fused_block import fuse_blocks
from .loading import install_placeholders, prepare_layers


@dataclass
class ModelArgs:
    """The config, whole (the model's own args class picks its fields from it in `Model`)."""

    config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> ModelArgs:
        return cls(dict(config))


@lru_cache(maxsize=None)
def _with_prepare(model_class: type) -> type:
    """`model_class` whose load_weights also validates the MarlinLinear arrays once and puts
    them in their layout (else the first forward does it; errors then name the layer)."""

    def load_weights(self, *args, **kwargs):
        out = model_class.load_weights(self, *args, **kwargs)
        prepare_layers(self)
        return out

    return type(model_class.__name__, (model_class,), {"load_weights": load_weights,
                                                        "__module__": model_class.__module__,
                                                        "__qualname__": model_class.__qualname__})


def Model(args: ModelArgs) -> nn.Module:  # noqa: N802  (mlx-lm calls it as its model class)
    """mlx-lm's model for `args.config` with marlin-dsl's layers installed, to be filled by
    mlx-lm's `load_weights`."""
    from mlx_lm.utils import _get_classes  # mlx-lm's own lookup by model_type; no public name

    config = args.config
    formats, layers, fused = read_section(config, CONFIG)
    model_class, args_class = _get_classes(config)
    model = _with_prepare(model_class)(args_class.from_dict(config))
    install_placeholders(model, formats, layers, fused)
    if config[SECTION].get("fused_blocks"):  # interleaved on the first call, after load_weights
        fuse_blocks(model, interleave_now=False)
    return model


__all__ = ["Model", "ModelArgs"]
