"""The target protocol (issue 14): one registry of target descriptions with their printers, one
emit function, one runtime per target (shipping, native checks, layer kernels, launchers)."""
from __future__ import annotations

import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.errors import CompileError
from marlin_dsl.schedule import Gemm, default_schedule
from marlin_dsl.source import suspended_declarations
from marlin_dsl.machine import CUDA, METAL, TARGETS, Target, reader_of
from marlin_dsl.targets import Launcher, emit
from marlin_dsl.targets.cuda.printer import print_cuda
from marlin_dsl.targets.metal.printer import print_metal
from marlin_dsl.targets.runtimes import RUNTIMES, runtime_for


def _kernel(target: Target, fmt_name: str = "fp4"):
    fmt = md.builtin_format(fmt_name)
    with suspended_declarations():
        gemm = Gemm(f"t_{fmt_name}", fmt, default_schedule(fmt), "f16")
    return compile_gemm(gemm, target)


def test_registry_holds_both_targets_and_their_runtimes() -> None:
    assert TARGETS == {"cuda": CUDA, "metal": METAL}
    assert set(RUNTIMES) == set(TARGETS)
    for name, runtime in RUNTIMES.items():
        assert runtime.target is TARGETS[name] and runtime_for(name) is runtime
        assert runtime_for(TARGETS[name]) is runtime
    with pytest.raises(md.MarlinDSLError, match="no runtime for target 'tpu'"):
        runtime_for("tpu")


@pytest.mark.parametrize("target", [METAL, CUDA], ids=lambda t: t.name)
def test_emit_is_the_targets_printer(target: Target) -> None:
    kernel = _kernel(target).kernel
    printer = {"metal": print_metal, "cuda": print_cuda}[target.name]
    assert emit(kernel, target).full_source() == printer(kernel).full_source()


def test_emit_refuses_an_unregistered_target() -> None:
    other = Target("other", (8, 8, 8), warp_size=32, max_threads=1024, max_shared_bytes=1024)
    with pytest.raises(CompileError, match="no printer for target 'other'"):
        emit(_kernel(METAL).kernel, other)


def test_descriptions_are_data() -> None:
    """Lane tables and metadata tables are data on the description; callers get copies."""
    assert METAL.lane_elements("a", 8, 8) is not None and METAL.sparse_metadata(0) is None
    assert METAL.lane_elements("a", 16, 16) is None
    rows, cols = CUDA.lane_elements("a", 16, 16)
    rows[:] = -1
    assert (CUDA.lane_elements("a", 16, 16)[0] >= 0).all()
    assert CUDA.lane_elements("a", 8, 8) is None
    with pytest.raises(ValueError, match="selector must be 0 or 1"):
        CUDA.sparse_metadata(2)
    fields = CUDA.sparse_metadata(1)
    assert len(fields.lanes) == 256 and set(np.unique(fields.lanes) % 4) == {2, 3}
    assert (CUDA.shared_row_pad_bytes, CUDA.async_copy_bytes) == (16, 16)
    assert METAL.activation_layout == "row_major" and CUDA.activation_layout == "cuda_mma_sp"
    assert reader_of("lane_stream") is CUDA and reader_of("metal_lane_stream") is METAL
    with pytest.raises(CompileError, match="no target reads weight layout"):
        reader_of("nope")


def test_launchers_follow_the_protocol() -> None:
    """Both targets build an in-process launcher from a compiled kernel (no GPU needed to
    build one; MLX is imported at launch)."""
    for target in (METAL, CUDA):
        launcher = runtime_for(target).launcher(_kernel(target).kernel)
        assert isinstance(launcher, Launcher), target.name


def test_metal_launcher_runs_on_the_cpu_harness(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Metal launcher, on Linux: mx.fast.metal_kernel is replaced by a stand-in that runs
    the text it is given on the CPU harness; y matches the format's float64 reference."""
    mx = pytest.importorskip("mlx.core")
    from marlin_dsl.targets.metal.cpu_harness import compile_metal, find_compiler
    from marlin_dsl.targets.metal.printer import MetalSource

    if find_compiler() is None:
        pytest.skip("no C++ compiler to run the Metal text on the CPU")
    compiled = _kernel(METAL)
    src = print_metal(compiled.kernel)
    cpu = compile_metal(src)

    def fake_mlx_kernel(self: MetalSource):
        assert self.full_source() == src.full_source()

        def launch(inputs, grid, threadgroup, output_shapes, output_dtypes, init_value=None):
            buffers = {n: np.array(a).ravel() for n, a in zip(self.input_names, inputs)}
            scalars = dict(zip(("M", "N", "K"), (int(v) for v in buffers.pop("dims"))))
            for n, shape in zip(self.output_names, output_shapes):
                buffers[n] = np.full(int(np.prod(shape)), init_value, np.float16)
            out = cpu.run(buffers, scalars, (grid[0] // threadgroup[0], grid[1], grid[2]))
            return [mx.array(out[n]).reshape(shape) for n, shape in zip(self.output_names, output_shapes)]
        return launch

    monkeypatch.setattr(MetalSource, "mlx_kernel", fake_mlx_kernel)
    rng = np.random.default_rng(3)
    packed = md.pack_fp4_weights(rng.standard_normal((128, 40)))
    x = rng.standard_normal((3, 128)).astype(np.float16)
    y = runtime_for(METAL).launcher(compiled.kernel)(packed, mx.array(x))
    want = md.reference_matmul(x.astype(np.float64), packed)
    assert y.shape == (3, 40)
    np.testing.assert_allclose(np.array(y.astype(mx.float32)), want, rtol=2e-2, atol=2e-2)
