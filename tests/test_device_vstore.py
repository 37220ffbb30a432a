"""`vstore` into a device buffer (the sparsify kernel's dense S and mask rows): one wide store
per lane in the interpreter, refused on a read-only buffer, and an unaligned or out-of-range
index is an interpreter error naming it. Its printed forms run in the sparsify kernels' CPU
harness tests (test_sparsify_kernels.py, test_cuda_cpu_activation.py)."""
from __future__ import annotations

import numpy as np
import pytest

from marlin_dsl.ir.verify import VerifyError
from marlin_dsl.ir import F16, U32, BufferParam, Builder, GridDim, VectorType
from marlin_dsl.ir.interpret import InterpreterError, run_kernel
from marlin_dsl.lowering.parts.shell import finish_kernel
from marlin_dsl.machine import CUDA


def _kernel(stride: int, access: str = "write"):
    """Each thread t stores x[4t .. 4t + 3] reversed at out[stride * t] as one vector of 4."""
    b = Builder()
    tid = b.index("tid")
    base = b.binary("mul", tid, 4)
    xs = [b.load("x", b.binary("add", base, 3 - i) if i < 3 else base, F16) for i in range(4)]
    vec = b.value("vec", xs, VectorType(F16, 4))
    b.op("vstore", [b.binary("mul", tid, stride), vec], attrs={"buffer": "out", "size": 4})
    return finish_kernel(b, CUDA, name="vstore_probe", threads=32, grid=(GridDim(None), GridDim(None), GridDim(None)),
                         buffers=[BufferParam("x", F16, "read"), BufferParam("out", F16, access)],
                         scalars=(), attrs={"target": "cuda"})


def test_each_lane_writes_its_vector() -> None:
    x = np.random.default_rng(0).normal(size=128).astype(np.float16)
    out = run_kernel(_kernel(4), {"x": x, "out": np.full(128, np.nan, np.float16)}, {})["out"]
    assert np.array_equal(out, x.reshape(32, 4)[:, ::-1].ravel())


def test_unaligned_and_out_of_range_indices_are_errors() -> None:
    x = np.zeros(128, np.float16)
    with pytest.raises(InterpreterError, match="not a multiple of 4") as err:
        run_kernel(_kernel(6), {"x": x, "out": np.zeros(256, np.float16)}, {})
    assert err.value.kind == "misaligned"
    with pytest.raises(InterpreterError, match="out of bounds") as err:
        run_kernel(_kernel(4), {"x": x, "out": np.zeros(124, np.float16)}, {})
    assert err.value.kind == "bounds"


def test_read_only_buffer_is_refused() -> None:
    with pytest.raises(VerifyError, match="@out is read-only"):
        _kernel(4, access="read")
