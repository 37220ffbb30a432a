"""What the CPU harnesses execute covers what the printers print (issue 32).

A mutation audit printed CUDA's half2 `add` as `__hsub2` and no test failed: no kernel the CUDA
CPU harness ran emitted `__hadd2` (the MLX affine formats' f16 kernels do; they run now,
tests/test_cuda_cpu_mlx_formats.py, tests/test_metal_mlx_formats.py). This module keeps such a
gap from opening again. For each target it compiles (lowers, runs the passes, prints; no g++)
every kernel the harness test modules run, from their case lists (the full lists, not the
default run's covering subset), and collects the (op, types) pairs they contain: the op's
name with its result and operand types (`for`, `if`, `switch` and `yield`: one pair per type
they carry). Then:

(a) every op of the printer's `EMITTERS` table (its legal ops) occurs in an executed kernel,
    except the ops the harness cannot run by design (NOT_EXECUTED, each with its reason);
(b) every (op, types) pair of the kernel corpus (tests/kernel_corpus.py) and of the kernels the
    library compiles for the MLX formats (the tuned schedules at the corpus' problem sizes and
    the first-generation ones, f16 and bf16 activations) occurs in an executed kernel; kernels
    the harness refuses by design (`refuse_unsupported`: the sparse wgmma) are left out
    of (b), and the test checks that the harness does refuse each one it leaves out.

Lowering about 2400 kernels takes some 4.5 minutes on one core: the module is `slow` (CI runs it).
"""
from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Callable, Iterable, Iterator

import pytest

pytest.importorskip("mlx.core")

import marlin_dsl as md  # noqa: E402
from marlin_dsl import CUDA, METAL, Gemm  # noqa: E402
from marlin_dsl.compiler import compile_gemm  # noqa: E402
from marlin_dsl.ir import Kernel  # noqa: E402
from marlin_dsl.schedule import DoubleBuffered, Schedule, StripedKParallel, default_schedule  # noqa: E402
from marlin_dsl.targets.cuda.cpu_harness import CudaCPUError, refuse_unsupported  # noqa: E402
from marlin_dsl.targets.cuda.printer import _Printer as CudaPrinter, print_cuda  # noqa: E402
from marlin_dsl.targets.metal.printer import _Printer as MetalPrinter, print_metal  # noqa: E402
from marlin_dsl.targets.metal.runtime import RUNTIME  # noqa: E402

import kernel_corpus  # noqa: E402
from mlx_format_cases import ACTS, MLX_FORMATS  # noqa: E402
from test_harness_compare import compare_kernel  # noqa: E402

pytestmark = pytest.mark.slow

CONTROL = ("for", "if", "switch", "yield")

#: target -> {op: why no harness kernel executes it}. The CUDA harness runs the warpgroup
#: MMA and the warp roles' mbarriers (codegen/cuda_shim_wgmma.h); it refuses only the sparse
#: wgmma (targets/cuda/cpu_harness.py, `refuse_unsupported`), whose ops the dense kernels cover.
NOT_EXECUTED: dict[str, dict[str, str]] = {"cuda": {}, "metal": {}}


def op_types(kernel: Kernel) -> set[tuple[str, str]]:
    """The kernel's (op, types) pairs: `results <- operands` (`-` where there are no
    results), for structured control flow one pair per carried type."""
    out: set[tuple[str, str]] = set()
    for op in kernel.walk():
        if op.name in CONTROL:
            out |= {(op.name, str(v.type)) for v in (*op.results, *op.operands)} or {(op.name, "-")}
            continue
        results = ", ".join(str(v.type) for v in op.results) or "-"
        out.add((op.name, f"{results} <- {', '.join(str(v.type) for v in op.operands)}"))
    return out


# ----- the kernels each target's harness tests run --------------------------------------------

Source = Iterator[tuple[str, Callable[[], Kernel]]]


def _gemms(prefix: str, gemms: Iterable[tuple[str, Gemm]], target) -> Source:
    for name, gemm in gemms:
        yield f"{prefix}:{name}", lambda gemm=gemm: compile_gemm(gemm, target).kernel


