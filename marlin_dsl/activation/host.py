"""Host side of the sparsify kernels: the buffers a kernel takes, how to launch it on any
executor (the IR interpreter, the Metal CPU harness, MLX on a GPU) and how to read it back.

Shared by every executor, so each is fed identically; `check_sparsify` compares any executor's
result with `reference.sparsify_reference` through the layout's independent decoder.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..ir import Kernel
from ..lowering.sparse_gemm import b_buffer, gemm_scalars, pack_b
from ..lowering.sparsify import launch_scalars, lower_sparsify
from ..ir.numerics import round_to_activation
from ..layouts.sparse_activation import ActivationLayout, _to_bits
from ..formats.activation_reference import mvue_key, operand_shape, sparsify_reference
from ..formats.activation_spec import SparsifyError, SparsifySpec

#: (kernel, buffers, scalars) -> written buffers, as `ir.interpret.run_kernel` has it.
Executor = Callable[[Kernel, dict[str, np.ndarray], dict[str, int]], dict[str, np.ndarray]]


@dataclass(frozen=True)
class SparsifyOutput:
    """A sparsify kernel's results in physical form, with the layout that reads them."""

    layout: ActivationLayout
    values: np.ndarray
    meta: np.ndarray
    col_zeros: np.ndarray | None
    dense: np.ndarray | None = None   # [P, L] float32 (spec.dense): S's logical form
    mask: np.ndarray | None = None    # [P, L] uint8 (spec.dense): its kept positions, 1 / 0


def sparsify_buffers(kernel: Kernel, spec: SparsifySpec, x: np.ndarray, seed: int,
                     columns: np.ndarray | None = None
                     ) -> tuple[dict[str, np.ndarray], dict[str, int], ActivationLayout]:
    """Buffers (x rounded to the activation type; outputs poisoned with all-ones words, an
    invalid nibble pattern), launch scalars and the layout for X = x [R, C], or for a
    gathering kernel X = x[:, columns] (x [R, LD] as it is, `columns` the index it reads)."""
    x = np.asarray(x)
    if x.ndim != 2 or min(x.shape) < 1:
        raise SparsifyError(f"x: expected a non-empty matrix [R, C], got shape {x.shape}")
    if bool(kernel.attrs.get("gather")) != (columns is not None):
        raise SparsifyError(f"columns: kernel {kernel.name} {'gathers' if kernel.attrs.get('gather') else 'does not gather'} "
                            f"X's columns, {'none' if columns is None else 'columns'} given")
    shape = x.shape if columns is None else (x.shape[0], len(columns))
    layout = ActivationLayout(str(kernel.attrs["target"]), *operand_shape(shape, spec.axis))
    held = np.asarray(round_to_activation(x.astype(np.float32), spec.dtype))
    buffers = {"x": np.ascontiguousarray(held.ravel()),
               "values": np.full(layout.value_words, 0xFFFFFFFF, np.uint32),
               "meta": np.full(layout.meta_words, 0xFFFFFFFF, np.uint32)}
    if columns is not None:
        buffers["cols"] = np.asarray(columns, np.uint32)
    if spec.stats:
        buffers["colz"] = np.zeros(shape[1], np.uint32)
    if spec.dense:  # NaN and 0xAB: an element the kernel missed shows
        size = layout.p * layout.length
        buffers["dense"] = np.full(size, np.nan, np.float16 if spec.dtype == "f16" else np.float32)
        buffers["mask"] = np.full(size, 0xAB, np.uint8)
    scalars = launch_scalars(spec, layout, shape, int(mvue_key(seed)), None if columns is None else x.shape[1])
    return buffers, scalars, layout


def run_sparsify(kernel: Kernel, spec: SparsifySpec, x: np.ndarray, seed: int, execute: Executor,
                 columns: np.ndarray | None = None) -> SparsifyOutput:
    buffers, scalars, layout = sparsify_buffers(kernel, spec, x, seed, columns)
    out = execute(kernel, buffers, scalars)
    shape = (layout.p, layout.length)
    dense = np.asarray(out["dense"], np.float32).reshape(shape) if spec.dense else None
    mask = np.asarray(out["mask"], np.uint8).reshape(shape) if spec.dense else None
    return SparsifyOutput(layout, np.asarray(out["values"], np.uint32), np.asarray(out["meta"], np.uint32),
                          np.asarray(out["colz"], np.uint32) if spec.stats else None, dense, mask)


