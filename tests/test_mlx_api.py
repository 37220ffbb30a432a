"""The MLX-facing API: `dequantize_mx` against the float64 reference for every built-in and
example format, `quantized_linear` on MLX's CPU device against `reference_matmul`,
`MarlinLinear` (from_linear, from_quantized_linear, bias, freezing, weights on disk), argument
errors and backend selection.

Tolerances of the matmul are stated relative to sum_k |x_mk| |W_kn| (computed in float64 from
the *dequantised* weight): floating-point error of a dot product scales with its terms, not
with the result, which may cancel to near zero.
"""
from __future__ import annotations

import runpy
from math import lcm
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

import marlin_dsl as md
from marlin_dsl.errors import MarlinDSLError, ShapeError, ValueRangeError
from marlin_dsl.formats import PER_COLUMN
from marlin_dsl.layers.mlx_ops import dequantize_mx, packed_to_mx
from marlin_dsl.nn import (MarlinLinear, pack_fp4_weights, quantized_linear,
                           select_backend)
from marlin_dsl.checks.format_check import sample_weights

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# Formats the MLX path must derive without code of its own: the built-ins, the two example
# spec files, and a few more descriptions that stress the derivation (per-column scales,
# 16-bit words with straddling 5-bit codes, 3:8 with 9-bit metadata fields straddling words).
EXTRA_FORMATS = {
    "int3_zp": runpy.run_path(str(EXAMPLES / "int3_zero_point.py"))["int3_zp"],
    "nf4_pairwise_4of8": runpy.run_path(str(EXAMPLES / "nf4_pairwise_4of8.py"))["nf4_pairwise_4of8"],
    "int4_per_column": md.builtin_format("int4", PER_COLUMN),
    "int5_words16": md.Format("int5_words16", md.IntEncoding(5, offset=16), md.GroupScale(32),
                              packing=md.Packing(word_bits=16)),
    "fp4_3of8": md.Format("fp4_3of8", md.FloatEncoding(4, exp_bits=2, man_bits=1, bias=1),
                          md.GroupScale(256), sparsity=md.NMSparsity(3, 8)),
}
FORMATS = {name: md.builtin_format(name) for name in md.BUILTIN_FORMATS} | EXTRA_FORMATS
DENSE_BUILTINS = ["fp4", "int4", "uint4_zp", "nf4"]

#: Relative tolerances of quantized_linear against the float64 reference (see module doc).
#: f16/bf16: the dequantised weight is rounded once to the activation type (2**-11 / 2**-8)
#: and so is the output; f32: accumulation error over K <= 384 terms.
RTOL = {mx.float16: 2e-3, mx.bfloat16: 1.6e-2, mx.float32: 1e-5}


def k_unit(fmt: md.Format) -> int:
    """The smallest K that fits the format: whole packed word groups and whole scale groups."""
    g = fmt.scale.group_size
    return fmt.k_granule if g == PER_COLUMN else lcm(fmt.k_granule, int(g))


def packed_random(fmt: md.Format, k: int, n: int, seed: int) -> md.PackedWeights:
    rng = np.random.default_rng(seed)
    return md.pack(fmt, sample_weights(fmt, k, n, rng))


def mx_dequant(packed: md.PackedWeights) -> np.ndarray:
    return np.array(dequantize_mx(packed.format, packed.shape, packed_to_mx(packed.arrays)))


# ----- dequantize_mx ----------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("groups, n", [(1, 1), (2, 37), (3, 70)])
def test_dequantize_mx_matches_reference(name: str, groups: int, n: int) -> None:
    fmt = FORMATS[name]
    k = k_unit(fmt) * groups
    packed = packed_random(fmt, k, n, seed=groups * 100 + n)
    ref = md.dequantize(packed)
    got = mx_dequant(packed)
    assert got.dtype == np.float32 and got.shape == (k, n)
    if fmt.element.kind == "table":
        # Table entry rounded to f32, then the product rounded: within one f32 ulp.
        ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
        assert np.all(np.abs(got.astype(np.float64) - ref) <= ulp)
    else:
        # Float and integer codes: every step is exact, so got is ref rounded to float32.
        np.testing.assert_array_equal(got, ref.astype(np.float32))
    if fmt.sparsity is not None and isinstance(fmt.sparsity, md.NMSparsity):
        assert np.all(got[ref == 0.0] == 0.0)  # pruned positions are 0.0, not table[0]


