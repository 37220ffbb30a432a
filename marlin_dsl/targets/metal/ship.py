"""Writing a compiled kernel out for users to vendor: for Metal, `<gemm>.metal` (the exact
text MLX compiles, header and body between marker lines), `<gemm>.py` (a launcher that needs
only MLX), `manifest.json` (what the kernel is and how to call it) and `<gemm>.ir` (the kernel
IR after the passes). Everything written is a function of the spec alone: no dates, no
absolute paths, so the same spec gives byte-identical files."""
from __future__ import annotations

import hashlib
import json
from fractions import Fraction
from pathlib import Path

from .printer import DIMS_NAME, MetalSource, print_metal
from ..._version import __version__
from ...compiler import CompiledGemm
from ...formats import Format
from ...formats.text import format_to_text
from ...ir.text import print_kernel
from ...layouts.weight_stream import stream_layout
from ...machine.outputs import gated, steps_of

HEADER_BEGIN = "// ---- marlin-dsl: header begin ----\n"
HEADER_END = "// ---- marlin-dsl: header end ----\n"
BODY_BEGIN = "// ---- marlin-dsl: body begin ----\n"
BODY_END = "// ---- marlin-dsl: body end ----\n"


def k_multiple(fmt: Format) -> int:
    """K must be a multiple of this for the format (its granule, scale group, super-block)."""
    return fmt.k_multiple


def buffer_shapes(fmt: Format) -> dict[str, str]:
    """Each packed buffer's shape as a formula in K and N, e.g. `[K/16, N]`."""
    k = k_multiple(fmt) * 2  # any valid K: shapes are linear in K
    shapes = {}
    for spec in fmt.buffers(k, 7):
        rows, cols = spec.shape
        if spec.name in fmt.parameters() and rows == 1:  # per column (or one group of K)
            row_text = "1"
        else:
            ratio = Fraction(rows, k)
            row_text = "K" if ratio == 1 else (f"K/{ratio.denominator}" if ratio.numerator == 1
                                               else f"K*{ratio.numerator}/{ratio.denominator}")
        col_text = "N" if cols == 7 else f"ceil(N/{fmt.sparsity.block_n})"  # type: ignore[union-attr]
        shapes[spec.name] = f"[{row_text}, {col_text}]"
    return shapes


def manifest(compiled: CompiledGemm, src: MetalSource, spec_path: Path | None) -> dict:
    gemm, kernel = compiled.gemm, compiled.kernel
    fmt, s = gemm.format, gemm.schedule
    act = {"f16": "float16", "bf16": "bfloat16"}[gemm.activation]
    steps = steps_of(kernel.attrs)
    n_out = "N/2" if gated(steps) else "N"
    shapes = {"x": "[M, K]", "y": f"[M, {n_out}]", **buffer_shapes(fmt), DIMS_NAME: "[3]",
              **{f"y{i}": f"[M, {w}]" for i, w in enumerate(gemm.outputs)},
              "bias": "[N]", "residual": f"[M, {n_out}]"}
    if kernel.attrs.get("pipeline") == "striped":
        shapes["partials"] = (f"[ceil(M/{s.tile_m}) * ceil(N/{s.tile_n}) * "
                              f"{kernel.attrs['parallel']} * {s.tile_m * s.tile_n}]")
        shapes["counters"] = f"[ceil(M/{s.tile_m}) * ceil(N/{s.tile_n})]"
    layout = kernel.attrs.get("weight_layout")
    extra = {}
    if layout is not None:  # qweight (and N:M metadata) re-laid out at pack time (layouts/weight_stream.py)
        stream = stream_layout(fmt, compiled.target)
        vectors = f"ceil(N/{stream.tile_rows}) * ceil(K/{stream.dense_chunk})"
        shapes["qweight"] = f"[{vectors} * {stream.lanes * stream.code_words}]"
        laid_out = "qweight"
        if stream.has_meta:
            shapes["meta"] = f"[{vectors} * {stream.lanes * stream.meta_words}]"
            laid_out = "qweight and meta"
        extra = {"weight_layout": layout,
                 "weights": (f"{laid_out} in the kernel's layout: marlin_dsl.kernel_args.to_kernel_layout("
                             f"{{'weight_layout': {layout!r}, 'target': {compiled.target.name!r}}}, "
                             "marlin_dsl.pack(format, w)); the other arrays as packed")}
    return {
        "tool": "marlin-dsl",
        "version": __version__,
        "spec": None if spec_path is None else spec_path.name,
        "spec_sha256": None if spec_path is None else hashlib.sha256(spec_path.read_bytes()).hexdigest(),
        "gemm": gemm.name,
        "target": compiled.target.name,
        "computes": "y[M, N] = x[M, K] @ W[K, N], W unpacked from the format's buffers"
                    + (f"; y's columns written as y0..y{len(gemm.outputs) - 1} of widths "
                       f"{list(gemm.outputs)} (N = {sum(gemm.outputs)})" if gemm.outputs else "")
                    + (f"; then the epilogue {' + '.join(steps)} (marlin_dsl/epilogue.py)" if steps else ""),
        "activation": act,
        "format": {"name": fmt.name, "description": fmt.describe(), "text": format_to_text(fmt)},
        "schedule": {"name": s.name, "tile": [s.tile_m, s.tile_n, s.tile_k],
                     "warps": [s.warps_m, s.warps_n], "pipeline": str(kernel.attrs["pipeline"]),
                     # the targets the schedule declares (None: every target)
                     "targets": None if s.targets is None else list(s.targets),
                     **({"parallel": kernel.attrs["parallel"]} if "parallel" in kernel.attrs else {})},
        "constraints": {"M": ">= 1",
                        "N": f"= {sum(gemm.outputs)}" if gemm.outputs else "a multiple of 16" if gated(steps) else ">= 1",
                        "K": f"a positive multiple of {k_multiple(fmt)}"},
        "kernel": {
            "name": src.name,
            "mlx_function_name": src.mlx_kernel_name(),
            "threads_per_threadgroup": src.threads,
            "threadgroups": [str(d) for d in kernel.grid],
            "threadgroup_memory_bytes": src.shared_bytes,
            # The striped pipeline's arrival counters must start at zero: MLX fills the
            # outputs with init_value before the launch. Other kernels write all of y.
            "init_value": 0 if kernel.attrs.get("pipeline") == "striped" else None,
        },
        "inputs": [{"name": n, "dtype": src.dtypes[n], "shape": shapes[n]} for n in src.input_names],
        "outputs": [{"name": n, "dtype": src.dtypes[n], "shape": shapes[n]} for n in src.output_names],
        "passes": compiled.stages[1:],
        **extra,
    }


