"""Issue 16: the weight-stream pipeline on Metal. The simdgroup 8x8 lane tables (from MLX's
BlockMMA) agree with the CPU harness's shim; the `metal_lane_stream` layout puts every code
where its lane reads it; the exact emitted .metal text runs on the CPU harness for every
format the stream takes (f16 and bf16, M = 1, 3, 65, 129, N and K tails, outputs NaN-poisoned)
against the float64 reference and bit for bit against the interpreter; the cost model shows
fewer bytes and instructions per weight than the first-generation Metal kernels for every
example format the stream takes; the formats it does not take are refused with a reason."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from functools import partial

import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl import METAL, DoubleBuffered, FusedDequant, Gemm, Schedule, StripedKParallel
from marlin_dsl.checks.format_check import sample_weights
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.cost.model import kernel_cost, storage_per_weight
from marlin_dsl.ir import GridDim
from marlin_dsl.ir.interpret import run_kernel
from marlin_dsl.kernel_args import gemm_buffers, read_output
from marlin_dsl.layouts.weight_stream import VECTOR_WORDS, stream_layout
from marlin_dsl.targets.metal.cpu_harness import compile_many, compile_metal, find_compiler
from marlin_dsl.machine.metal import STREAM_LAYOUT, simdgroup_lane_elements
from marlin_dsl.targets.metal.printer import MetalSource, print_metal
from marlin_dsl.targets.metal.runtime import RUNTIME

from lazy_builds import LazyBuilds

needs_gxx = pytest.mark.skipif(
    find_compiler() is None,
    reason="g++ is not installed: the Metal CPU harness compiles the emitted Metal as C++20 with it")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TOL = {"f16": 2e-3, "bf16": 1.6e-2}


def _example_formats() -> dict[str, md.Format]:
    out = {}
    for path in sorted(EXAMPLES.glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        out.update({v.name: v for v in vars(module).values() if isinstance(v, md.Format)})
    return out


EXAMPLE_FORMATS = _example_formats()
#: The example formats the weight stream takes on Metal (and on CUDA), and those it refuses:
#: int3 streams with spare bits and block patterns as dense values
#: (tests/test_metal_stream_widths.py); the N:M formats (2:4, 4:8 of pairs), which Metal's lanes
#: scatter themselves, in tests/test_metal_stream_sparse.py. No example format is refused now.
STREAMED = ["fp4_g128", "uint4_zp_g128", "int4_g64", "int4_two_level_g64", "fp4_two_level_g32",
            "int3_zp", "fp4_blocks_g128", "fp4",  # fp4: the built-in examples/fused_mlp.py uses
            "gguf_q4_k", "gguf_q6_k", "gptq_v1_4bit_g128", "awq_4bit_g128"]  # examples/checkpoint_formats.py
REFUSED: dict[str, str] = {}
BUILTIN = ["fp4", "int4", "uint4_zp", "nf4"]


def _format(name: str) -> md.Format:
    return EXAMPLE_FORMATS[name] if name in EXAMPLE_FORMATS else md.builtin_format(name)


# ----- the lane tables -------------------------------------------------------------------------

def test_lane_table_is_mlx_blockmma() -> None:
    """MLX's BlockMMA (steel/gemm/mma.h): qid = lane / 4, row = (qid & 4) + (lane / 2) % 4,
    col = (qid & 2) * 2 + (lane % 2) * 2; thread_elements() = (row, col), (row, col + 1).
    Every element of the 8x8 tile is held by exactly one lane."""
    rows, cols = simdgroup_lane_elements()
    for lane in range(32):
        qid = lane // 4
        r, c = (qid & 4) + (lane // 2) % 4, (qid & 2) * 2 + (lane % 2) * 2
        assert list(rows[lane]) == [r, r] and list(cols[lane]) == [c, c + 1]
    seen = np.zeros((8, 8), int)
    np.add.at(seen, (rows, cols), 1)
    assert (seen == 1).all()
    for role in "abc":
        r2, c2 = METAL.lane_elements(role, 8, 8)
        assert np.array_equal(r2, rows) and np.array_equal(c2, cols)


_OWNERSHIP_BODY = """
  uint lane = thread_index_in_simdgroup;
  simdgroup_matrix<float, 8, 8> m;
  simdgroup_load(m, x, 8, ulong2(0, 0), false);
  y[2 * lane] = m.thread_elements()[0];
  y[2 * lane + 1] = m.thread_elements()[1];
