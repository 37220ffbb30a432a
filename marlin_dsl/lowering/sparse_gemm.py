"""Lowering of the GEMM that consumes a run-time sparsified operand: C = S @ B on a target with
a 2:4 sparse MMA (CUDA's `mma.sp` m16n8k32), S [P, L] in the "cuda_mma_sp" activation layout
(`layouts/sparse_activation.py`), B [L, N] dense: transposed as a model stores it on a sparse
MMA, in the matching fragment layout (`pack_b`) for the scatter (`b_buffer`).
A target without a sparse MMA (Metal) gets seed 000's software scatter into its dense MMA
(`sparse_gemm_scatter.py`); `lower_sparse_gemm`, `b_lane_order` and `gemm_scalars` choose by the
target's data.

On the sparse MMA the kernel is `sparse_gemm_staged.py`'s: threadgroup blocks of S's rows x
C's columns (`SparseGemmTiles`, chosen per shape by `choose_tiles`), both operands copied into
shared-memory stages asynchronously, a warp's tile pairs sharing one metadata word per lane
(selectors 0 and 1). C is stored from the accumulators' own lane elements (`frag_elems`).

Launch scalars: P, N (C's shape), KT (K tiles of 32), then PAIRS (tile pairs of S, Pp / 32) on
the sparse MMA, MT and NT for the scatter (`gemm_scalars`).
"""
from __future__ import annotations

import numpy as np

from ..errors import CompileError
from ..ir import Kernel
from ..layouts.sparse_activation import ActivationLayout
from ..machine.target import TARGETS
from .sparse_gemm_scatter import lower_scatter_gemm, scatter_possible, scatter_tables
from .sparse_gemm_staged import LARGE, SparseGemmTiles, StagedSparseGemm, choose_tiles

__all__ = ["LARGE", "b_buffer", "b_lane_order", "choose_tiles", "gemm_scalars", "has_sparse_gemm", "has_sparse_mma",
           "lower_sparse_gemm", "pack_b", "SparseGemmTiles"]


def b_lane_order(target: str) -> tuple[np.ndarray, np.ndarray]:
    """(k[lane, e], n[lane, e]): the B element each lane's e-th half holds in one 32 x 8 tile
    of the scatter GEMM's fragment order (its shuffled K steps). Only the scatter GEMM takes B
    packed ("bp"); on a sparse MMA the staged kernel reads B^T as it lies (`b_buffer`)."""
    if b_buffer(target) != "bp":
        raise CompileError(f"{target}: its sparse GEMM reads B^T as it lies, not packed B")
    tab = scatter_tables(target)
    return tab.b_k.copy(), tab.b_n.copy()


def pack_b(b: np.ndarray, target: str) -> np.ndarray:
    """B [L, N] (float32 holding f16/bf16 values) -> [KT, NT, 32 lanes, 8] in the scatter
    GEMM's fragment order (`b_lane_order`), zero padded to whole tiles; the kernel reads one
    lane's 8 halves as one 16-byte vector."""
    length, n = b.shape
    kt, nt = -(-length // 32), -(-n // 8)
    padded = np.zeros((kt * 32, nt * 8), b.dtype)
    padded[:length, :n] = b
    ks, ns = b_lane_order(target)
    tiles = padded.reshape(kt, 32, nt, 8).transpose(0, 2, 1, 3)      # [KT, NT, 32, 8]
    return tiles[:, :, ks, ns]                                       # [KT, NT, lane, e]


def b_buffer(target: str) -> str:
    """The name of B's buffer in `target`'s sparse GEMM: "bt" (B transposed, [N, Lp] in the
    activation type, rows zero-padded to whole K tiles: the staged kernel on a sparse MMA) or
    "bp" (`pack_b`'s fragment order as u32 words: the scatter GEMM)."""
    return "bt" if has_sparse_mma(target) else "bp"


def has_sparse_mma(target: str) -> bool:
    """Whether `target` has the m16n8k32 sparse MMA this module's own lowering issues."""
    return TARGETS[target].sparse_mma == (16, 8, 32)


def has_sparse_gemm(target: str) -> bool:
    """Whether a sparse activation GEMM lowers for `target`: on its sparse MMA, or as the
    software scatter into its dense MMA (`sparse_gemm_scatter.scatter_possible`)."""
    return has_sparse_mma(target) or scatter_possible(TARGETS[target])


def lower_sparse_gemm(dtype: str, target: str = "cuda", tiles: SparseGemmTiles = LARGE) -> Kernel:
    """C = S @ B for activations of `dtype` ("f16" / "bf16") on `target`; on a sparse MMA in
    threadgroup blocks of `tiles` (`choose_tiles` picks them for a shape)."""
    if dtype not in ("f16", "bf16"):
        raise CompileError(f"dtype: expected 'f16' or 'bf16', got {dtype!r}")
    if has_sparse_mma(target):
        return StagedSparseGemm(dtype, TARGETS[target], tiles).lower()
    if scatter_possible(TARGETS[target]):
        return lower_scatter_gemm(dtype, target)
    raise CompileError(f"{target}: no m16n8k32 sparse MMA and no dense MMA lane tables for the "
                       f"software scatter; the sparse activation GEMM needs one of them")


def gemm_scalars(layout: ActivationLayout, n: int) -> dict[str, int]:
    """The launch scalars of `layout.target`'s sparse GEMM for S in `layout` and N columns."""
    base = {"P": layout.p, "N": n, "KT": layout.k_tiles}
    if has_sparse_mma(layout.target):
        return {**base, "PAIRS": layout.pp // 32}
    return {**base, "MT": layout.m_tiles, "NT": -(-n // TARGETS[layout.target].mma_n)}
