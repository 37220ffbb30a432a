"""The sparse FFN's training step makes no host sync (issue 15), and its split dW2 chooses the
forward's most-sparse columns on the device.

Two independent proofs that no array value reaches the host on the forward or backward path:
- The whole step (forward and VJP, all methods, dw2 "split" and "dense") traces under
  `mx.compile`, where evaluating any array (np.array, .item(), bool(), mx.eval, ...) raises;
  the compiled step equals the eager one bit for bit.
- Building the step's graph eagerly under a tripwire: every Python-level way to read an MLX
  array on the host (`item`, `tolist`, `__bool__`, `__int__`, `__float__`, `__index__`,
  `__array__`, `__iter__`, `__dlpack__`, `mx.eval`, and numpy's array constructors given an MLX
  array) raises; nothing trips. (numpy reads MLX arrays through the buffer protocol, which
  cannot be patched from Python: the compile test is what covers that route.)

The results equal a float64 reference of the backward (relative error < 1e-2 in float16, as in
tests/test_sparse_ffn.py; dW2 element-wise within the split-GEMM bound of that file) on fresh
random inputs with T = 3, 65 and hidden 70 (not a multiple of 4). The split's columns are the
reference selection: the F_s columns with the most zeros, ties to the lower index.
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable, Iterator

import mlx.core as mx
import numpy as np
import pytest

from marlin_dsl.activation import ops
from marlin_dsl.activation.ffn import FFNConfig, ffn_forward, sparse_ffn, step_seed
from marlin_dsl.formats.activation_reference import sparsify_reference
from marlin_dsl.formats.activation_spec import METHODS, SparsifyError, SparsifySpec
from marlin_dsl.errors import ShapeError

F16 = mx.float16
GRAD_RTOL = 1e-2
NAMES = ("x", "w1", "b1", "w2", "b2")


def f64(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32)).astype(np.float64)


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def ref_split_mask(col_zeros: np.ndarray, n_sparse: int) -> np.ndarray:
    """bool [F]: the n_sparse columns with the most zeros, ties to the lower index (numpy)."""
    f = len(col_zeros)
    ranked = np.lexsort((np.arange(f), -np.asarray(col_zeros, np.int64)))  # last key first
    mask = np.zeros(f, bool)
    mask[ranked[:n_sparse]] = True
    return mask


def arrays(seed: int, t: int, dims: int = 24, hidden: int = 70) -> dict[str, mx.array]:
    """Fresh float16 inputs; a third of the hidden units biased to be mostly zero after ReLU^2,
    so the column zero counts spread (and tie) across the whole range."""
    rng = np.random.default_rng(seed)
    shift = np.where(rng.random(hidden) < 1 / 3, -1.5, 0.0)
    a = {"x": rng.normal(size=(t, dims)), "w1": rng.normal(size=(hidden, dims)) / math.sqrt(dims),
         "b1": rng.normal(size=hidden) * 0.5 + shift, "w2": rng.normal(size=(dims, hidden)) / math.sqrt(hidden),
         "b2": rng.normal(size=dims) * 0.1, "dy": rng.normal(size=(t, dims))}
    return {k: mx.array(v.astype(np.float32)).astype(F16) for k, v in a.items()}


def step_fn(method: str, dw2: str, fraction: float, seed: int) -> Callable[..., tuple]:
    """(y, dx, dw1, db1, dw2, db2) of one training step: the forward and its VJP for dy."""
    def step(x, w1, b1, w2, b2, dy):  # noqa: ANN001, ANN202
        def fwd(*p):  # noqa: ANN002, ANN202
            return sparse_ffn(*p, method=method, seed=seed, dw2=dw2, split_fraction=fraction, backend="mlx")
        (y,), grads = mx.vjp(fwd, [x, w1, b1, w2, b2], [dy])
        return (y, *grads)
    return step


def reference_step(p: dict[str, mx.array], cfg: FFNConfig) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """The float64 step from the forward's cache (h, S, kept mask, col_zeros: the forward is
    checked separately against the sparsify reference): (y, dx, dw1, db1, dw2, db2), the
    dW2 bound sum |S'| |dy| and the reference split mask."""
    _, cache = ffn_forward(p["x"], p["w1"], p["b1"], p["w2"], p["b2"], cfg)
    x, w1, b1, w2, b2, dy = (f64(p[k]) for k in (*NAMES, "dy"))
    h, s = f64(cache.h), f64(cache.s)
    # The forward's operand is the sparsify reference of h (ReLU^2 fused, along hidden).
    spec = SparsifySpec(cfg.method, 1, "f16", relu2=True, stats=True)
    want = sparsify_reference(np.array(cache.h.astype(mx.float32)), spec, cfg.seed)
    assert np.array_equal(s, want.dense) and np.array_equal(np.array(cache.col_zeros), want.col_zeros)
    mask = np.array(cache.mask)
    ds = dy @ w2
    da = ds if cfg.method == "mvue" else ds * mask
    dh = da * 2 * np.maximum(h, 0)
    t, hidden = s.shape
    split = np.zeros(hidden, bool)
    if cfg.dw2 == "split":
        split = ref_split_mask(want.col_zeros, ops.sparse_column_count(hidden, cfg.split_fraction))
    sp = s.copy()
    if split.any():
        sp[:, split] = sparsify_reference(s[:, split].astype(np.float32), SparsifySpec("mvue", 0, "f16"),
                                          step_seed(cfg.seed, 0, 1)).dense.T
    ref = [s @ w2.T + b2, dh @ w1, dh.T @ x, dh.sum(0), dy.T @ sp, dy.sum(0)]
    return ref, np.abs(dy).T @ np.abs(sp), split


