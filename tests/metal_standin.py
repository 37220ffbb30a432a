"""A stand-in for `mx.fast.metal_kernel` for the activation kernels (no Apple GPU here).

`MetalStandIn(expected)` is called as MLX's `metal_kernel(name, input_names, output_names,
source, header, ...)`: it checks the kernel's text and names against the printed kernel that
`expected(name)` returns, and its launches record exactly what MLX would receive (the inputs as
numpy arrays, `dims`, grid in threads, threadgroup, output shapes, dtypes, init_value) and run
the exact text on the Metal CPU harness (`targets/metal/cpu_harness.py`). Outputs come back as
MLX arrays of the requested dtypes. Write-only outputs are poisoned by the harness whatever
init_value says (stricter than MLX: an unwritten element shows); readwrite ones start from
init_value (MLX fills every output with it)."""
from __future__ import annotations

from typing import Any, Callable

import mlx.core as mx
import numpy as np

from marlin_dsl.targets.metal.cpu_harness import CompiledMetal, compile_metal
from marlin_dsl.targets.metal.printer import MetalSource

_STORE = {"uint32_t": np.uint32, "float16_t": np.float16, "bfloat16_t": np.float32, "float": np.float32,
          "bool": np.bool_, "uint8_t": np.uint8}


class MetalStandIn:
    """See the module docstring; `launches` lists every launch's record, oldest first."""

    def __init__(self, expected: Callable[[str], MetalSource],
                 compiled: dict[str, CompiledMetal] | None = None, seed: int = 0) -> None:
        self.expected = expected
        self.compiled = compiled if compiled is not None else {}
        self.launches: list[dict[str, Any]] = []
        self.seed = seed

    def __call__(self, name: str, input_names: list, output_names: list, source: str, header: str,
                 **kw: Any) -> Callable[..., list]:
        src = self.expected(name)
        assert (source, header) == (src.body, src.header)  # exactly the printed text
        assert (list(input_names), list(output_names)) == (src.input_names, src.output_names)
        assert not kw  # no template, no atomic outputs: the printer casts colz to atomic_uint
        if name not in self.compiled:
            self.compiled[name] = compile_metal(src)
        cpu = self.compiled[name]

        def launch(inputs: list, grid: tuple, threadgroup: tuple, output_shapes: list,
                   output_dtypes: list, init_value: float | None = None, **_: Any) -> list:
            assert len(inputs) == len(input_names) and grid[0] % threadgroup[0] == 0
            buffers = {nm: np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a).ravel()
                       for nm, a in zip(input_names, inputs)}
            dims = [int(v) for v in buffers.pop("dims")]
            self.launches.append({"name": name, "inputs": buffers, "dims": dims, "grid": tuple(grid),
                                  "threadgroup": tuple(threadgroup), "shapes": [tuple(s) for s in output_shapes],
                                  "dtypes": list(output_dtypes), "init_value": init_value})
            for nm, shape in zip(output_names, output_shapes):
                store = _STORE[src.dtypes[nm]]
                fill = 0xFFFFFFFF if init_value is None and store == np.uint32 else (
                    0xAB if store == np.uint8 else True if store == np.bool_ else
                    np.nan if init_value is None else init_value)
                buffers[nm] = np.full(int(np.prod(shape)), fill, store)
            out = cpu.run(buffers, dict(zip(src.scalar_names, dims)),
                          (grid[0] // threadgroup[0], grid[1], grid[2]), threadgroup[0], seed=self.seed)
            return [mx.array(out[nm]).reshape(shape).astype(dt)
                    for nm, shape, dt in zip(output_names, output_shapes, output_dtypes)]
        return launch

    def named(self, name: str) -> list[dict[str, Any]]:
        """The launches of kernel `name`."""
        return [launch for launch in self.launches if launch["name"] == name]
