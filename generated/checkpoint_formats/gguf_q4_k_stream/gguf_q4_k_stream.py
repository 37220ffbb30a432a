"""MLX launcher for the marlin-dsl kernel gguf_q4_k_stream (generated; do not edit).

y[M, N] = x[M, K] @ W[K, N], W packed in format gguf_q4_k: pass the packed
arrays (qweight, scales, super_scales, mins, super_mins) as MLX arrays shaped as manifest.json says. Needs only MLX on an Apple GPU.
"""
from pathlib import Path

import mlx.core as mx

NAME = 'gguf_q4_k_stream'
INPUT_NAMES = ['x', 'qweight', 'scales', 'super_scales', 'mins', 'super_mins', 'dims']
OUTPUT_NAMES = ['y']
THREADS = 512
K_MULTIPLE = 256

_TEXT = (Path(__file__).resolve().parent / 'gguf_q4_k_stream.metal').read_text()
HEADER = _TEXT.split('// ---- marlin-dsl: header begin ----\n', 1)[1].split('// ---- marlin-dsl: header end ----\n', 1)[0]
BODY = _TEXT.split('// ---- marlin-dsl: body begin ----\n', 1)[1].split('// ---- marlin-dsl: body end ----\n', 1)[0]
_kernel = None


def threadgroups(M: int, N: int, K: int) -> tuple[int, int, int]:
    return (-(-N // 128), -(-M // 8), 1)


def output_specs(M: int, N: int, K: int) -> list[tuple[str, tuple[int, ...], mx.Dtype]]:
    return [
    ('y', (M * N,), mx.float16),
    ]


def kernel():
    global _kernel
    if _kernel is None:
        _kernel = mx.fast.metal_kernel(name=NAME, input_names=INPUT_NAMES, output_names=OUTPUT_NAMES,
                                       source=BODY, header=HEADER)
    return _kernel


def launch(x: mx.array, qweight, scales, super_scales, mins, super_mins) -> mx.array:
    """y = x @ W for x [M, K]; returns y [M, N] in x's dtype."""
    if x.ndim != 2:
        raise ValueError(f"x: expected [M, K], got shape {x.shape}")
    M, K = x.shape
    N = scales.shape[1]
    if K % K_MULTIPLE:
        raise ValueError(f"x: K={K} is not a multiple of {K_MULTIPLE}")
    gx, gy, gz = threadgroups(M, N, K)
    specs = output_specs(M, N, K)
    dims = mx.array([M, N, K], dtype=mx.uint32)
    outs = kernel()(inputs=[x, qweight, scales, super_scales, mins, super_mins, dims], grid=(gx * THREADS, gy, gz), threadgroup=(THREADS, 1, 1),
                    output_shapes=[shape for _, shape, _ in specs],
                    output_dtypes=[dtype for _, _, dtype in specs])
    return outs[OUTPUT_NAMES.index("y")].reshape(M, N)
