"""Launch printed GEMM kernels through MLX's `mx.fast.cuda_kernel` (MLX with its CUDA backend),
or, precompiled by NVRTC, through `mx.fast.precompiled_cuda_kernel` (launch_precompiled.py:
kernels written for an architecture-specific target such as sm_90a, or every kernel under
$MARLIN_DSL_CUDA_LAUNCH=precompiled); `mlx_kernel` picks the path, both are called alike.

`build_cuda_kernel(kernel)` takes a lowered GEMM `Kernel` (or a `CudaSource` printed from one,
e.g. loaded from a manifest written where the compiler runs) and returns a `CudaGemm`: call it
with a `PackedWeights` (or the MLX arrays `weights()` made from one) and activations x [M, K]
to get y [M, N] as an MLX array in the kernel's activation type.

Buffers, as `kernel_args.gemm_buffers` lays them out for every executor: x (flat [M, K] in the
activation type), the packed arrays by name (flat), `dims` = [M, N, K] (u32), then the outputs.
The striped pipeline's `counters` (one u32 per output tile; the kernel finds them zero and
leaves them zero) are passed as a zeroed *input* (see `targets/cuda/printer.py`, `inout_inputs`), so
that every real output (y, and the striped pipeline's f32 `partials`) can be poisoned with NaN
through `init_value`: an element the kernel fails to write stays NaN. `poison=False` leaves
outputs uninitialised (no fill kernels, for timing). Each launch gets its own zeroed counters
by default: MLX's CUDA graph orders launches only through the arrays they write, and the
counters are an input.

Grid: MLX's grid is in threads (like `metal_kernel`): (groups_x * threads, groups_y,
groups_z) with threadgroup (threads, 1, 1), groups from the kernel's `GridDim`s over
(M, N, K) as `ir.interpret.launch_size` evaluates them. MLX caches a compiled module by kernel
name for the life of the process, so the name carries a hash of the printed source.

`CudaGemm` also offers what the benchmark runner times (`TimedKernel` of targets/base.py:
weight copies, a launch with its inputs prepared, the public call path), and `CudaLaunch` binds
any printed kernel (the activation sparsify and sparse-GEMM kernels) to `mx.fast.cuda_kernel`
(`TargetRuntime.kernel_launcher`).

Importing this module needs only numpy and marlin_dsl's printer; MLX is imported when a kernel
is built or launched.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ...errors import CompileError, MarlinDSLError, ShapeError
from ...ir.core import Kernel
from ...machine.outputs import output_names, y_columns
from .printer import print_cuda
from .launch_precompiled import LAUNCH_PATHS, arch_specific, launch_path, precompiled_kernel
from .launch_text import mlx_strings
from .source import CudaSource

__all__ = ["CudaGemm", "CudaLaunch", "CudaWeights", "build_cuda_kernel", "gemm_inout_inputs", "cuda_executor",
           "mlx_kernel"]

#: Readwrite buffers of the lowered GEMMs that a launch must find zeroed (and that the kernel
#: leaves zeroed): the striped pipeline's arrival counters (kernel_args.gemm_buffers).
ZEROED_STATE = ("counters",)

_MX_DTYPE = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "u32": "uint32",
             "u8": "uint8", "u16": "uint16", "i32": "int32", "bool": "bool_"}
#: numpy dtype of the packed arrays and zeroed state (bf16 never occurs there).
_NP_DTYPE = {"f16": np.float16, "f32": np.float32, "u32": np.uint32, "u8": np.uint8,
             "u16": np.uint16, "i32": np.int32, "bool": np.bool_}


@dataclass
class CudaWeights:
    """A packed weight's arrays as flat MLX arrays, ready to launch with (reusable)."""

    arrays: dict
    shape: tuple[int, int]  # (K, N)
    format_name: str | None = None


def gemm_inout_inputs(kernel: Kernel) -> list[str]:
    """The readwrite buffers of a GEMM kernel to pass as zeroed inputs."""
    return [b.name for b in kernel.buffers if b.access == "readwrite" and b.name in ZEROED_STATE]


def _mx():
    import mlx.core as mx

    return mx