def test_dequantize_mx_rejects_wrong_arrays() -> None:
    packed = packed_random(md.builtin_format("uint4_zp"), 128, 8, seed=0)
    arrays = packed_to_mx(packed.arrays)
    with pytest.raises(ShapeError, match="zeros"):
        dequantize_mx(packed.format, packed.shape, {k: v for k, v in arrays.items() if k != "zeros"})
    with pytest.raises(ShapeError, match=r"\['scales'\].*dtype"):
        dequantize_mx(packed.format, packed.shape, arrays | {"scales": arrays["scales"].astype(mx.float32)})
    with pytest.raises(ShapeError, match=r"\['qweight'\].*shape"):
        dequantize_mx(packed.format, (256, 8), arrays)


# ----- quantized_linear -------------------------------------------------------------------

def _check_against_reference(y: mx.array, x: mx.array, packed: md.PackedWeights,
                             rtol: float, bias: np.ndarray | None = None) -> None:
    """y == x @ dequantize(packed) (+ bias) within rtol * (|x| @ |W|), x as passed (rounded)."""
    x64 = np.array(x.astype(mx.float32)).astype(np.float64)
    k, n = packed.shape
    flat = x64.reshape(-1, k)
    ref = md.reference_matmul(flat, packed)
    scale = np.abs(flat) @ np.abs(md.dequantize(packed))
    if bias is not None:
        ref = ref + bias
        scale = scale + np.abs(bias)
    got = np.array(y.astype(mx.float32)).astype(np.float64).reshape(-1, n)
    assert np.all(np.abs(got - ref) <= rtol * scale + 1e-30), np.max(np.abs(got - ref) / (scale + 1e-30))


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32], ids=str)
def test_quantized_linear_matches_reference(name: str, dtype: mx.Dtype) -> None:
    fmt = FORMATS[name]
    k, n = k_unit(fmt) * 2, 37  # an N tail of every tile size
    packed = packed_random(fmt, k, n, seed=7)
    for m in (1, 3, 65):
        x = mx.array(np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)).astype(dtype)
        y = quantized_linear(x, packed)
        assert y.dtype == dtype and y.shape == (m, n)
        _check_against_reference(y, x, packed, RTOL[dtype])


@pytest.mark.parametrize("dtype", [mx.float16, mx.float32], ids=str)
def test_quantized_linear_batched_input(dtype: mx.Dtype) -> None:
    packed = pack_fp4_weights(np.random.default_rng(0).standard_normal((256, 48)))
    x = mx.array(np.random.default_rng(1).standard_normal((2, 5, 256)).astype(np.float32)).astype(dtype)
    y = quantized_linear(x, packed)
    assert y.shape == (2, 5, 48) and y.dtype == dtype
    _check_against_reference(y, x, packed, RTOL[dtype])
    # 1-D x (a single token) works as in mlx.nn.Linear.
    assert quantized_linear(x[0, 0], packed).shape == (48,)


def test_quantized_linear_bias() -> None:
    packed = pack_fp4_weights(np.random.default_rng(0).standard_normal((128, 24)))
    bias = np.random.default_rng(1).standard_normal(24).astype(np.float32)
    for dtype in (mx.float16, mx.float32):
        x = mx.array(np.random.default_rng(2).standard_normal((3, 128)).astype(np.float32)).astype(dtype)
        y = quantized_linear(x, packed, bias=mx.array(bias))
        assert y.dtype == dtype  # an f32 bias does not promote an f16 result
        rounded_bias = np.array(mx.array(bias).astype(dtype).astype(mx.float32)).astype(np.float64)
        _check_against_reference(y, x, packed, RTOL[dtype], rounded_bias)
    with pytest.raises(ShapeError, match="bias"):
        quantized_linear(x, packed, bias=mx.zeros((23,)))
    with pytest.raises(ValueRangeError, match=r"bias: non-finite .* index \(4,\)"):
        quantized_linear(x, packed, bias=mx.array(np.where(np.arange(24) == 4, np.nan, 0.0)))


