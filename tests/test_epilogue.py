"""Epilogues (marlin_dsl/epilogue.py, issue 35): the declaration and its errors, the IR's exp2
and recip, the weight stream's epilogue in the interpreter and as printed text on both CPU
harnesses against the float64 composition, a check that fails on a wrong epilogue, and the
layer path (one launch at decode, the composition beyond) on CUDA through the interpreter."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl.checks.epilogue_check import compare_epilogue
from marlin_dsl.checks.error_model import kernel_weights
from marlin_dsl.checks.format_check import sample_weights
from marlin_dsl.checks.kernel_check import check_kernel, check_shapes
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.epilogue import Epilogue, gate_interleave, reference_epilogue
from marlin_dsl.errors import ScheduleError, ShapeError
from marlin_dsl.formats.evaluate import dequantize
from marlin_dsl.ir import F16, F32, BufferParam, Builder, GridDim, Kernel, VerifyError, verify
from marlin_dsl.ir.interpret import run_kernel
from marlin_dsl.kernel_args import gemm_buffers, read_output
from marlin_dsl.layers.epilogue_dispatch import compose, deinterleave
from marlin_dsl.targets.cuda.cpu_harness import cuda_cpu_executor, find_compiler
from marlin_dsl.targets.metal.cpu_harness import run_metal_cpu
from marlin_dsl.targets.cuda.printer import print_cuda
from marlin_dsl.targets.metal.printer import print_metal
from marlin_dsl.targets.metal.tuning import tuned_schedule as metal_schedule

EPILOGUES = [Epilogue(gate="silu"), Epilogue(bias=True, gate="gelu_tanh", residual=True),
             Epilogue(residual=True), Epilogue(bias=True)]
needs_gxx = pytest.mark.skipif(find_compiler() is None, reason="no C++ compiler (g++) for the CPU harnesses")


def _gemm(fmt_name: str, act: str, epilogue: Epilogue, target: md.Target) -> md.Gemm:
    fmt = md.builtin_format(fmt_name)
    schedule = md.tuned_schedule(fmt, 1, k=256, n=256) if target is md.CUDA else metal_schedule(fmt, 1)
    return md.Gemm("ep", fmt, schedule, act, epilogue=epilogue)


# ----- the declaration -------------------------------------------------------------------------

def test_steps_and_errors() -> None:
    assert Epilogue(bias=True, gate="silu", residual=True).steps == ("bias", "silu", "residual")
    assert Epilogue.from_steps(("silu", "residual")) == Epilogue(gate="silu", residual=True)
    with pytest.raises(ScheduleError, match="gate must be None or one of 'silu', 'gelu_tanh'"):
        Epilogue(gate="relu")
    with pytest.raises(ScheduleError, match="does nothing"):
        Epilogue()
    with pytest.raises(ScheduleError, match="residual must be True or False"):
        Epilogue(residual=1)
    with pytest.raises(ScheduleError, match="in that order"):
        Epilogue.from_steps(("residual", "silu"))
    fmt = md.builtin_format("fp4")
    with pytest.raises(ScheduleError, match="gemm 'g': epilogue silu: the fused_dequant pipeline .* does not "
                                            "apply epilogues; only (multistage, weight_stream|weight_stream, multistage) "):
        md.Gemm("g", fmt, md.Schedule("s", tile_k=32, pipeline=md.FusedDequant()), epilogue=Epilogue(gate="silu"))
    with pytest.raises(ScheduleError, match="an epilogue and outputs"):
        md.Gemm("g", fmt, md.tuned_schedule(fmt, 1), outputs=(16, 16), epilogue=Epilogue(bias=True))
    narrow = md.Schedule("n8", tile_m=8, tile_n=64, tile_k=128, warps_m=1, warps_n=8,
                         pipeline=md.WeightStream(k_warps=2))
    with pytest.raises(ScheduleError, match=r"N rows \(tile_n / warps_n = 8\) must be a multiple of 16"):
        md.Gemm("g", fmt, narrow, epilogue=Epilogue(gate="silu"))
    with pytest.raises(ScheduleError, match="epilogue must be an Epilogue"):
        md.Gemm("g", fmt, md.tuned_schedule(fmt, 1), epilogue="silu")


def test_interleave_and_references_agree() -> None:
    """gate_interleave puts gate j at column 16 (j // 8) + j % 8 and up j 8 further; the float64
    reference and the MLX composition read pairs the same way."""
    order = gate_interleave(16)
    assert list(order[:16]) == [*range(8), *range(16, 24)]
    rng = np.random.default_rng(0)
    g, u = rng.standard_normal((3, 16)), rng.standard_normal((3, 16))
    y = np.concatenate([g, u], axis=1)[:, order]
    want = g / (1 + np.exp(-g)) * u
    assert np.allclose(reference_epilogue(("silu",), y), want)
    got = compose(("silu",), mx.array(y.astype(np.float32)), ())
    assert np.allclose(np.array(got), want, rtol=1e-5, atol=1e-6)
    gm, um = deinterleave(mx.array(y.astype(np.float32)))
    assert np.allclose(np.array(gm), g) and np.allclose(np.array(um), u)


# ----- the IR's exp2 and recip -----------------------------------------------------------------

def test_exp2_recip_ops() -> None:
    from marlin_dsl.ir.ops import OPS
    from marlin_dsl.ir.semantics import Signature

    a = np.array([-3.5, 0.0, 1.25, 200.0], dtype=np.float32)
    e = OPS["exp2"].evaluate(Signature("exp2", {}, (F32,), F32))(a)[0]
    r = OPS["recip"].evaluate(Signature("recip", {}, (F32,), F32))(a)[0]
    with np.errstate(over="ignore"):
        want = np.exp2(a.astype(np.float64)).astype(np.float32)
    assert e.dtype == np.float32 and np.array_equal(e, want)
    assert np.isinf(e[3]) and np.isinf(r[1]) and r[2] == np.float32(0.8)
    strict = OPS["exp2"].evaluate(Signature("exp2", {}, (F32,), F32, strict=True))(a)[1]
    assert strict and strict[0].kind == "open"  # the folder leaves device rounding alone
    b = Builder()
    b.value("exp2", [b.const(1.0, F16)], F16)
    kernel = Kernel("k", 32, (GridDim(None),) * 3, b.block)
    with pytest.raises(VerifyError, match="exp2 takes and gives f32, got f16"):
        verify(kernel)
    b = Builder()
    x = b.value("recip", [b.value("exp2", [b.const(0.5, F32)], F32)], F32)
    b.store("y", b.const(0), x)
    printed = [print_cuda(Kernel("k", 32, (GridDim(None),) * 3, b.block,
                                 buffers=[BufferParam("y", F32, "write")])).body,
               print_metal(Kernel("k", 32, (GridDim(None),) * 3, b.block,
                                  buffers=[BufferParam("y", F32, "write")])).body]
    assert "exp2f(" in printed[0] and "(1.0f / " in printed[0]
    assert "metal::exp2(" in printed[1] and "(1.0f / " in printed[1]


# ----- kernels: interpreter and printed text ---------------------------------------------------

@pytest.mark.sweep
@pytest.mark.parametrize("target", ["cuda", "metal"])
@pytest.mark.parametrize("epilogue", EPILOGUES, ids=lambda e: "+".join(e.steps))
@pytest.mark.parametrize("act", ["f16", "bf16"])
@pytest.mark.parametrize("fmt", ["fp4", "uint4_zp", "nf4"])
def test_epilogue_kernels(fmt: str, act: str, epilogue: Epilogue, target: str) -> None:
    """The interpreter and the printed text (CPU harness), M = 1, 3, 65 with N tails (gates:
    whole runs), against the float64 composition under the carried error model."""
    t = md.CUDA if target == "cuda" else md.METAL
    gemm = _gemm(fmt, act, epilogue, t)
    kernel = compile_gemm(gemm, t).kernel
    assert kernel.attrs["epilogue"] == epilogue.steps
    rng = np.random.default_rng(hash((fmt, act, epilogue.steps, target)) % 2**32)
    executors = [run_kernel]
    if find_compiler() is not None:
        executors.append(cuda_cpu_executor() if t is md.CUDA else (lambda k, b, s: run_metal_cpu(k, b, s)))
    for execute in executors:
        for shape in check_shapes(gemm):
            res = check_kernel(gemm, kernel, shape, rng, execute=execute)
            assert res.ok, (shape, res.summary())


@pytest.mark.sweep
@pytest.mark.parametrize("epilogue", EPILOGUES, ids=lambda e: "+".join(e.steps))
@pytest.mark.parametrize("act", ["f16", "bf16"])
@pytest.mark.parametrize("fmt", ["fp4", "uint4_zp"])
def test_multistage_epilogue_kernels(fmt: str, act: str, epilogue: Epilogue) -> None:
    """The multistage pipeline (CUDA's tuned kernel for 17-64 rows where N > K) applies the
    epilogue on each lane's elements, a gate pairing the m16n8 C tile's rows g and g + 8: the
    interpreter and the printed text on the CUDA CPU harness, M = 1, 3, 65."""
    f = md.builtin_format(fmt)
    gemm = md.Gemm("ms_ep", f, md.tuned_schedule(f, 32, k=4096, n=14336), act, epilogue=epilogue)
    assert gemm.schedule.pipeline.kind == "multistage"
    kernel = compile_gemm(gemm, md.CUDA).kernel
    rng = np.random.default_rng(hash((fmt, act, epilogue.steps)) % 2**32)
    executors = [run_kernel] + ([cuda_cpu_executor()] if find_compiler() is not None else [])
    for execute in executors:
        for shape in check_shapes(gemm):
            res = check_kernel(gemm, kernel, shape, rng, execute=execute)
            assert res.ok, (shape, res.summary())


@needs_gxx
def test_metal_multistage_takes_bias_and_residual_but_no_gate() -> None:
    """Metal's 8x8 C tile gives a lane one row: its multistage kernel adds a bias and a residual
    (the printed text on the Metal CPU harness) and refuses a gate, naming the weight stream."""
    fmt = md.builtin_format("fp4")
    schedule = metal_schedule(fmt, 64)
    assert schedule.pipeline.kind == "multistage"
    gemm = md.Gemm("ms_metal", fmt, schedule, epilogue=Epilogue(bias=True, residual=True))
    kernel = compile_gemm(gemm, md.METAL).kernel
    rng = np.random.default_rng(4)
    res = check_kernel(gemm, kernel, (3, 145, 256), rng, execute=lambda k, b, s: run_metal_cpu(k, b, s))
    assert res.ok, res.summary()
    with pytest.raises(ScheduleError, match="metal's 8-row C tile gives a lane no such pairs .* use the weight stream"):
        compile_gemm(md.Gemm("ms_gate", fmt, schedule, epilogue=Epilogue(gate="silu")), md.METAL)


def test_the_check_fails_on_a_wrong_epilogue() -> None:
    """A kernel with silu against the reference of gelu_tanh, or without its residual, fails;
    against its own steps it passes (the check can tell)."""
    gemm = _gemm("fp4", "f16", Epilogue(gate="silu", residual=True), md.CUDA)
    kernel = compile_gemm(gemm, md.CUDA).kernel
    rng = np.random.default_rng(2)
    m, n, k = 3, 64, 256
    packed = md.pack(gemm.format, sample_weights(gemm.format, k, n, rng))
    x = rng.standard_normal((m, k))
    r = rng.standard_normal((m, n // 2))
    buffers, scalars = gemm_buffers(kernel, packed, x, {"residual": r})
    y = read_output(run_kernel(kernel, buffers, scalars), m, n // 2).astype(np.float64)
    xr, w, wk = buffers["x"].astype(np.float64).reshape(m, k), dequantize(packed), kernel_weights(packed, "f16")
    rr = buffers["residual"].astype(np.float64).reshape(m, n // 2)
    assert compare_epilogue(y, ("silu", "residual"), xr, w, "f16", wk, None, rr).ok
    assert not compare_epilogue(y, ("gelu_tanh", "residual"), xr, w, "f16", wk, None, rr).ok
    assert not compare_epilogue(y, ("silu",), xr, w, "f16", wk).ok
    poisoned = y.copy()
    poisoned[1, 5] = np.nan
    assert not compare_epilogue(poisoned, ("silu", "residual"), xr, w, "f16", wk, None, rr).ok


def test_epilogue_inputs_are_checked() -> None:
    gemm = _gemm("fp4", "f16", Epilogue(bias=True, residual=True), md.CUDA)
    kernel = compile_gemm(gemm, md.CUDA).kernel
    packed = md.pack(gemm.format, np.random.default_rng(0).standard_normal((256, 32)))
    x = np.ones((2, 256))
    with pytest.raises(ShapeError, match="reads 'bias'"):
        gemm_buffers(kernel, packed, x, {"residual": np.ones((2, 32))})
    with pytest.raises(ShapeError, match=r"residual must be finite with shape \[2, 32\], got \[2, 16\]"):
        gemm_buffers(kernel, packed, x, {"bias": np.ones(32), "residual": np.ones((2, 16))})
    with pytest.raises(ShapeError, match="not \\['zeros'\\]"):
        gemm_buffers(kernel, packed, x, {"bias": np.ones(32), "residual": np.ones((2, 32)), "zeros": 1})
    gated = compile_gemm(_gemm("fp4", "f16", Epilogue(gate="silu"), md.CUDA), md.CUDA).kernel
    with pytest.raises(ShapeError, match="N=40 with a gated epilogue must be a multiple of 16"):
        gemm_buffers(gated, md.pack(gemm.format, np.ones((256, 40))), x)


# ----- layers and models -----------------------------------------------------------------------

def _logits(model, tokens: mx.array) -> np.ndarray:
    return np.array(model(tokens).astype(mx.float32)).astype(np.float64)


def test_fused_blocks_on_cuda_launch_the_epilogue_kernels(fake_cuda) -> None:
    """A tiny llama converted to fp4 on backend "cuda" (kernels run by the interpreter): at one
    token (the weight stream) and at 70 (the multistage pipeline, no warpgroup MMA here) the
    MLP runs two launches, the gate/up kernel with silu and the down kernel with the residual,
    and no MLX op between. With the runtime's epilogue kernels withheld the same layers compose
    the steps in MLX ops. Logits against the unfused conversion of the same weights (f16: the
    fused kernels round once where the unfused model rounds after each op)."""
    from mlx.utils import tree_flatten
    from tiny_models import tiny_llama

    from marlin_dsl.models import convert

    fused, plain = tiny_llama(3, mx.float16), tiny_llama(3, mx.float16)
    conv = convert(fused, "fp4", backend="cuda")
    convert(plain, "fp4", backend="cuda", blocks=False)
    assert conv.fused_blocks == ["model.layers.0.mlp", "model.layers.1.mlp"]
    assert type(fused.model.layers[0]).__name__ == "FusedTransformerBlock"
    assert {k for k, _ in tree_flatten(fused.parameters())} == {k for k, _ in tree_flatten(plain.parameters())}
    for length in (1, 70):
        tokens = mx.array(np.random.default_rng(length).integers(0, 384, (1, length)))
        fake_cuda.clear()
        got = _logits(fused, tokens)
        names = [launch["name"] for launch in fake_cuda]
        assert sum("_silu" in n for n in names) == 2 and sum("_residual" in n for n in names) == 2, names
        want = _logits(plain, tokens)
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 5e-3, length
    from marlin_dsl.layers import epilogue_dispatch
    from marlin_dsl.targets.cuda.runtime import RUNTIME

    epilogue_dispatch.epilogue_dispatch_for.cache_clear()
    for layer in [m for _, m in fused.named_modules() if hasattr(m, "_epilogue_calls")]:
        layer._epilogue_calls.clear()
    with pytest.MonkeyPatch.context() as patch:  # no epilogue kernels: the layers compose
        patch.setattr(type(RUNTIME), "layer_epilogue", lambda self, *args: None)
        fake_cuda.clear()
        got = _logits(fused, tokens)
        assert not any("_silu" in launch["name"] or "_residual" in launch["name"] for launch in fake_cuda)
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 5e-3


def test_fused_model_saves_portable_and_loads_fused(tmp_path, fake_cuda) -> None:
    """Saved weights are the unfused conversion's, bit for bit (gate/up side by side); the
    config lists the fused MLPs; `load_into` rebuilds the fused blocks, logits equal. On MLX
    ops (no kernel applies epilogues) nothing is fused."""
    from tiny_models import tiny_llama

    from marlin_dsl.models import convert, load_into, save_model

    assert convert(tiny_llama(4), "fp4", backend="mlx").fused_blocks == []
    fused, plain = tiny_llama(4, mx.float16), tiny_llama(4, mx.float16)
    convert(fused, "fp4", backend="cuda")
    convert(plain, "fp4", backend="cuda", blocks=False)
    save_model(fused, tmp_path / "fused")
    save_model(plain, tmp_path / "plain")
    a, b = mx.load(str(tmp_path / "fused" / "model.safetensors")), mx.load(str(tmp_path / "plain" / "model.safetensors"))
    assert a.keys() == b.keys() and all(mx.array_equal(a[k], b[k]).item() for k in a)
    import json
    section = json.loads((tmp_path / "fused" / "config.json").read_text())["marlin_dsl"]
    assert section["fused_blocks"] == ["model.layers.0.mlp", "model.layers.1.mlp"]
    loaded = load_into(tiny_llama(9, mx.float16), tmp_path / "fused", backend="cuda")
    assert type(loaded.model.layers[1].mlp).__name__ == "FusedMLP"
    tokens = mx.array([[5, 9, 11]])
    assert np.array_equal(_logits(loaded, tokens), _logits(fused, tokens))


def test_gpu_script_checks_run_through_the_interpreter(fake_cuda) -> None:
    """bench/probes/epilogue_gpu.py's check, as the GPU runs it, on the CUDA kernels through the
    interpreter: the fused kernel is launched and passes."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "probes" / "epilogue_gpu.py"
    spec = importlib.util.spec_from_file_location("epilogue_gpu", path)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)  # type: ignore[union-attr]
    rng = np.random.default_rng(8)
    for steps, bias, n in ((("silu",), False, 64), (("gelu_tanh", "residual"), True, 64), ((), True, 40)):
        got = probe.check("fp4", "f16", steps, bias, 3, 256, n, rng)
        assert got["ok"] and got["fused_kernel"], got
    assert any("_silu" in launch["name"] for launch in fake_cuda)


def test_epilogue_call_errors() -> None:
    """A residual of the wrong shape, a missing one, or one given to an epilogue without a
    residual: errors that name it (the MLX-ops backend: the checks are the layer's)."""
    from marlin_dsl.errors import MarlinDSLError
    from marlin_dsl.models.fused_block import epilogue_call
    from marlin_dsl.nn import MarlinLinear

    layer = MarlinLinear.from_packed(md.pack(md.builtin_format("fp4"), np.ones((256, 32))), backend="mlx")
    x = mx.ones((2, 256), mx.float16)
    got = epilogue_call(layer, ("residual",), x, mx.ones((2, 32), mx.float16))
    assert got.shape == (2, 32) and got.dtype == mx.float16
    with pytest.raises(ShapeError, match=r"residual: expected shape \[2, 32\] for x of shape \[2, 256\], got \[2, 31\]"):
        epilogue_call(layer, ("residual",), x, mx.ones((2, 31), mx.float16))
    with pytest.raises(ShapeError, match="residual: expected an mlx.core.array"):
        epilogue_call(layer, ("residual",), x, np.ones((2, 32)))
    with pytest.raises(MarlinDSLError, match=r"takes \['residual'\], got 0"):
        epilogue_call(layer, ("residual",), x)
    with pytest.raises(MarlinDSLError, match="takes no arrays, got 1"):
        epilogue_call(layer, ("silu",), mx.ones((2, 256), mx.float16), mx.ones((2, 16), mx.float16))


def test_built_by_mlx_lm_model_file_then_filled(tmp_path, fake_cuda, monkeypatch) -> None:
    """The path mlx-lm takes with trust_remote_code (`models.mlx_lm_model.Model`, then
    load_weights; "auto" is the CUDA backend, as on an NVIDIA GPU): the blocks are fused when
    built, the gate/up columns interleaved on the first call after the weights arrive; logits
    equal the saved model's."""
    import json

    import marlin_dsl.nn as mnn

    monkeypatch.setattr(mnn, "select_backend", lambda backend="auto": "cuda" if backend == "auto" else backend)

    from mlx.utils import tree_flatten
    from tiny_models import tiny_llama

    from marlin_dsl.models import convert, save_model
    from marlin_dsl.models.mlx_lm_model import Model, ModelArgs

    fused = tiny_llama(6, mx.float16)
    convert(fused, "fp4", backend="cuda")
    save_model(fused, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    built = Model(ModelArgs.from_dict(config))
    assert type(built.model.layers[0].mlp).__name__ == "FusedMLP"
    built.load_weights(list(mx.load(str(tmp_path / "m" / "model.safetensors")).items()))
    tokens = mx.array([[3, 1, 4]])
    assert np.array_equal(_logits(built, tokens), _logits(fused, tokens))
    assert {k for k, _ in tree_flatten(built.parameters())} == {k for k, _ in tree_flatten(fused.parameters())}


@needs_gxx
def test_metal_layer_launches_the_shipped_epilogue_kernel(monkeypatch, tmp_path) -> None:
    """On backend "metal" (no Apple GPU here: mx.fast.metal_kernel is a stand-in that checks
    the text it is handed and runs it on the Metal CPU harness, tests/metal_standin.py) a call
    with an epilogue at 3 rows is one launch of the generated launcher's epilogue kernel; its
    output against the float64 composition."""
    import sys
    from pathlib import Path

    import marlin_dsl.layers.dispatch as dispatch
    import marlin_dsl.layers.epilogue_dispatch as epilogue_dispatch
    import marlin_dsl.nn as mnn
    from marlin_dsl.models.fused_block import epilogue_call
    from marlin_dsl.nn import MarlinLinear
    from marlin_dsl.targets.metal.runtime import metal_launcher, stream_schedule

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from metal_standin import MetalStandIn

    monkeypatch.setenv("MARLIN_DSL_CACHE", str(tmp_path))
    monkeypatch.setattr(mnn, "_metal_available", lambda: True)
    caches = (metal_launcher, dispatch.dispatch_for, epilogue_dispatch.epilogue_dispatch_for)
    for cache in caches:
        cache.cache_clear()
    monkeypatch.setattr(mx.fast, "metal_kernel", lambda **_: None)  # set below, per kernel
    try:
        rng = np.random.default_rng(21)
        fmt, k, n, m = md.builtin_format("fp4"), 256, 64, 3
        packed = md.pack(fmt, rng.standard_normal((k, n)))
        layer = MarlinLinear.from_packed(packed, backend="metal")
        sched = stream_schedule(fmt, m, k, n)
        kernels = {}
        for steps in (("silu",), ("residual",)):
            name = metal_launcher(fmt, "f16", sched, (), steps).NAME
            kernels[name] = print_metal(compile_gemm(md.Gemm(name, fmt, sched, "f16",
                                                             epilogue=Epilogue.from_steps(steps)), md.METAL).kernel)
        standin = MetalStandIn(kernels.__getitem__)
        monkeypatch.setattr(mx.fast, "metal_kernel", standin)
        x = rng.standard_normal((m, k)).astype(np.float16)
        r = rng.standard_normal((m, n)).astype(np.float16)
        y_gate = epilogue_call(layer, ("silu",), mx.array(x))
        y_res = epilogue_call(layer, ("residual",), mx.array(x), mx.array(r))
        assert [launch["name"] for launch in standin.launches] == list(kernels)
        xr, w, wk = x.astype(np.float64), dequantize(packed), kernel_weights(packed, "f16")
        got = np.array(y_gate.astype(mx.float32)).astype(np.float64)
        assert got.shape == (m, n // 2) and compare_epilogue(got, ("silu",), xr, w, "f16", wk).ok
        got = np.array(y_res.astype(mx.float32)).astype(np.float64)
        assert compare_epilogue(got, ("residual",), xr, w, "f16", wk, None, r.astype(np.float64)).ok
    finally:
        for cache in caches:
            cache.cache_clear()
