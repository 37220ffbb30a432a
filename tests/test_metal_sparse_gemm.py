"""Issue 16: the activation-sparse GEMM C = S @ B on Metal, seed 000's software scatter
(`lowering/sparse_gemm_scatter.py`), launched through `mx.fast.metal_kernel`.

- Its lane tables are the target's (`Target.lane_elements`) and the row-major layout's index
  maps: the K shuffle is a permutation that gives every lane whole 2:4 groups, and B's packing
  applies the same shuffle to the target's B lane table.
- The printed Metal on the CPU harness (g++; outputs poisoned): f16 and bf16, P = 1, 3, 65,
  129, N and L tails, random data; within the error model (`checks/error_model.py`) of the
  float64 product and bit for bit equal to the IR interpreter.
- The launch: a stand-in `mx.fast.metal_kernel` (tests/metal_standin.py) records what MLX would
  receive (text, grid, threadgroup, inputs, output shapes / dtypes, init_value) and runs the
  exact text on the harness; "auto" on an Apple GPU launches it.
- The SparseFFN on the metal backend against the MLX-ops backend: the same selections bit for
  bit, the products within the error model, the gradients that do not pass through the sparse
  GEMM bit for bit, the others within a few f16 ulps.
- Mutations: a wrong metadata slot fails on both oracles; a wrong A lane table (the target's
  data, which the interpreter shares) fails on the harness.
- Bad shapes and dtypes raise the project's errors naming the argument; the cost model.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

import marlin_dsl.nn as mnn  # noqa: E402
from marlin_dsl.activation import kernels, ops  # noqa: E402
from marlin_dsl.activation.ffn import FFNConfig, ffn_backward, ffn_forward  # noqa: E402
from marlin_dsl.activation.host import (SparsifyOutput, pack_b_words, run_sparse_gemm,  # noqa: E402
                                        sparse_gemm_scalars)
from marlin_dsl.formats.activation_reference import sparsify_reference  # noqa: E402
from marlin_dsl.formats.activation_spec import SparsifyError, SparsifySpec  # noqa: E402
from marlin_dsl.checks.error_model import compare, ulp  # noqa: E402
from marlin_dsl.cost.loop import count_loop  # noqa: E402
from marlin_dsl.cost.model import cost_from_counts  # noqa: E402
from marlin_dsl.errors import CompileError, ShapeError  # noqa: E402
from marlin_dsl.ir.interpret import run_kernel  # noqa: E402
from marlin_dsl.ir.numerics import round_to_activation  # noqa: E402
from marlin_dsl.layouts.sparse_activation import ActivationLayout  # noqa: E402
from marlin_dsl.lowering import sparse_gemm_scatter as scatter  # noqa: E402
from marlin_dsl.lowering.sparse_gemm import b_lane_order, has_sparse_gemm, lower_sparse_gemm  # noqa: E402
from marlin_dsl.lowering.sparsify import lower_sparsify  # noqa: E402
from marlin_dsl.passes import DEFAULT_PIPELINE, PassManager  # noqa: E402
from marlin_dsl.machine import METAL  # noqa: E402
from marlin_dsl.targets.metal.cpu_harness import compile_many, compile_metal, find_compiler  # noqa: E402
from marlin_dsl.targets.metal.printer import print_metal  # noqa: E402
from metal_standin import MetalStandIn  # noqa: E402

pytestmark = pytest.mark.skipif(
    find_compiler() is None,
    reason="g++ is not installed: the Metal CPU harness compiles the emitted Metal as C++20 with it")

DTYPES = ("f16", "bf16")
_MX = {"f16": mx.float16, "bf16": mx.bfloat16}
#: (P, L, N): P = 1, 3, 65, 129; L not a multiple of 4 or 32; N tails of 8 and 128
SHAPES = [(1, 37, 9), (3, 64, 130), (65, 45, 9), (129, 100, 257)]


def _activations(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """float32 normals with ~25% exact zeros and small-integer ties."""
    x = rng.normal(size=shape).astype(np.float32) * 2
    x = np.where(rng.random(shape) < 0.3, np.round(x), x).astype(np.float32)
    x[rng.random(shape) < 0.25] = 0.0
    return x


def _operand(rng: np.random.Generator, p: int, length: int, spec: SparsifySpec,
             seed: int = 5) -> tuple[SparsifyOutput, np.ndarray]:
    """S [P, L] in Metal's row-major layout (the reference, encoded by the layout) and S dense."""
    x = _activations(rng, (p, length) if spec.axis == 1 else (length, p))
    ref = sparsify_reference(x, spec, seed)
    layout = ActivationLayout("metal", p, length)
    values, meta = layout.encode(ref, spec.dtype)
    return SparsifyOutput(layout, values, meta, None), ref.dense.astype(np.float64)