def mlx_kernel(source: CudaSource, name: str | None = None, path: str | None = None):
    """`source` bound to MLX (needs MLX's CUDA backend to run): `mx.fast.cuda_kernel(...)`,
    handed #include lines of files holding its text (launch_text.py says why), or on the
    "precompiled" path (`launch_precompiled.launch_path`: kernels for an architecture-specific
    target, or all under $MARLIN_DSL_CUDA_LAUNCH=precompiled) a `PrecompiledKernel`, called the
    same way. `path` forces one ("cuda_kernel" or "precompiled"; the benchmark compares them)."""
    name = name or source.name
    path = path or launch_path(source)
    if path == "precompiled":
        return precompiled_kernel(source, name)
    if path != "cuda_kernel":
        raise MarlinDSLError(f"cuda: launch path {path!r}: expected one of {', '.join(LAUNCH_PATHS)}")
    if arch_specific(source.attrs.get("cuda_arch")):
        raise CompileError(f"cuda: kernel {source.name} is written for {source.attrs['cuda_arch']}, which "
                           "mx.fast.cuda_kernel cannot compile for (it targets the plain sm_<cc>)")
    mx = _mx()
    header, body = mlx_strings(name, source.header, source.body)
    return mx.fast.cuda_kernel(name=name, input_names=list(source.input_names),
                               output_names=list(source.output_names), source=body,
                               header=header, **source.shared_memory_kwargs)


def _mx_dtype(elem: str):
    return getattr(_mx(), _MX_DTYPE[elem])


