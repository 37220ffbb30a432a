"""`marlin-dsl convert`: an mlx-lm model directory's linear layers to marlin-dsl formats.

Everything that can be checked without the model is checked before it is loaded (format
names, --spec files, --group-size, the source and the destination), so a typo costs a second,
not a conversion."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import FormatError, UsageError
from ..formats import Format
from ..formats.builtin import BUILTIN_FORMATS, builtin_format
from ..models.rules import EXACT, MATCHING_RULE, UnmatchedRules
from .common import EXIT_CHECK_FAILED, EXIT_OK, positive


def spec_formats(paths: list[Path] | None) -> dict[str, Format]:
    """The formats declared in --spec files by name (SpecError naming the file and line)."""
    from ..spec import load_spec

    found: dict[str, Format] = {}
    origin: dict[str, Path] = {}
    for path in paths or []:
        for fmt in load_spec(path).formats:
            if fmt.name in found and found[fmt.name] != fmt:
                raise UsageError(f"--spec: {origin[fmt.name]} and {path} declare different formats named "
                                 f"{fmt.name!r}")
            found[fmt.name], origin[fmt.name] = fmt, path
    return found


def _format_choice(name: str, value: str, specs: dict[str, Format]) -> str | Format | None:
    """One --format NAME: a spec's format (spec names win over built-in ones), a built-in
    name, 'exact' or 'none'."""
    if name.lower() == "none":
        return None
    if name in specs:
        return specs[name]
    if name == EXACT or name in BUILTIN_FORMATS:
        return name
    from_specs = f"formats of the --spec files {sorted(specs)}, " if specs else ""
    raise UsageError(f"--format {value!r}: unknown format {name!r}; expected one of the {from_specs}"
                     f"built-in formats {sorted(BUILTIN_FORMATS)}, {EXACT!r} or 'none'"
                     + ("" if specs else " (formats declared in a spec file: --spec FILE)"))


def parse_format_rules(values: list[str] | None, specs: dict[str, Format] | None = None,
                       skip: list[str] | None = None) -> tuple[object, dict[str, str]]:
    """--format and --skip values -> (convert()'s choice, {pattern: the argument that gave it}).
    The choice is one format for every layer, or PATTERN=NAME rules (first match wins, --skip
    patterns first, a plain NAME is the default "*"); NAME may be "none"."""
    specs = specs or {}
    rules: dict[str, object] = {}
    origin: dict[str, str] = {}
    for pattern in skip or []:
        rules[pattern] = None
        origin[pattern] = f"--skip {pattern!r}"
    default: object = "fp4" if not values else None
    for value in values or []:
        pattern, sep, name = value.rpartition("=")
        choice = _format_choice(name.strip(), value, specs)
        if not sep:
            default = choice
            continue
        pattern = pattern.strip()
        if pattern in origin:
            raise UsageError(f"--format {value!r}: pattern {pattern!r} is already given by {origin[pattern]}")
        rules[pattern], origin[pattern] = choice, f"--format {value!r}"
    if not rules:
        return default, origin
    rules["*"] = default
    return rules, origin


def check_group_size(group_size: int | None, choice: object) -> None:
    """--group-size applies to the built-in formats chosen: each must take it."""
    if group_size is None:
        return
    values = choice.values() if isinstance(choice, dict) else [choice]
    names = sorted({v for v in values if isinstance(v, str) and v in BUILTIN_FORMATS})
    if not names:
        raise UsageError(f"--group-size {group_size}: applies to built-in formats, and none is chosen "
                         "(a spec file's format has its own group size)")
    for name in names:
        try:
            builtin_format(name, group_size)
        except FormatError as err:
            raise UsageError(f"--group-size {group_size}: {err.message}") from None


def cmd_convert(args: argparse.Namespace) -> int:
    from ..models.destination import check_destination, check_not_inside
    from ..models.directory import check_source, convert_directory
    from ..models.mlx_lm_env import require_mlx_lm

    if _quantized_checkpoint(args.src):
        return _import_checkpoint(args)
    choice, origin = parse_format_rules(args.format, spec_formats(args.spec), args.skip)
    check_group_size(args.group_size, choice)
    require_mlx_lm("marlin-dsl convert")
    source, _ = check_source(args.src, "SRC")
    check_not_inside(args.dst, source, "DST")
    check_destination(args.dst, args.overwrite, "DST", "--overwrite")
    try:
        conversion = convert_directory(source, args.dst, choice, group_size=args.group_size,
                                       backend=args.backend, overwrite=args.overwrite,
                                       progress=None if args.quiet else sys.stderr)
    except UnmatchedRules as err:  # name the command-line arguments, not the rule mapping
        raise UnmatchedRules(err.unmatched, lambda pattern: origin.get(pattern, repr(pattern))) from None
    summary = ", ".join(f"{count} x {name}" for name, count in conversion.counts().items()) or "no layers"
    print(f"converted {len(conversion.formats)} linear layers ({summary}) in "
          f"{conversion.seconds:.1f} s; left {len(conversion.skipped)} as they were")
    unconverted = conversion.unconverted
    for path, why in unconverted.items():
        print(f"  not converted {path}: {why}")
    print(f"wrote {args.dst}")
    if unconverted:
        total = len(conversion.formats) + len(conversion.skipped)
        path, why = next(iter(unconverted.items()))
        print(f"marlin-dsl: {len(unconverted)} of {total} linear layers were left unconverted because the "
              f"chosen format cannot hold their shape (listed above; {path}: {why}); choose another "
              "--group-size or format for them, or --skip them", file=sys.stderr)
        return EXIT_CHECK_FAILED
    return EXIT_OK


def _quantized_checkpoint(src: Path) -> bool:
    """SRC is a .gguf file or a model directory with a GPTQ / AWQ quantization_config."""
    import json

    if src.suffix == ".gguf":
        return True
    config = src / "config.json"
    if not config.is_file():
        return False
    try:
        return "quantization_config" in json.loads(config.read_text())
    except (OSError, ValueError):
        return False


def _import_checkpoint(args: argparse.Namespace) -> int:
    """SRC's quantised layers loaded bit for bit in their own checkpoint formats
    (models/imports.py); --format and friends do not apply."""
    import time

    from ..models.checkpoint import save_model
    from ..models.destination import check_destination, check_not_inside
    from ..models.imports import read_gguf, read_hf_quantized
    from ..models.mlx_lm_env import require_mlx_lm

    given = [flag for flag, value in (("--format", args.format), ("--spec", args.spec),
                                      ("--group-size", args.group_size), ("--skip", args.skip)) if value]
    if given:
        raise UsageError(f"{given[0]}: SRC {args.src} is a quantised checkpoint; its layers keep their own "
                         f"formats, bit for bit (leave out {', '.join(given)})")
    require_mlx_lm("marlin-dsl convert")
    if not args.src.exists():
        raise UsageError(f"SRC: {args.src} does not exist")
    check_not_inside(args.dst, args.src if args.src.is_dir() else args.src.parent, "DST")
    check_destination(args.dst, args.overwrite, "DST", "--overwrite")
    start = time.perf_counter()
    if args.src.suffix == ".gguf":
        model, config = read_gguf(args.src, backend=args.backend)
        source_dir = None
    else:
        model, config = read_hf_quantized(args.src, backend=args.backend)
        source_dir = args.src
    save_model(model, args.dst, config, source_dir=source_dir, overwrite=args.overwrite)
    from ..nn import MarlinLinear

    counts: dict[str, int] = {}
    for _, module in model.named_modules():
        if isinstance(module, MarlinLinear):
            counts[module.format.name] = counts.get(module.format.name, 0) + 1
    summary = ", ".join(f"{c} x {name}" for name, c in sorted(counts.items()))
    print(f"imported {sum(counts.values())} quantised linear layers ({summary}) bit for bit in "
          f"{time.perf_counter() - start:.1f} s")
    print(f"wrote {args.dst}")
    if source_dir is None:
        print("the GGUF file's tokenizer is not converted: for `marlin-dsl generate`, copy the model's "
              "tokenizer files (tokenizer.json, tokenizer_config.json, ...) into DST")
    return EXIT_OK


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The `convert` subcommand."""
    convert = sub.add_parser(
        "convert", help="convert an mlx-lm model directory's linear layers to marlin-dsl formats",
        description="Load an mlx-lm model directory (float weights, or quantised by MLX), replace its "
                    "linear layers by MarlinLinear in the chosen formats (packed on the device), and write "
                    "a model directory that marlin_dsl.models.load(), `marlin-dsl generate` and "
                    "mlx_lm.generate --trust-remote-code read. Needs mlx-lm "
                    "(pip install \"marlin-dsl[mlx-lm]\"). Patterns: " + MATCHING_RULE + ". Exit codes: 0 "
                    "done, 1 written but some layers left unconverted (their shape does not fit the "
                    "format), 2 usage (unknown format, a pattern that matches no layer, DST not empty), "
                    "3 bad input (the source, its weights), 4 mlx-lm missing.")
    convert.add_argument("src", type=Path, metavar="SRC",
                         help="the source model directory, or a quantised checkpoint: a llama .gguf file "
                              "or a directory with a GPTQ / AWQ quantization_config (loaded bit for bit)")
    convert.add_argument("dst", type=Path, metavar="DST",
                         help="where to write the converted model (absent or empty, or --overwrite)")
    convert.add_argument("--format", action="append", metavar="[PATTERN=]NAME",
                         help="format of the linear layers: a built-in name, a format of a --spec file "
                              "(those win over built-in names), 'exact' (keep an MLX-quantised layer's "
                              "own format, bit for bit) or 'none'; repeat as PATTERN=NAME for rules by "
                              "layer path, first match wins, e.g. --format fp4 --format mlp=fp4_2of4 "
                              "(default: fp4). A pattern that matches no layer is an error")
    convert.add_argument("--spec", action="append", type=Path, metavar="FILE",
                         help="a spec file whose declared formats --format may name (repeatable)")
    convert.add_argument("--group-size", type=positive, default=None, metavar="G",
                         help="group size for the built-in formats chosen (default: each format's own; "
                              "a spec file's format has its own)")
    convert.add_argument("--skip", action="append", metavar="PATTERN",
                         help="leave layers matching this path pattern as they are (e.g. lm_head); "
                              "a pattern that matches no layer is an error")
    convert.add_argument("--overwrite", action="store_true",
                         help="replace DST if it is a model directory (the new one is written beside it "
                              "and renamed into place when complete)")
    convert.add_argument("--backend", choices=["auto", "cuda", "metal", "mlx"], default="auto",
                         help="the backend whose kernels the layers are laid out for while converting")
    convert.add_argument("--quiet", action="store_true", help="no progress (a bar on a terminal, "
                                                               "else a line per layer, on stderr)")
    convert.set_defaults(func=cmd_convert)


__all__ = ["add_parsers", "check_group_size", "cmd_convert", "parse_format_rules", "spec_formats"]
