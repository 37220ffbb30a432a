"""The `marlin-dsl` command line. Exit codes (docs/CLI.md): 0 success, 1 a check failed,
2 usage (unknown option or value), 3 bad input (a spec file, format, weights), 4 this
machine lacks what the command needs (GPU backend, compiler), 130 interrupted (Ctrl-C)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import zlib
from pathlib import Path

import numpy as np

from .errors import EnvironmentUnavailable, MarlinDSLError, UsageError
from .formats.builtin import BUILTIN_FORMATS

EXIT_OK, EXIT_CHECK_FAILED, EXIT_USAGE, EXIT_INPUT, EXIT_ENVIRONMENT, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130

#: Shape at which `formats` reports storage: a typical LLM projection.
REPORT_SHAPE = (4096, 4096)


#: Tables are wrapped to this many columns (the widest column's cells wrap onto more lines).
TABLE_WIDTH = 100


def _table(headers: list[str], rows: list[list[str]], width: int = TABLE_WIDTH) -> str:
    """A plain-text table no wider than `width`: while it is too wide, the widest column is
    narrowed and its cells wrap (at spaces and commas) onto continuation lines."""
    import textwrap

    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    # A column narrows no further than its longest word (words never break).
    floors = [max(len(word) for cell in [h, *(r[i] for r in rows)] for word in cell.split() or [""])
              for i, h in enumerate(headers)]
    while sum(widths) + 2 * (len(widths) - 1) > width:
        movable = [i for i in range(len(widths)) if widths[i] > floors[i]]
        if not movable:
            break
        widths[max(movable, key=widths.__getitem__)] -= 1  # the widest narrows first
    # Columns of unbreakable words (names, numbers) that still overflow: one space between them.
    sep = "  " if sum(widths) + 2 * (len(widths) - 1) <= width else " "

    def lines(cells: list[str]) -> list[str]:
        wrapped = [textwrap.wrap(c, w, break_on_hyphens=False, break_long_words=False) or [""]
                   for c, w in zip(cells, widths)]
        out = []
        for i in range(max(len(w) for w in wrapped)):
            out.append(sep.join((w[i] if i < len(w) else "").ljust(n) for w, n in zip(wrapped, widths)).rstrip())
        return out
    body = [line for r in rows for line in lines(r)]
    return "\n".join([*lines(headers), sep.join("-" * w for w in widths), *body])


def report_shape(fmt) -> tuple[int, int]:
    """The K x N at which storage is reported: 4096 x 4096, K rounded to whole groups and
    granules of the format (a group of 48 reports at K = 4080)."""
    from math import lcm

    from .formats import PER_COLUMN

    k, n = REPORT_SHAPE
    g = fmt.scale.group_size
    unit = fmt.k_granule if g == PER_COLUMN else lcm(fmt.k_granule, int(g))
    return max(unit, round(k / unit) * unit), n


def cmd_formats(_: argparse.Namespace) -> int:
    rows, docs = [], []
    for name, factory in BUILTIN_FORMATS.items():
        fmt = factory()
        k, n = report_shape(fmt)
        bits = fmt.bits_per_weight(k, n, include_scales=False)
        total = fmt.bits_per_weight(k, n, include_scales=True)
        rows.append([name, fmt.describe(), f"{bits:.3f}", f"{total:.3f}", f"{total / 16:.3f}"])
        docs.append(f"  {name}: {fmt.doc}")
    print(_table(["format", "description", "codes b/w", "bits/w", "vs fp16"], rows))
    print(f"\ncodes b/w: codes and sparsity metadata per weight; bits/w: all storage per weight, with\n"
          f"scales, zero points and biases (as in `compile`); vs fp16: bits/w / 16; at K x N = "
          f"{REPORT_SHAPE[0]} x {REPORT_SHAPE[1]}.\n")
    print("\n".join(docs))
    return EXIT_OK


def _format_rows(spec, rng: np.random.Generator) -> tuple[list[list[str]], int]:
    from .checks.format_check import verify_format

    rows, failures = [], 0
    for fmt in spec.formats:
        check = verify_format(fmt, rng)
        failures += not check.ok
        failed = [name for name, ok in check.checks.items() if not ok]
        rows.append([
            fmt.name, f"{spec.path.name}:{fmt.location.line if fmt.location else '?'}",
            f"{fmt.bits_per_weight(*report_shape(fmt)):.3f}",
            f"{len(check.checks) - len(failed)}/{len(check.checks)}",
            f"{check.quant_excess:.1e}", f"{check.matmul_rel_error:.2e}",
            "PASS" if check.ok else "FAIL: " + ", ".join(failed),
        ])
    return rows, failures


FORMAT_LEGEND = """
bits/w: storage per weight with scales, zero points, biases and metadata, at K x N = 4096 x
  4096 (K rounded to whole groups). checks: the format's self-checks that passed (quantising
  picks the nearest value, array shapes and dtypes, unpack(pack(codes)) == codes, the
  reference matmul, N:M kept per block). q-excess: worst (|dequant - w| - |nearest
  representable - w|) / scale, 0 for round to nearest. rel.err: ||x @ W_q - x @ W|| /
  ||x @ W||, the format's own quantisation error on random weights (informational)."""