"""


@needs_gxx
def test_shim_owns_the_elements_the_lane_table_says() -> None:
    """The shim's simdgroup_load gives lane L the elements of the description's table: the
    harness checks kernels that build fragments from registers with the GPU's ownership."""
    src = MetalSource(name="ownership", header="#include <metal_stdlib>\nusing namespace metal;\n",
                      body=_OWNERSHIP_BODY, input_names=["x", "dims"], output_names=["y"],
                      dtypes={"x": "float", "dims": "uint32_t", "y": "float"}, threads=32,
                      grid=(GridDim(None, 1, 1), GridDim(None), GridDim(None)), scalar_names=["M"],
                      access={"x": "read", "dims": "read", "y": "write"})
    compiled = compile_many([src])[0]
    tile = np.arange(64, dtype=np.float32)  # element (r, c) holds 8 r + c
    out = compiled.run({"x": tile, "y": np.zeros(64, np.float32)}, {"M": 1})
    rows, cols = simdgroup_lane_elements()
    np.testing.assert_array_equal(out["y"].reshape(32, 2), 8 * rows + cols)


# ----- the layout -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["fp4", "int4"])
def test_every_code_lands_where_its_lane_reads_it(name: str) -> None:
    fmt = md.builtin_format(name)
    layout = stream_layout(fmt, METAL)
    assert (layout.tile_rows, layout.tile_cols, layout.tiles, layout.chunk) == (8, 8, 16, 128)
    assert layout.x_run == 16  # one activation K row per lane and tile: 16 per chunk
    ks, n = 256, 24
    codes = np.random.default_rng(0).integers(0, 16, size=(ks, n))
    words = layout.pack(codes).reshape(n // 8, ks // 128, 32, VECTOR_WORDS)
    perm = layout.k_perm if layout.k_perm is not None else np.arange(layout.chunk)
    positions = layout.bit_order.positions
    for nt in range(n // 8):
        for kv in range(ks // 128):
            for lane in range(32):
                for pair in range(16):  # one pair (2 K-adjacent codes of one row) per tile
                    word, slot = layout.pair_slot(pair)
                    w = int(words[nt, kv, lane, word])
                    got = [sum(((w >> (16 * h + p)) & 1) << i for i, p in enumerate(positions[slot]))
                           for h in (0, 1)]
                    k = kv * 128 + perm[8 * pair + layout.cols[lane]]
                    assert got == list(codes[k, nt * 8 + layout.rows[lane]])


# ----- kernels on the CPU harness and in the interpreter ---------------------------------------

def _cases() -> list[tuple[str, str, int]]:
    """(format, activation, tuned-for M): every streamed format in f16 at the small-M and the
    32-row schedule (run on more rows too: the stream's largest tile); bf16 at the small-M one."""
    out = [(name, "f16", m) for name in STREAMED + BUILTIN for m in (1, 32)]
    return out + [(name, "bf16", 1) for name in STREAMED + BUILTIN]


def _shapes(fmt: md.Format, m_tuned: int) -> list[tuple[int, int, int]]:
    """(M, N, K): M = 1, 3, 65, 129 (the 32-row schedule: 65, 129), N tails, and a K that is
    not a whole number of 128-position vectors where the scale group allows it."""
    g = fmt.scale.group_size
    unit = 128 if g == "K" else int(g)
    k_tail = 3 * unit if 128 % (3 * unit) else 5 * unit  # 96, 192 or 384 (g = 128: whole vectors)
    ms = (1, 3, 65, 129) if m_tuned == 1 else (65, 129)
    step = fmt.k_multiple  # a super-block (GGUF k-quants: 256) allows no shorter K
    return [(m, n, -(-k // step) * step) for m, n, k in zip(ms, (40, 136, 24, 8), (256, k_tail, 128, k_tail))]


def case_kernel(name: str, act: str, m: int):
    """A case's kernel as the harness runs it (tests/test_harness_coverage.py reads its ops)."""
    fmt = _format(name)
    return compile_gemm(Gemm(f"ms_{name}_{act}_{m}", fmt, RUNTIME.tuned_schedule(fmt, m), act), METAL).kernel


@pytest.fixture(scope="module")
def built():
    if find_compiler() is None:
        pytest.skip("g++ is not installed")
    def make(name: str, act: str, m: int) -> tuple:
        kernel = case_kernel(name, act, m)
        return kernel, compile_metal(print_metal(kernel))

    return LazyBuilds({case: partial(make, *case) for case in _cases()})  # each built on first use


@needs_gxx
@pytest.mark.sweep
@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c[0]}-{c[1]}-m{c[2]}")
def test_stream_kernel_on_harness_matches_reference(built, case) -> None:
    name, act, m_tuned = case
    kernel, compiled = built[case]
    fmt = _format(name)
    assert kernel.attrs["weight_layout"] == STREAM_LAYOUT and kernel.attrs["pipeline"] == "weight_stream"
    for seed, (m, n, k) in enumerate(_shapes(fmt, m_tuned)):
        rng = np.random.default_rng(seed)
        packed = md.pack(fmt, sample_weights(fmt, k, n, rng))
        bufs, scalars = gemm_buffers(kernel, packed, rng.standard_normal((m, k)))  # y: NaN
        ref = md.reference_matmul(bufs["x"].reshape(m, k).astype(np.float64), packed)
        out = compiled.run(bufs, scalars, seed=seed + 1)
        y = read_output(out, m, n).astype(np.float64)
        assert not np.isnan(y).any(), f"{name}/{act} M={m} N={n} K={k}: unwritten outputs"
        err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
        assert err < TOL[act], f"{name}/{act} M={m} N={n} K={k}: relative error {err:.2e}"
        if m <= 3:  # the interpreter runs the same IR: the same bits
            theirs = run_kernel(kernel, bufs, scalars)
            np.testing.assert_array_equal(out["y"], theirs["y"], err_msg=f"{name}/{act} M={m}")


# ----- the cost model: the bar of issue 16 ----------------------------------------------------

FIRST_GENERATION = {
    "double_buffered": Schedule("db_64x64x32", pipeline=DoubleBuffered()),
    "fused_dequant": Schedule("fused_64x64x32", pipeline=FusedDequant()),
    "striped": Schedule("striped_64x64x32_p4", pipeline=StripedKParallel(parallel=4, groups=16)),
}


def _cost(fmt: md.Format, schedule: Schedule):
    gemm = Gemm(f"c_{schedule.name}", fmt, schedule, "f16")
    return kernel_cost(compile_gemm(gemm, METAL).kernel, gemm, m=1)


@pytest.mark.parametrize("name", STREAMED)
def test_stream_costs_less_per_weight_than_first_generation(name: str) -> None:
    """At M = 1: fewer unique and requested device bytes per weight, and fewer lane
    instructions per weight in the K loop, than every first-generation Metal kernel."""
    fmt = EXAMPLE_FORMATS[name]
    new = _cost(fmt, RUNTIME.tuned_schedule(fmt, 1))
    assert new.shared_traffic == (0.0, 0.0) and not new.barriers_per_step, "weights never touch threadgroup memory"
    # the layout's spare bits and K padding (code widths that do not divide 16: int3 at 3.25
    # bits a code, +0.031 B/w) outweigh the activation bytes the stream's wider tile saves
    spare = new.unique_bytes["qweight"] - storage_per_weight(fmt)["qweight"]
    for kind, schedule in FIRST_GENERATION.items():
        old = _cost(fmt, schedule)
        assert new.unique_bytes_per_weight - spare < old.unique_bytes_per_weight, (kind, new.unique_bytes,
                                                                                  old.unique_bytes)
        assert new.requested_bytes_per_weight < old.requested_bytes_per_weight, (kind, new.requested_bytes,
                                                                                 old.requested_bytes)
        assert new.instructions_per_weight < old.instructions_per_weight / 2, (kind, new.per_weight, old.per_weight)


def test_every_example_format_has_a_metal_small_m_kernel() -> None:
    """Issue 16's bar: every example format gets a Metal weight-stream schedule at M = 1 (the
    dense ones here, the N:M ones in test_metal_stream_sparse.py, int3 and block patterns in
    test_metal_stream_widths.py, each with its cost against the first generation), and layers
    run it in the stream layout."""
    assert not REFUSED
    for name, fmt in EXAMPLE_FORMATS.items():
        assert RUNTIME.tuned_schedule(fmt, 1).pipeline.kind == "weight_stream", name
        assert RUNTIME.layer_layout(fmt, 256, 64) == STREAM_LAYOUT, name


def test_tuned_schedule_by_m() -> None:
    """The stream up to 32 rows (above: the multistage pipeline, tests/test_metal_multistage.py)."""
    fmt = md.builtin_format("fp4")
    tiles = {m: RUNTIME.tuned_schedule(fmt, m).tile_m for m in (1, 8, 9, 16, 17, 32)}
    assert tiles == {1: 8, 8: 8, 9: 16, 16: 16, 17: 32, 32: 32}
    assert RUNTIME.tuned_schedule(fmt, 33).pipeline.kind == "multistage"
    assert RUNTIME.layer_layout(fmt, 256, 64) == STREAM_LAYOUT


# ----- the launch through MLX (as far as Linux allows) ----------------------------------------

@needs_gxx
@pytest.mark.parametrize("name, m", [("fp4", 1), ("uint4_zp", 3), ("fp4", 24), ("fp4", 40), ("uint4_zp", 70)])
def test_quantized_linear_launches_the_stream_kernel(monkeypatch: pytest.MonkeyPatch, tmp_path,
                                                     name: str, m: int) -> None:
    """quantized_linear(backend="metal") on Linux: mx.fast.metal_kernel is a stand-in that
    checks what MLX would receive (the exact printed header and body of the tuned kernel on
    the stream layout: the weight stream, above 32 rows the multistage pipeline; its input and
    output names, the grid in threads and the threadgroup, the weights in metal_lane_stream)
    and runs that text on the CPU harness."""
    mx = pytest.importorskip("mlx.core")
    import marlin_dsl.layers.dispatch as dispatch
    import marlin_dsl.nn as mnn
    from marlin_dsl.kernel_args import physical_arrays
    from marlin_dsl.targets.metal.cpu_harness import compile_metal
    from marlin_dsl.targets.metal.runtime import metal_launcher

    monkeypatch.setenv("MARLIN_DSL_CACHE", str(tmp_path))
    monkeypatch.setattr(mnn, "_metal_available", lambda: True)
    metal_launcher.cache_clear()
    dispatch.dispatch_for.cache_clear()
    fmt = md.builtin_format(name)
    k, n = 256, 136
    rng = np.random.default_rng(5)
    packed = md.pack(fmt, sample_weights(fmt, k, n, rng))
    schedule = RUNTIME.tuned_schedule(fmt, m, k, n)
    gemm_name = None
    launches = []

    def fake_metal_kernel(name, input_names, output_names, source, header):
        nonlocal gemm_name
        gemm_name = name
        src = print_metal(compile_gemm(Gemm(name, fmt, schedule, "f16"), METAL).kernel)
        assert (source, header) == (src.body, src.header)
        assert list(input_names) == ["x", "qweight", *[b for b in src.input_names if b not in ("x", "qweight")]]
        assert list(output_names) == ["y"]
        cpu = compile_metal(src)

        def launch(inputs, grid, threadgroup, output_shapes, output_dtypes, init_value=None):
            buffers = {nm: np.array(a).ravel() for nm, a in zip(input_names, inputs)}
            want = physical_arrays({"weight_layout": STREAM_LAYOUT, "target": "metal"}, packed)
            for nm, array in want.items():  # the layer holds Metal's stream layout
                np.testing.assert_array_equal(buffers[nm], np.ascontiguousarray(array).ravel(), err_msg=nm)
            dims = [int(v) for v in buffers.pop("dims")]
            launches.append((dims, grid, threadgroup, init_value))
            for nm, shape in zip(output_names, output_shapes):
                buffers[nm] = np.full(int(np.prod(shape)), np.nan, np.float16)
            out = cpu.run(buffers, dict(zip(("M", "N", "K"), dims)), (grid[0] // threadgroup[0], grid[1], grid[2]))
            return [mx.array(out[nm]).reshape(shape) for nm, shape in zip(output_names, output_shapes)]
        return launch

    monkeypatch.setattr(mx.fast, "metal_kernel", fake_metal_kernel)
    x = rng.standard_normal((m, k)).astype(np.float16)
    from marlin_dsl.nn import quantized_linear

    y = quantized_linear(mx.array(x), packed, backend="metal")
    expected = md.reference_matmul(x.astype(np.float64), packed)
    rel = np.linalg.norm(np.array(y).astype(np.float64) - expected) / np.linalg.norm(expected)
    assert y.shape == (m, n) and rel < 2e-3
    threads = schedule.threads(METAL)
    assert schedule.pipeline.kind == ("multistage" if m > 32 else "weight_stream")
    assert launches == [([m, n, k], (-(-n // schedule.tile_n) * threads, -(-m // schedule.tile_m), 1),
                         (threads, 1, 1), None)]
    assert schedule.name in gemm_name
    # MarlinLinear holds the weight in Metal's stream layout and launches the same kernel
    layer = mnn.MarlinLinear.from_packed(packed, backend="metal")
    assert layer.layout == STREAM_LAYOUT
    launches.clear()
    y2 = layer(mx.array(x))
    assert np.array_equal(np.array(y2), np.array(y)) and len(launches) == 1
    back = layer.to_packed()  # the linear layout again, exactly
    for nm, array in packed.arrays.items():
        np.testing.assert_array_equal(back.arrays[nm], array, err_msg=nm)
    manifests = list(tmp_path.rglob("manifest.json"))
    assert manifests and '"weight_layout": "metal_lane_stream"' in manifests[0].read_text()
    dispatch.dispatch_for.cache_clear()
    metal_launcher.cache_clear()