def test_quantized_linear_bad_input() -> None:
    packed = pack_fp4_weights(np.random.default_rng(0).standard_normal((128, 16)))
    with pytest.raises(ShapeError, match=r"x: has K=120"):
        quantized_linear(mx.zeros((2, 120)), packed)
    with pytest.raises(ShapeError, match=r"x: expected rank >= 1"):
        quantized_linear(mx.array(1.0), packed)
    with pytest.raises(ShapeError, match=r"x: expected dtype"):
        quantized_linear(mx.zeros((2, 128), dtype=mx.int32), packed)
    with pytest.raises(ShapeError, match=r"x: expected an mlx.core.array"):
        quantized_linear(np.zeros((2, 128), dtype=np.float32), packed)  # type: ignore[arg-type]
    x = np.zeros((2, 128), dtype=np.float32)
    x[1, 5] = np.nan
    with pytest.raises(ValueRangeError, match=r"x: non-finite value nan at index \(1, 5\)"):
        quantized_linear(mx.array(x), packed)
    with pytest.raises(ShapeError, match="packed"):
        quantized_linear(mx.zeros((2, 128)), {"qweight": None})  # type: ignore[arg-type]
    for error in (ShapeError, ValueRangeError, MarlinDSLError):
        assert issubclass(error, ValueError)


# ----- backends ---------------------------------------------------------------------------

def test_backend_selection_on_this_machine() -> None:
    if mx.default_device().type == mx.DeviceType.cpu:
        assert select_backend("auto") == "mlx"
    with pytest.raises(MarlinDSLError, match="backend: expected one of"):
        select_backend("opencl")


@pytest.mark.skipif(mx.metal.is_available(), reason="Metal is available here")
def test_explicit_metal_backend_is_a_clear_error() -> None:
    packed = pack_fp4_weights(np.random.default_rng(0).standard_normal((128, 16)))
    with pytest.raises(MarlinDSLError, match="the Metal backend needs an Apple GPU"):
        quantized_linear(mx.zeros((1, 128)), packed, backend="metal")
    with pytest.raises(MarlinDSLError, match="the Metal backend needs"):  # at construction
        MarlinLinear(128, 16, backend="metal")


@pytest.mark.skipif(bool(getattr(mx, "cuda", None) and mx.cuda.is_available()),
                    reason="CUDA is available here")
def test_explicit_cuda_backend_is_a_clear_error() -> None:
    packed = pack_fp4_weights(np.random.default_rng(0).standard_normal((128, 16)))
    with pytest.raises(MarlinDSLError, match="the CUDA backend needs an NVIDIA GPU"):
        quantized_linear(mx.zeros((1, 128)), packed, backend="cuda")


def test_unknown_backend_is_a_clear_error() -> None:
    with pytest.raises(MarlinDSLError, match="backend: expected one of"):
        select_backend("tpu")