def _held(b: np.ndarray, dtype: str) -> np.ndarray:
    return np.asarray(round_to_activation(np.asarray(b, np.float32), dtype), np.float64)


def _f32(a: Any) -> np.ndarray:
    return np.array(a.astype(mx.float32))


@pytest.fixture(scope="module")
def gemms() -> dict[str, tuple[Any, Any]]:
    """Both GEMMs lowered for Metal and compiled for the CPU harness."""
    kernels_ = {d: lower_sparse_gemm(d, "metal") for d in DTYPES}
    return {d: (k, c) for (d, k), c in zip(kernels_.items(), compile_many(list(kernels_.values()), jobs=2))}


# ----- the tables: target data and the layout --------------------------------------------------

def test_scatter_tables_come_from_the_target() -> None:
    tab = scatter.scatter_tables("metal")
    rows, cols = METAL.lane_elements("a", 8, 8)
    assert tab.mma == (8, 8, 8) and tab.k_tiles == 4
    assert sorted(tab.k_order.ravel()) == list(range(32))
    # each lane owns whole 2:4 groups: its 8 logical K per step are groups a_pair, a_pair + 1
    owned = tab.k_order[:, cols].transpose(1, 0, 2).reshape(32, -1)        # [lane, t * 2 + e]
    assert np.array_equal(np.sort(owned, axis=1), 4 * tab.a_pair[:, None] + np.arange(8))
    assert np.array_equal(tab.a_row, rows[:, 0])
    # the nibble of (row, group) is where the layout's encoder puts it
    lay = ActivationLayout("metal", 16, 32)
    for lane in range(32):
        for sel in (0, 1):
            for i in (0, 1):
                r, g = tab.a_row[lane] + 8 * sel, tab.a_pair[lane] + i
                assert tab.meta_word[lane] == lay.meta_word_index(0, 0, r % 8, g // 4)
                assert tab.meta_shift[lane, sel, i] == 16 * (r // 8) + 4 * (g % 4)
    # B: the target's B lane table with the same K shuffle, one 16-byte load per lane
    brows, bcols = METAL.lane_elements("b", 8, 8)
    ks, ns = b_lane_order("metal")
    assert ks.shape == ns.shape == (32, 8)
    for t in range(4):
        assert np.array_equal(ks[:, 2 * t:2 * t + 2], tab.k_order[t][brows])
        assert np.array_equal(ns[:, 2 * t:2 * t + 2], bcols)
    assert has_sparse_gemm("metal") and has_sparse_gemm("cuda")


# ----- the printed kernel on the CPU harness ---------------------------------------------------

@pytest.mark.parametrize("method,axis", [("top2", 1), ("mvue", 0)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_harness_matches_float64_and_interpreter(gemms: dict, dtype: str, method: str, axis: int) -> None:
    kernel, cpu = gemms[dtype]
    spec = SparsifySpec(method, axis, dtype)
    rng = np.random.default_rng([ord(c) for c in dtype + method])
    for i, (p, length, n) in enumerate(SHAPES):
        out, dense = _operand(rng, p, length, spec)
        b = rng.normal(size=(length, n)).astype(np.float32)
        y = run_sparse_gemm(kernel, out, b, dtype, lambda k, bufs, s: cpu.run(bufs, s, seed=i))
        assert y.shape == (p, n) and not np.isnan(y).any(), f"{(p, length, n)}: unwritten outputs"
        bh = _held(b, dtype)
        check = compare(y, dense @ bh, dense, bh, dtype)
        assert check.ok, f"{dtype} {(p, length, n)}: {check.summary()}"
        theirs = run_sparse_gemm(kernel, out, b, dtype, run_kernel)
        assert np.array_equal(y.view(np.uint32), theirs.view(np.uint32)), (p, length, n)


def test_sparsify_kernel_output_feeds_the_gemm(gemms: dict) -> None:
    """The Metal sparsify kernel's own output (printed, on the harness) through the GEMM."""
    kernel, cpu = gemms["bf16"]
    spec = SparsifySpec("soft_threshold", 1, "bf16", True, True)
    sk = compile_metal(lower_sparsify(spec, "metal"))
    from marlin_dsl.activation.host import run_sparsify

    rng = np.random.default_rng(3)
    x = _activations(rng, (65, 70))
    out = run_sparsify(lower_sparsify(spec, "metal"), spec, x, 0, lambda k, bufs, s: sk.run(bufs, s))
    b = rng.normal(size=(70, 33)).astype(np.float32)
    y = run_sparse_gemm(kernel, out, b, "bf16", lambda k, bufs, s: cpu.run(bufs, s, seed=3))
    dense = sparsify_reference(x, spec, 0).dense.astype(np.float64)
    assert compare(y, dense @ _held(b, "bf16"), dense, _held(b, "bf16"), "bf16").ok


# ----- mutations ------------------------------------------------------------------------------

def _mutated_tables(tab: scatter.ScatterTables) -> scatter.ScatterTables:
    """A lane reads its first group's nibble from the second group's slot and vice versa."""
    return replace(tab, meta_shift=tab.meta_shift[:, :, ::-1].copy())


def test_wrong_metadata_slot_fails(gemms: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    tab = scatter.scatter_tables("metal")
    monkeypatch.setattr(scatter, "scatter_tables", lambda name: _mutated_tables(tab))
    bad = lower_sparse_gemm("f16", "metal")
    monkeypatch.undo()
    cpu = compile_metal(bad)
    rng = np.random.default_rng(11)
    out, dense = _operand(rng, 65, 64, SparsifySpec("top2", 1, "f16"))
    b = rng.normal(size=(64, 24)).astype(np.float32)
    bh = _held(b, "f16")
    for execute in (run_kernel, lambda k, bufs, s: cpu.run(bufs, s)):
        y = run_sparse_gemm(bad, out, b, "f16", execute)
        assert not compare(y, dense @ bh, dense, bh, "f16").ok
    good = run_sparse_gemm(gemms["f16"][0], out, b, "f16", run_kernel)
    assert compare(good, dense @ bh, dense, bh, "f16").ok


def test_wrong_a_lane_table_is_caught_by_the_harness(monkeypatch: pytest.MonkeyPatch) -> None:
    """Swap the A rows of lanes 0 and 2 in the target's table: the interpreter, which reads the
    same table, still agrees with the reference; the harness (its own lane ownership) does not."""
    rows, cols = METAL.lane_elements("a", 8, 8)
    rows[[0, 2]] = rows[[2, 0]]
    monkeypatch.setitem(METAL.lane_tables, ("a", 8, 8), (rows, cols))
    scatter.scatter_tables.cache_clear()
    try:
        bad = lower_sparse_gemm("f16", "metal")
        rng = np.random.default_rng(12)
        out, dense = _operand(rng, 16, 32, SparsifySpec("top2", 1, "f16"))
        b = rng.normal(size=(32, 8)).astype(np.float32)
        bh = _held(b, "f16")
        assert compare(run_sparse_gemm(bad, out, b, "f16", run_kernel), dense @ bh, dense, bh, "f16").ok
        cpu = compile_metal(bad)
        y = run_sparse_gemm(bad, out, b, "f16", lambda k, bufs, s: cpu.run(bufs, s))
        assert not compare(y, dense @ bh, dense, bh, "f16").ok
    finally:
        monkeypatch.undo()
        scatter.scatter_tables.cache_clear()


# ----- the launch through mx.fast.metal_kernel -------------------------------------------------

_SPECS = {s.name: s for s in (SparsifySpec(m, a, d, r, r, dense=dense) for m in ("top2", "mvue") for a in (0, 1)
                              for d in DTYPES for r in (False, True) for dense in (False, True))}


def _expected(name: str) -> Any:
    if name.startswith("sparse_act_gemm_"):
        return print_metal(lower_sparse_gemm(name.rsplit("_", 1)[1], "metal"))
    gather = name.endswith("_gather")  # the split's sparsify reads the columns in place
    return print_metal(lower_sparsify(_SPECS[name.removesuffix("_gather")], "metal", gather))


@pytest.fixture
def metal(monkeypatch: pytest.MonkeyPatch, gemms: dict) -> MetalStandIn:
    """An Apple GPU as far as the activation API can tell (see test_metal_activation.py)."""
    standin = MetalStandIn(_expected, {f"sparse_act_gemm_{d}": c for d, (_, c) in gemms.items()}, seed=1)
    monkeypatch.setattr(mnn, "_metal_available", lambda: True)
    monkeypatch.setattr(mnn, "_cuda_available", lambda: False)
    monkeypatch.setattr(mx.fast, "metal_kernel", standin)
    had = "metal" in ops.KERNEL_BACKENDS
    kernels._sparsify_launch.cache_clear()
    kernels._gemm_launch.cache_clear()
    yield standin
    kernels._sparsify_launch.cache_clear()
    kernels._gemm_launch.cache_clear()
    if not had:
        ops.KERNEL_BACKENDS.pop("metal", None)


@pytest.mark.parametrize("dtype", DTYPES)
def test_launch_is_what_the_printed_kernel_asks_for(metal: MetalStandIn, gemms: dict, dtype: str) -> None:
    kernel = gemms[dtype][0]
    src = print_metal(kernel)
    spec = SparsifySpec("top2", 1, dtype)
    rng = np.random.default_rng(21)
    for p, length, n in SHAPES:
        x = mx.array(_activations(rng, (p, length))).astype(_MX[dtype])
        b = mx.array(rng.normal(size=(length, n)).astype(np.float32)).astype(_MX[dtype])
        s = ops.sparsify(x, spec, 0, backend="auto")
        assert s.backend == "metal"
        y = kernels.sparse_matmul(s, b, init_value=float("nan"))
        got = metal.launches[-1]
        layout = ActivationLayout("metal", p, length)
        scalars = sparse_gemm_scalars(layout, n)
        assert got["name"] == f"sparse_act_gemm_{dtype}"
        assert got["dims"] == [scalars[nm] for nm in src.scalar_names] and src.scalar_names == list(scalars)
        assert got["grid"] == (-(-n // 128) * 128, -(-p // 32), 1) and got["threadgroup"] == (128, 1, 1)
        assert np.array_equal(got["inputs"]["values"], np.array(s.values))
        assert np.array_equal(got["inputs"]["meta"], np.array(s.metadata))
        # the MLX-ops packer of B equals the numpy one (the K shuffle included)
        assert np.array_equal(got["inputs"]["bp"], pack_b_words(_f32(b), dtype, "metal"))
        assert got["shapes"] == [(p, n)] and got["dtypes"] == [_MX[dtype]]
        assert np.isnan(got["init_value"])
        # the result: the harness's, which is the interpreter's, bit for bit
        sparse = SparsifyOutput(layout, np.array(s.values), np.array(s.metadata), None)
        theirs = run_sparse_gemm(kernel, sparse, _f32(b), dtype, run_kernel)
        assert np.array_equal(_f32(y).view(np.uint32), theirs.view(np.uint32))
    # ops.sparse_matmul launches it too (MLX's default: no fill)
    ops.sparse_matmul(s, b)
    assert metal.launches[-1]["name"] == f"sparse_act_gemm_{dtype}" and metal.launches[-1]["init_value"] is None


def test_sparse_ffn_on_metal_against_mlx_ops(metal: MetalStandIn) -> None:
    """Forward and backward of the SparseFFN: the metal backend (sparsify and GEMM kernels)
    against the MLX-ops backend, fed the same arrays."""
    rng = np.random.default_rng(4)
    dims, hidden, tokens = 24, 72, 37
    x, w1, w2, dy = (mx.array(rng.normal(size=s).astype(np.float32) * 0.5).astype(mx.float16)
                     for s in ((tokens, dims), (hidden, dims), (dims, hidden), (tokens, dims)))
    cfg = {b: FFNConfig("mvue", "split", 0.5, 5, b) for b in ("metal", "mlx")}
    y, cache = {}, {}
    for b in cfg:
        y[b], cache[b] = ffn_forward(x, w1, None, w2, None, cfg[b])
    # the same selections, bit for bit
    for name in ("h", "s", "mask", "col_zeros"):
        assert np.array_equal(np.array(getattr(cache["metal"], name)), np.array(getattr(cache["mlx"], name))), name
    # the product S @ W2^T: the kernel within the error model of the float64 product
    s64 = _f32(cache["metal"].s).astype(np.float64)
    w64 = _f32(w2.T).astype(np.float64)
    check = compare(_f32(y["metal"]), s64 @ w64, s64, w64, "f16")
    assert check.ok, check.summary()
    assert np.all(np.abs(_f32(y["metal"]) - _f32(y["mlx"])) <= ulp(s64 @ w64, "f16"))
    names = {launch["name"] for launch in metal.launches}
    # the FFN's sparsify also writes S's dense form and kept mask (compared above with MLX's)
    assert names == {"relu2_stats_dense_sparsify_mvue_axis1_f16", "sparse_act_gemm_f16"}
    grads = {b: ffn_backward(cache[b], x, w1, w2, dy, cfg[b]) for b in cfg}
    # the split dW2 launched the axis-0 sparsify and the GEMM; nothing else passes through it
    assert len(metal.named("sparsify_mvue_axis0_f16_gather")) == 1 and len(metal.named("sparse_act_gemm_f16")) == 2
    for name in ("da", "dh", "dx", "dw1", "db1", "db2"):
        assert np.array_equal(_f32(getattr(grads["metal"], name)).view(np.uint32),
                              _f32(getattr(grads["mlx"], name)).view(np.uint32)), name
    got, want = _f32(grads["metal"].dw2), _f32(grads["mlx"].dw2)
    assert np.all(np.abs(got - want) <= ulp(want.astype(np.float64), "f16")), np.abs(got - want).max()
    assert np.linalg.norm(got - want) <= 1e-3 * np.linalg.norm(want)


def test_sparse_ffn_end_to_end_gradients(metal: MetalStandIn) -> None:
    """value_and_grad through `sparse_ffn` (the custom VJP) on both backends: within 1e-2."""
    from marlin_dsl.activation.ffn import sparse_ffn

    rng = np.random.default_rng(8)
    x, w1, w2 = (mx.array(rng.normal(size=s).astype(np.float32) * 0.5).astype(mx.float16)
                 for s in ((9, 24), (40, 24), (24, 40)))

    def run(backend: str) -> list[np.ndarray]:
        def loss(x_: Any, w1_: Any, w2_: Any) -> Any:
            out = sparse_ffn(x_, w1_, None, w2_, None, method="top2", split_fraction=0.8, backend=backend)
            return (out.astype(mx.float32) ** 2).sum()
        value, grads = mx.value_and_grad(loss, argnums=(0, 1, 2))(x, w1, w2)
        return [_f32(a).astype(np.float64) for a in (value, *grads)]

    got, want = run("metal"), run("mlx")
    assert "sparse_act_gemm_f16" in {launch["name"] for launch in metal.launches}
    for g, w in zip(got, want):
        assert np.linalg.norm(g - w) <= 1e-2 * np.linalg.norm(w)


# ----- errors ---------------------------------------------------------------------------------

def test_bad_shapes_and_dtypes_name_the_argument(metal: MetalStandIn) -> None:
    spec = SparsifySpec("top2", 1, "f16")
    s = ops.sparsify(mx.array(_activations(np.random.default_rng(2), (5, 40))).astype(mx.float16), spec,
                     backend="metal")
    with pytest.raises(ShapeError, match=r"^b: has 41 rows"):
        ops.sparse_matmul(s, mx.ones((41, 8), dtype=mx.float16))
    with pytest.raises(ShapeError, match=r"^b: expected dtype"):
        ops.sparse_matmul(s, mx.ones((40, 8), dtype=mx.bfloat16))
    with pytest.raises(ShapeError, match=r"^b: expected a non-empty matrix"):
        ops.sparse_matmul(s, mx.ones((40,), dtype=mx.float16))
    with pytest.raises(ShapeError, match=r"^b: expected an mlx.core.array"):
        ops.sparse_matmul(s, np.ones((40, 8), np.float16))
    with pytest.raises(SparsifyError, match=r"^s: expected a SparseActivation"):
        ops.sparse_matmul(s.dense_operand(), mx.ones((40, 8), dtype=mx.float16))
    with pytest.raises(CompileError, match=r"dtype: expected 'f16' or 'bf16'"):
        lower_sparse_gemm("f32", "metal")
    out = SparsifyOutput(s.layout.layout, np.array(s.values), np.array(s.metadata), None)
    with pytest.raises(SparsifyError, match=r"^b: expected \[40, N\]"):
        run_sparse_gemm(lower_sparse_gemm("f16", "metal"), out, np.ones((39, 8), np.float32), "f16", run_kernel)


# ----- the cost model ---------------------------------------------------------------------------

def test_cost_model() -> None:
    """Per weight (one element of B per threadgroup step), after the default passes: no
    threadgroup memory, no barrier, 2 MMAs (64 per lane and step over 32 x 128 x 32)."""
    kernel = lower_sparse_gemm("f16", "metal")
    PassManager(list(DEFAULT_PIPELINE)).run(kernel)
    tm, tn, tk = kernel.attrs["tile"]
    cost = cost_from_counts(kernel, count_loop(kernel), tn * tk, 1, tile=(tm, tn, tk), m=tm)
    assert (tm, tn, tk) == (32, 128, 32) and cost.shared_bytes == 0 and not cost.barriers_per_step
    assert cost.per_weight["mma"] == 2.0 and cost.per_weight["float"] == 0.75  # 24 selects a step
    assert cost.requested_bytes == {"bp": 4.0, "meta": 0.125, "values": 0.5}
    assert cost.instructions_per_weight < 9
