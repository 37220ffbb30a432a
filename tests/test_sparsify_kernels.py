"""Run-time 2:4 activation sparsify kernels and the sparse GEMM that consumes them.

- The sparsify kernels (`lowering/sparsify.py`) equal `formats/activation_reference.py` bit for bit on
  the IR interpreter for both targets' layouts ("cuda_mma_sp", "row_major") and on the Metal
  CPU harness (the printed Metal, compiled with g++), through `host.check_sparsify`.
- Padding: a group running past the end of the sparsified axis is zero padded, padded
  positions never carry a nonzero value, and all-padding groups carry the method's nibble.
- The "cuda_mma_sp" layout is what `mma.sp` reads, checked with the independent numpy model
  `machine/cuda/sparse_layout.py` (metadata fields, A lane coordinates, the MMA itself).
- The sparse GEMM (`lowering/sparse_gemm.py`) on the interpreter against float64, with a
  negative control (corrupted metadata must change the result or be refused).
- nvcc compiles the printed CUDA for sm_80 and sm_90; printing is deterministic.
- MVUE seeds; error cases.

Inputs are seeded: ~25% exact zeros, small integers (ties within groups), a row and a column of
equal values (ties), negative values, never all zeros.
"""
from __future__ import annotations

import numpy as np
import pytest

from marlin_dsl.activation.host import (SparsifyOutput, check_sparsify, run_sparse_gemm,
                                        run_sparsify)
from marlin_dsl.layouts.sparse_activation import ActivationLayout
from marlin_dsl.formats.activation_reference import nibbles_to_indices, operand_shape, sparsify_reference
from marlin_dsl.formats.activation_spec import METHODS, SparsifyError, SparsifySpec
from marlin_dsl.machine.cuda import sparse_layout as sl
from marlin_dsl.targets.cuda.printer import print_cuda
from marlin_dsl.targets.cuda.nvcc import find_nvcc, nvcc_check
from marlin_dsl.targets.metal.printer import print_metal
from marlin_dsl.targets.metal.cpu_harness import compile_many, find_compiler, run_metal_cpu
from marlin_dsl.ir.interpret import InterpreterError, run_kernel
from marlin_dsl.lowering.sparse_gemm import lower_sparse_gemm
from marlin_dsl.lowering.sparse_gemm_staged import SMALL
from marlin_dsl.lowering.sparsify import lower_sparsify
from marlin_dsl.ir.numerics import round_to_activation
from marlin_dsl.machine import CUDA

DTYPES = ("f16", "bf16")
AXES = (0, 1)
TARGETS = ("cuda", "metal")
#: (relu2, stats)
FLAGS = [(False, False), (True, True)]
#: R or C = 1, 3, 65; lengths that are not multiples of 4 or 32 on either axis; (300, 9) has
#: more than TILES_PER_THREAD (8) tiles along the loop axis on both axes, so several threads
#: publish their column counts (atomics) for one column.
SHAPES = [(1, 5), (3, 64), (65, 130), (37, 45), (7, 1), (300, 9), (48, 32)]  # (48, 32): whole 16-runs on both axes
RTOL = {"f16": 2e-3, "bf16": 1.6e-2}
PAD_NIBBLE = {"top2": 0b0100, "soft_threshold": 0b0100, "mvue": 0b1000}

needs_gxx = pytest.mark.skipif(
    find_compiler() is None,
    reason="no C++ compiler (g++ / $CXX): the Metal CPU harness compiles the printed Metal as C++20")
needs_nvcc = pytest.mark.skipif(
    find_nvcc() is None,
    reason="nvcc (the CUDA toolkit) is not installed: the printed CUDA is compile-checked with nvcc")


