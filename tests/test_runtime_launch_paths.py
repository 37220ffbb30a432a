"""The benchmark runner and the activation kernels reach a target only through its runtime
(`TargetRuntime.tuned_schedule`, `timed_kernel`, `kernel_launcher`; issue 14). No GPU here: the
CUDA paths run with a stand-in for `mx.fast.cuda_kernel` that checks MLX's calling convention
(inputs in `input_names` order, the `dims` input, grid and threadgroup) and returns zeroed
outputs of the shapes asked for, so what is checked is the wiring, not the numbers (those are
the GPU scripts' part: bench/gpu_correctness.py, bench/probes/activation_gpu.py)."""
from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from marlin_dsl import Format, GroupScale, IntEncoding, NMSparsity  # noqa: E402
from marlin_dsl.activation import kernels  # noqa: E402
from marlin_dsl.formats.activation_spec import SparsifyError, SparsifySpec  # noqa: E402
from marlin_dsl.benchmarks import mlx_runner  # noqa: E402
from marlin_dsl.benchmarks.cases import bench_schedule  # noqa: E402
from marlin_dsl.errors import ScheduleError  # noqa: E402
from marlin_dsl.formats.builtin import builtin_format  # noqa: E402
from marlin_dsl.targets.cuda.tuning import tuned_schedule  # noqa: E402
from marlin_dsl.targets.runtimes import runtime_for  # noqa: E402


class _StandIn:
    """What `mx.fast.cuda_kernel(...)` returns: records each launch, returns zeroed outputs."""

    launches: list[dict] = []

    def __init__(self, name, input_names, output_names, source, header, **_) -> None:
        self.name, self.input_names, self.output_names = name, list(input_names), list(output_names)

    def __call__(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup, init_value=None,
                 verbose=False, template=None, stream=None):
        assert len(inputs) == len(self.input_names) and len(output_shapes) == len(self.output_names)
        dims = dict(zip(self.input_names, inputs))["dims"]
        assert dims.dtype == mx.uint32 and grid[0] % threadgroup[0] == 0
        self.launches.append({"name": self.name, "inputs": self.input_names, "init_value": init_value})
        return [mx.zeros(shape, dtype=dtype) for shape, dtype in zip(output_shapes, output_dtypes)]


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    import marlin_dsl.targets.cuda.launch as cuda_launch

    monkeypatch.setattr(mx.fast, "cuda_kernel", lambda **kw: _StandIn(**kw))
    # bounded kernels (512 threads or more) launch precompiled on a GPU: here through the stand-in
    monkeypatch.setattr(cuda_launch, "launch_path", lambda source: "cuda_kernel")
    _StandIn.launches.clear()
    return _StandIn.launches


def test_tuned_schedules_come_from_the_runtime() -> None:
    fmt = builtin_format("fp4")
    cuda = runtime_for("cuda")
    assert bench_schedule(fmt, "weight_stream", 16, 4096, 1024, tuned=cuda.tuned_schedule) == \
        tuned_schedule(fmt, 16, None, 4096, 1024)  # the runtime asks the tuned table (no GPU here)
    assert bench_schedule(fmt, "fused_dequant", 16, tuned=cuda.tuned_schedule).name == "bench"
    metal = runtime_for("metal")  # issue 16: Metal's weight-stream tiles (targets/metal/tuning.py)
    assert bench_schedule(fmt, "weight_stream", 16, tuned=metal.tuned_schedule) == metal.tuned_schedule(fmt, 16)
    # 2:4 streams on Metal too, its lanes scattering their kept values (issue 16)
    assert bench_schedule(builtin_format("fp4_2of4"), "weight_stream", 16, tuned=metal.tuned_schedule) == \
        metal.tuned_schedule(builtin_format("fp4_2of4"), 16)
    one_of_four = Format("int4_1of4", IntEncoding(bits=4, offset=8), GroupScale(128), sparsity=NMSparsity(1, 4))
    with pytest.raises(ScheduleError, match="software scatter"):  # a format the stream does not take
        bench_schedule(one_of_four, "weight_stream", 16, tuned=metal.tuned_schedule)


@pytest.mark.parametrize("pipeline", ["weight_stream", "striped"])
def test_bench_runner_times_cuda_kernels_through_the_runtime(monkeypatch: pytest.MonkeyPatch,
                                                             stand_in: list[dict], pipeline: str) -> None:
    monkeypatch.setattr(mlx_runner, "gpu_backend", lambda mx=None: "cuda")
    monkeypatch.setattr(mx, "set_default_device", lambda device: None)  # no GPU device here
    runner = mlx_runner.MLXRunner(repeats=1)
    k, n, m = 256, 64, 2
    subject = runner.marlin("fp4", pipeline, k, n)
    assert runner.runtime() is runtime_for("cuda")
    x = runner.activations(m, k)
    y = subject._make_launch(x, m)(0)  # the timed launch: dims and counters prepared beforehand
    assert tuple(y.shape) == (m, n) and stand_in[-1]["init_value"] is None
    y = subject._make_call(x, m)(1)  # the public call path, outputs not poisoned
    assert tuple(y.shape) == (m, n) and stand_in[-1]["init_value"] is None
    gemm = runner._gemm("fp4", pipeline, m, k, n)
    assert stand_in[-1]["inputs"] == gemm.source.input_names
    copies = runner._packed[("fp4", k, n)]["copies"]
    assert list(copies) == [gemm.weights_key] and gemm.weights_key.startswith("cuda/")


def test_activation_kernels_launch_through_the_runtime(stand_in: list[dict],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(kernels.SUPPORTED_TARGETS) == {"cuda", "metal"}  # Metal: tests/test_metal_activation.py
    spec = SparsifySpec("top2")
    x = mx.ones((8, 64), dtype=mx.float16)
    s = kernels.sparsify(x, spec, 0, "cuda")
    assert s.backend == "cuda" and stand_in[-1]["inputs"][0] == "x"
    y = kernels.sparse_matmul(s, mx.ones((64, 8), dtype=mx.float16))
    assert tuple(y.shape) == (8, 8) and stand_in[-1]["inputs"][:3] == ["values", "meta", "bt"]  # B^T as it lies
    monkeypatch.setattr(kernels, "SUPPORTED_TARGETS", ("cuda",))  # a runtime that launches none
    with pytest.raises(SparsifyError, match="launch on cuda only"):
        kernels.sparsify(x, spec, 0, "metal")
