"""A fixed corpus of kernels over every pipeline, both targets, the built-in formats and the
activation kernels: their IR text after the passes and their printed source. The digests of
this corpus are committed (tests/data/kernel_digests.json); `test_kernel_digests.py` pins them,
so a restructure that claims "output unchanged" is checked on CUDA as well as on the Metal
files in generated/. After an intended change: `python tests/kernel_corpus.py --update`
(and say why in the commit)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import replace
import sys
from pathlib import Path
from typing import Iterator

DIGESTS = Path(__file__).parent / "data" / "kernel_digests.json"


def corpus() -> Iterator[tuple[str, str]]:
    """(name, text) for every kernel of the corpus; text = IR text + printed source."""
    from marlin_dsl.ir.text import print_kernel

    for name, target, kernel in kernels():
        yield name, print_kernel(kernel) + emit_source(target, kernel)


def kernels() -> Iterator[tuple[str, object, object]]:
    """(name, target, kernel) for every kernel of the corpus: the kernel after the passes,
    as it is printed (tests/test_harness_coverage.py reads its ops)."""
    from marlin_dsl.formats.activation_spec import SparsifySpec
    from marlin_dsl.compiler import compile_gemm
    from marlin_dsl.formats.builtin import BUILTIN_FORMATS, builtin_format
    from marlin_dsl.lowering.sparse_gemm import lower_sparse_gemm
    from marlin_dsl.lowering.sparsify import lower_sparsify
    from marlin_dsl.passes import DEFAULT_PIPELINE, PassManager
    from marlin_dsl.schedule import DoubleBuffered, Gemm, Schedule, StripedKParallel, WeightStream, default_schedule
    from marlin_dsl.errors import ScheduleError
    from marlin_dsl.targets.cuda.tuning import tuned_schedule, warpgroup_roles_schedule, warpgroup_schedule
    from marlin_dsl.source import suspended_declarations
    from marlin_dsl.machine import TARGETS

    with suspended_declarations():
        for fname in sorted(BUILTIN_FORMATS):
            fmt = builtin_format(fname)
            for act in ("f16", "bf16"):
                if act == "bf16" and fname not in ("fp4", "int4", "uint4_zp", "fp4_2of4"):
                    continue
                seeds = [Schedule("db", tile_k=max(32, fmt.k_granule), pipeline=DoubleBuffered()),
                         default_schedule(fmt),
                         Schedule("striped", tile_k=max(32, fmt.k_granule),
                                  pipeline=StripedKParallel(parallel=2, groups=8))]
                for tname in ("metal", "cuda"):
                    for s in seeds:
                        yield _gemm_kernel(compile_gemm, TARGETS[tname], Gemm(f"{fname}_{s.name}_{act}", fmt, s, act))
                if fname == "fp4_blockpattern":  # the weight stream that skips empty blocks
                    for tile_m, k_warps in ((8, 8), (16, 8)):
                        s = Schedule(f"skip_m{tile_m}", tile_m=tile_m, tile_n=32, tile_k=64, warps_m=1, warps_n=1,
                                     pipeline=WeightStream(k_warps=k_warps, depth=2, skip_empty=True))
                        yield _gemm_kernel(compile_gemm, TARGETS["cuda"], Gemm(f"{fname}_{s.name}_{act}", fmt, s, act))
                    continue
                for m, k, n in ((1, 4096, 4096), (16, 4096, 14336), (16, 14336, 4096), (32, 4096, 4096),
                                (64, 4096, 14336), (256, 4096, 4096), (2048, 4096, 4096)):
                    s = tuned_schedule(fmt, m, TARGETS["cuda"], k, n)
                    yield _gemm_kernel(compile_gemm, TARGETS["cuda"],
                                       Gemm(f"{fname}_{s.name}_m{m}_k{k}_n{n}_{act}", fmt, s, act))
                # the warpgroup pipeline (Hopper): both A sources where the format takes it
                for a_source in ("shared", "registers"):
                    try:
                        s = warpgroup_schedule(fmt, 2048, TARGETS["cuda"])
                    except ScheduleError:  # block patterns: no warpgroup kernel
                        break
                    s = replace(s, name=f"{s.name}_{a_source}", pipeline=replace(s.pipeline, a_source=a_source))
                    yield _gemm_kernel(compile_gemm, TARGETS["cuda"], Gemm(f"{fname}_{s.name}_{act}", fmt, s, act))
                try:  # with warp roles (dense formats)
                    s = warpgroup_roles_schedule(fmt, 2048, TARGETS["cuda"])
                except ScheduleError:
                    continue
                yield _gemm_kernel(compile_gemm, TARGETS["cuda"], Gemm(f"{fname}_{s.name}_{act}", fmt, s, act))
        # GGUF k-quants and Q4_0 (issue 36): groups shorter than a K vector, scaled per run of
        # the MMA's sums on CUDA, Q4_K's mins added through an MMA of ones
        from marlin_dsl.formats.checkpoint import gguf_format

        for type_name in ("Q4_0", "Q4_K", "Q6_K"):
            fmt = gguf_format(type_name).format
            for m in (1, 16):
                s = tuned_schedule(fmt, m, TARGETS["cuda"], 4096, 4096)
                yield _gemm_kernel(compile_gemm, TARGETS["cuda"], Gemm(f"{fmt.name}_{s.name}_m{m}_f16", fmt, s, "f16"))
        for tname in ("cuda", "metal"):
            for method in ("top2", "mvue", "soft_threshold"):
                for axis in (0, 1):
                    for relu2, stats in ((False, False), (True, True)):
                        spec = SparsifySpec(method, axis, "f16", relu2, stats)
                        kernel = lower_sparsify(spec, tname)
                        PassManager(list(DEFAULT_PIPELINE)).run(kernel)
                        yield f"sparsify_{tname}_{method}_{axis}_{relu2}_{stats}", TARGETS[tname], kernel
        for dtype in ("f16", "bf16"):
            kernel = lower_sparse_gemm(dtype, "cuda")
            PassManager(list(DEFAULT_PIPELINE)).run(kernel)
            yield f"sparse_gemm_cuda_{dtype}", TARGETS["cuda"], kernel
        for dtype in ("f16", "bf16"):  # Metal: the software scatter into the dense MMA (issue 16)
            kernel = lower_sparse_gemm(dtype, "metal")
            PassManager(list(DEFAULT_PIPELINE)).run(kernel)
            yield f"sparse_gemm_metal_{dtype}", TARGETS["metal"], kernel


def emit_source(target, kernel) -> str:
    """The printed text of `kernel` for `target` (header and body as the launcher ships them)."""
    from marlin_dsl.targets import emit  # the one emit function (issue 14)

    return emit(kernel, target).full_source()


def _gemm_kernel(compile_gemm, target, gemm) -> tuple[str, object, object]:
    return f"{gemm.name}@{target.name}", target, compile_gemm(gemm, target).kernel


def digests() -> dict[str, str]:
    return {name: hashlib.sha256(text.encode()).hexdigest()[:24] for name, text in corpus()}


if __name__ == "__main__":
    if "--dump" in sys.argv:  # write every text to a folder, for diffing two trees
        out = Path(sys.argv[sys.argv.index("--dump") + 1])
        out.mkdir(parents=True, exist_ok=True)
        for name, text in corpus():
            (out / f"{name}.txt").write_text(text)
    else:
        found = digests()
        if "--update" in sys.argv:
            DIGESTS.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
            print(f"wrote {len(found)} digests to {DIGESTS}")
        else:
            print(json.dumps(found, indent=1, sort_keys=True))