def cuda_harness_kernels() -> Source:
    """(name, make kernel) for every kernel the CUDA CPU harness tests run."""
    import test_cuda_cpu_activation as act
    import test_cuda_cpu_harness as harness
    import test_cuda_cpu_mlx_formats as mlx
    from marlin_dsl.formats.activation_spec import SparsifySpec
    from marlin_dsl.ir import BF16, F16
    from marlin_dsl.lowering.sparse_gemm import lower_sparse_gemm
    from marlin_dsl.lowering.sparse_gemm_staged import LARGE, SMALL
    from marlin_dsl.lowering.sparsify import lower_sparsify

    yield from _gemms("test_cuda_cpu_harness", ((n, g) for n, (g, _) in harness.CASES.items()), CUDA)
    yield from (("test_cuda_cpu_mlx_formats:" + n, lambda n=n: mlx.case_kernel(n)) for n in mlx.CASES)
    for spec in act.SPECS:
        yield f"test_cuda_cpu_activation:{spec.name}", lambda spec=spec: lower_sparsify(spec, "cuda")
    for axis in (0, 1):  # test_gathering_sparsify_is_bit_exact
        spec = SparsifySpec("mvue" if axis == 0 else "top2", axis, "bf16", True, True)
        yield f"test_cuda_cpu_activation:gather_{axis}", lambda spec=spec: lower_sparsify(spec, "cuda", gather=True)
    for dtype in ("f16", "bf16"):
        for tiles in (LARGE, SMALL):
            yield (f"test_cuda_cpu_activation:sparse_gemm_{dtype}_{tiles.name}",
                   lambda d=dtype, t=tiles: lower_sparse_gemm(d, "cuda", t))
    for elem in ("f16", "bf16"):  # the probes of test_cuda_cpu_harness.py
        for b_from in ("build", "load"):
            yield f"test_cuda_cpu_harness:probe_{elem}_{b_from}", lambda e=elem, b=b_from: harness.probe.build_kernel(e, b)
    for elem in (F16, BF16):
        yield f"test_cuda_cpu_harness:dense_mma_{elem}", lambda e=elem: harness._dense_mma_kernel(e)
    for args in (("x",), ("s",), ("s", 0, False), ("x", 1)):
        yield f"test_cuda_cpu_harness:copy_{args}", lambda a=args: harness._copy_kernel(*a)
    yield "test_harness_compare:cuda", lambda: compare_kernel("cuda")
    yield from _epilogue_kernels(CUDA)


def metal_harness_kernels() -> Source:
    """(name, make kernel) for every kernel the Metal CPU harness tests run (the deliberately
    broken ones of test_metal_backend.py and its hand-written Metal left out)."""
    import test_metal_activation as activation
    import test_metal_backend as backend
    import test_metal_mlx_formats as mlx
    import test_metal_multistage as multistage
    import test_metal_sparse_gemm as sparse_gemm
    import test_metal_stream as stream
    import test_metal_stream_sparse as stream_sparse
    import test_metal_stream_widths as widths
    import test_sparsify_kernels as sparsify
    from marlin_dsl.lowering.sparse_gemm import lower_sparse_gemm
    from marlin_dsl.lowering.sparsify import lower_sparsify

    for name, recipe in backend._kernel_recipes().items():
        if not name.startswith(("broken", "hw_")):
            yield f"test_metal_backend:{name}", lambda recipe=recipe: recipe()[0]
    yield from (("test_metal_mlx_formats:" + n, lambda n=n: mlx.case_kernel(n)) for n in mlx.CASES)
    for module, cases in ((stream, stream._cases()), (stream_sparse, stream_sparse._cases()),
                          (multistage, multistage.CASES)):
        for case in cases:
            yield f"{module.__name__}:{case}", lambda m=module, c=case: m.case_kernel(*c)
    yield from _gemms("test_metal_stream_widths", ((str(c), widths.case_gemm(*c)) for c in widths.CASES), METAL)
    for spec in dict.fromkeys([*sparsify.METAL_SPECS, *activation.SPECS]):
        yield f"sparsify:{spec.name}", lambda spec=spec: lower_sparsify(spec, "metal")
    for dtype in sparse_gemm.DTYPES:
        yield f"test_metal_sparse_gemm:{dtype}", lambda d=dtype: lower_sparse_gemm(d, "metal")
    yield "test_harness_compare:metal", lambda: compare_kernel("metal")
    yield from _epilogue_kernels(METAL)


