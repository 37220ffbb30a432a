"""The compact CUDA text that layers hand to MLX (targets/cuda/compact.py): the same tokens as
the readable text minus comments, nvcc compiles it (MLX's own translation-unit form) for every
pipeline, and the prelude keeps exactly what a kernel uses."""
from __future__ import annotations

import re

import mlx.core as mx
import pytest

import marlin_dsl as md
from marlin_dsl import CUDA, Gemm
from marlin_dsl.targets.cuda.printer import prelude, print_cuda
from marlin_dsl.targets.cuda.nvcc import find_nvcc, nvcc_check
from marlin_dsl.targets.cuda.compact import compact_cuda, trim_prelude
from marlin_dsl.targets.cuda.launch import gemm_inout_inputs
from marlin_dsl.targets.cuda.runtime import cuda_gemm, cuda_schedule
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.layers.interop import mlx_format
from marlin_dsl.schedule import default_schedule
from marlin_dsl.targets.cuda.tuning import multistage_schedule, tuned_schedule

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed here")

#: Tokens of C++ as far as these tests need: literals, identifiers and numbers, punctuation.
_TOKENS = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|[A-Za-z_]\w*|\d[\w.]*|==|!=|<=|>=|<<|>>|&&|\|\||::|->|\+\+|--|[^\s\w]')


def _tokens(text: str) -> list[str]:
    text = re.sub(r"//[^\n]*", "", text)  # the readable side's comments (none sit inside strings here)
    return _TOKENS.findall(text)


def _kernels() -> list:
    out = []
    for name in ("fp4", "uint4_zp", "nf4", "fp4_2of4", "fp4_blockpattern"):
        fmt = md.builtin_format(name)
        schedules = [default_schedule(fmt)]
        if fmt.sparsity is None or name == "fp4_2of4":
            schedules += [tuned_schedule(fmt, 1, CUDA, 4096, 4096), tuned_schedule(fmt, 16, CUDA, 4096, 1024),
                          multistage_schedule(fmt, 2048, CUDA, 4096, 4096)]
        for schedule in schedules:
            for act in ("f16", "bf16"):
                kernel = compile_gemm(Gemm(f"c_{name}_{schedule.name}_{act}", fmt, schedule, act), CUDA).kernel
                out.append(print_cuda(kernel, inout_inputs=gemm_inout_inputs(kernel)))
    # MLX's modes, as layers launch them (cuda_schedule per row count): code-table scales
    # (E8M0 / E4M3, with NaN entries that must be constant initialisers) and biases.
    for fmt in (mlx_format("mxfp4", 4, 32), mlx_format("nvfp4", 4, 16), mlx_format("mxfp8", 8, 32),
                mlx_format("affine", 4, 64, mx.float16), mlx_format("affine", 8, 32, mx.bfloat16)):
        for m in (1, 65, 2048):
            out.append(cuda_gemm(fmt, "f16", cuda_schedule(fmt, m, 4096, 4096)).source)
    return out


@pytest.fixture(scope="module")
def printed() -> list:
    return _kernels()


def test_compact_keeps_every_token_but_comments(printed) -> None:
    for src in printed:
        for text in (src.body, src.declarations, src.prelude):
            assert _tokens(compact_cuda(text)) == _tokens(text), src.name


def test_compact_is_much_shorter(printed) -> None:
    """Shorter everywhere; the decode kernels by more than a quarter (a third before their
    steps held two weight vectors: the longer body, bf16's scalar decode most, shrinks less
    than the prelude's comments; launches hand MLX an #include, not the text: launch_text.py)."""
    for src in printed:
        compact = src.compact()
        ratio = (len(compact.header) + len(compact.body)) / (len(src.header) + len(src.body))
        assert ratio < (0.75 if "stream_m8" in src.name else 0.85), (src.name, ratio)


def test_squeezing_keeps_operators_apart() -> None:
    text = "  a = b == c;  // note\n  d <= e; f != g; h = -i; j += k; y[i] = v; z <<= 2;\n  s = \"x = y // z\";\n"
    assert compact_cuda(text) == 'a=b == c;\nd <= e;f != g;h=-i;j += k;y[i]=v;z <<= 2;\ns="x = y // z";\n'


def test_prelude_keeps_what_a_kernel_uses_and_what_that_needs() -> None:
    trimmed = trim_prelude(prelude(), "mdsl::frag_c v = mdsl::mma(a, b, c);")
    assert "mma(" in trimmed and "struct frag_a" in trimmed and "struct frag_b{" in trimmed
    assert "cp_async" not in trimmed and "mma_sp" not in trimmed and "load_a" not in trimmed
    assert trimmed.count("#ifndef") == trimmed.count("#endif")


def test_tables_with_nan_are_constant_initialisers() -> None:
    """A `static __device__` table must be initialised by constants: neither NVRTC nor nvcc
    takes __uint_as_float there, and NVRTC has no __builtin_nanf (both found on the H100).
    The E8M0 scale table (code 255 is NaN) is printed as f32 bits, read with __uint_as_float."""
    fmt = mlx_format("mxfp4", 4, 32)
    src = cuda_gemm(fmt, "f16", cuda_schedule(fmt, 65, 4096, 4096)).source
    start = src.declarations.index("static __device__ const uint32_t tbl_scales")
    table = src.declarations[start: src.declarations.index("};", start)]
    assert "0x7fc00000u" in table and "(" not in table.split("=", 1)[1]
    assert "__uint_as_float(tbl_scales" in src.body


@pytest.mark.slow  # an nvcc/ptxas sweep: CI runs it (-m slow)
@needs_nvcc
def test_nvcc_compiles_the_compact_text_mlx_builds(printed) -> None:
    """MLX's own translation unit of the compact text, for sm_80 and sm_90."""
    results = nvcc_check([src.compact() for src in printed], archs=("sm_80", "sm_90"), jobs=2, form="mlx")
    failed = [r for r in results if not r.ok]
    assert not failed, "\n\n".join(f"{r.summary()}\n{r.log}" for r in failed)