def activation_input(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """float32 [R, C]: normals (half of them negative), ~25% exact zeros, ~30% small integers
    (ties inside groups), row 0 all equal and negative, column 0 all equal; never all zeros."""
    r, c = shape
    x = rng.normal(size=shape).astype(np.float32) * 2
    x = np.where(rng.random(shape) < 0.3, np.round(x), x).astype(np.float32)
    if r > 1:
        x[0, :] = -1.25          # a row of ties (negative: relu2 zeroes it)
    if c > 1:
        x[:, 0] = 0.75           # a column of ties
    x[rng.random(shape) < 0.25] = 0.0
    if not x.any():
        x[-1, -1] = 3.0
    return x


def _rng(*key) -> np.random.Generator:
    """A generator seeded from `key` (stable across runs, unlike hash())."""
    return np.random.default_rng([ord(ch) for ch in repr(key)])


# ----- 1. interpreter, both targets, bit exact -----------------------------------------------

@pytest.mark.sweep
@pytest.mark.parametrize("relu2,stats,dense", [(False, False, False), (True, True, False), (True, True, True),
                                               (False, False, True)],
                         ids=["plain", "relu2_stats", "relu2_stats_dense", "dense"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", AXES)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("target", TARGETS)
def test_interpreter_bit_exact(target: str, method: str, axis: int, dtype: str, relu2: bool, stats: bool,
                               dense: bool) -> None:
    """The lowered kernel on the IR interpreter equals the reference bit for bit (operand,
    every nibble including padding's, every physical word, column zero counts, and with
    `dense` the dense S and kept mask it writes, NaN- and True-poisoned) on odd shapes."""
    spec = SparsifySpec(method, axis, dtype, relu2, stats, dense=dense)
    kernel = lower_sparsify(spec, target)
    assert kernel.attrs["layout"] == ("cuda_mma_sp" if target == "cuda" else "row_major")
    rng = _rng("interp", target, method, axis, dtype, relu2)
    for i, shape in enumerate(SHAPES):
        check_sparsify(spec, target, activation_input(rng, shape), seed=7 + i, execute=run_kernel, kernel=kernel)


# ----- 2. Metal CPU harness ------------------------------------------------------------------

METAL_SPECS = [SparsifySpec(m, a, d, True, True) for m in METHODS for a in AXES for d in DTYPES] + [
    SparsifySpec("top2", 1, "f16", True, True, dense=True), SparsifySpec("mvue", 0, "bf16", True, True, dense=True)]


@pytest.fixture(scope="module")
def metal_compiled():
    """The 12 relu2+stats sparsify kernels (and 2 writing dense S) lowered for Metal, printed
    and compiled (2 jobs)."""
    kernels = [lower_sparsify(s, "metal") for s in METAL_SPECS]
    return dict(zip(METAL_SPECS, zip(kernels, compile_many(kernels, jobs=2))))


@needs_gxx
@pytest.mark.parametrize("spec", METAL_SPECS, ids=lambda s: s.name)
def test_metal_cpu_harness_bit_exact(metal_compiled, spec: SparsifySpec) -> None:
    """The printed Metal, executed on the CPU (g++), equals the reference bit for bit."""
    kernel, compiled = metal_compiled[spec]
    rng = _rng("metal", spec.name)
    for shape in [(3, 5), (65, 130), (300, 9)]:   # (300, 9): concurrent atomics on one column
        check_sparsify(spec, "metal", activation_input(rng, shape), seed=11,
                       execute=lambda k, b, s: run_metal_cpu(compiled, b, s), kernel=kernel)


# ----- 3. padding of the sparsified axis ------------------------------------------------------

def _full_layout(out) -> ActivationLayout:
    """A layout of shape [Pp, Lp]: the same index maps as the padded [P, L] one, so its decode
    reads the whole physical operand, padding included."""
    lay = out.layout
    full = ActivationLayout(lay.target, lay.pp, lay.lp)
    assert (full.pp, full.lp, full.value_words, full.meta_words) == (lay.pp, lay.lp, lay.value_words, lay.meta_words)
    return full


@pytest.mark.parametrize("stats", [False, True])
@pytest.mark.parametrize("axis", AXES)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("target", TARGETS)
def test_gathering_kernel_reads_the_columns_in_place(target: str, method: str, axis: int, stats: bool) -> None:
    """A gathering kernel on H [R, LD] and columns c equals the reference on the copy H[:, c]
    bit for bit (values, every nibble, column counts), for permuted, repeated and tail-only
    column sets."""
    spec = SparsifySpec(method, axis, "f16", stats, stats)
    kernel = lower_sparsify(spec, target, gather=True)
    assert kernel.name == spec.name + "_gather" and [b.name for b in kernel.buffers][:2] == ["x", "cols"]
    rng = _rng("gather", target, method, axis, stats)
    for shape in [(3, 5), (65, 130), (40, 9)]:
        h = activation_input(rng, shape)
        for cols in (rng.permutation(shape[1])[:max(1, 2 * shape[1] // 3)], np.array([shape[1] - 1] * 3),
                     np.arange(shape[1])[::-1]):
            check_sparsify(spec, target, h, 3, run_kernel, kernel=kernel, columns=cols)


def test_gathering_and_plain_kernels_refuse_each_others_buffers() -> None:
    spec = SparsifySpec("top2", 0, "f16")
    x = activation_input(_rng("mix"), (8, 6))
    with pytest.raises(SparsifyError, match="gathers X's columns, none given"):
        run_sparsify(lower_sparsify(spec, "cuda", gather=True), spec, x, 0, run_kernel)
    with pytest.raises(SparsifyError, match="does not gather X's columns, columns given"):
        run_sparsify(lower_sparsify(spec, "cuda"), spec, x, 0, run_kernel, columns=np.arange(3))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("method", METHODS)
def test_tail_group_is_zero_padded(target: str, method: str) -> None:
    """Axis 0 with R = 1, 2, 3, 5, 65 (not multiples of 4): the decoded operand equals the
    reference, padded positions (past L, past P) hold 0, a padded position is kept only where
    the rule forces it, and every all-padding group carries the method's padding nibble."""
    dtype = "f16"
    spec = SparsifySpec(method, 0, dtype)
    kernel = lower_sparsify(spec, target)
    pad = PAD_NIBBLE[method]
    rng = _rng("pad", target, method)
    for r in (1, 2, 3, 5, 65):
        x = rng.normal(size=(r, 20)).astype(np.float32) + 0.0
        x[rng.random(x.shape) < 0.1] = 0.0
        x[0, 0] = 1.0
        out = run_sparsify(kernel, spec, x, 3, run_kernel)
        ref = sparsify_reference(x, spec, 3)
        assert ref.pad_nibble == pad
        p, length = operand_shape(x.shape, 0)
        assert (p, length) == (20, r)
        dense, nib = out.layout.decode(out.values, out.meta, dtype)
        assert np.array_equal(dense, ref.dense) and np.array_equal(nib, ref.nibbles)

        full = _full_layout(out)
        fdense, fnib = full.decode(out.values, out.meta, dtype)
        assert fdense.shape == (full.pp, full.lp)
        assert not fdense[:, length:].any(), f"R={r}: a padded column is nonzero"
        assert not fdense[p:, :].any(), f"R={r}: a padded row is nonzero"
        assert np.array_equal(fdense[:p, :length], ref.dense)
        # groups entirely past L, and rows past P: the method's all-zero nibble
        g_real = -(-length // 4)
        assert (fnib[:, g_real:] == pad).all(), f"R={r}: padding nibbles {np.unique(fnib[:, g_real:])}"
        assert (fnib[p:, :] == pad).all()
        # the tail group: a padded position is kept only when fewer than 2 (top2/soft) real
        # positions exist, or (mvue) when its whole pair is padding
        if length % 4:
            idx = nibbles_to_indices(fnib[:p, g_real - 1])            # [P, 2]
            real = length % 4
            kept_pad = (idx >= real).sum(-1)
            if method == "mvue":
                expect = 1 if real <= 2 else 0
            else:
                expect = max(0, 2 - real)
            assert (kept_pad == expect).all(), f"R={r}: padded positions kept {np.unique(kept_pad)}"
            if method == "mvue" and real <= 2:
                assert (idx[:, 1] == 2).all()
        # the same check on raw metadata words: every all-padding group's nibble, by word
        lay = out.layout
        rows, groups = np.meshgrid(np.arange(lay.pp), np.arange(lay.lp // 4), indexing="ij")
        padded = (rows >= p) | (groups >= g_real)
        mt, rr = rows // 16, rows % 16
        words = out.meta[lay.meta_word_index(mt, groups // 8, rr % 8, (groups % 8) // 4)]
        raw = (words >> (16 * (rr // 8) + 4 * (groups % 4)).astype(np.uint32)) & 0xF
        assert (raw[padded] == pad).all()


# ----- 4. the CUDA layout is what mma.sp reads ------------------------------------------------

@pytest.mark.parametrize("method,dtype,axis", [("top2", "f16", 1), ("mvue", "bf16", 0),
                                               ("soft_threshold", "bf16", 1)])
def test_cuda_layout_is_what_mma_sp_reads(method: str, dtype: str, axis: int) -> None:
    """For tile pairs (q, kt) of the kernel's "cuda" output, the independent mma.sp model
    recovers the reference: unpack_metadata(words, F) gives tile 2q + F's positions, the lane
    value words are the reference compressed values at a_compressed_coords, and
    mma_sp_reference on them equals the dense S tile @ B."""
    spec = SparsifySpec(method, axis, dtype)
    rng = _rng("cuda_layout", method, dtype, axis)
    x = activation_input(rng, (70, 100) if axis == 1 else (100, 70))
    out = run_sparsify(lower_sparsify(spec, "cuda"), spec, x, 5, run_kernel)
    ref = sparsify_reference(x, spec, 5)
    lay = out.layout
    assert lay.kind == "cuda_mma_sp" and (lay.p, lay.length) == (70, 100)
    assert (lay.pp, lay.lp, lay.m_tiles, lay.k_tiles) == (96, 128, 6, 4)
    # the reference, padded to the layout (values, positions, dense)
    vals = np.zeros((lay.pp, lay.lp // 2), np.float32)
    vals[:lay.p, :ref.values.shape[1]] = ref.values
    pos = np.zeros((lay.pp, lay.lp // 4, 2), np.int64)
    pos[...] = nibbles_to_indices(np.uint8(ref.pad_nibble))
    pos[:lay.p, :ref.indices.shape[1]] = ref.indices
    dense = np.zeros((lay.pp, lay.lp), np.float64)
    dense[:lay.p, :lay.length] = ref.dense
    b = np.round(rng.normal(size=(32, 8)) * 4) / 4                   # exact in f16 and bf16
    for q, kt in [(0, 0), (1, 2), (2, 3)]:                           # (2, 3): padded rows and K
        words = out.meta[(q * lay.k_tiles + kt) * 32:(q * lay.k_tiles + kt + 1) * 32]
        for f in (0, 1):
            mt = 2 * q + f
            rows, groups = slice(16 * mt, 16 * mt + 16), slice(8 * kt, 8 * kt + 8)
            assert np.array_equal(sl.unpack_metadata(words, f), pos[rows, groups]), (q, kt, f)
            block = out.values[(mt * lay.k_tiles + kt) * 128:(mt * lay.k_tiles + kt + 1) * 128]
            lane_vals = sl.from_b32_registers(block.reshape(32, 4), dtype)          # [32, 8]
            comp = vals[rows, 16 * kt:16 * kt + 16]                                  # [16, 16]
            ar, ac = sl.a_compressed_coords()
            assert np.array_equal(lane_vals, comp[ar, ac].astype(np.float64)), (q, kt, f)
            assert np.array_equal(sl.a_lane_values(comp).astype(np.float64), lane_vals)
            d = sl.mma_sp_reference(lane_vals, words, sl.b_lane_values(b), f)
            want = dense[rows, 32 * kt:32 * kt + 32] @ b
            np.testing.assert_allclose(d, want, rtol=1e-12, atol=1e-12)


# ----- 5. sparse GEMM on the interpreter ------------------------------------------------------

#: (P, L, N): P = 1, 3, 65; N tails 9, 130; L tails (not multiples of 4 / 32).
GEMM_SHAPES = [(1, 37, 9), (3, 64, 130), (65, 45, 9), (65, 130, 130)]


def _x_for(p: int, length: int, axis: int, rng: np.random.Generator) -> np.ndarray:
    return activation_input(rng, (p, length) if axis == 1 else (length, p))


@pytest.mark.parametrize("method", ["top2", "mvue"])
@pytest.mark.parametrize("axis", AXES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_sparse_gemm_matches_float64(dtype: str, axis: int, method: str) -> None:
    """C = S @ B from the sparsify kernel's output equals the float64 product of the
    reference operand with B (rounded to dtype), within the output rounding; every output
    element is written (the buffer is NaN-poisoned)."""
    spec = SparsifySpec(method, axis, dtype)
    sk = lower_sparsify(spec, "cuda")
    gk = lower_sparse_gemm(dtype, "cuda")
    rng = _rng("gemm", dtype, axis, method)
    for p, length, n in GEMM_SHAPES:
        x = _x_for(p, length, axis, rng)
        b = rng.normal(size=(length, n)).astype(np.float32)
        out = run_sparsify(sk, spec, x, 9, run_kernel)
        y = run_sparse_gemm(gk, out, b, dtype, run_kernel)
        assert y.shape == (p, n)
        assert np.isfinite(y).all(), f"{(p, length, n)}: unwritten (NaN) or non-finite outputs"
        bh = np.asarray(round_to_activation(b, dtype), np.float64)
        want = np.asarray(round_to_activation(
            (sparsify_reference(x, spec, 9).dense.astype(np.float64) @ bh).astype(np.float32), dtype), np.float64)
        scale = np.abs(want).max()
        assert scale > 0
        err = np.abs(y - want).max() / scale
        assert err < RTOL[dtype], f"{(p, length, n)}: relative error {err:.3g}"


def test_sparse_gemm_corrupted_metadata_is_caught() -> None:
    """Negative control: swapping the two indices of one nibble (unordered metadata) makes the
    interpreter refuse the mma_sp (kind "metadata"); replacing it by a different valid nibble
    changes the result."""
    dtype = "f16"
    spec = SparsifySpec("top2", 1, dtype)
    x = activation_input(_rng("neg"), (20, 64))
    x[0, :4] = [1.0, -2.0, 3.0, 0.5]           # row 0, group 0: keeps positions 1, 2 (nibble 0b1001)
    out = run_sparsify(lower_sparsify(spec, "cuda"), spec, x, 0, run_kernel)
    gk = lower_sparse_gemm(dtype, "cuda")
    b = _rng("negb").normal(size=(64, 16)).astype(np.float32)
    good = run_sparse_gemm(gk, out, b, dtype, run_kernel)
    w = int(out.layout.meta_word_index(0, 0, 0, 0))              # row 0, groups 0..3: bits 0..15
    assert out.meta[w] & 0xF == 0b1001

    swapped = out.meta.copy()
    swapped[w] = (swapped[w] & ~np.uint32(0xF)) | np.uint32(0b0110)     # idx0 = 2, idx1 = 1
    bad = SparsifyOutput(out.layout, out.values, swapped, out.col_zeros)
    with pytest.raises(InterpreterError) as err:
        run_sparse_gemm(gk, bad, b, dtype, run_kernel)
    assert err.value.kind == "metadata"

    moved = out.meta.copy()
    moved[w] = (moved[w] & ~np.uint32(0xF)) | np.uint32(0b1100)         # positions 0, 3
    y = run_sparse_gemm(gk, SparsifyOutput(out.layout, out.values, moved, out.col_zeros), b, dtype, run_kernel)
    assert np.isfinite(y).all()
    assert not np.array_equal(y[0], good[0]), "a different nibble must move row 0's values"
    assert np.array_equal(y[1:], good[1:]), "only row 0 reads that nibble"


def test_idle_meta_is_a_valid_padding_word() -> None:
    """The GEMM's metadata for tile pairs past S (the target's idle word) is ordered for both selectors."""
    for f in (0, 1):
        pos = sl.unpack_metadata(np.full(32, CUDA.sparse_idle_metadata, np.uint32), f)
        assert (pos[..., 0] == 0).all() and (pos[..., 1] == 1).all()


# ----- 6. nvcc ----------------------------------------------------------------------------

@pytest.mark.slow  # an nvcc/ptxas sweep: CI runs it (-m slow)
@needs_nvcc
def test_nvcc_compiles_sparsify_and_sparse_gemm(tmp_path) -> None:
    """The printed CUDA of sparsify kernels (with and without colz as an inout input) and of
    the sparse GEMM (both dtypes, both block sizes) compiles with nvcc for sm_80 and sm_90."""
    sources = [print_cuda(lower_sparsify(SparsifySpec("top2", 1, "f16"), "cuda")),
               print_cuda(lower_sparsify(SparsifySpec("mvue", 0, "bf16", True, True), "cuda"),
                          inout_inputs=("colz",)),
               print_cuda(lower_sparsify(SparsifySpec("soft_threshold", 1, "bf16", True, True), "cuda")),
               print_cuda(lower_sparsify(SparsifySpec("top2", 1, "f16", True, True, dense=True), "cuda")),
               print_cuda(lower_sparsify(SparsifySpec("mvue", 0, "bf16"), "cuda", gather=True)),
               print_cuda(lower_sparsify(SparsifySpec("soft_threshold", 0, "f16", False, True), "cuda"),
                          inout_inputs=("colz",)),
               print_cuda(lower_sparse_gemm("f16", "cuda")),
               print_cuda(lower_sparse_gemm("bf16", "cuda")),
               print_cuda(lower_sparse_gemm("f16", "cuda", SMALL))]
    assert "colz" in sources[1].input_names and "colz" in sources[2].output_names
    results = nvcc_check(sources, archs=("sm_80", "sm_90"), jobs=2, cache_dir=tmp_path)
    failed = [r for r in results if not r.ok]
    assert not failed, "\n\n".join(f"{r.summary()}\n{r.log}" for r in failed)
    assert {(n, r.arch) for r in results for n in r.names} == {(s.name, a) for s in sources
                                                              for a in ("sm_80", "sm_90")}


# ----- 7. determinism -------------------------------------------------------------------------

ALL_SPECS = [SparsifySpec(m, a, d, r, s) for m in METHODS for a in AXES for d in DTYPES
             for r in (False, True) for s in (False, True)]


@pytest.mark.parametrize("spec", [SparsifySpec("mvue", 0, "bf16", True, True),
                                  SparsifySpec("soft_threshold", 1, "f16")], ids=lambda s: s.name)
def test_printing_is_deterministic(spec: SparsifySpec) -> None:
    """Lowering the same spec twice prints identical CUDA and Metal text (and the GEMM too)."""
    def cuda_text():
        return print_cuda(lower_sparsify(spec, "cuda")).full_source()

    def metal_text():
        m = print_metal(lower_sparsify(spec, "metal"))
        return m.header + "\n" + m.body

    assert cuda_text() == cuda_text()
    assert metal_text() == metal_text()
    assert print_cuda(lower_sparse_gemm(spec.dtype)).full_source() == print_cuda(lower_sparse_gemm(spec.dtype)).full_source()


def test_kernel_names_are_distinct() -> None:
    """Every distinct spec (method x axis x dtype x relu2 x stats) gives a distinct kernel name,
    and the names are what the lowered kernels are called."""
    names = [s.name for s in ALL_SPECS] + [SparsifySpec("top2", 1, "f16", True, True, dense=True).name]
    assert len(set(names)) == len(ALL_SPECS) + 1 == 49
    for s in ALL_SPECS[::7]:
        assert lower_sparsify(s, "cuda").name == s.name == lower_sparsify(s, "metal").name
    assert lower_sparse_gemm("f16").name != lower_sparse_gemm("bf16").name


# ----- 8. MVUE seeds --------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
def test_mvue_seeds(target: str) -> None:
    """Different seeds give different selections, the same seed the same output, and the
    kernel equals the reference at the extreme seeds 0 and 2^32 - 1 (both axes)."""
    rng = _rng("mvue", target)
    x = rng.normal(size=(64, 128)).astype(np.float32) + 0.0
    x[x == 0] = 1.0
    for axis in AXES:
        spec = SparsifySpec("mvue", axis, "f16")
        kernel = lower_sparsify(spec, target)
        a = run_sparsify(kernel, spec, x, 1, run_kernel)
        a2 = run_sparsify(kernel, spec, x, 1, run_kernel)
        b = run_sparsify(kernel, spec, x, 2, run_kernel)
        assert np.array_equal(a.values, a2.values) and np.array_equal(a.meta, a2.meta)
        _, nib_a = a.layout.decode(a.values, a.meta, "f16")
        _, nib_b = b.layout.decode(b.values, b.meta, "f16")
        frac = (nib_a != nib_b).mean()
        assert frac > 0.2, f"seeds 1 and 2 differ in only {frac:.1%} of groups"
        for seed in (0, 2 ** 32 - 1):
            check_sparsify(spec, target, x, seed, run_kernel, kernel=kernel)


# ----- 9. errors -----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,field", [
    (dict(method="top3"), "method"), (dict(method="TOP2"), "method"),
    (dict(axis=2), "axis"), (dict(axis=-1), "axis"), (dict(axis=True), "axis"),
    (dict(dtype="f32"), "dtype"), (dict(dtype="float16"), "dtype"),
    (dict(n=1), "2:4"), (dict(m=8), "2:4"), (dict(n=4, m=8), "2:4"),
    (dict(relu2=1), "relu2"), (dict(stats="yes"), "stats"), (dict(dense=1), "dense"),
])
def test_spec_errors_name_the_field(kwargs: dict, field: str) -> None:
    """A bad SparsifySpec field raises SparsifyError naming it."""
    with pytest.raises(SparsifyError, match=field):
        SparsifySpec(**kwargs)


def test_layout_and_gemm_errors() -> None:
    """decode with wrong-sized arrays, B of the wrong length (or rank), an out-of-range seed
    and an empty matrix raise SparsifyError."""
    spec = SparsifySpec("top2", 1, "f16")
    x = activation_input(_rng("err"), (5, 40))
    out = run_sparsify(lower_sparsify(spec, "cuda"), spec, x, 0, run_kernel)
    lay = out.layout
    with pytest.raises(SparsifyError, match="value words"):
        lay.decode(out.values[:-1], out.meta, "f16")
    with pytest.raises(SparsifyError, match="metadata"):
        lay.decode(out.values, np.concatenate([out.meta, out.meta[:1]]), "f16")
    with pytest.raises(SparsifyError, match="metadata"):
        ActivationLayout("metal", 5, 40).decode(out.values, out.meta, "f16")    # cuda-sized
    gk = lower_sparse_gemm("f16")
    with pytest.raises(SparsifyError, match=r"\[40, N\]"):
        run_sparse_gemm(gk, out, np.ones((41, 8), np.float32), "f16", run_kernel)
    with pytest.raises(SparsifyError):
        run_sparse_gemm(gk, out, np.ones((39, 8), np.float32), "f16", run_kernel)
    with pytest.raises(SparsifyError):
        run_sparse_gemm(gk, out, np.ones(40, np.float32), "f16", run_kernel)
    with pytest.raises(SparsifyError, match="seed"):
        run_sparsify(lower_sparsify(spec, "cuda"), spec, x, 2 ** 32, run_kernel)
    with pytest.raises(SparsifyError):
        run_sparsify(lower_sparsify(spec, "cuda"), spec, np.zeros((0, 4), np.float32), 0, run_kernel)
    with pytest.raises(SparsifyError):
        ActivationLayout("cuda", 0, 4)


@pytest.mark.parametrize("method,axis", [("mvue", 0), ("soft_threshold", 1)])
def test_activation_kernels_round_trip_through_the_textual_ir(method: str, axis: int) -> None:
    """The sparsify and sparse-GEMM kernels print as IR text that parses back to the same
    text (so `--dump-ir` works for them like for the weight GEMMs)."""
    from marlin_dsl.ir.text import parse_kernel, print_kernel

    for kernel in (lower_sparsify(SparsifySpec(method, axis, relu2=True, stats=True), "cuda"),
                   lower_sparse_gemm("bf16", "cuda")):
        text = print_kernel(kernel)
        assert print_kernel(parse_kernel(text)) == text