KERNEL_LEGEND = """
thr: threads per threadgroup; tgmem: threadgroup (shared) memory bytes. interp: the compiled
  kernel IR run by the interpreter (threadgroups, barriers) on fresh random weights and
  activations, outputs poisoned with NaN first: the worst ||y - y_ref|| / ||y_ref|| against the
  float64 reference of the packed weights over M = 1, 3 and 65 rows (N = tile_n + 17, at
  M = 65 17 + tile_n rounded up to 128; a Gemm with outputs: their widths' sum; K = two K
  steps). PASS: every output written, and
  every check of the error model (marlin_dsl/checks/error_model.py): the error within 1.5x
  (plus a sampling allowance) of what rounding to the activation type predicts (~3e-4 f16,
  ~2.4e-3 bf16), no bias (the slope of y on y_ref within 6 sigma of what the decode's own
  roundings give) and no element off by more than 5% of the rms.
  unchecked: --no-check, the kernels were not run."""


def _progress(message: str) -> None:
    """One overwritten status line on stderr while a long run works; nothing unless stderr
    is a terminal (logs and pipes stay clean). An empty message clears it."""
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K" + message[:TABLE_WIDTH])
        sys.stderr.flush()


def _summary(results) -> str:
    """The worst relative error over the checked shapes, or why there is none."""
    return f"{max(r.rel_error for r in results):.1e}" if results else "-"


