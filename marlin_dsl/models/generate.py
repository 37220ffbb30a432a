"""Text from a converted model: mlx-lm's tokenizer and generation loop around a model loaded
with marlin-dsl's loader (`models.load`), for `marlin-dsl generate` and Python callers.

(mlx-lm's own tools load a converted directory too, through its marlin_dsl_model.py:
`mlx_lm.generate --model DIR --trust-remote-code --prompt ...`.)
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import mlx.nn as nn

from ..errors import MarlinDSLError
from ..nn import Backend
from .loading import load, model_directory
from .mlx_lm_env import require_mlx_lm


def load_for_generation(path: str | Path, backend: Backend = "auto") -> tuple[nn.Module, Any]:
    """(model, mlx-lm TokenizerWrapper) of a converted model directory."""
    require_mlx_lm("generating text")
    from mlx_lm.utils import load_tokenizer

    directory, _ = model_directory(path)  # a missing local path must not become a Hub download
    model, config = load(directory, backend)
    try:
        tokenizer = load_tokenizer(directory, eos_token_ids=config.get("eos_token_id"))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise MarlinDSLError(f"{directory}: no tokenizer that mlx-lm can load ({type(err).__name__}: {err}); "
                             "copy the source model's tokenizer files (tokenizer.json, tokenizer_config.json, "
                             "...) into it (`marlin-dsl convert` does)") from None
    return model, tokenizer


def stream_text(model: nn.Module, tokenizer: Any, prompt: str, *, max_tokens: int = 100,
                temp: float = 0.0, chat_template: bool = True) -> Iterator[str]:
    """The generated text, piece by piece. `chat_template`: wrap the prompt in the
    tokenizer's chat template as a user message, where it has one (as mlx_lm.generate)."""
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    if chat_template and getattr(tokenizer, "has_chat_template", False):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                               add_generation_prompt=True)
    for response in stream_generate(model, tokenizer, prompt, max_tokens=max_tokens, sampler=make_sampler(temp)):
        yield response.text


def generate_text(path: str | Path, prompt: str, *, max_tokens: int = 100, temp: float = 0.0,
                  chat_template: bool = True, backend: Backend = "auto") -> str:
    """Load a converted model directory and return the text it generates for `prompt`
    (greedy unless `temp` > 0). Needs mlx-lm and the model's tokenizer files."""
    model, tokenizer = load_for_generation(path, backend)
    return "".join(stream_text(model, tokenizer, prompt, max_tokens=max_tokens, temp=temp,
                               chat_template=chat_template))


__all__ = ["generate_text", "load_for_generation", "stream_text"]
