"""`marlin-dsl convert`: an mlx-lm model directory's linear layers to marlin-dsl formats."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import MarlinDSLError
from ..formats.builtin import BUILTIN_FORMATS
from .common import positive


def parse_format_rules(values: list[str] | None) -> str | dict[str, str]:
    """--format values -> convert()'s choice: one NAME for every layer, or PATTERN=NAME rules
    (first match wins, later plain NAME is the default "*"); NAME may be "none"."""
    values = values or ["fp4"]
    rules: dict[str, str | None] = {}
    default: str | None = None
    for value in values:
        pattern, sep, name = value.rpartition("=")
        name = name.strip()
        choice = None if name.lower() == "none" else name
        if choice is not None and choice != "exact" and choice not in BUILTIN_FORMATS:
            raise MarlinDSLError(f"--format {value!r}: unknown format {name!r}; expected one of "
                                 f"{sorted(BUILTIN_FORMATS)}, 'exact' or 'none'")
        if sep:
            rules[pattern.strip()] = choice
        else:
            default = choice
    if not rules:
        return default  # type: ignore[return-value]
    rules["*"] = default
    return rules  # type: ignore[return-value]


def cmd_convert(args: argparse.Namespace) -> int:
    from ..models.checkpoint import convert_directory

    choice = parse_format_rules(args.format)
    if args.skip:
        skip = {pattern: None for pattern in args.skip}
        choice = skip | (choice if isinstance(choice, dict) else {"*": choice})
    conversion = convert_directory(args.src, args.dst, choice, group_size=args.group_size,
                                   backend=args.backend, progress=None if args.quiet else sys.stderr)
    counts: dict[str, int] = {}
    for fmt in conversion.formats.values():
        counts[fmt.name] = counts.get(fmt.name, 0) + 1
    summary = ", ".join(f"{count} x {name}" for name, count in sorted(counts.items())) or "no layers"
    print(f"converted {len(conversion.formats)} linear layers ({summary}) in "
          f"{conversion.seconds:.1f} s; left {len(conversion.skipped)} as they were")
    for path, why in conversion.skipped.items():
        if why != "no format chosen":
            print(f"  skipped {path}: {why}")
    print(f"wrote {args.dst}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The `convert` subcommand."""
    convert = sub.add_parser(
        "convert", help="convert an mlx-lm model directory's linear layers to marlin-dsl formats",
        description="Load an mlx-lm model directory (float weights, or quantised by MLX), replace its "
                    "linear layers by MarlinLinear in the chosen formats (packed on the device), and write "
                    "a model directory that marlin_dsl.models.load() reads. Needs mlx-lm.")
    convert.add_argument("src", type=Path, help="the source model directory")
    convert.add_argument("dst", type=Path, help="where to write the converted model")
    convert.add_argument("--format", action="append", metavar="[PATTERN=]NAME",
                         help="format of the linear layers: a built-in name, 'exact' (keep an MLX-"
                              "quantised layer's own format, bit for bit) or 'none'; repeat as "
                              "PATTERN=NAME for rules by layer path, first match wins, e.g. "
                              "--format fp4 --format mlp=fp4_2of4 (default: fp4)")
    convert.add_argument("--group-size", type=positive, default=None,
                         help="group size for the built-in formats (default: each format's own)")
    convert.add_argument("--skip", action="append", metavar="PATTERN",
                         help="leave layers matching this path pattern as they are (e.g. lm_head)")
    convert.add_argument("--backend", choices=["auto", "cuda", "metal", "mlx"], default="auto",
                         help="the backend whose kernels the layers are laid out for while converting")
    convert.add_argument("--quiet", action="store_true", help="no progress bar")
    convert.set_defaults(func=cmd_convert)


__all__ = ["add_parsers", "cmd_convert", "parse_format_rules"]