def _epilogue_kernels(target) -> Source:
    """test_epilogue.py's weight-stream kernels with a gated epilogue (exp2, recip) and with a
    bias and residual, run on each harness there."""
    import test_epilogue as epilogue
    from marlin_dsl.epilogue import Epilogue

    for ep in (Epilogue(gate="silu"), Epilogue(bias=True, gate="gelu_tanh", residual=True)):
        for act in ("f16", "bf16"):
            gemm = epilogue._gemm("fp4", act, ep, target)
            yield f"test_epilogue:{'+'.join(ep.steps)}_{act}", lambda g=gemm: compile_gemm(g, target).kernel


HARNESS = {"cuda": cuda_harness_kernels, "metal": metal_harness_kernels}
PRINT = {"cuda": print_cuda, "metal": print_metal}
EMITTERS = {"cuda": CudaPrinter.EMITTERS, "metal": MetalPrinter.EMITTERS}


def _collect(kernels: Source, target: str) -> dict[tuple[str, str], str]:
    """(op, types) -> the first kernel that has it; every kernel is printed (the printer
    takes it)."""
    found: dict[tuple[str, str], str] = {}
    for name, make in kernels:
        kernel = make()
        PRINT[target](kernel)
        for pair in op_types(kernel):
            found.setdefault(pair, name)
    return found


@lru_cache(maxsize=None)
def executed(target: str) -> dict[tuple[str, str], str]:
    return _collect(HARNESS[target](), target)


# ----- the kernels that must be covered ---------------------------------------------------------

def _refused_by_the_harness(kernel: Kernel) -> str | None:
    try:
        refuse_unsupported(print_cuda(kernel))
    except CudaCPUError as e:
        assert e.kind == "unsupported"
        return str(e)
    return None


@lru_cache(maxsize=None)
def _corpus() -> dict[str, tuple[dict[tuple[str, str], str], dict[str, str]]]:
    """target -> ((op, types) -> first corpus kernel having it, {left-out kernel: why})."""
    out: dict[str, tuple[dict, dict]] = {"cuda": ({}, {}), "metal": ({}, {})}
    for name, target, kernel in kernel_corpus.kernels():
        pairs, left_out = out[target.name]
        why = _refused_by_the_harness(kernel) if target.name == "cuda" else None
        if why is not None:
            left_out[name] = why
            continue
        for pair in op_types(kernel):
            pairs.setdefault(pair, name)
    return out


#: (m, k, n) of the corpus' tuned CUDA kernels (tests/kernel_corpus.py): 8-, 16- and 32-row
#: streams (with fewer warps splitting K where N > K), the multistage pipeline's tiles
CORPUS_SHAPES = ((1, 4096, 4096), (16, 4096, 14336), (16, 14336, 4096), (32, 4096, 4096),
                 (64, 4096, 14336), (256, 4096, 4096), (2048, 4096, 4096))


def _same(gemm: Gemm) -> tuple:
    """What makes two GEMMs the same kernel but for its name."""
    return gemm.format, dataclasses.replace(gemm.schedule, name=""), gemm.activation, gemm.outputs


