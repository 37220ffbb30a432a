"""`marlin-dsl generate`: text from a converted model directory (mlx-lm's tokenizer and
generation loop around marlin-dsl's loader), printed as it is generated."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import EXIT_OK, positive


def cmd_generate(args: argparse.Namespace) -> int:
    from ..models.generate import load_for_generation, stream_text

    model, tokenizer = load_for_generation(args.model, args.backend)
    if args.seed is not None:
        import mlx.core as mx

        mx.random.seed(args.seed)
    for piece in stream_text(model, tokenizer, args.prompt, max_tokens=args.max_tokens, temp=args.temp,
                             chat_template=not args.ignore_chat_template):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return EXIT_OK


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The `generate` subcommand."""
    generate = sub.add_parser(
        "generate", help="generate text with a converted model directory (needs mlx-lm)",
        description="Load a model directory written by `marlin-dsl convert` (marlin-dsl's layers, the "
                    "source model's tokenizer) and print the text it generates for --prompt, with "
                    "mlx-lm's generation loop. Needs mlx-lm (pip install \"marlin-dsl[mlx-lm]\"). "
                    "mlx-lm's own command works too: mlx_lm.generate --model DIR --trust-remote-code.")
    generate.add_argument("model", type=Path, metavar="DIR", help="a converted model directory")
    generate.add_argument("--prompt", required=True, help="the prompt text")
    generate.add_argument("--max-tokens", type=positive, default=100,
                          help="the most tokens to generate (default: 100)")
    generate.add_argument("--temp", type=float, default=0.0, help="sampling temperature (default: 0, greedy)")
    generate.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    generate.add_argument("--ignore-chat-template", action="store_true",
                          help="use the prompt as it is, not wrapped in the tokenizer's chat template")
    generate.add_argument("--backend", choices=["auto", "cuda", "metal", "mlx"], default="auto",
                          help="the backend the layers run on (default: by MLX's default device)")
    generate.set_defaults(func=cmd_generate)


__all__ = ["add_parsers", "cmd_generate"]
