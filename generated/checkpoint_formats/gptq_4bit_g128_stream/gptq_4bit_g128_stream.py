"""MLX launcher for the marlin-dsl kernel gptq_4bit_g128_stream (generated; do not edit).

y[M, N] = x[M, K] @ W[K, N], W packed in format gptq_v1_4bit_g128: pass the packed
arrays (qweight, scales, zeros) as MLX arrays shaped as manifest.json says. Needs only MLX on an Apple GPU.
"""
from pathlib import Path

import mlx.core as mx

NAME = 'gptq_4bit_g128_stream'
INPUT_NAMES = ['x', 'qweight', 'scales', 'zeros', 'dims']
OUTPUT_NAMES = ['y']
THREADS = 512
K_MULTIPLE = 128

_TEXT = (Path(__file__).resolve().parent / 'gptq_4bit_g128_stream.metal').read_text()
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


def launch(x: mx.array, qweight, scales, zeros) -> mx.array:
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
    outs = kernel()(inputs=[x, qweight, scales, zeros, dims], grid=(gx * THREADS, gy, gz), threadgroup=(THREADS, 1, 1),
                    output_shapes=[shape for _, shape, _ in specs],
                    output_dtypes=[dtype for _, _, dtype in specs])
    return outs[OUTPUT_NAMES.index("y")].reshape(M, N)