CASES = [(method, dw2, t, fraction) for method in METHODS for t in (3, 65)
         for dw2, fraction in (("split", 0.5), ("split", 1.0), ("dense", 0.95))]


@pytest.mark.parametrize("method, dw2, t, fraction", CASES)
def test_step_traces_under_compile_and_equals_reference(method: str, dw2: str, t: int, fraction: float) -> None:
    p = arrays(1000 + t, t)
    args = [p[k] for k in (*NAMES, "dy")]
    seed = 77 + t
    eager = step_fn(method, dw2, fraction, seed)(*args)
    compiled = mx.compile(step_fn(method, dw2, fraction, seed))(*args)  # raises on any eval
    for name, e, c in zip(("y", *NAMES), eager, compiled):
        assert np.array_equal(f64(e), f64(c)), name
    cfg = FFNConfig(method, dw2, fraction, seed, "mlx")
    ref, dw2_scale, split = reference_step(p, cfg)
    if dw2 == "split":
        assert split.sum() == {0.5: 32, 1.0: 70}[fraction]
    for name, got, want in zip(("y", "dx", "dw1", "db1", "dw2", "db2"), compiled, ref):
        got = f64(got)
        if name == "dw2":
            # float32 accumulation, one f16 rounding of the output (2^-11, or 2^-25 if subnormal)
            assert np.all(np.abs(got - want) <= 2e-3 * dw2_scale + 2.0 ** -24)
        else:
            assert rel_err(got, want) < GRAD_RTOL, name


# ----- the tripwire: no host read while the step's graph is built ---------------------------

class HostRead(AssertionError):
    """An MLX array was read on the host."""


@contextlib.contextmanager
def host_read_tripwire() -> Iterator[list[str]]:
    """Within: every Python-level host read of an MLX array raises HostRead (and is listed)."""
    trips: list[str] = []

    def trap(what: str) -> Callable[..., object]:
        def raise_(*_a: object, **_k: object) -> object:
            trips.append(what)
            raise HostRead(f"host read of an MLX array: {what}")
        return raise_

    mp = pytest.MonkeyPatch()
    try:
        for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__",
                     "__array__", "__iter__", "__dlpack__"):
            mp.setattr(mx.array, name, trap(f"mx.array.{name}"))
        mp.setattr(mx, "eval", trap("mx.eval"))
        for name in ("array", "asarray", "asanyarray", "ascontiguousarray", "flatnonzero",
                     "argwhere", "nonzero"):
            def guarded(*a: object, _real: Callable = getattr(np, name), _name: str = name,
                        **k: object) -> object:
                if any(isinstance(v, mx.array) for v in (*a, *k.values())):
                    trap(f"np.{_name}(mx.array)")()
                return _real(*a, **k)
            mp.setattr(np, name, guarded)
        yield trips
    finally:
        mp.undo()


def test_tripwire_trips() -> None:
    """The tripwire catches what the old backward did (np.array of the column counts)."""
    a = mx.array([1, 2, 3])
    with host_read_tripwire() as trips:
        for read in (lambda: np.array(a), lambda: a.item(), lambda: bool(a[0]), lambda: a.tolist(),
                     lambda: mx.eval(a)):
            with pytest.raises(HostRead):
                read()
    assert len(trips) == 5
    assert np.array(a).tolist() == [1, 2, 3]  # restored


@pytest.mark.parametrize("method", METHODS)
def test_step_builds_without_host_reads(method: str) -> None:
    """The step's graph (forward, VJP, split dW2) is built with no host read; evaluated
    afterwards it equals the step built normally."""
    p = arrays(2000, 65)
    args = [p[k] for k in (*NAMES, "dy")]
    plain = step_fn(method, "split", 0.5, 5)(*args)
    with host_read_tripwire() as trips:
        wired = step_fn(method, "split", 0.5, 5)(*args)  # lazy: nothing is evaluated here
    assert trips == []
    for name, a, b in zip(("y", *NAMES), plain, wired):
        assert np.array_equal(f64(a), f64(b)), name