def check_sparsify(spec: SparsifySpec, target: str, x: np.ndarray, seed: int, execute: Executor,
                   kernel: Kernel | None = None, columns: np.ndarray | None = None) -> SparsifyOutput:
    """Run the kernel on `execute` and require bit-exact agreement with the reference: the
    decoded operand, every metadata nibble (including the padding's), the column counts and
    (spec.dense) the dense S and kept mask the kernel wrote. With `columns` the kernel gathers
    X = x[:, columns] and the reference sparsifies that copy."""
    kernel = kernel or lower_sparsify(spec, target, gather=columns is not None)
    got = run_sparsify(kernel, spec, x, seed, execute, columns)
    ref = sparsify_reference(x if columns is None else np.asarray(x)[:, np.asarray(columns)], spec, seed)
    want_values, want_meta = got.layout.encode(ref, spec.dtype)
    dense, nibbles = got.layout.decode(got.values, got.meta, spec.dtype)
    where = f"{kernel.name} ({target}) on x {tuple(np.shape(x))}, seed {seed}"
    if not np.array_equal(nibbles, ref.nibbles):
        bad = np.argwhere(nibbles != ref.nibbles)[0]
        raise AssertionError(f"{where}: metadata of S row {bad[0]}, group {bad[1]}: "
                             f"{nibbles[tuple(bad)]:#x}, reference {ref.nibbles[tuple(bad)]:#x}")
    if not np.array_equal(dense, ref.dense):
        bad = np.argwhere(dense != ref.dense)[0]
        raise AssertionError(f"{where}: S[{bad[0]}, {bad[1]}] = {dense[tuple(bad)]}, reference {ref.dense[tuple(bad)]}")
    if not (np.array_equal(got.values, want_values) and np.array_equal(got.meta, want_meta)):
        bad = np.flatnonzero((got.values != want_values))
        what = f"value word {bad[0]}" if bad.size else f"metadata word {np.flatnonzero(got.meta != want_meta)[0]}"
        raise AssertionError(f"{where}: physical {what} differs from the layout's encoding (padding?)")
    if spec.stats and not np.array_equal(got.col_zeros, ref.col_zeros):
        bad = np.flatnonzero(got.col_zeros != ref.col_zeros)[0]
        raise AssertionError(f"{where}: zero count of column {bad}: {got.col_zeros[bad]}, reference {ref.col_zeros[bad]}")
    if spec.dense:
        want_mask = ref.kept_mask().astype(np.uint8)  # 0xAB (the poison) where unwritten
        for name, value, want in (("dense S", got.dense, ref.dense), ("kept mask", got.mask, want_mask)):
            if not np.array_equal(value, want):  # NaN (unwritten) never equals
                bad = np.argwhere(~(value == want))[0]
                raise AssertionError(f"{where}: {name}[{bad[0]}, {bad[1]}] = {value[tuple(bad)]}, "
                                     f"reference {want[tuple(bad)]}")
    return got


# ----- the GEMM that consumes a sparsified operand -------------------------------------------

def pack_b_words(b: np.ndarray, dtype: str, target: str) -> np.ndarray:
    """B [L, N] in the sparse GEMM's fragment layout, as flat u32 words (two halves each)."""
    held = np.asarray(round_to_activation(np.asarray(b, np.float32), dtype), np.float32)
    bits = _to_bits(pack_b(held, target), dtype).astype(np.uint32)       # [KT, NT, 32, 8]
    return (bits[..., 0::2] | (bits[..., 1::2] << np.uint32(16))).ravel()


def b_operand(b: np.ndarray, dtype: str, layout: ActivationLayout) -> dict[str, np.ndarray]:
    """B [L, N]'s buffer for the layout's target's sparse GEMM (`sparse_gemm.b_buffer`): "bt",
    B transposed with rows zero-padded to Lp (f16 as float16, bf16 as float32 holding bf16
    values), or "bp", the scatter GEMM's fragment words."""
    name = b_buffer(layout.target)
    if name == "bp":
        return {name: pack_b_words(b, dtype, layout.target)}
    held = np.asarray(round_to_activation(np.asarray(b, np.float32), dtype), np.float32)
    bt = np.zeros((b.shape[1], layout.lp), np.float16 if dtype == "f16" else np.float32)
    bt[:, :b.shape[0]] = held.T
    return {name: bt.ravel()}


def sparse_gemm_scalars(layout: ActivationLayout, n: int) -> dict[str, int]:
    """The launch scalars of the layout's target's sparse GEMM (`sparse_gemm.gemm_scalars`)."""
    return gemm_scalars(layout, n)


def run_sparse_gemm(kernel: Kernel, sparse: SparsifyOutput, b: np.ndarray, dtype: str,
                    execute: Executor) -> np.ndarray:
    """C = S @ B [P, N] (float32 holding the output type) from a sparsify kernel's output."""
    lay = sparse.layout
    if b.ndim != 2 or b.shape[0] != lay.length:
        raise SparsifyError(f"b: expected [{lay.length}, N] (the sparsified length first), got {b.shape}")
    n = b.shape[1]
    buffers = {"values": sparse.values, "meta": sparse.meta, **b_operand(b, dtype, lay),
               "y": np.full(lay.p * n, np.nan, np.float16 if dtype == "f16" else np.float32)}
    out = execute(kernel, buffers, sparse_gemm_scalars(lay, n))
    return np.asarray(out["y"], np.float32).reshape(lay.p, n)
