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
    from .compiler import LOWER_STAGE, compile_gemm
    from .ir.text import print_kernel
    from .kernel_check import check_kernel, check_shapes
    from .spec import load_spec
    from .targets import TARGETS
    from .verify import verify_format

    target = TARGETS[args.target]
    passes = None if args.passes is None else [p for p in args.passes.split(",") if p]
    failures = 0
    format_rows, kernel_rows = [], []
    for spec_file in args.specs:
        spec = load_spec(spec_file)
        # Seeded by the spec's name so a run is repeatable; fresh across specs and kernels.
        rng = np.random.default_rng(zlib.crc32(spec.path.name.encode()))
        for fmt in spec.formats:
            check = verify_format(fmt, rng)
            failures += not check.ok
            failed = [name for name, ok in check.checks.items() if not ok]
            format_rows.append([
                spec.path.name, fmt.name, str(fmt.location.line if fmt.location else "?"),
                fmt.describe(), f"{fmt.bits_per_weight(*REPORT_SHAPE):.3f}",
                f"{check.shape[0]}x{check.shape[1]}", f"{len(check.checks) - len(failed)}/{len(check.checks)}",
                f"{check.quant_excess:.1e}", f"{check.matmul_rel_error:.2e}",
                "PASS" if check.ok else "FAIL: " + ", ".join(failed),
            ])
        for gemm in spec.gemms:
            def dump(stage: str, kernel, notes: list[str], gemm=gemm) -> None:
                if args.dump_ir in ("all", stage):
                    print(f"// ---- {spec.path.name}: {gemm.name} ({target.name}) after {stage} ----")
                    for note in notes:
                        print(f"// {note}")
                    print(print_kernel(kernel))
            compiled = compile_gemm(gemm, target, passes, args.stop_after, dump)
            if args.output is not None:
                out_dir = args.output / spec.stem
                out_dir.mkdir(parents=True, exist_ok=True)
                (out_dir / f"{gemm.name}.{target.name}.ir").write_text(print_kernel(compiled.kernel))
            results = [] if args.no_check else [check_kernel(gemm, compiled.kernel, shape, rng)
                                                 for shape in check_shapes(gemm)]
            bad = [r for r in results if not r.ok]
            failures += bool(bad)
            kernel = compiled.kernel
            kernel_rows.append([
                spec.path.name, gemm.name, gemm.format.name, gemm.schedule.name,
                str(kernel.attrs["pipeline"]), str(kernel.threads), f"{kernel.shared_bytes}",
                str(sum(1 for _ in kernel.walk())),
                ", ".join(f"M={r.shape[0]}:{r.rel_error:.1e}" for r in results) or "skipped",
                "PASS" if not bad else "FAIL: " + ", ".join(
                    f"M={r.shape[0]} rel {r.rel_error:.2e} > {r.tolerance:g}, {r.untouched_poison} unwritten"
                    for r in bad),
            ])
    print(_table(["spec", "format", "line", "description", "bits/w", "K x N", "checks",
                  "q-excess", "rel.err vs fp64", "result"], format_rows))
    print("\nq-excess: worst (|dequant - w| - |nearest representable - w|) / scale (0 = round to nearest)")
    print("rel.err vs fp64: ||x @ W_q - x @ W|| / ||x @ W||, the format's quantisation error")
    if kernel_rows:
        print()
        print(_table(["spec", "gemm", "format", "schedule", "pipeline", "threads", "tg bytes",
                      "ops", f"IR interpreter vs fp64 ({target.name} IR)", "result"], kernel_rows))
        print("\nIR interpreter: the compiled kernel IR executed with threadgroup semantics on "
              "random data, relative error against the float64 reference at each M")
    return 1 if failures else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="marlin-dsl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("formats", help="list the built-in formats").set_defaults(func=cmd_formats)
    compile_ = sub.add_parser("compile", help="load spec files, check and summarise them")
    compile_.add_argument("specs", nargs="+", type=Path, help="spec files (Python)")
    compile_.add_argument("--target", choices=["metal", "cuda"], default="metal",
                          help="target to compile for (default: metal)")
    compile_.add_argument("--dump-ir", metavar="all|lower|PASS",
                          help="print the IR after every stage (all) or after one stage")
    compile_.add_argument("--stop-after", metavar="PASS", help="stop the pipeline after this stage")
    compile_.add_argument("--passes", metavar="P1,P2", help="pass pipeline (default: "
                          "specialise,unroll,fold,cse,dce,interleave)")
    compile_.add_argument("-o", "--output", type=Path, help="write the compiled kernels here")
    compile_.add_argument("--no-check", action="store_true",
                          help="skip executing the kernels (the format checks still run)")
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
