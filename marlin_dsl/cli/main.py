"""The `marlin-dsl` command line. Exit codes (docs/CLI.md): 0 success, 1 a check failed,
2 usage (unknown option or value), 3 bad input (a spec file, format, weights), 4 this
machine lacks what the command needs (GPU backend, compiler), 130 interrupted (Ctrl-C).

Each command is one module with its `add_parsers(sub)`; this one puts them together."""
from __future__ import annotations

import argparse
import sys

from ..errors import MarlinDSLError
from .bench import add_parsers as add_bench
from .compile import add_parsers as add_compile
from .convert import add_parsers as add_convert
from .common import EXIT_INTERRUPTED, EXIT_OK, exit_code


def cmd_cache(args: argparse.Namespace) -> int:
    from .. import cache

    root = cache.cache_root()
    if args.clear:
        print(f"removed {cache.clear() / 2**20:.1f} MB from {root}")
        return EXIT_OK
    print(f"cache: {root} (MARLIN_DSL_CACHE, XDG_CACHE_HOME), bound per part "
          f"{cache.max_bytes() / 2**20:.0f} MB (MARLIN_DSL_CACHE_MAX_MB)")
    for part in ("metal_cpu", "cuda_cpu", "metal", "nvcc", "nvrtc", "cuda_text"):
        print(f"  {part:<10} {cache.size_bytes(root / part) / 2**20:8.1f} MB")
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
    cache = sub.add_parser("cache", help="show where marlin-dsl caches builds, and their size",
                           description="The per-user cache (docs/CLI.md): g++ builds of emitted Metal "
                                       "for the CPU harness and generated Metal launchers.")
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
