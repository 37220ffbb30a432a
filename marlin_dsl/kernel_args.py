"""Host side of a lowered GEMM: the buffers a kernel takes and how to read its result.

Shared by every executor of a kernel (the IR interpreter, the Metal CPU harness, MLX
launchers), so they all feed a kernel the same way.
"""
from __future__ import annotations

import numpy as np

from .errors import ShapeError
from .formats import PackedWeights
from .formats.tensors import check_float_matrix
from .ir import Kernel
from .ir.numerics import round_to_activation
from .layouts.block_skip import skip_arrays
from .layouts.weight_stream import LAYOUT_NAME, stream_arrays
from .machine.outputs import epilogue_inputs, steps_of, y_columns
from .machine.target import TARGETS

#: Poison written into outputs before a kernel runs: any element the kernel fails to write
#: stays NaN and fails the comparison.
POISON = np.nan


def physical_arrays(attrs: dict, packed: PackedWeights) -> dict[str, np.ndarray]:
    """The packed arrays in the physical layout the kernel (its `attrs`) reads: the target
    chooses it at pack time; kernels without a `weight_layout` read the format's own layout."""
    layout = attrs.get("weight_layout")
    if layout is None or packed.layout == layout:  # already in the kernel's layout
        return dict(packed.arrays)
    target = TARGETS[str(attrs["target"])]
    if layout == target.skip_layout:  # the stream without each block's empty vectors
        return skip_arrays(packed.format, target, packed)
    if layout != LAYOUT_NAME and layout not in target.weight_layouts[:1]:
        raise ShapeError(f"kernel: unknown weight layout {layout!r}")
    # K is even here: the layout takes code widths up to 16, whose K granule (the codes that
    # fill whole 32-bit words: 32 / gcd(bits, 32)) is even, so the kernel's pairs of
    # activations never straddle a row.
    return stream_arrays(packed.format, target, packed)


def to_kernel_layout(attrs: dict, packed: PackedWeights) -> PackedWeights:
    """`packed` re-laid out once for kernels with these attrs (reusable across calls)."""
    layout = attrs.get("weight_layout") or packed.layout
    return PackedWeights(packed.format, packed.shape, physical_arrays(attrs, packed), layout)


def gemm_buffers(kernel: Kernel, packed: PackedWeights, x: object,
                 epilogue: dict[str, object] | None = None) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Flat input/output buffers and launch scalars for Y = X @ W with a lowered kernel.

    `epilogue`: the arrays the kernel's epilogue reads (`bias` [N], `residual` [M, N_out];
    rounded to the activation type here). Y is poisoned; the striped pipeline's partial sums
    are poisoned and its arrival counters zeroed (the kernel leaves them zero again).
    """
    xs = check_float_matrix(x, "x")
    k, n = packed.shape
    if xs.shape[1] != k:
        raise ShapeError(f"x: has K={xs.shape[1]} columns, the packed weight has K={k}")
    # The kernel records its format's name; the packed weight carries the full description.
    if packed.format.name != kernel.attrs.get("format"):
        raise ShapeError(f"packed: format {packed.format.name!r} is not the kernel's "
                         f"{kernel.attrs.get('format')!r}")
    m = xs.shape[0]
    activation = str(kernel.attrs["activation"])
    buffers: dict[str, np.ndarray] = {"x": round_to_activation(xs, activation).ravel()}
    storage = packed.format.parameters()
    for name, array in physical_arrays(kernel.attrs, packed).items():
        flat = np.ascontiguousarray(array).ravel()
        if name in storage and storage[name].name == "bf16":  # executors hold bf16 in float32
            flat = storage[name].to_float64(flat).astype(np.float32)
        buffers[name] = flat
    columns = y_columns(kernel.attrs, kernel.name, n, "packed")
    buffers.update(epilogue_buffers(kernel, epilogue or {}, m, n, sum(columns.values()), activation))
    out_dtype = np.float16 if activation == "f16" else np.float32
    for name, width in columns.items():
        buffers[name] = np.full(m * width, POISON, dtype=out_dtype)
    if kernel.attrs.get("pipeline") == "striped":
        tile_m, tile_n, _ = kernel.attrs["tile"]  # type: ignore[misc]
        tiles = -(-m // tile_m) * -(-n // tile_n)
        parallel = int(kernel.attrs["parallel"])
        buffers["partials"] = np.full(tiles * parallel * tile_m * tile_n, POISON, dtype=np.float32)
        buffers["counters"] = np.zeros(tiles, dtype=np.uint32)
    return buffers, {"M": m, "N": n, "K": k}


def epilogue_buffers(kernel: Kernel, arrays: dict[str, object], m: int, n: int, n_out: int,
                     activation: str) -> dict[str, np.ndarray]:
    """The epilogue's inputs of `kernel` from `arrays` (bias [N], residual [M, N_out]), flat and
    rounded to the activation type; ShapeError naming a missing, extra or misshapen one."""
    wanted = epilogue_inputs(steps_of(kernel.attrs))
    extra = sorted(set(arrays) - set(wanted))
    if extra:
        raise ShapeError(f"epilogue: kernel {kernel.name!r} reads {wanted or 'no epilogue inputs'}, "
                         f"not {extra}")
    shapes = {"bias": (n,), "residual": (m, n_out)}
    out = {}
    for name in wanted:
        if name not in arrays:
            raise ShapeError(f"epilogue: kernel {kernel.name!r} reads {name!r} {list(shapes[name])}; pass it")
        a = np.asarray(arrays[name], dtype=np.float64)
        if a.shape != shapes[name] or not np.all(np.isfinite(a)):
            raise ShapeError(f"epilogue: {name} must be finite with shape {list(shapes[name])}, got "
                             f"{list(a.shape)}{'' if a.shape != shapes[name] else ' with non-finite values'}")
        out[name] = round_to_activation(a, activation).ravel()
    return out


def read_output(buffers: dict[str, np.ndarray], m: int, n: int) -> np.ndarray:
    """Y [M, N]: y, or the parts y0, y1, ... (`Gemm.outputs`) side by side (N: Y's columns,
    half the GEMM's with a gated epilogue)."""
    if "y" in buffers:
        return buffers["y"][: m * n].reshape(m, n)
    parts = [buffers[f"y{i}"].reshape(m, -1) for i in range(sum(1 for name in buffers if _is_part(name)))]
    y = np.concatenate(parts, axis=1)
    if y.shape[1] != n:
        raise ShapeError(f"outputs: {[p.shape[1] for p in parts]} columns side by side, not N={n}")
    return y


def _is_part(name: str) -> bool:
    return name[:1] == "y" and name[1:].isdigit()
