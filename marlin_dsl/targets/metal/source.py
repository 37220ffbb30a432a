"""A kernel printed for Metal (`MetalSource`): the header and body `mx.fast.metal_kernel` takes,
the names MLX needs and the complete kernel text MLX compiles (`full_source()`: header +
the signature MLX's writer generates + body), with MLX's conventions the printer follows: the
launch-scalar input `dims`, the thread attributes MLX adds when their names occur in the body
(`MLX_ATTRIBUTES`), inputs small enough to arrive in the constant address space and MLX's
dtype spelling of each buffer type (`MLX_DTYPE`). The printer is `printer.print_metal`."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["DIMS_NAME", "MLX_ATTRIBUTES", "MLX_DTYPE", "MLX_MAX_CONSTANT_ARRAY_SIZE", "MetalSource"]

#: The name of the input holding the launch scalars.
DIMS_NAME = "dims"

#: MLX's kernel attributes in the order its signature writer lists them (mlx/fast.cpp): an
#: attribute is a parameter of the kernel when its name occurs anywhere in the body.
MLX_ATTRIBUTES: tuple[tuple[str, str], ...] = (
    ("dispatch_quadgroups_per_threadgroup", "uint"),
    ("dispatch_simdgroups_per_threadgroup", "uint"),
    ("dispatch_threads_per_threadgroup", "uint3"),
    ("grid_origin", "uint3"),
    ("grid_size", "uint3"),
    ("quadgroup_index_in_threadgroup", "uint"),
    ("quadgroups_per_threadgroup", "uint"),
    ("simdgroup_index_in_threadgroup", "uint"),
    ("simdgroups_per_threadgroup", "uint"),
    ("thread_execution_width", "uint"),
    ("thread_index_in_quadgroup", "uint"),
    ("thread_index_in_simdgroup", "uint"),
    ("thread_index_in_threadgroup", "uint"),
    ("thread_position_in_grid", "uint3"),
    ("thread_position_in_threadgroup", "uint3"),
    ("threadgroup_position_in_grid", "uint3"),
    ("threadgroups_per_grid", "uint3"),
    ("threads_per_grid", "uint3"),
    ("threads_per_simdgroup", "uint"),
    ("threads_per_threadgroup", "uint3"),
)

#: Inputs with fewer elements than this are passed in the constant address space by MLX.
MLX_MAX_CONSTANT_ARRAY_SIZE = 8

#: MLX's `get_type_string` spelling of each buffer dtype (what its signature writer prints).
MLX_DTYPE = {"bool": "bool", "u8": "uint8_t", "u16": "uint16_t", "u32": "uint32_t",
             "i32": "int32_t", "f16": "float16_t", "bf16": "bfloat16_t", "f32": "float"}


@dataclass
class MetalSource:
    """A kernel printed for Metal: what `mx.fast.metal_kernel` takes, and the full text."""

    name: str
    header: str
    body: str
    input_names: list[str]
    output_names: list[str]
    #: MLX dtype string of every input and output (`float16_t`, `uint32_t`, ...).
    dtypes: dict[str, str]
    threads: int
    grid: tuple  # the kernel's GridDims
    scalar_names: list[str] = field(default_factory=list)
    #: "read", "write" or "readwrite" for every buffer (dims: "read").
    access: dict[str, str] = field(default_factory=dict)
    #: threadgroup memory the kernel declares, in bytes.
    shared_bytes: int = 0

    @property
    def attributes(self) -> list[tuple[str, str]]:
        """(type, name) of the thread attributes MLX adds: those whose names occur in the body."""
        return [(t, a) for a, t in MLX_ATTRIBUTES if a in self.body]

    def mlx_kernel_name(self, input_sizes: dict[str, int] | None = None) -> str:
        """The function name MLX gives the kernel (`custom_kernel_<name>_<input dtypes>...`)."""
        parts = [f"custom_kernel_{self.name}"]
        for n in self.input_names:
            suffix = "c" if self._is_constant(n, input_sizes) else ""
            parts.append(self.dtypes[n] + suffix)
        parts += [self.dtypes[n] for n in self.output_names]
        return "_".join(parts)

    def _is_constant(self, name: str, input_sizes: dict[str, int] | None) -> bool:
        size = len(self.scalar_names) if name == DIMS_NAME else (input_sizes or {}).get(name)
        return size is not None and size < MLX_MAX_CONSTANT_ARRAY_SIZE

    def signature(self, name: str | None = None, input_sizes: dict[str, int] | None = None) -> str:
        """The kernel signature MLX's `write_signature` generates for this body, ending in `{`.

        Inputs are `const device T*` (`const constant T*` when MLX would pass them as
        constants: fewer than 8 elements; `dims` always is, other inputs when `input_sizes`
        says so), outputs `device T*`, then the used thread attributes."""
        name = name or self.mlx_kernel_name(input_sizes)
        params = []
        index = 0
        for n in self.input_names:
            space = "constant" if self._is_constant(n, input_sizes) else "device"
            params.append(f"  const {space} {self.dtypes[n]}* {n} [[buffer({index})]]")
            index += 1
        for n in self.output_names:
            params.append(f"  device {self.dtypes[n]}* {n} [[buffer({index})]]")
            index += 1
        params += [f"  {t} {a} [[{a}]]" for t, a in self.attributes]
        return f"[[kernel]] void {name}(\n" + ",\n".join(params) + ") {\n"

    def full_source(self, signature: str | None = None, name: str | None = None,
                    input_sizes: dict[str, int] | None = None) -> str:
        """header + signature + body + closing brace, as MLX assembles it (without MLX's own
        utility prelude). `signature` replaces the generated one (text up to and including
        the opening brace)."""
        sig = signature if signature is not None else self.signature(name, input_sizes)
        return self.header + sig + self.body + "\n}\n"

    def launch_dims(self, scalars: dict[str, int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """(grid in threads, threadgroup) for MLX's dispatch_threads launch."""
        sizes = {k: int(v) for k, v in scalars.items()}
        groups = [d.evaluate(sizes) for d in self.grid]
        return (groups[0] * self.threads, groups[1], groups[2]), (self.threads, 1, 1)

    def mlx_kernel(self):
        """This kernel as `mx.fast.metal_kernel(...)` (it runs where MLX has a Metal backend:
        call it with `inputs=[...input_names order..., dims]`, `grid`/`threadgroup` from
        `launch_dims`, the output shapes and dtypes, and `init_value=0`)."""
        import mlx.core as mx

        return mx.fast.metal_kernel(name=self.name, input_names=list(self.input_names),
                                    output_names=list(self.output_names), source=self.body,
                                    header=self.header)

    def dims(self, scalars: dict[str, int]) -> np.ndarray:
        """The `dims` input for these launch scalars."""
        return np.array([int(scalars[n]) for n in self.scalar_names], dtype=np.uint32)
