"""`marlin-dsl compile` (load spec files, verify formats, compile and check every Gemm) and
`marlin-dsl formats` (the built-in formats)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import zlib
from pathlib import Path

import numpy as np

from ..errors import CompileError, MarlinDSLError, ScheduleError, UsageError
from ..formats.builtin import BUILTIN_FORMATS
from .common import EXIT_CHECK_FAILED, EXIT_INPUT, EXIT_OK, positive, progress, table

#: Shape at which `formats` reports storage: a typical LLM projection.
REPORT_SHAPE = (4096, 4096)


def report_shape(fmt) -> tuple[int, int]:
    """The K x N at which storage is reported: 4096 x 4096, K rounded to whole groups and
    granules of the format (a group of 48 reports at K = 4080)."""
    from math import lcm

    from ..formats import PER_COLUMN

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
    print(table(["format", "description", "codes b/w", "bits/w", "vs fp16"], rows))
    print(f"\ncodes b/w: codes and sparsity metadata per weight; bits/w: all storage per weight, with\n"
          f"scales, zero points and biases (as in `compile`); vs fp16: bits/w / 16; at K x N = "
          f"{REPORT_SHAPE[0]} x {REPORT_SHAPE[1]}.\n")
    print("\n".join(docs))
    return EXIT_OK


def _format_rows(spec, rng: np.random.Generator) -> tuple[list[list[str]], int]:
    from ..checks.format_check import verify_format

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
  roundings give) and no element off by more than 5% of the rms. A Gemm with an epilogue:
  against the float64 composition (bias, silu(gate) * up, + residual) with the model's errors
  carried through it (checks/epilogue_check.py; no slope check), N whole gate/up runs.
  unchecked: --no-check, the kernels were not run."""


def _summary(results) -> str:
    """The worst relative error over the checked shapes, or why there is none."""
    return f"{max(r.rel_error for r in results):.1e}" if results else "-"


def cmd_compile(args: argparse.Namespace) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from ..compiler import compile_gemm
    from ..ir.text import print_kernel
    from ..checks.kernel_check import check_kernel, check_shapes
    from ..spec import load_spec
    from ..machine import TARGETS
    from ..targets.runtimes import runtime_for

    from ..compiler import LOWER_STAGE, pipeline_names

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
    skipped: list[list[str]] = []  # Gemms whose schedule declares other targets
    for spec_file in args.specs:
        try:  # a bad spec is reported and the others still compile
            spec = load_spec(spec_file)
            progress(f"checking the formats of {spec.path.name}")
            # Seeded by the spec's name so a run is repeatable; fresh across specs and kernels.
            rng = np.random.default_rng(zlib.crc32(spec.path.name.encode()))
            rows, bad = _format_rows(spec, rng)
        except UsageError:
            raise
        except MarlinDSLError as err:
            print(f"marlin-dsl: error: {err}", file=sys.stderr)
            bad_specs += 1
            continue
        format_rows += rows
        described += [(spec, fmt) for fmt in spec.formats]
        failures += bad
        bad_gemms = 0
        for gemm in spec.gemms:
            if not gemm.schedule.runs_on(target):
                skipped.append(_skipped_row(gemm))
                continue
            def dump(stage: str, kernel, notes: list[str], gemm=gemm) -> None:
                if args.dump_ir in ("all", stage):
                    print(f"// ---- {spec.path.name}: {gemm.name} ({target.name}) after {stage} ----")
                    for note in notes:
                        print(f"// {note}")
                    print(print_kernel(kernel))
            progress(f"compiling {spec.path.name}: {gemm.name}")
            try:  # a Gemm that does not compile is reported; the spec's other results still show
                compiled_all.append((spec, compile_gemm(gemm, target, passes, args.stop_after, dump), rng))
            except UsageError:
                raise
            except MarlinDSLError as err:
                print(f"marlin-dsl: error: {_gemm_error(err, gemm, target, TARGETS)}", file=sys.stderr)
                bad_gemms += 1
        bad_specs += bad_gemms > 0

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
            progress(f"[{index + 1}/{len(compiled_all)}] running {gemm.name} at M = 1, 3, 65")
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
    progress("")
    if format_rows:
        print(table(["format", "spec:line", "bits/w", "checks", "q-excess", "rel.err", "result"],
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
        print(table(headers + ["result"], kernel_rows))
        print(KERNEL_LEGEND)
        if runtime.native_check is not None:
            note = runtime.native_check.note
            if harness is None and not args.no_check:
                note = runtime.native_check.unavailable_note
            print(f"{runtime.native_check.column}: {note}; the same shapes and tolerance")
    if skipped:
        print(f"\nnot compiled for {target.name}: their schedules declare other targets "
              "(Schedule(..., targets=...))")
        print(table(["gemm", "schedule", "spec:line", "why"], skipped))
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


def _skipped_row(gemm) -> list[str]:
    """A row of the skipped list: the Gemm, its schedule, where the schedule is declared
    (the line that says `targets=`) and why."""
    s = gemm.schedule
    where = f"{Path(s.location.file).name}:{s.location.line}" if s.location else "?"
    return [gemm.name, s.name, where, f"declares targets={s.targets!r}"]


def _gemm_error(err: MarlinDSLError, gemm, target, targets: dict) -> str:
    """One line for a Gemm that does not compile: the spec line (the error's, else the
    Gemm's), the Gemm's name (a schedule may serve several), the message and, where the
    schedule does not fit this target (an error at its line) but passes another's checks,
    the hint that a schedule meant for other targets says so with `targets=`."""
    message = err.message if err.message.startswith(f"gemm {gemm.name!r}") else f"gemm {gemm.name!r}: {err.message}"
    s = gemm.schedule
    if isinstance(err, (ScheduleError, CompileError)) and err.location is not None and err.location == s.location:
        fits = [name for name, other in sorted(targets.items()) if other != target and _fits(gemm, other)]
        if fits:
            message += (f" (schedule {s.name!r} fits {', '.join(fits)}: if it is meant only for "
                        f"{'that target' if len(fits) == 1 else 'those'}, declare it: "
                        f"Schedule(..., targets={tuple(fits)!r}))")
    where = err.location or gemm.location
    return f"{where}: {message}" if where is not None else message


def _fits(gemm, target) -> bool:
    """Whether `gemm`'s schedule passes `target`'s checks for its format (its declared targets,
    the pipeline's checks, the thread limit; threadgroup memory is checked by the lowering)."""
    try:
        gemm.schedule.check(gemm.format, target)
    except MarlinDSLError:
        return False
    return True


def _cost(args: argparse.Namespace, compiled: list) -> None:
    """--cost: the cost model's tables; --cost-json FILE: the same as JSON."""
    from ..cost import kernel_cost
    from ..cost.report import cost_json, cost_report

    costs = [kernel_cost(c.kernel, c.gemm, args.cost_m) for c in compiled]
    if args.cost and costs:
        print()
        print(cost_report(costs, table))
    if args.cost_json is not None:
        try:
            args.cost_json.write_text(json.dumps(cost_json(costs), indent=1) + "\n")
        except OSError as err:
            raise UsageError(f"--cost-json {str(args.cost_json)!r}: {err.strerror}") from None


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The `formats` and `compile` subcommands."""
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
    compile_.add_argument("--cost-m", type=positive, metavar="M", help="activation rows the cost "
                          "model assumes (default: each schedule's tile_m)")
    compile_.set_defaults(func=cmd_compile)


__all__ = ["REPORT_SHAPE", "add_parsers", "cmd_compile", "cmd_formats", "report_shape"]
