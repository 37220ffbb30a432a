"""Two kinds of tests, one suite.

`python -m pytest -q` is the default run: every test except those marked `slow`, on every core
(pytest-xdist, `-n auto` in pyproject.toml). `python -m pytest -q -m slow` runs only the slow
ones, and CI runs both (`.ci/run`). `slow` marks the exhaustive sweeps: the nvcc/ptxas compile
checks of every kernel, and the parts of a sweep beyond its covering subset.

A *sweep* (`@pytest.mark.sweep`) is a parametrised test whose cases are a product of axes
(format x pipeline x dtype ...). By default it runs a covering subset: cases taken in
collection order while they add a value of some axis not seen yet, so every format, every
pipeline and every dtype still runs at least once; the other cases are marked `slow`. The axes
are the test's parameters, a tuple parameter giving one axis per element; a sweep whose cases
are names gives its own: `@pytest.mark.sweep(axes=lambda params: (...))`.

Module fixtures that would compile every case of a sweep up front hand out a `LazyBuilds`
(tests/lazy_builds.py) instead: a case is built when a test first asks for it.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import pytest

Axes = Callable[[dict[str, Any]], Iterable[Any]]


def _key(value: Any) -> Any:
    """A hashable stand-in for a parameter value (formats and schedules are frozen dataclasses;
    anything unhashable counts by its repr)."""
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


def _default_axes(params: dict[str, Any]) -> list[Any]:
    axes = []
    for name, value in sorted(params.items()):
        if isinstance(value, tuple):
            axes += [(name, i, _key(v)) for i, v in enumerate(value)]
        else:
            axes.append((name, _key(value)))
    return axes


def covering_subset(cases: list[dict[str, Any]], axes: Axes | None = None) -> list[bool]:
    """For each case (its parameters), whether it is in the covering subset: taken in order
    while it brings a value of some axis that no earlier taken case had."""
    seen: set = set()
    taken = []
    for params in cases:
        values = {(i, v) for i, v in enumerate(axes(params))} if axes else set(_default_axes(params))
        new = values - seen
        taken.append(bool(new))
        seen |= values
    return taken


def _sweeps(items: list[pytest.Item]) -> None:
    """Mark the cases of every sweep beyond its covering subset as slow."""
    by_function: dict[tuple[str, str], list[pytest.Item]] = {}
    for item in items:
        if item.get_closest_marker("sweep") is not None and hasattr(item, "callspec"):
            by_function.setdefault((item.module.__name__, item.originalname), []).append(item)
    for group in by_function.values():
        axes = group[0].get_closest_marker("sweep").kwargs.get("axes")
        for item, taken in zip(group, covering_subset([i.callspec.params for i in group], axes)):
            if not taken:
                item.add_marker(pytest.mark.slow)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _sweeps(items)
    if config.getoption("markexpr"):  # -m says what runs (`-m slow`, `-m "slow or not slow"`)
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]


# ----- shared fixtures ---------------------------------------------------------------------------

@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch):
    """MLX's CUDA backend without a GPU: `mx.fast.cuda_kernel` is replaced by a stand-in that
    executes the IR of the kernel it was built from (recorded when the launcher is built) in
    the interpreter, with the buffers, launch sizes and shapes it is given. Records every
    launch's inputs."""
    import mlx.core as mx
    import numpy as np

    import marlin_dsl.targets.cuda.launch as cuda_launch
    import marlin_dsl.targets.cuda.runtime as runtime
    import marlin_dsl.layers.dispatch as dispatch
    import marlin_dsl.layers.epilogue_dispatch as epilogue_dispatch
    import marlin_dsl.layers.skip as skip
    import marlin_dsl.nn as mnn
    from marlin_dsl.ir.interpret import run_kernel

    kernels: dict[str, object] = {}
    launches: list[dict] = []
    build = runtime.build_cuda_kernel

    def recording_build(kernel, name=None):
        gemm = build(kernel, name)
        kernels[gemm.name] = kernel
        return gemm

    def fake_cuda_kernel(name, input_names, output_names, source, header, **_):
        def launch(inputs, output_shapes, output_dtypes, grid, threadgroup, init_value=None, verbose=False):
            launches.append({"name": name, "inputs": dict(zip(input_names, inputs)), "grid": grid})
            buffers = {n: np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a).ravel()
                       for n, a in zip(input_names, inputs)}
            scalars = dict(zip(("M", "N", "K"), (int(v) for v in buffers.pop("dims"))))
            for n, shape in zip(output_names, output_shapes):
                buffers[n] = np.full(int(np.prod(shape)), np.nan, np.float32)
            out = run_kernel(kernels[name], buffers, scalars)
            return [mx.array(out[n]).reshape(shape).astype(dtype)
                    for n, shape, dtype in zip(output_names, output_shapes, output_dtypes)]
        return launch

    monkeypatch.setattr(runtime, "build_cuda_kernel", recording_build)
    monkeypatch.setattr(mx.fast, "cuda_kernel", fake_cuda_kernel)
    # Kernels printed with __launch_bounds__ launch precompiled on a GPU; the stand-in runs the
    # IR either way, so every kernel goes through it.
    monkeypatch.setattr(cuda_launch, "launch_path", lambda source: "cuda_kernel")
    monkeypatch.setattr(mnn, "_cuda_available", lambda: True)
    caches = (runtime.cuda_gemm, dispatch.dispatch_for, skip.skip_dispatch_for,  # launches bound to the fake
              epilogue_dispatch.epilogue_dispatch_for)
    for cache in caches:
        cache.cache_clear()
    yield launches
    for cache in caches:
        cache.cache_clear()
