"""The kernel backends of `activation.ops`: the sparsify and sparse-GEMM kernels lowered from
IR for a target and launched through its runtime (`TargetRuntime.kernel_launcher`:
`mx.fast.cuda_kernel` on CUDA, `mx.fast.metal_kernel` on Metal).

Same interface as the "mlx" backend (`ops._MLXBackend`): `sparsify(x, spec, seed, target)` and
`sparse_matmul(s, b)`. On the sparse MMA (CUDA) the kernel reads B^T as it is stored: a
layer's weight passed as `w.T` is read in place, a row-major B (a weight gradient's dY) is
transposed by MLX once (`_b_operand`). The scatter GEMM (Metal) takes B in its fragment layout,
converted with MLX ops (pad, reshape, one gather derived from the target's lane table) on
every call.

A target with no sparse MMA (Metal) runs seed 000's software scatter into its dense MMA
(`lowering/sparse_gemm_scatter.py`), launched the same way; B's fragment order then carries
that kernel's K shuffle (`sparse_gemm.b_lane_order`). On Metal the sparsify and GEMM kernels are
checked on the CPU harness and the launch with a stand-in `mx.fast.metal_kernel`
(tests/test_metal_activation.py, tests/test_metal_sparse_gemm.py); no Apple GPU has run them
here. `BoundLayout.decode_mx` (the logical S with MLX ops) serves the backward pass's dense
products and checks.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import mlx.core as mx
import numpy as np

from ..targets.base import KernelLaunch
from ..targets.runtimes import RUNTIMES, runtime_for
from ..ir import Kernel
from ..lowering.sparse_gemm import (SparseGemmTiles, b_buffer, b_lane_order, choose_tiles, gemm_scalars,
                                    has_sparse_gemm, lower_sparse_gemm)
from ..lowering.sparsify import launch_scalars, lower_sparsify
from ..layouts.sparse_activation import ROW_TILE, ActivationLayout
from .operand import SparseActivation
from ..formats.activation_reference import mvue_key, operand_shape
from ..formats.activation_spec import SparsifyError, SparsifySpec

#: Targets whose kernels this module launches (`ops.resolve_backend` reads it): those whose
#: runtime binds any kernel to MLX.
SUPPORTED_TARGETS = tuple(name for name, runtime in RUNTIMES.items() if runtime.kernel_launcher is not None)
_MX_DTYPE = {"f16": mx.float16, "bf16": mx.bfloat16}


def _launch(kernel: Kernel, target: str) -> KernelLaunch:
    launcher = runtime_for(target).kernel_launcher
    if launcher is None:  # sparsify() refuses such targets first
        raise SparsifyError(f"backend {target!r}: its runtime launches no activation kernels")
    return launcher(kernel, ())


@lru_cache(maxsize=None)
def _sparsify_launch(spec: SparsifySpec, target: str, gather: bool = False) -> KernelLaunch:
    return _launch(lower_sparsify(spec, target, gather), target)


@lru_cache(maxsize=None)
def _gemm_launch(dtype: str, target: str, tiles: SparseGemmTiles) -> KernelLaunch:
    return _launch(lower_sparse_gemm(dtype, target, tiles), target)


@dataclass(frozen=True)
class BoundLayout:
    """A layout with the element type of its values: what `SparseActivation.layout` holds."""

    layout: ActivationLayout
    dtype: str

    def decode_mx(self, values: mx.array, metadata: mx.array) -> tuple[mx.array, mx.array]:
        """(dense S [P, L], kept mask [P, L]) from the physical arrays, with MLX ops."""
        return _decode_mx(self.layout, self.dtype, values, metadata)


def _mx_lookup(table: np.ndarray, flat_index: mx.array) -> mx.array:
    return mx.take(mx.array(table.ravel().astype(np.uint32)), flat_index)


def _decode_mx(layout: ActivationLayout, dtype: str, values: mx.array, metadata: mx.array) -> tuple[mx.array, mx.array]:
    """The layout's index maps evaluated on the device (no host index arrays), then gathers."""
    pp, groups = layout.pp, layout.lp // 4
    rows = mx.arange(pp, dtype=mx.uint32)[:, None]
    cols = mx.arange(groups, dtype=mx.uint32)[None, :]     # pair index = group index here
    value_idx = layout.value_word_index(rows, cols, _mx_lookup)
    mt, r = rows // ROW_TILE, rows % ROW_TILE
    word_idx = layout.meta_word_index(mt, cols // 8, r % 8, (cols % 8) // 4, _mx_lookup)
    shift = layout.nibble_shift(r, cols)
    words = mx.take(values.reshape(-1), value_idx.reshape(-1))
    vals = mx.view(words, _MX_DTYPE[dtype]).reshape(pp, groups, 2)         # slot 0 = low half
    nib = (mx.take(metadata.reshape(-1), word_idx.reshape(-1)).reshape(pp, groups) >> shift) & 0xF
    pos = mx.arange(4, dtype=mx.uint32)
    hit0 = (nib & 3)[..., None] == pos
    hit1 = (nib >> 2)[..., None] == pos
    zero = mx.zeros((), _MX_DTYPE[dtype])
    dense = mx.where(hit0, vals[..., 0:1], mx.where(hit1, vals[..., 1:2], zero)).reshape(pp, layout.lp)
    mask = (hit0 | hit1).reshape(pp, layout.lp)
    p, length = layout.p, layout.length
    return dense[:p, :length], mask[:p, :length]


def sparsify(x: mx.array, spec: SparsifySpec, seed: int, target: str, *, init_value: int = 0,
             columns: mx.array | None = None) -> Any:
    """Run the sparsify kernel on X [R, C] (`x`, already in the spec's type), or with `columns`
    (uint32 [C]) on X = x[:, columns], read where it lies by the gathering kernel. `init_value`
    pre-fills every output (checks pass a nonzero pattern to see unwritten words; the column
    counts are corrected for it)."""
    if target not in SUPPORTED_TARGETS:
        raise SparsifyError(f"backend {target!r}: the activation kernels launch on "
                            f"{', '.join(SUPPORTED_TARGETS)} only (the other targets' kernels are "
                            f"checked on the CPU harness; use 'mlx')")
    shape = (int(x.shape[0]), int(x.shape[1]) if columns is None else int(columns.shape[0]))
    layout = ActivationLayout(target, *operand_shape(shape, spec.axis))
    launch = _sparsify_launch(spec, target, columns is not None)
    scalars = launch_scalars(spec, layout, shape, int(mvue_key(seed)), None if columns is None else int(x.shape[1]))
    outs = {"values": (layout.value_words,), "meta": (layout.meta_words,), "colz": (shape[1],)}
    if spec.dense:
        outs |= {"dense": (layout.p, layout.length), "mask": (layout.p, layout.length)}
    inputs = {"x": x} if columns is None else {"x": x, "cols": columns.astype(mx.uint32)}
    got = launch(inputs, outs, scalars, init_value=float(init_value))
    col_zeros = got.get("colz")
    if col_zeros is not None and init_value:
        col_zeros = col_zeros - mx.array(init_value, mx.uint32)
    activation = x if columns is None else mx.take(x, columns, axis=1)  # lazy: only if used
    if spec.relu2:  # the dense activation for the backward pass (the kernel streams it)
        r = mx.maximum(activation.astype(mx.float32), 0.0)
        activation = (r * r).astype(x.dtype)
    return SparseActivation(spec, seed, shape, (layout.p, layout.length), activation,
                            col_zeros, backend=target, values=got["values"], metadata=got["meta"],
                            layout=BoundLayout(layout, spec.dtype), dense=got.get("dense"),
                            mask=None if "mask" not in got else mx.view(got["mask"], mx.bool_))  # u8 0/1


@lru_cache(maxsize=8)
def _b_gather(target: str) -> mx.array:
    ks, ns = b_lane_order(target)
    return mx.array((ks * 8 + ns).reshape(-1).astype(np.uint32))


def pack_b_mx(b: mx.array, target: str) -> mx.array:
    """B [L, N] -> the sparse GEMM's fragment layout as flat u32 words (MLX ops)."""
    length, n = int(b.shape[0]), int(b.shape[1])
    kt, nt = -(-length // 32), -(-n // 8)
    padded = mx.pad(b, [(0, kt * 32 - length), (0, nt * 8 - n)])
    tiles = padded.reshape(kt, 32, nt, 8).transpose(0, 2, 1, 3).reshape(kt, nt, 256)
    frag = mx.take(tiles, _b_gather(target), axis=2)                    # [KT, NT, lane * 8 + e]
    return mx.view(mx.contiguous(frag).reshape(-1), mx.uint32)


def _b_operand(b: mx.array, layout: ActivationLayout) -> dict[str, mx.array]:
    """B [L, N]'s buffer for the target's sparse GEMM (`sparse_gemm.b_buffer`). "bt" is B^T:
    for a layer's weight passed as `w.T` that is `w` itself, which the kernel reads where it is
    (no copy); a row-major B is transposed by MLX once (its launch needs row-contiguous
    inputs). Rows are zero-padded to whole K tiles only where L is not."""
    name = b_buffer(layout.target)
    if name == "bp":
        return {name: pack_b_mx(b, layout.target)}
    bt = b.T
    if layout.lp != layout.length:
        bt = mx.pad(bt, [(0, 0), (0, layout.lp - layout.length)])
    return {name: bt}


def sparse_matmul(s: Any, b: mx.array, *, init_value: float | None = None,
                  tiles: SparseGemmTiles | None = None) -> mx.array:
    """C = S @ B [P, N] by the target's sparse GEMM kernel: the sparse MMA (CUDA) or the
    software scatter into the dense MMA (Metal). `init_value` pre-fills C (checks pass NaN to
    see unwritten elements; MLX leaves C uninitialised by default, every element is written).
    `tiles` overrides the sparse MMA kernel's block (`choose_tiles`; benchmarks sweep it)."""
    layout: ActivationLayout = s.layout.layout
    if b.dtype != _MX_DTYPE[s.spec.dtype]:
        b = b.astype(_MX_DTYPE[s.spec.dtype])
    if not has_sparse_gemm(s.backend):  # not reached for the registered targets
        raise SparsifyError(f"backend {s.backend!r}: no sparse activation GEMM lowers for this target")
    n = int(b.shape[1])
    # The sparse MMA's kernel comes in block sizes; the scatter GEMM ignores them.
    got = _gemm_launch(s.spec.dtype, s.backend, tiles or choose_tiles(layout.p, n))({"values": s.values, "meta": s.metadata,
                                                        **_b_operand(b, layout)},
                                                       {"y": (layout.p, n)}, gemm_scalars(layout, n),
                                                       init_value=init_value)
    return got["y"]