def mlx_library_gemms(target: str) -> Iterator[tuple[str, Gemm]]:
    """The GEMMs the library compiles for the MLX formats on `target`: the tuned schedules
    (CUDA: at the corpus' problem sizes, no warpgroup; Metal: the runtime's at M = 1, 16, 32 and
    2048), the default schedule and the corpus' first-generation ones, f16 and bf16; but those
    the harness module of the MLX formats runs already."""
    import test_cuda_cpu_mlx_formats
    import test_metal_mlx_formats

    harness = {"cuda": test_cuda_cpu_mlx_formats, "metal": test_metal_mlx_formats}[target]
    seen = {_same(gemm) for gemm, _ in harness.CASES.values()}
    for f in MLX_FORMATS.values():
        fmt = f.fmt
        schedules = [default_schedule(fmt),
                     Schedule("db", tile_k=max(32, fmt.k_granule), pipeline=DoubleBuffered()),
                     Schedule("striped", tile_k=max(32, fmt.k_granule), pipeline=StripedKParallel(parallel=2, groups=8))]
        if target == "cuda":
            schedules += [md.tuned_schedule(fmt, m, CUDA, k, n) for m, k, n in CORPUS_SHAPES]
        else:
            schedules += [RUNTIME.tuned_schedule(fmt, m) for m in (1, 16, 32, 2048)]
        for s in schedules:
            for act in ACTS:
                gemm = Gemm(f"cov_{f.label}_{s.name}_{act}", fmt, s, act)
                if _same(gemm) not in seen:
                    seen.add(_same(gemm))
                    yield f"{f.label}_{s.name}_{act}", gemm


@lru_cache(maxsize=None)
def _mlx_library(target: str) -> dict[tuple[str, str], str]:
    return _collect(_gemms("mlx", mlx_library_gemms(target), {"cuda": CUDA, "metal": METAL}[target]), target)


# ----- the tests ---------------------------------------------------------------------------------

def _where(pairs: dict[tuple[str, str], str]) -> str:
    return "\n".join(f"  {op} {types}   (e.g. {name})" for (op, types), name in sorted(pairs.items()))


@pytest.mark.parametrize("target", ["cuda", "metal"])
def test_every_emitter_runs_on_the_harness(target: str) -> None:
    """(a): every legal op of the target's printer occurs in a kernel its harness executes,
    but those it cannot run by design; and those are legal ops that really are not executed
    (no stale exceptions)."""
    ops = {op for op, _ in executed(target)}
    exceptions = NOT_EXECUTED[target]
    assert set(exceptions) <= set(EMITTERS[target]), sorted(set(exceptions) - set(EMITTERS[target]))
    assert not set(exceptions) & ops, f"{target}: executed after all: {sorted(set(exceptions) & ops)}"
    missing = set(EMITTERS[target]) - ops - set(exceptions)
    assert not missing, f"{target}: printer ops no harness kernel executes: {sorted(missing)}"


@pytest.mark.parametrize("target", ["cuda", "metal"])
def test_every_op_type_of_the_corpus_runs_on_the_harness(target: str) -> None:
    """(b), the kernel corpus: every (op, types) pair of its kernels for the target occurs in
    a kernel the harness executes. Left out: the kernels the harness refuses (the sparse
    warpgroup kernels on CUDA), each checked to be refused."""
    pairs, left_out = _corpus()[target]
    assert all("wgmma.mma_async.sp" in why for why in left_out.values()), left_out
    assert all("warpgroup" in name for name in left_out), sorted(left_out)
    missing = {p: n for p, n in pairs.items() if p not in executed(target)}
    assert not missing, f"{target}: (op, types) of the corpus no harness kernel executes:\n{_where(missing)}"


@pytest.mark.parametrize("target", ["cuda", "metal"])
def test_every_op_type_of_the_mlx_formats_runs_on_the_harness(target: str) -> None:
    """(b), the MLX formats: every (op, types) pair of the kernels the library compiles for
    them occurs in a kernel the harness executes."""
    missing = {p: n for p, n in _mlx_library(target).items() if p not in executed(target)}
    assert not missing, f"{target}: (op, types) of MLX-format kernels no harness kernel executes:\n{_where(missing)}"


def test_the_half2_add_is_executed() -> None:
    """Issue 32's mutant: CUDA's `__hadd2` (an f16 pair `add`) is in an executed kernel."""
    assert ("add", "vec<f16, 2> <- vec<f16, 2>, vec<f16, 2>") in executed("cuda")


def test_no_tuned_mlx_schedule_is_a_warpgroup_one() -> None:
    """The MLX kernels of (b) are the harness's kind: no warpgroup schedule among them (the
    layers pick one only where asked, `tuned_schedule(..., warpgroup=True)`)."""
    for _, gemm in mlx_library_gemms("cuda"):
        assert gemm.schedule.pipeline.kind != "warpgroup", gemm.name