class CudaGemm:
    """A printed GEMM kernel bound to `mx.fast.cuda_kernel`; see the module docstring."""

    def __init__(self, source: CudaSource, name: str | None = None, path: str | None = None) -> None:
        self.source = source
        self.name = name or f"{source.name}_{source.digest[:12]}"
        #: the launch path (mlx_kernel), None: chosen when the MLX kernel is made
        self.path = path
        attrs = source.attrs
        self.activation = str(attrs.get("activation", source.elems.get("x", "f16")))
        self.tile = tuple(int(v) for v in attrs.get("tile", (0, 0, 0)))
        self.parallel = int(attrs.get("parallel", 1))
        self.format_name = attrs.get("format")
        self._kernel = None
        self._zero_state: dict[tuple[str, int], object] = {}
        #: (M, N, K) -> (dims array, output sizes, grid, threadgroup): built once per size
        self._launches: dict[tuple[int, int, int], tuple] = {}

    # ----- MLX objects ------------------------------------------------------------------------

    @property
    def kernel(self):
        """The `mx.fast.cuda_kernel` object or `PrecompiledKernel` (`mlx_kernel`; created on
        first use), of the compact text (`CudaSource.compact`: MLX's per-launch host cost grows
        with the text)."""
        if self._kernel is None:
            self._kernel = mlx_kernel(self.source.compact(), self.name, self.path)
        return self._kernel

    def weights(self, packed) -> CudaWeights:
        """The packed arrays as flat MLX arrays of the kernel's buffer types (reusable)."""
        mx = _mx()
        if self.format_name is not None and getattr(packed, "format", None) is not None \
                and packed.format.name != self.format_name:
            raise ShapeError(f"packed: format {packed.format.name!r} is not the kernel's {self.format_name!r}")
        from ...kernel_args import physical_arrays

        arrays = physical_arrays(self.source.attrs, packed)  # the target's layout, chosen here
        out = {}
        for name in self.source.input_names:
            if name == "x" or name == "dims" or name in self.source.inout_inputs:
                continue
            if name not in arrays:
                raise ShapeError(f"packed: has no array {name!r} (kernel {self.source.name} reads it)")
            arr = np.ascontiguousarray(arrays[name]).ravel()
            want = np.dtype(_NP_DTYPE[self.source.elems[name]])
            if arr.dtype != want:
                raise ShapeError(f"packed: array {name!r} has dtype {arr.dtype}, the kernel reads {want}")
            out[name] = mx.array(arr)
        k, n = (int(v) for v in packed.shape)
        return CudaWeights(out, (k, n), packed.format.name)

    def _zeroed(self, name: str, size: int, fresh: bool):
        mx = _mx()
        dtype = np.dtype(_NP_DTYPE[self.source.elems[name]])
        if fresh:
            return mx.array(np.zeros(size, dtype))
        key = (name, size)
        if key not in self._zero_state:  # the kernel leaves these zero: one buffer serves every call
            self._zero_state[key] = mx.array(np.zeros(size, dtype))
        return self._zero_state[key]

    # ----- launch ------------------------------------------------------------------------------

    def sizes(self, m: int, n: int, k: int) -> dict[str, int]:
        """Element counts of the outputs and zeroed-state inputs for an M x N x K problem."""
        tm, tn, _ = self.tile
        tiles = -(-m // tm) * -(-n // tn) if tm and tn else 0
        sizes = {"y": m * n, "partials": tiles * self.parallel * tm * tn, "counters": tiles}
        sizes.update({name: m * w for name, w in self.y_columns(n).items()})
        return {name: sizes[name] for name in (*self.source.output_names, *self.source.inout_inputs)
                if name in sizes}

    def y_columns(self, n: int) -> dict[str, int]:
        """The outputs holding Y and their columns (`base.y_columns`: y, or Y's parts)."""
        return y_columns(self.source.attrs, self.source.name, n, "weights")

    def __call__(self, weights, x, *, poison: bool = True, fresh_state: bool = True,
                 state: dict | None = None, return_all: bool = False, verbose: bool = False):
        """y = x @ W. `weights`: a PackedWeights or `self.weights(packed)`; x: [M, K] (MLX or
        numpy; converted to the activation type). Returns y [M, N] (or, with `return_all`, a
        dict of every output, flat).

        The zeroed-state inputs (counters) come from `state` when given (the caller's arrays,
        which the kernel updates in place and must leave zeroed), else from a new zero array per
        call. MLX's CUDA backend orders the nodes of its CUDA graph only through arrays they
        *write*, so two launches sharing one counters input could run at the same time:
        `fresh_state=False` (one zero buffer per size, reused) is only safe when every launch
        is evaluated before the next is queued."""
        mx = _mx()
        if not isinstance(weights, CudaWeights):
            weights = self.weights(weights)
        elif self.format_name and weights.format_name and weights.format_name != self.format_name:
            raise ShapeError(f"weights: format {weights.format_name!r} is not the kernel's {self.format_name!r}")
        k, n = weights.shape
        act = _mx_dtype(self.activation)
        if isinstance(x, np.ndarray):
            x = mx.array(np.asarray(x, dtype=np.float32))
        if x.ndim != 2 or x.shape[1] != k:
            raise ShapeError(f"x: expected [M, {k}], got {tuple(x.shape)}")
        m = int(x.shape[0])
        if m < 1 or n < 1 or k < 1:
            raise ShapeError(f"empty problem M={m}, N={n}, K={k}")
        if x.dtype != act:
            x = x.astype(act)
        s = self.source
        launch = self._launches.get((m, n, k))
        if launch is None:  # once per problem size: the per-call path is lookups and one launch
            scalars = {"M": m, "N": n, "K": k}
            sizes = self.sizes(m, n, k)
            grid, threadgroup = s.launch_dims(scalars)
            cols = self.y_columns(n)
            shapes = [(m, cols[name]) if name in cols else (sizes[name],) for name in s.output_names]
            launch = self._launches[(m, n, k)] = (
                mx.array(s.dims(scalars)), sizes, grid, threadgroup, shapes,
                [_mx_dtype(s.elems[name]) for name in s.output_names])
        dims, sizes, grid, threadgroup, shapes, dtypes = launch
        inputs = []
        for name in s.input_names:
            if name == "x":
                inputs.append(x)
            elif name == "dims":
                inputs.append(dims)
            elif name in s.inout_inputs:
                inputs.append(state[name] if state and name in state
                              else self._zeroed(name, sizes[name], fresh_state))
            else:
                inputs.append(weights.arrays[name])
        outs = self.kernel(inputs=inputs, output_shapes=shapes, output_dtypes=dtypes, grid=grid,
                           threadgroup=threadgroup, init_value=float("nan") if poison else None,
                           verbose=verbose)
        if return_all:  # every output flat, as kernel_args.gemm_buffers lays them out
            return {name: out.reshape(-1) for name, out in zip(s.output_names, outs)}
        return self._y(outs)

    @property
    def y_names(self) -> list[str]:
        """The outputs that hold Y: y, or its parts y0, y1, ..."""
        return output_names(tuple(self.source.attrs.get("outputs", ())))

    def _y(self, outs: list) -> Any:
        """Y [M, N] from the kernel's outputs (the parts side by side)."""
        names = self.source.output_names
        parts = [outs[names.index(name)] for name in self.y_names]
        return parts[0] if len(parts) == 1 else _mx().concatenate(parts, axis=1)

    # ----- timing (the benchmark runner's `TimedKernel`) ---------------------------------------

    @property
    def weights_key(self) -> str:
        """Weight copies made for one kernel serve every kernel of the same physical layout."""
        return f"cuda/{self.source.attrs.get('weight_layout')}"

    def weight_copies(self, packed, count: int) -> list[CudaWeights]:
        """`count` device copies of the packed weight in this kernel's layout, evaluated."""
        copies = [self.weights(packed) for _ in range(count)]
        _mx().eval(*[a for c in copies for a in c.arrays.values()])
        return copies

    def launch_timed(self, copies: list[CudaWeights], x, m: int, n: int, k: int,
                     slots: int) -> Callable[[int], Any]:
        """launch(i): one launch on weight copy i, everything but the launch itself prepared
        here (dims, zeroed counters: one per launch slot of a batch of `slots`; the kernel
        leaves them zero and every batch is evaluated before the next is queued)."""
        mx = _mx()
        s = self.source
        scalars = {"M": m, "N": n, "K": k}
        sizes = self.sizes(m, n, k)
        dims = mx.array(s.dims(scalars))
        grid, threadgroup = s.launch_dims(scalars)
        pool = [{nm: mx.zeros((sizes[nm],), dtype=_mx_dtype(s.elems[nm])) for nm in s.inout_inputs}
                for _ in range(slots)]
        mx.eval(dims, *[a for st in pool for a in st.values()])
        shapes = [(sizes[nm],) for nm in s.output_names]
        dtypes = [_mx_dtype(s.elems[nm]) for nm in s.output_names]
        cols = self.y_columns(n)
        y_at = [s.output_names.index(nm) for nm in cols]
        widths = list(cols.values())
        kernel = self.kernel

        def launch(i: int):
            w, state = copies[i % len(copies)], pool[i % len(pool)]
            inputs = [x if nm == "x" else dims if nm == "dims" else state[nm] if nm in state else w.arrays[nm]
                      for nm in s.input_names]
            outs = kernel(inputs=inputs, output_shapes=shapes, output_dtypes=dtypes, grid=grid,
                          threadgroup=threadgroup, init_value=None)
            if len(y_at) == 1:
                return outs[y_at[0]].reshape(m, n)
            return [outs[at].reshape(m, w) for at, w in zip(y_at, widths)]  # the parts, as a layer takes them

        return launch

    def timed_call(self, copies: list[CudaWeights], x) -> Callable[[int], Any]:
        """call(i): the public call path on weight copy i (outputs not poisoned)."""
        return lambda i: self(copies[i % len(copies)], x, poison=False)


class CudaLaunch:
    """One printed kernel bound to MLX (`mlx_kernel`: `mx.fast.cuda_kernel` or precompiled; any
    kernel, not only GEMMs): called
    with the input arrays by name, the output shapes by name, the launch scalars and the fill
    value of the outputs; returns the outputs by name."""

    def __init__(self, kernel: Kernel, inout_inputs: tuple[str, ...] = (), path: str | None = None) -> None:
        self.source: CudaSource = print_cuda(kernel, inout_inputs=inout_inputs)
        s = self.source
        self.name = f"{s.name}_{s.digest[:12]}"
        self._kernel = mlx_kernel(s.compact(), self.name, path)

    def __call__(self, arrays: dict[str, Any], out_shapes: dict[str, tuple[int, ...]],
                 scalars: dict[str, int], init_value: float | None = None) -> dict[str, Any]:
        mx = _mx()
        s = self.source
        grid, threadgroup = s.launch_dims(scalars)
        inputs = [mx.array(s.dims(scalars)) if n == "dims" else arrays[n] for n in s.input_names]
        outs = self._kernel(inputs=inputs, output_shapes=[out_shapes[n] for n in s.output_names],
                            output_dtypes=[_mx_dtype(s.elems[n]) for n in s.output_names],
                            grid=grid, threadgroup=threadgroup, init_value=init_value)
        return dict(zip(s.output_names, outs))


def build_cuda_kernel(kernel: Kernel | CudaSource, name: str | None = None, path: str | None = None) -> CudaGemm:
    """A launcher for a lowered GEMM kernel (printed here with the counters as zeroed inputs)
    or for a `CudaSource` printed elsewhere; `path` forces a launch path (`mlx_kernel`)."""
    if isinstance(kernel, Kernel):
        source = print_cuda(kernel, inout_inputs=gemm_inout_inputs(kernel))
    else:
        source = kernel
    return CudaGemm(source, name, path)


def cuda_executor():
    """An executor for `kernel_check.check_kernel` (Kernel, numpy buffers as
    `kernel_args.gemm_buffers` makes them, scalars) -> numpy outputs, running on MLX's CUDA
    backend. Launchers are cached per kernel."""
    cache: dict[int, CudaGemm] = {}

    def execute(kernel: Kernel, buffers: dict[str, np.ndarray], scalars: dict[str, int]) -> dict[str, np.ndarray]:
        mx = _mx()
        gemm = cache.get(id(kernel))
        if gemm is None:
            gemm = cache[id(kernel)] = build_cuda_kernel(kernel)
        s = gemm.source
        m, n, k = (int(scalars[c]) for c in "MNK")
        weights = CudaWeights({name: mx.array(np.ascontiguousarray(buffers[name]))
                               for name in s.input_names if name not in ("x", "dims", *s.inout_inputs)},
                              (k, n))
        x = mx.array(buffers["x"].reshape(m, k).astype(np.float32))
        state = {name: mx.array(np.ascontiguousarray(buffers[name])) for name in s.inout_inputs}
        outs = gemm(weights, x, return_all=True, state=state)
        mx.eval(*outs.values())
        result = {}
        for name, arr in {**outs, **state}.items():  # state: read back what the kernel left
            a = np.array(arr.astype(mx.float32) if s.elems[name] == "bf16" else arr)
            result[name] = a.astype(buffers[name].dtype) if name in buffers else a
        return result

    return execute
