"""The `marlin-dsl` command line."""
from __future__ import annotations

import argparse
import sys
import zlib
from pathlib import Path

import numpy as np

from .errors import MarlinDSLError
from .formats.builtin import BUILTIN_FORMATS

#: Shape at which `formats` reports storage: a typical LLM projection.
REPORT_SHAPE = (4096, 4096)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join([line, "  ".join("-" * w for w in widths), *body])


def cmd_formats(_: argparse.Namespace) -> int:
    k, n = REPORT_SHAPE
    rows = []
    for name, factory in BUILTIN_FORMATS.items():
        fmt = factory()
        bits = fmt.bits_per_weight(k, n, include_scales=False)
        total = fmt.bits_per_weight(k, n, include_scales=True)
        rows.append([name, fmt.describe(), f"{bits:.3f}", f"{total:.3f}",
                     f"{total / 16:.3f}", fmt.doc])
    print(_table(["format", "description", "bits/w", "bits/w+scales", "vs fp16", "doc"], rows))
    print(f"\nbits per weight at K x N = {k} x {n}; 'vs fp16' is storage with scales / fp16 storage")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from .spec import load_spec
    from .verify import verify_format

    failures = 0
    rows = []
    for spec_file in args.specs:
        spec = load_spec(spec_file)
        # Seeded by the spec's path so a run is repeatable; fresh across specs and formats.
        rng = np.random.default_rng(zlib.crc32(str(spec.path).encode()))
        for fmt in spec.formats:
            check = verify_format(fmt, rng)
            failures += not check.ok
            failed = [name for name, ok in check.checks.items() if not ok]
            rows.append([
                spec.path.name, fmt.name, str(fmt.location.line if fmt.location else "?"),
                fmt.describe(), f"{fmt.bits_per_weight(*REPORT_SHAPE):.3f}",
                f"{check.shape[0]}x{check.shape[1]}", f"{len(check.checks) - len(failed)}/{len(check.checks)}",
                f"{check.quant_excess:.1e}", f"{check.matmul_rel_error:.2e}",
                "PASS" if check.ok else "FAIL: " + ", ".join(failed),
            ])
    print(_table(["spec", "format", "line", "description", "bits/w", "K x N", "checks",
                  "q-excess", "rel.err vs fp64", "result"], rows))
    print("\nq-excess: worst (|dequant - w| - |nearest representable - w|) / scale (0 = round to nearest)")
    print("rel.err vs fp64: ||x @ W_q - x @ W|| / ||x @ W||, the format's quantisation error")
    return 1 if failures else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="marlin-dsl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("formats", help="list the built-in formats").set_defaults(func=cmd_formats)
    compile_ = sub.add_parser("compile", help="load spec files, check and summarise them")
    compile_.add_argument("specs", nargs="+", type=Path, help="spec files (Python)")
    compile_.set_defaults(func=cmd_compile)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except MarlinDSLError as err:
        print(f"marlin-dsl: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
