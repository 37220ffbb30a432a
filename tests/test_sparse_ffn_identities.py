"""The gradient identities of docs/notes/i33-sparse-ffn-math.md, checked on the layer's own
backward (marlin_dsl.activation.ffn, MLX backend) against float64 references:

1. dh has S's 2:4 pattern along the hidden features (top2, soft_threshold), so dx = dh W1 is a
   2:4 GEMM on dh, exactly: compressing dh loses nothing and the library's sparse GEMM gives
   the float64 product to the GEMM's rounding; with mvue dh is dense.
2. dW1 = dh^T x through the MVUE split along T is unbiased, with the variance the note states.

Relative errors are Frobenius norms in float64; the expectation check is element-wise
|mean - ref| <= 5 SE + rounding (test_sparse_ffn.expectation_check)."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from marlin_dsl.activation import ops
from marlin_dsl.activation.ffn import FFNConfig, ffn_backward, ffn_forward
from marlin_dsl.formats.activation_spec import SparsifySpec
from test_sparse_ffn import expectation_check, f64, ffn_arrays, mvue_dw2_se, rel_err


def forward_backward(method: str, seed: int, t: int = 128, hidden: int = 64):  # noqa: ANN201
    p = ffn_arrays(seed, t=t, hidden=hidden)
    cfg = FFNConfig(method, dw2="dense", seed=seed, backend="mlx")
    _, cache = ffn_forward(p["x"], p["w1"], p["b1"], p["w2"], p["b2"], cfg)
    return p, cache, ffn_backward(cache, p["x"], p["w1"], p["w2"], p["r"], cfg)


@pytest.mark.parametrize("method", ["top2", "soft_threshold"])
@pytest.mark.parametrize("t", [3, 65, 128])
def test_dh_has_the_forward_pattern(method: str, t: int) -> None:
    p, cache, g = forward_backward(method, 40 + t, t=t)
    dh, kept = f64(g.dh), np.array(cache.mask)
    assert not dh[~kept].any()  # zero wherever S dropped a value
    assert ((dh != 0).reshape(t, -1, 4).sum(axis=-1) <= 2).all()  # at most 2 of every 4 features
    assert (dh[kept] != 0).mean() > 0.3  # and not trivially empty: ReLU keeps about half


@pytest.mark.parametrize("method", ["top2", "soft_threshold"])
@pytest.mark.parametrize("t", [3, 65, 128])
def test_dx_is_a_2to4_gemm_on_dh(method: str, t: int) -> None:
    """Identity 1: dh compressed 2:4 (its own top-2: its dropped entries are zeros) is dh
    exactly, and the library's 2:4 GEMM of it with W1 is the float64 dh W1 to the GEMM's
    roundings, as close as the backward's dense dx."""
    p, cache, g = forward_backward(method, 50 + t, t=t)
    s = ops.sparsify(g.dh, SparsifySpec("top2", axis=1, dtype="f16"), 0, "mlx")
    assert np.array_equal(f64(s.dense_operand()), f64(g.dh))  # lossless
    ref = f64(g.dh) @ f64(p["w1"])
    sparse_dx = ops.sparse_matmul(s, p["w1"])
    # float32 accumulation, one f16 rounding of the output: 2^-11 relative, with margin
    assert rel_err(sparse_dx, ref) < 2e-3
    assert rel_err(g.dx, ref) < 2e-3
    assert rel_err(sparse_dx, g.dx) < 2e-3


def test_mvue_dh_is_dense() -> None:
    """With mvue the straight-through gradient passes every entry: dh is not 2:4, and
    identity 1 does not apply (dx stays dense)."""
    _, _, g = forward_backward("mvue", 60)
    nonzero = (f64(g.dh) != 0).reshape(128, -1, 4).sum(axis=-1)
    assert (nonzero > 2).any()


def test_split_dw1_is_unbiased() -> None:
    """Identity 2 for dW1 = dh^T x: the hidden features with the most zeros sparsified along T
    by MVUE average to the exact dW1 over 300 seeds, within 5 standard errors of the note's
    variance formula; the other features are exact in every draw."""
    p, cache, g = forward_backward("top2", 70, hidden=128)
    dh, x = g.dh, p["x"]
    zeros = (f64(dh) == 0).sum(axis=0)
    cols = np.zeros(128, bool)
    cols[np.argsort(-zeros, kind="stable")[:96]] = True
    ref = f64(dh).T @ f64(x)
    scale = np.abs(f64(dh)).T @ np.abs(f64(x))
    draws = [f64(ops.split_matmul(dh, x, cols, "mvue", seed, "mlx")) for seed in range(300)]
    se = mvue_dw2_se(f64(dh), f64(x), cols, len(draws)).T  # [F, d]
    expectation_check(draws, ref, scale, se)
    spread = np.stack(draws).std(0)
    assert not spread[~cols].any() and spread[cols].any()