def cmd_compile(args: argparse.Namespace) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from .compiler import compile_gemm
    from .ir.text import print_kernel
    from .checks.kernel_check import check_kernel, check_shapes
    from .spec import load_spec
    from .targets import TARGETS
    from .targets.runtimes import runtime_for

    from .compiler import LOWER_STAGE, pipeline_names

    target = TARGETS[args.target]
    passes = None if args.passes is None else [p for p in args.passes.split(",") if p]
    stages = [LOWER_STAGE, *pipeline_names(passes, None)]
    if args.dump_ir is not None and args.dump_ir not in ("all", *stages):
        raise UsageError(f"--dump-ir {args.dump_ir!r}: expected 'all' or a stage of the pipeline "
                         f"({', '.join(stages)})")
    stems = [Path(spec).stem for spec in args.specs]
    if args.output is not None and len(set(stems)) < len(stems):
        twice = sorted({s for s in stems if stems.count(s) > 1})
        raise UsageError(f"-o: specs with the same file name {twice} would write into one folder; "
                         f"compile them in separate runs or rename one")
    if args.output is not None and args.output.exists() and not args.output.is_dir():
        raise UsageError(f"-o {str(args.output)!r} is a file; -o names a folder to write the kernels into")
    failures = bad_specs = 0
    format_rows: list[list[str]] = []
    described: list = []  # (spec, format): each format's description under the table
    compiled_all = []  # (spec, compiled gemm, rng)
    for spec_file in args.specs:
        try:  # a bad spec is reported and the others still compile
            spec = load_spec(spec_file)
            _progress(f"checking the formats of {spec.path.name}")
            # Seeded by the spec's name so a run is repeatable; fresh across specs and kernels.
            rng = np.random.default_rng(zlib.crc32(spec.path.name.encode()))
            rows, bad = _format_rows(spec, rng)
            compiled_here = []
            for gemm in spec.gemms:
                def dump(stage: str, kernel, notes: list[str], gemm=gemm) -> None:
                    if args.dump_ir in ("all", stage):
                        print(f"// ---- {spec.path.name}: {gemm.name} ({target.name}) after {stage} ----")
                        for note in notes:
                            print(f"// {note}")
                        print(print_kernel(kernel))
                _progress(f"compiling {spec.path.name}: {gemm.name}")
                compiled_here.append((spec, compile_gemm(gemm, target, passes, args.stop_after, dump), rng))
        except UsageError:
            raise
        except MarlinDSLError as err:
            print(f"marlin-dsl: error: {err}", file=sys.stderr)
            bad_specs += 1
            continue
        format_rows += rows
        described += [(spec, fmt) for fmt in spec.formats]
        failures += bad
        compiled_all += compiled_here

    runtime = runtime_for(target)
    shipped = {}  # gemm name -> the emitted text that ships, where the target ships text
    written: list[Path] = []  # files -o wrote, summarised at the end
    for spec, compiled, _ in compiled_all:
        out = runtime.ship(compiled, spec.path, None if args.output is None else args.output / spec.stem)
        written += out.files
        if out.text is not None:
            shipped[compiled.gemm.name] = out.text

    native_check = None if args.no_check else runtime.native_check
    harness = None  # gemm name -> the shipped text built for the native check
    if native_check is not None and native_check.available():
        def build(item):
            _, compiled, _ = item
            return native_check.build(compiled, shipped.get(compiled.gemm.name))
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            harness = dict(zip((c.gemm.name for _, c, _ in compiled_all), pool.map(build, compiled_all)))

    kernel_rows = []
    for index, (spec, compiled, rng) in enumerate(compiled_all):
        gemm, kernel = compiled.gemm, compiled.kernel
        if not args.no_check:
            _progress(f"[{index + 1}/{len(compiled_all)}] running {gemm.name} at M = 1, 3, 65")
        interp = [] if args.no_check else [check_kernel(gemm, kernel, shape, rng) for shape in check_shapes(gemm)]
        native = []
        cpu = None if harness is None else harness[gemm.name]  # None: the check does not apply
        if cpu is not None:
            native = [check_kernel(gemm, kernel, shape, rng, lambda k, b, sc: cpu.run(b, sc, seed=1))
                      for shape in check_shapes(gemm)]
        bad = [r for r in interp + native if not r.ok]
        failures += bool(bad)
        kernel_rows.append([
            gemm.name, gemm.schedule.name, str(kernel.attrs["pipeline"]), str(kernel.threads),
            f"{kernel.shared_bytes}", _summary(interp),
            *([_summary(native)] if runtime.native_check is not None else []),
            ("unchecked" if args.no_check else "PASS") if not bad else "FAIL: " + ", ".join(
f"M={r.shape[0]} {r.summary()}" for r in bad),
        ])
    _progress("")
    if format_rows:
        print(_table(["format", "spec:line", "bits/w", "checks", "q-excess", "rel.err", "result"],
                     format_rows))
        print()
        for spec, fmt in described:
            print(f"  {fmt.name}: {fmt.describe()}")
        print(FORMAT_LEGEND)
    if kernel_rows:
        headers = ["gemm", "schedule", "pipeline", "thr", "tgmem", "interp"]
        if runtime.native_check is not None:
            headers.append(runtime.native_check.column)
        print()
        print(_table(headers + ["result"], kernel_rows))
        print(KERNEL_LEGEND)
        if runtime.native_check is not None:
            note = runtime.native_check.note
            if harness is None and not args.no_check:
                note = runtime.native_check.unavailable_note
            print(f"{runtime.native_check.column}: {note}; the same shapes and tolerance")
    if args.cost or args.cost_json is not None:
        _cost(args, [compiled for _, compiled, _ in compiled_all])
    if args.output is not None:
        print(f"marlin-dsl: wrote {len(compiled_all)} kernel(s), {len(written)} files, under "
              f"{args.output}/<spec>/<gemm>/", file=sys.stderr)
    if bad_specs:
        print(f"marlin-dsl: {bad_specs} of {len(args.specs)} spec file(s) failed to load or compile "
              f"(errors above)", file=sys.stderr)
        return EXIT_INPUT
    return EXIT_CHECK_FAILED if failures else EXIT_OK


def _cost(args: argparse.Namespace, compiled: list) -> None:
    """--cost: the cost model's tables; --cost-json FILE: the same as JSON."""
    from .cost import kernel_cost
    from .cost.report import cost_json, cost_report

    costs = [kernel_cost(c.kernel, c.gemm, args.cost_m) for c in compiled]
    if args.cost and costs:
        print()
        print(cost_report(costs, _table))
    if args.cost_json is not None:
        try:
            args.cost_json.write_text(json.dumps(cost_json(costs), indent=1) + "\n")
        except OSError as err:
            raise UsageError(f"--cost-json {str(args.cost_json)!r}: {err.strerror}") from None