def metal_text(src: MetalSource, compiled: CompiledGemm, spec_path: Path | None) -> str:
    """The shipped .metal file: a comment, then MLX's full kernel text with marker lines
    around the header and the body (the launcher hands exactly those to MLX)."""
    gemm = compiled.gemm
    origin = "a format at run time" if spec_path is None else spec_path.name
    intro = (f"// {gemm.name}: generated by marlin-dsl {__version__} from {origin}; do not edit.\n"
             f"// y[M, N] = x[M, K] @ W[K, N]; W in format {gemm.format.name} "
             f"({gemm.format.describe()}); schedule {gemm.schedule.name}.\n"
             f"// mx.fast.metal_kernel receives the text between the header and body markers;\n"
             f"// the signature in between is the one MLX generates. Launch: {gemm.name}.py.\n")
    signature = src.signature()
    return (intro + HEADER_BEGIN + src.header + HEADER_END + signature + BODY_BEGIN + src.body
            + ("" if src.body.endswith("\n") else "\n") + BODY_END + "}\n")


def launcher_text(src: MetalSource, compiled: CompiledGemm) -> str:
    """A Python module that launches the kernel through `mx.fast.metal_kernel`, needing only
    MLX: it reads the .metal file beside it and computes the grid from M, N, K."""
    kernel = compiled.kernel
    grid = ", ".join(
        str(d.count) if d.symbol is None else
        (f"-(-{d.symbol} // {d.tile})" + (f" * {d.count}" if d.count != 1 else ""))
        for d in kernel.grid)
    s = compiled.gemm.schedule
    striped = kernel.attrs.get("pipeline") == "striped"
    inputs = [n for n in src.input_names if n not in ("x", DIMS_NAME)]
    mx_dtype = {"float16_t": "mx.float16", "bfloat16_t": "mx.bfloat16", "float": "mx.float32",
                "uint32_t": "mx.uint32", "uint8_t": "mx.uint8", "uint16_t": "mx.uint16"}
    widths = tuple(compiled.gemm.outputs)
    outputs = []
    for n in src.output_names:
        size = {"y": "M * (N // 2)" if gated(steps_of(kernel.attrs)) else "M * N", "partials": f"tiles * {kernel.attrs.get('parallel', 1)} * {s.tile_m * s.tile_n}",
                "counters": "tiles", **{f"y{i}": f"M * {w}" for i, w in enumerate(widths)}}[n]
        outputs.append(f"    ({n!r}, ({size},), {mx_dtype[src.dtypes[n]]}),")
    if widths:  # Y's columns as parts (Gemm.outputs)
        returns, result = "list[mx.array]", f"its parts y0..y{len(widths) - 1} [M, width] of widths {list(widths)}"
        ret = (f"    return [outs[OUTPUT_NAMES.index(f'y{{i}}')].reshape(M, w) for i, w in enumerate({list(widths)!r})]\n")
    else:
        returns, result = "mx.array", "y [M, N] in x's dtype"
        cols = "N // 2" if gated(steps_of(kernel.attrs)) else "N"
        ret = f'    return outs[OUTPUT_NAMES.index("y")].reshape(M, {cols})\n'
    tiles_line = f"    tiles = -(-M // {s.tile_m}) * -(-N // {s.tile_n})\n" if striped else ""
    # Only the striped pipeline needs its outputs zeroed (arrival counters); a fill of y
    # would cost a pass over the output for nothing.
    init = ", init_value=0" if striped else ""
    args = ", ".join(inputs)
    return f'''"""MLX launcher for the marlin-dsl kernel {compiled.gemm.name} (generated; do not edit).

y[M, N] = x[M, K] @ W[K, N], W packed in format {compiled.gemm.format.name}: pass the packed
arrays ({args}) as MLX arrays shaped as manifest.json says. Needs only MLX on an Apple GPU.
"""
from pathlib import Path

import mlx.core as mx

NAME = {src.name!r}
INPUT_NAMES = {list(src.input_names)!r}
OUTPUT_NAMES = {list(src.output_names)!r}
THREADS = {src.threads}
K_MULTIPLE = {k_multiple(compiled.gemm.format)}

_TEXT = (Path(__file__).resolve().parent / {src.name + ".metal"!r}).read_text()
HEADER = _TEXT.split({HEADER_BEGIN!r}, 1)[1].split({HEADER_END!r}, 1)[0]
BODY = _TEXT.split({BODY_BEGIN!r}, 1)[1].split({BODY_END!r}, 1)[0]
_kernel = None


def threadgroups(M: int, N: int, K: int) -> tuple[int, int, int]:
    return ({grid})


def output_specs(M: int, N: int, K: int) -> list[tuple[str, tuple[int, ...], mx.Dtype]]:
{tiles_line}    return [
{chr(10).join(outputs)}
    ]


def kernel():
    global _kernel
    if _kernel is None:
        _kernel = mx.fast.metal_kernel(name=NAME, input_names=INPUT_NAMES, output_names=OUTPUT_NAMES,
                                       source=BODY, header=HEADER)
    return _kernel


def launch(x: mx.array, {args}) -> {returns}:
    """y = x @ W for x [M, K]; returns {result}."""
    if x.ndim != 2:
        raise ValueError(f"x: expected [M, K], got shape {{x.shape}}")
    M, K = x.shape
    N = scales.shape[1]
    if K % K_MULTIPLE:
        raise ValueError(f"x: K={{K}} is not a multiple of {{K_MULTIPLE}}")
    gx, gy, gz = threadgroups(M, N, K)
    specs = output_specs(M, N, K)
    dims = mx.array([M, N, K], dtype=mx.uint32)
    outs = kernel()(inputs=[x, {args}, dims], grid=(gx * THREADS, gy, gz), threadgroup=(THREADS, 1, 1),
                    output_shapes=[shape for _, shape, _ in specs],
                    output_dtypes=[dtype for _, _, dtype in specs]{init})
{ret}'''


def write_metal_kernel(compiled: CompiledGemm, spec_path: Path | None, out_dir: Path) -> dict[str, Path]:
    """Write the four files of one kernel into out_dir/<gemm>/; returns them by kind."""
    src = print_metal(compiled.kernel)
    folder = out_dir / compiled.gemm.name
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "metal": folder / f"{src.name}.metal",
        "launcher": folder / f"{src.name}.py",
        "manifest": folder / "manifest.json",
        "ir": folder / f"{src.name}.ir",
    }
    files["metal"].write_text(metal_text(src, compiled, spec_path))
    files["launcher"].write_text(launcher_text(src, compiled))
    files["manifest"].write_text(json.dumps(manifest(compiled, src, spec_path), indent=2) + "\n")
    files["ir"].write_text(print_kernel(compiled.kernel))
    return files
