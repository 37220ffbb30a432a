"""marlin-dsl: declarative quantised and sparse weight formats compiled to Metal and CUDA GEMM
kernels, and mlx-lm models converted to them. `marlin-dsl COMMAND --help` shows a command's
options. Exit codes: 0 success, 1 a check failed (or some layers were left unconverted),
2 usage (an unknown option or value), 3 bad input (a spec file, format, weights or model
directory), 4 this machine lacks what the command needs (a GPU backend, a compiler, mlx-lm),
130 interrupted (Ctrl-C).

Each command is one module with its `add_parsers(sub)`; this one puts them together."""
from __future__ import annotations

import argparse
import sys

from ..errors import MarlinDSLError
from .bench import add_parsers as add_bench
from .compile import add_parsers as add_compile
from .convert import add_parsers as add_convert
from .generate import add_parsers as add_generate
from .common import EXIT_INTERRUPTED, EXIT_OK, exit_code


#: The cache's folders and what each holds (`marlin-dsl cache` and its --help).
CACHE_PARTS = {
    "metal_cpu": "g++ builds of emitted Metal text for the CPU harness",
    "cuda_cpu": "g++ builds of printed CUDA text for the CUDA CPU harness",
    "metal": "generated Metal launchers of the layers (Apple GPUs)",
    "nvcc": "cubins of nvcc compile checks of printed CUDA",
    "nvrtc": "cubins and PTX compiled by NVRTC for precompiled CUDA launches",
    "cuda_text": "CUDA kernel text handed to MLX's run-time compiler",
}


def cmd_cache(args: argparse.Namespace) -> int:
    from .. import cache

    root = cache.cache_root()
    if args.clear:
        print(f"removed {cache.clear() / 2**20:.1f} MB from {root}")
        return EXIT_OK
    print(f"cache: {root} (MARLIN_DSL_CACHE, XDG_CACHE_HOME), bound per part "
          f"{cache.max_bytes() / 2**20:.0f} MB (MARLIN_DSL_CACHE_MAX_MB)")
    for part, holds in CACHE_PARTS.items():
        print(f"  {part:<10} {cache.size_bytes(root / part) / 2**20:8.1f} MB  {holds}")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    from .._version import __version__

    parser = argparse.ArgumentParser(prog="marlin-dsl", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"marlin-dsl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_compile(sub)
    add_bench(sub)
    add_convert(sub)
    add_generate(sub)
    cache = sub.add_parser("cache", help="show where marlin-dsl caches builds, and their size",
                           description="The per-user cache of builds that can be reused: $MARLIN_DSL_CACHE, "
                                       "else $XDG_CACHE_HOME/marlin_dsl, else ~/.cache/marlin_dsl. Folders: "
                                       + "; ".join(f"{part}/: {holds}" for part, holds in CACHE_PARTS.items())
                                       + ". Each is bounded by $MARLIN_DSL_CACHE_MAX_MB (default 512); deleting "
                                       "the folder by hand is safe.")
    cache.add_argument("--clear", action="store_true", help="remove everything in the cache")
    cache.set_defaults(func=cmd_cache)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # usage errors: argparse exits with 2
    try:
        return args.func(args)
    except MarlinDSLError as err:
        print(f"marlin-dsl: error: {err}", file=sys.stderr)
        return exit_code(err)
    except KeyboardInterrupt:
        print("marlin-dsl: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


__all__ = ["build_parser", "main"]
