"""The staged sparse activation GEMM's own choices (`lowering/sparse_gemm_staged.py`): which
block a shape gets, where B's fragment registers come from in a staged row of B^T, what the
kernel declares, and the errors for blocks and targets it cannot take. Its results are checked
in the interpreter (test_sparsify_kernels.py), as printed CUDA on the CPU harness
(test_cuda_cpu_activation.py) and on the GPU (bench/probes/sparse_gemm_gpu.py check)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from marlin_dsl.activation.host import b_operand
from marlin_dsl.errors import CompileError
from marlin_dsl.layouts.sparse_activation import ActivationLayout
from marlin_dsl.lowering.sparse_gemm import b_buffer, gemm_scalars, lower_sparse_gemm
from marlin_dsl.lowering.sparse_gemm_staged import (LARGE, SMALL, SparseGemmTiles, StagedSparseGemm,
                                                   b_offsets, choose_tiles)
from marlin_dsl.machine import CUDA


def test_choose_tiles_fills_the_gpu() -> None:
    assert choose_tiles(8192, 4096) == LARGE            # the FFN's forward: 64 x 32 blocks
    assert choose_tiles(13600, 4096) == LARGE           # its dW2
    assert choose_tiles(65, 130) == SMALL               # one large block only
    assert choose_tiles(1024, 1024) == SMALL            # 64 large blocks < 132 SMs
    assert choose_tiles(2048, 1024) == SMALL            # 16 x 8 = 128 large blocks
    assert choose_tiles(2048, 1152) == LARGE            # 16 x 9 = 144


@pytest.mark.parametrize("k_tiles", [1, 2, 4])
def test_b_offsets_follow_the_lane_table(k_tiles: int) -> None:
    """Register r of lane l holds B[k][n] and B[k + 1][n] with (k, n) the lane table's
    element 2r: its offset in the staged rows of B^T is n * b_row + k."""
    b_row = SparseGemmTiles(128, 128, 2, 2, 3, k_tiles).b_row
    assert b_row == 32 * k_tiles + 8
    k, n = CUDA.lane_elements("b", 32, 8)
    off = b_offsets(CUDA, b_row)
    assert off.shape == (32, 4)
    for lane in (0, 5, 31):
        for r in range(4):
            assert off[lane, r] == n[lane, 2 * r] * b_row + k[lane, 2 * r]
    # conflict-free: for each register the 32 lanes' words fall in 32 different banks
    for r in range(4):
        assert len({(int(o) // 2) % 32 for o in off[:, r]}) == 32


def test_b_offsets_refuse_a_table_without_k_pairs() -> None:
    k, n = CUDA.lane_elements("b", 32, 8)
    swapped = k.copy()
    swapped[:, [0, 1]] = swapped[:, [1, 0]]                 # element 0 is no longer the pair's low half
    odd = dataclasses.replace(CUDA, name="odd")
    object.__setattr__(odd, "lane_elements",  # a frozen description: shadow the method on this one
                       lambda role, rows, cols: (swapped, n) if role == "b" else CUDA.lane_elements(role, rows, cols))
    with pytest.raises(CompileError, match="not pairs of adjacent K"):
        b_offsets(odd, 40)


@pytest.mark.parametrize("bad", [dict(tile_m=96), dict(tile_n=60), dict(stages=1), dict(warps_m=3), dict(k_tiles=3)])
def test_tiles_refuse_partial_warps_and_one_stage(bad) -> None:
    fields = dict(tile_m=128, tile_n=128, warps_m=2, warps_n=2, stages=3) | bad
    with pytest.raises(CompileError, match="sparse GEMM tiles"):
        SparseGemmTiles(**fields)


def test_a_target_without_async_copies_is_refused() -> None:
    no_copies = dataclasses.replace(CUDA, name="nocopy", async_copy_bytes=0)
    with pytest.raises(CompileError, match="asynchronous copies"):
        StagedSparseGemm("f16", no_copies, LARGE)


def test_kernel_declares_its_block() -> None:
    k = lower_sparse_gemm("bf16", "cuda", SMALL)
    assert k.name == f"sparse_act_gemm_bf16_{SMALL.name}"
    assert k.threads == SMALL.threads == 128
    assert k.attrs["tile"] == [64, 128, 32] and k.attrs["stages"] == 4
    assert [b.name for b in k.buffers] == ["values", "meta", "bt", "y"]
    # stages x (A values + metadata words) * 4 bytes + stages x B rows * 2 bytes
    assert k.shared_bytes == 4 * (4 * 4 * 128 + 4 * 2 * 32) + 2 * 4 * 128 * SMALL.b_row


def test_b_operand_is_b_transposed_and_padded() -> None:
    """The staged kernel's "bt": row n is column n of B, zero-padded to Lp = whole K tiles; the
    scatter GEMM (Metal) keeps its fragment words."""
    rng = np.random.default_rng(3)
    b = rng.normal(size=(37, 9)).astype(np.float32)
    lay = ActivationLayout("cuda", 5, 37)
    got = b_operand(b, "f16", lay)
    assert list(got) == ["bt"] == [b_buffer("cuda")]
    bt = got["bt"].reshape(9, lay.lp)
    assert lay.lp == 64 and np.array_equal(bt[:, :37], b.T.astype(np.float16)) and not bt[:, 37:].any()
    assert list(b_operand(b, "f16", ActivationLayout("metal", 5, 37))) == ["bp"]
    assert gemm_scalars(lay, 9) == {"P": 5, "N": 9, "KT": 2, "PAIRS": 1}