# ----- the split's selection ---------------------------------------------------------------

@pytest.mark.parametrize("f, tokens", [(1, 3), (5, 3), (70, 3), (70, 65), (130, 4), (64, 2 ** 27)])
def test_most_sparse_columns_is_the_reference_selection(f: int, tokens: int) -> None:
    """Many ties (few distinct counts); tokens = 2^27 takes the int64 key path."""
    rng = np.random.default_rng(f * 7 + tokens)
    for trial in range(4):
        hi = min(tokens, 4) if trial < 2 else tokens
        z = rng.integers(0, hi + 1, size=f)
        if tokens > 2 ** 20:
            z = np.where(rng.random(f) < 0.5, tokens - rng.integers(0, 3, size=f), z)
        for n in sorted({0, 1, f // 3, f // 2, f - 1, f} & set(range(f + 1))):
            order = np.array(ops.most_sparse_columns(mx.array(z.astype(np.uint32)), n, tokens))
            mask = ref_split_mask(z, n)
            assert sorted(order.tolist()) == list(range(f))  # a permutation
            assert np.array_equal(order[:n], np.flatnonzero(mask)), (f, tokens, n)
            assert np.array_equal(order[n:], np.flatnonzero(~mask))


def test_sparse_column_count() -> None:
    count = ops.sparse_column_count
    assert ops.SPLIT_GRANULE == 32
    assert [count(14336, fr) for fr in (0.0, 0.5, 0.9, 0.95, 1.0)] == [0, 7168, 12896, 13600, 14336]
    assert count(70, 0.5) == 32 and count(70, 1.0) == 70 and count(70, 0.99) == 64 and count(31, 0.9) == 0
    assert count(3200, 0.29) == 928  # 0.29 * 3200 = 927.999... in binary: still 29 * 32
    for bad in (-0.1, 1.5, True, "0.5"):
        with pytest.raises(SparsifyError, match="split fraction"):
            count(64, bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("t", [3, 65, 2048])
def test_split_by_rank_equals_split_by_mask(t: int) -> None:
    """The device path is the host-mask path for the reference selection, bit for bit (same
    gathered order, hence the same MVUE draw), and its float64 reference."""
    rng = np.random.default_rng(t + 5)
    f, n_cols = 70, 12
    a = np.maximum(rng.normal(size=(t, f)) - np.where(rng.random(f) < 0.5, 1.0, 0.0), 0) ** 2
    a = mx.array(a.astype(np.float32)).astype(F16)
    g = mx.array(rng.normal(size=(t, n_cols)).astype(np.float32)).astype(F16)
    z = (np.array(a.astype(mx.float32)) == 0).sum(0).astype(np.uint32)
    for n_sparse in (0, 32, 64, 70):
        mask = ref_split_mask(z, n_sparse)
        for method in ("mvue", "top2"):
            got = ops.split_matmul_by_rank(a, g, mx.array(z), n_sparse, method, 11, "mlx")
            want = ops.split_matmul(a, g, mask, method, 11, "mlx")
            assert np.array_equal(f64(got), f64(want)), (n_sparse, method)


def test_split_by_rank_errors() -> None:
    a = mx.ones((8, 6), dtype=F16)
    z = mx.zeros((6,), dtype=mx.uint32)
    cases = [
        (lambda: ops.split_matmul_by_rank(a, a, z[:5], 2), ShapeError, r"col_zeros: expected .* shape \(6,\)"),
        (lambda: ops.split_matmul_by_rank(a, a, z.astype(mx.float32), 2), SparsifyError, "integer zero counts"),
        (lambda: ops.split_matmul_by_rank(a, a, z, 7), SparsifyError, "n_sparse: expected an integer in 0..F=6"),
        (lambda: ops.split_matmul_by_rank(a, a, z, 2.0), SparsifyError, "n_sparse"),  # type: ignore[arg-type]
        (lambda: ops.split_matmul_by_rank(a, a[:3], z, 2), ShapeError, "g: has 3 rows"),
        (lambda: ops.split_matmul_by_rank(a, a, z, 2, method="random"), SparsifyError, "method: expected"),
        (lambda: ops.split_matmul_by_rank(a, a, z, 2, backend="tpu"), SparsifyError, "backend: expected"),
    ]
    for call, cls, pattern in cases:
        with pytest.raises(cls, match=pattern):
            call()