def parse_shape(text: str) -> tuple[int, int]:
    """'KxN' (e.g. 4096x14336) -> (K, N)."""
    parts = text.lower().replace("*", "x").split("x")
    try:
        k, n = (int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a shape KxN such as 4096x14336, got {text!r}") from None
    if k < 1 or n < 1:
        raise argparse.ArgumentTypeError(f"K and N must be positive, got {text!r}")
    return k, n


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def bench_settings(args: argparse.Namespace) -> dict:
    """run_bench's keyword arguments from `marlin-dsl bench` arguments (--quick fills in what
    is not given explicitly)."""
    from . import benchmarks as gb

    quick = bool(args.quick)
    return {
        "formats": args.formats or (list(gb.QUICK_FORMATS) if quick else None),
        "pipelines": args.pipelines or None,
        "shapes_kn": args.shapes or (list(gb.QUICK_SHAPES) if quick else None),
        "ms": args.m or (list(gb.QUICK_MS) if quick else None),
        "repeats": args.repeats if args.repeats is not None else (3 if quick else gb.DEFAULT_REPEATS),
        "out_dir": args.out,
    }


def cmd_bench(args: argparse.Namespace) -> int:
    from . import benchmarks as gb

    settings = bench_settings(args)
    gb.gpu_backend()  # says what this machine lacks before anything is written
    out = settings["out_dir"]
    log = gb.Log(out / "bench.log" if out is not None else None)
    doc = gb.run_bench(log=log, plot=not args.no_plot, **settings)
    return 1 if doc["failed"] else 0


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
    from .models.checkpoint import convert_directory

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


def cmd_cache(args: argparse.Namespace) -> int:
    from . import cache

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
    from . import __version__

    parser = argparse.ArgumentParser(prog="marlin-dsl", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"marlin-dsl {__version__}")
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
    compile_.add_argument("--cost", action="store_true", help="print each kernel's static cost "
                          "model: bytes and K-loop instructions per weight, registers, barriers")
    compile_.add_argument("--cost-json", type=Path, metavar="FILE", help="write the cost model as JSON")
    compile_.add_argument("--cost-m", type=_positive, metavar="M", help="activation rows the cost "
                          "model assumes (default: each schedule's tile_m)")
    compile_.set_defaults(func=cmd_compile)
    bench = sub.add_parser(
        "bench", help="time the kernels on a GPU against MLX's own and the bandwidth floor (GPU only)",
        description="Time our kernels (format x pipeline), mx.quantized_matmul (4-bit affine, group 64) "
                    "and float16 mx.matmul per (K, N) and M, with the bandwidth floor; print a table and "
                    "write bench.json (+ bench.png with matplotlib) to --out. Needs MLX's CUDA (or Metal) "
                    "GPU backend.")
    bench.add_argument("--formats", nargs="+", metavar="FORMAT", choices=list(BUILTIN_FORMATS),
                       help="built-in formats (default: all; --quick: fp4 fp4_2of4)")
    bench.add_argument("--pipelines", nargs="+", metavar="PIPELINE",
                       choices=["double_buffered", "fused_dequant", "striped", "weight_stream"],
                       help="pipelines (default: all four; weight_stream picks its schedule by M "
                            "and skips formats it has no layout for)")
    bench.add_argument("--shapes", nargs="+", type=parse_shape, metavar="KxN",
                       help="weight shapes (default: 4096x4096 4096x14336 14336x4096; --quick: 4096x4096)")
    bench.add_argument("--m", nargs="+", type=_positive, metavar="M",
                       help="rows of x (default: 1 16 64 256 2048; --quick: 1 16)")
    bench.add_argument("--repeats", type=_positive, default=None,
                       help="timed batches per measurement (default: 5; --quick: 3)")
    bench.add_argument("--out", type=Path, default=Path("marlin-bench"),
                       help="folder for bench.json, bench.log and bench.png (default: ./marlin-bench)")
    bench.add_argument("--quick", action="store_true",
                       help="one shape (4096x4096), M in 1 16, formats fp4 and fp4_2of4")
    bench.add_argument("--no-plot", action="store_true", help="do not write bench.png")
    bench.set_defaults(func=cmd_bench)
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
    convert.add_argument("--group-size", type=_positive, default=None,
                         help="group size for the built-in formats (default: each format's own)")
    convert.add_argument("--skip", action="append", metavar="PATTERN",
                         help="leave layers matching this path pattern as they are (e.g. lm_head)")
    convert.add_argument("--backend", choices=["auto", "cuda", "metal", "mlx"], default="auto",
                         help="the backend whose kernels the layers are laid out for while converting")
    convert.add_argument("--quiet", action="store_true", help="no progress bar")
    convert.set_defaults(func=cmd_convert)
    cache = sub.add_parser("cache", help="show where marlin-dsl caches builds, and their size",
                           description="The per-user cache (docs/CLI.md): g++ builds of emitted Metal "
                                       "for the CPU harness and generated Metal launchers.")
    cache.add_argument("--clear", action="store_true", help="remove everything in the cache")
    cache.set_defaults(func=cmd_cache)
    return parser


def exit_code(err: MarlinDSLError) -> int:
    """The documented exit code of one of our errors."""
    if isinstance(err, UsageError):
        return EXIT_USAGE
    if isinstance(err, EnvironmentUnavailable):
        return EXIT_ENVIRONMENT
    return EXIT_INPUT


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


if __name__ == "__main__":
    sys.exit(main())