@pytest.mark.parametrize("name", ["fp4", "int4_2of4", "fp4_blockpattern"])
def test_cuda_backend_launches_the_compiled_kernel(fake_cuda, name: str) -> None:
    """quantized_linear and MarlinLinear on backend "cuda": the weight in the CUDA layout made
    on the device (2:4: fragment order and mma.sp metadata; block patterns: their dense values
    in fragment order, the patterns as packed), the schedule chosen by row count, against the
    float64 reference."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((256, 40))
    packed = md.pack(md.builtin_format(name), w)
    for m in (1, 12, 70):  # stream_m8, stream_m16, multistage_small
        x = rng.standard_normal((m, 256)).astype(np.float16)
        y = quantized_linear(mx.array(x), packed, backend="cuda")
        expected = md.reference_matmul(x.astype(np.float64), packed)
        rel = np.linalg.norm(np.array(y).astype(np.float64) - expected) / np.linalg.norm(expected)
        assert y.shape == (m, 40) and y.dtype == mx.float16 and rel < 2e-3
    assert MarlinLinear.from_packed(packed, backend="cuda").layout == "lane_stream"
    schedules = {launch["name"].split("_f16_")[1].rsplit("_", 1)[0] for launch in fake_cuda}
    assert len(schedules) == 3, schedules


@pytest.mark.parametrize("bias", [False, True])
def test_fused_parts_come_out_of_one_kernel_at_decode(fake_cuda, bias: bool) -> None:
    """A fused q/k/v group on backend "cuda": at the decode's row counts (the weight stream)
    one launch whose kernel writes the three parts as its own outputs (no split after it);
    from 70 rows (multistage) one y, split; with a bias always y + bias, split. Every part
    against the float64 reference of its own columns."""
    from marlin_dsl.models.fuse import FusedLinear, LinearSlice

    rng = np.random.default_rng(11)
    widths = (64, 24, 24)
    w = rng.standard_normal((256, sum(widths)))
    packed = md.pack(md.builtin_format("fp4"), w)
    b = mx.array(rng.standard_normal(sum(widths)).astype(np.float32)) if bias else None
    group = FusedLinear(MarlinLinear.from_packed(packed, b, backend="cuda"), widths)
    parts = [LinearSlice(group, i) for i in range(3)]
    starts = np.cumsum((0,) + widths)
    for m in (1, 12, 70):
        fake_cuda.clear()
        x = rng.standard_normal((m, 256)).astype(np.float16)
        got = [np.array(p(mx.array(x))).astype(np.float64) for p in parts]  # x: 3 array objects...
        assert len(fake_cuda) == 3  # ... so 3 launches; one x for all parts below
        xa = mx.array(x)
        fake_cuda.clear()
        got = [np.array(p(xa)).astype(np.float64) for p in parts]
        assert len(fake_cuda) == 1
        names = [launch["name"] for launch in fake_cuda]
        assert ("_parts64x24x24" in names[0]) == (m <= 16 and not bias), names
        full = md.reference_matmul(x.astype(np.float64), packed) + (np.array(b) if bias else 0)
        for i, part in enumerate(got):
            want = full[:, starts[i]:starts[i + 1]]
            assert part.shape == want.shape
            assert np.linalg.norm(part - want) / np.linalg.norm(want) < 2e-3, (m, i)


def test_part_widths_are_checked() -> None:
    layer = MarlinLinear.from_linear(nn.Linear(256, 40), "fp4", backend="mlx")
    for bad in ((40,), (30, 9), (41, -1), (20, 0, 20), ("20", 20), (20.0, 20), 40, None):
        with pytest.raises(ShapeError, match="widths: expected two or more positive part widths"):
            layer.split_outputs(bad)
    with pytest.raises(ShapeError, match="call_parts before split_outputs"):
        layer.call_parts(mx.zeros((1, 256)))


def test_second_call_does_no_host_work(fake_cuda, monkeypatch: pytest.MonkeyPatch) -> None:
    """A spy: after the first call of a layer (which binds the launch), calls pass the layer's
    own device arrays to the kernel and run no validation, layout conversion or packing."""
    import importlib

    import marlin_dsl.layers.arguments as arguments
    import marlin_dsl.layers.weights as weights
    import marlin_dsl.layouts.weight_stream as stream_layout
    import marlin_dsl.nn as mnn

    host_validate = importlib.import_module("marlin_dsl.formats.validate")  # the package exports the function
    layer = MarlinLinear.from_linear(nn.Linear(256, 40), "fp4_2of4", backend="cuda")
    x = mx.random.normal((3, 256), key=mx.random.key(0)).astype(mx.float16)
    first = np.array(layer(x))
    calls: list[str] = []

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            calls.append(name)
            return fn(*args, **kwargs)
        return wrapped

    for module, attr in ((mnn, "validate_mx"), (mnn, "to_layout"), (mnn, "pack_mx"), (arguments, "validate"),
                         (arguments, "validate_mx"), (arguments, "to_layout"),
                         (weights, "to_layout"), (host_validate, "validate"), (stream_layout, "stream_arrays"),
                         (mnn, "packed_to_numpy"), (arguments, "packed_to_mx")):
        monkeypatch.setattr(module, attr, spy(attr, getattr(module, attr)))
    fake_cuda.clear()
    for _ in range(3):
        np.testing.assert_array_equal(np.array(layer(x)), first)
    assert calls == []
    assert len(fake_cuda) == 3
    for launch in fake_cuda:
        for name in ("qweight", "scales", "meta"):
            assert launch["inputs"][name] is layer[name]  # the held arrays themselves


def test_replaced_weights_are_checked_once(fake_cuda) -> None:
    """update()/load_weights() replacing arrays (here in the linear layout): the next call
    validates and converts them once; an invalid array raises, naming it and its index."""
    rng = np.random.default_rng(8)
    layer = MarlinLinear.from_linear(nn.Linear(256, 40), "fp4_2of4", backend="cuda")
    packed = md.pack(md.builtin_format("fp4_2of4"), rng.standard_normal((256, 40)))
    layer.update({name: mx.array(a) for name, a in packed.arrays.items()})
    x = rng.standard_normal((2, 256)).astype(np.float16)
    y = np.array(layer(mx.array(x))).astype(np.float64)
    expected = md.reference_matmul(x.astype(np.float64), packed) + np.array(layer["bias"])
    assert np.linalg.norm(y - expected) / np.linalg.norm(expected) < 2e-3
    assert layer["qweight"].ndim == 1  # converted to the CUDA layout
    bad = dict(packed.arrays)
    bad["meta"] = bad["meta"].copy()
    bad["meta"][2, 7] = 0xFFFFFFFF
    layer.update({"meta": mx.array(bad["meta"]), "qweight": mx.array(bad["qweight"])})
    with pytest.raises(ValueRangeError, match=r"meta\[2, 7\] field 0: invalid 2:4 metadata value 15"):
        layer(mx.array(x))


@pytest.fixture
def metal_on_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """The Metal layer path on Linux: the runtime believes in Metal, generated launchers go to
    a fresh cache, no launcher or dispatch is left over from another test (and none is left
    behind); skipped without a C++ compiler for the CPU harness that runs the Metal text."""
    import marlin_dsl.layers.dispatch as dispatch
    import marlin_dsl.nn as mnn
    from marlin_dsl.targets.metal.cpu_harness import find_compiler
    from marlin_dsl.targets.metal.runtime import metal_launcher

    if find_compiler() is None:
        pytest.skip("no C++ compiler to run the Metal text on the CPU")
    monkeypatch.setenv("MARLIN_DSL_CACHE", str(tmp_path))
    monkeypatch.setattr(mnn, "_metal_available", lambda: True)
    metal_launcher.cache_clear()
    dispatch.dispatch_for.cache_clear()
    yield tmp_path
    metal_launcher.cache_clear()
    dispatch.dispatch_for.cache_clear()


def test_metal_backend_runs_the_generated_kernel(metal_on_cpu, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Metal path of quantized_linear, on Linux: mx.fast.metal_kernel is replaced by a
    stand-in that runs the text it is given (the kernel compiled on first use and written to
    the cache with its launcher) on the CPU harness."""
    from marlin_dsl.targets.metal.printer import print_metal
    from marlin_dsl.targets.metal.runtime import default_schedule, stream_schedule
    from marlin_dsl.compiler import compile_gemm
    from marlin_dsl.targets.metal.cpu_harness import compile_metal
    from marlin_dsl.schedule import Gemm
    from marlin_dsl.machine import METAL

    rng = np.random.default_rng(11)
    packed = md.pack_fp4_2of4_weights(rng.standard_normal((128, 40)))
    fmt = packed.format
    # the runtime's pick for 6 rows: the weight stream (2:4 scattered by the lanes, issue 16)
    schedule = stream_schedule(fmt, 6, 128, 40) or default_schedule(fmt)

    def fake_metal_kernel(name, input_names, output_names, source, header):
        src = print_metal(compile_gemm(Gemm(name, fmt, schedule, "f16"), METAL).kernel)
        assert (source, header) == (src.body, src.header)
        cpu = compile_metal(src)

        def launch(inputs, grid, threadgroup, output_shapes, output_dtypes, init_value=None):
            buffers = {n: np.array(a).ravel() for n, a in zip(input_names, inputs)}
            scalars = dict(zip(("M", "N", "K"), (int(v) for v in buffers.pop("dims"))))
            for n, shape in zip(output_names, output_shapes):
                buffers[n] = np.zeros(int(np.prod(shape)), np.float16)
            out = cpu.run(buffers, scalars, (grid[0] // threadgroup[0], grid[1], grid[2]))
            return [mx.array(out[n]).reshape(shape) for n, shape in zip(output_names, output_shapes)]
        return launch

    monkeypatch.setattr(mx.fast, "metal_kernel", fake_metal_kernel)
    x = rng.standard_normal((2, 3, 128)).astype(np.float16)
    y = quantized_linear(mx.array(x), packed, backend="metal")
    expected = md.reference_matmul(x.reshape(6, 128).astype(np.float64), packed).reshape(2, 3, 40)
    assert y.shape == (2, 3, 40) and y.dtype == mx.float16
    rel = np.linalg.norm(np.array(y).astype(np.float64) - expected) / np.linalg.norm(expected)
    assert rel < 2e-3
    assert list(metal_on_cpu.rglob("manifest.json")), "the kernel is written to the cache"


def test_metal_fused_parts_come_out_of_the_shipped_kernel(metal_on_cpu, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fused group on backend "metal": at the weight stream's row counts one launch of the
    generated launcher's kernel writing the parts (y0, y1, y2), above them one y, split; each
    part against the float64 reference. mx.fast.metal_kernel is a stand-in that checks the text
    it is given and runs it on the Metal CPU harness (tests/metal_standin.py)."""
    import sys

    from marlin_dsl.compiler import compile_gemm
    from marlin_dsl.models.fuse import FusedLinear, LinearSlice
    from marlin_dsl.pipelines import splits_outputs
    from marlin_dsl.schedule import Gemm
    from marlin_dsl.machine import METAL
    from marlin_dsl.targets.metal.printer import print_metal
    from marlin_dsl.targets.metal.runtime import metal_launcher, stream_schedule

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from metal_standin import MetalStandIn

    rng = np.random.default_rng(12)
    widths, k = (32, 8, 16), 128
    fmt = md.builtin_format("fp4")
    packed = md.pack(fmt, rng.standard_normal((k, sum(widths))))
    kernels = {}  # the generated launchers' kernel names -> the printed text they must hand MLX
    for m, split in ((3, widths), (64, ())):
        sched = stream_schedule(fmt, m, k, sum(widths))
        assert splits_outputs(sched.pipeline) == bool(split)  # the weight stream at 3 rows, not at 64
        name = metal_launcher(fmt, "f16", sched, split).NAME
        kernels[name] = print_metal(compile_gemm(Gemm(name, fmt, sched, "f16", split), METAL).kernel)
    standin = MetalStandIn(kernels.__getitem__)
    monkeypatch.setattr(mx.fast, "metal_kernel", standin)
    group = FusedLinear(MarlinLinear.from_packed(packed, backend="metal"), widths)
    parts = [LinearSlice(group, i) for i in range(3)]
    starts = np.cumsum((0,) + widths)
    for m, expect_parts in ((3, True), (64, False)):
        x = rng.standard_normal((m, k)).astype(np.float16)
        xa = mx.array(x)
        before = len(standin.launches)
        got = [np.array(p(xa)).astype(np.float64) for p in parts]
        launched = standin.launches[before:]
        assert len(launched) == 1
        assert (len(launched[0]["shapes"]) == 3) == expect_parts, launched[0]["shapes"]
        want = md.reference_matmul(x.astype(np.float64), packed)
        for i, part in enumerate(got):
            ref = want[:, starts[i]:starts[i + 1]]
            assert np.linalg.norm(part - ref) / np.linalg.norm(ref) < 2e-3, (m, i)


# ----- MarlinLinear -----------------------------------------------------------------------

def _half_step_bound(packed: md.PackedWeights, w: np.ndarray) -> np.ndarray:
    """Per element, half the gap between the two representable values around w: the largest
    error of round-to-nearest into the format (with its scales and zero points)."""
    fmt = packed.format
    k, n = packed.shape
    g = fmt.group_size_for(k)
    s = np.repeat(packed["scales"].astype(np.float64), g, axis=0)
    z = (np.repeat(packed["zeros"].astype(np.float64), g, axis=0)
         if fmt.zero_point is not None else 0.0)
    table = np.unique(fmt.element.table())
    u = np.clip(w / s + z, table[0], table[-1])  # w in table units
    hi = np.clip(np.searchsorted(table, u), 1, len(table) - 1)
    return 0.5 * (table[hi] - table[hi - 1]) * np.abs(s) * (1 + 1e-12)


@pytest.mark.parametrize("name", DENSE_BUILTINS + ["fp4_2of4"])
def test_from_linear_round_trip(name: str) -> None:
    k, n = 256, 40
    linear = nn.Linear(k, n)
    layer = MarlinLinear.from_linear(linear, name)
    packed = layer.to_packed()
    assert packed.format == md.builtin_format(name) and packed.shape == (k, n)
    md.validate(packed)
    w = np.array(linear.weight).astype(np.float64).T  # [N, K] -> [K, N]
    w_deq = md.dequantize(packed)
    bound = _half_step_bound(packed, w)
    if packed.format.sparsity is None:
        assert np.all(np.abs(w_deq - w) <= bound)
    else:  # kept positions round to nearest; pruned ones are 0.0
        unpacked = md.unpack(packed)
        kept = unpacked.keep
        assert np.all(np.abs(w_deq - w)[kept] <= bound[kept]) and np.all(w_deq[~kept] == 0.0)
    # The output error is what the weight error implies, plus f32 rounding.
    x = mx.random.normal((3, k), key=mx.random.key(0))
    x64 = np.array(x).astype(np.float64)
    bias = np.array(linear.bias).astype(np.float64)
    got = np.array(layer(x)).astype(np.float64)
    exact = x64 @ w + bias
    allowed = np.abs(x64) @ np.abs(w_deq - w) + RTOL[mx.float32] * (np.abs(x64) @ np.abs(w_deq) + np.abs(bias))
    assert np.all(np.abs(got - exact) <= allowed + 1e-12)
    # And MarlinLinear equals the functional form on its own packed weight.
    np.testing.assert_array_equal(np.array(layer(x)), np.array(quantized_linear(x, packed, mx.array(bias, dtype=mx.float32))))


def test_from_linear_options_and_errors() -> None:
    linear = nn.Linear(128, 8, bias=False)
    layer = MarlinLinear.from_linear(linear, "nf4", group_size=32)
    assert "bias" not in layer and layer.format.scale.group_size == 32
    custom = EXTRA_FORMATS["int3_zp"]
    assert MarlinLinear.from_linear(nn.Linear(64, 8), custom).format is custom
    with pytest.raises(MarlinDSLError, match="group_size"):
        MarlinLinear.from_linear(linear, custom, group_size=64)
    with pytest.raises(MarlinDSLError, match="format"):
        MarlinLinear.from_linear(linear, "fp5")
    with pytest.raises(ShapeError, match="linear.weight"):
        MarlinLinear.from_linear(nn.Linear(100, 8), "fp4")
    with pytest.raises(ShapeError, match="from_quantized_linear"):
        MarlinLinear.from_linear(nn.QuantizedLinear(128, 8), "fp4")  # type: ignore[arg-type]
    # bfloat16 models convert exactly to float32 before packing.
    bf = nn.Linear(128, 8)
    bf.set_dtype(mx.bfloat16)
    assert MarlinLinear.from_linear(bf).to_packed().shape == (128, 8)


def test_marlin_linear_module_behaviour(tmp_path: Path) -> None:
    layer = MarlinLinear(256, 24, format="uint4_zp", group_size=64)
    assert sorted(k for k, _ in tree_flatten(layer.parameters())) == ["bias", "qweight", "scales", "zeros"]
    assert tree_flatten(layer.trainable_parameters()) == []  # frozen, like QuantizedLinear
    assert layer["qweight"].dtype == mx.uint32 and layer["zeros"].dtype == mx.uint8
    x = mx.random.normal((4, 256), key=mx.random.key(1))
    y = layer(x)
    assert y.shape == (4, 24) and y.dtype == mx.float32
    with pytest.raises(ShapeError, match="x: has K=128"):
        layer(mx.zeros((1, 128)))
    # Weights round-trip through MLX's own file formats like any module's.
    path = str(tmp_path / "layer.safetensors")
    layer.save_weights(path)
    other = MarlinLinear(256, 24, format="uint4_zp", group_size=64)
    other.load_weights(path)
    np.testing.assert_array_equal(np.array(other(x)), np.array(y))
    # Gradients flow to the input through a frozen layer.
    grad = mx.grad(lambda v: layer(v).sum())(x)
    assert grad.shape == x.shape
    with pytest.raises(ShapeError, match="input_dims"):
        MarlinLinear(100, 8)
    # A model built from MarlinLinear runs (on whatever device MLX defaults to).
    model = nn.Sequential(MarlinLinear(256, 64, format="nf4"), nn.ReLU(), MarlinLinear(64, 8, format="int4", group_size=64))
    assert model(x.astype(mx.float16)).dtype == mx.float16


def test_from_packed_validates() -> None:
    packed = md.pack_fp4_2of4_weights(np.random.default_rng(0).standard_normal((128, 8)))
    packed.arrays["meta"] = packed.arrays["meta"].copy()
    packed.arrays["meta"][0, 0] = 0  # nibble 0: position 0 kept twice
    with pytest.raises(ValueRangeError, match=r"meta\[0, 0\]"):
        MarlinLinear.from_packed(packed)
    good = md.pack_int4_weights(np.random.default_rng(0).standard_normal((128, 8)))
    with pytest.raises(ShapeError, match="bias"):
        MarlinLinear.from_packed(good, np.zeros(8, dtype=np.float32))  # type: ignore[arg-type]
    layer = MarlinLinear.from_packed(good, mx.ones((8,)))
    assert tree_flatten(layer.trainable_parameters()) == []
    for name, array in layer.to_packed().arrays.items():
        np.testing.assert_array_equal(array, good[name])


# ----- from_quantized_linear (more in test_mlx_interop.py) -------------------------------

@pytest.mark.parametrize("mode, bits, group", [("affine", 4, 64), ("affine", 3, 32), ("mxfp4", 4, 32)])
def test_from_quantized_linear_loads_every_mode(mode: str, bits: int, group: int) -> None:
    ql = nn.QuantizedLinear.from_linear(nn.Linear(256, 20), group_size=group, bits=bits, mode=mode)
    layer = MarlinLinear.from_quantized_linear(ql)
    mlx_w = np.array(mx.dequantize(ql["weight"], ql["scales"], ql.get("biases"), group, bits, mode,
                                   dtype=mx.float32))  # [N, K]
    np.testing.assert_array_equal(mx_dequant(layer.to_packed()).T, mlx_w)
    x = mx.random.normal((3, 256), key=mx.random.key(2))
    scale = np.abs(np.array(x)) @ np.abs(mlx_w.T) + np.abs(np.array(ql.bias))
    assert np.all(np.abs(np.array(layer(x)) - np.array(ql(x))) <= 1e-5 * scale)
