"""A kernel's `cuda_arch` attribute decides the architecture of its nvcc compile checks
(targets/cuda/nvcc.py): a kernel written for sm_90a (wgmma) is compiled with
`-gencode=arch=compute_90a,code=sm_90a` only, every other kernel for the architectures asked
for. Data, not a name branch: the printer copies the attribute into `CudaSource.attrs`."""
from __future__ import annotations

from dataclasses import replace

import pytest

import marlin_dsl as md
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.targets.cuda.nvcc import find_nvcc, gencode, kernel_archs, nvcc_check
from marlin_dsl.targets.cuda.printer import CudaSource, print_cuda

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc (the CUDA toolkit) is not installed")
#: Only the architecture-specific sm_90a target has this instruction.
WGMMA_FENCE = '  asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");\n'


def _source(arch: str | None) -> CudaSource:
    fmt = md.builtin_format("fp4")
    kernel = compile_gemm(md.Gemm("arch_fp4_m1", fmt, md.tuned_schedule(fmt, 1)), md.CUDA).kernel
    if arch is not None:
        kernel.attrs["cuda_arch"] = arch
    return print_cuda(kernel)


def test_the_attribute_chooses_the_architectures():
    assert gencode("sm_90a") == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert gencode("sm_80") == ["-gencode=arch=compute_80,code=sm_80"]
    with pytest.raises(ValueError, match="compute_90"):
        gencode("compute_90")
    plain, hopper = _source(None), _source("sm_90a")
    assert "cuda_arch" not in plain.attrs and hopper.attrs["cuda_arch"] == "sm_90a"
    assert kernel_archs(plain, ("sm_80", "sm_90")) == ("sm_80", "sm_90")
    assert kernel_archs(hopper, ("sm_80", "sm_90")) == ("sm_90a",)
    assert CudaSource.from_json(hopper.to_json()).attrs["cuda_arch"] == "sm_90a"  # manifests keep it


@needs_nvcc
def test_wgmma_kernel_is_checked_for_sm90a_only(tmp_path):
    hopper = _source("sm_90a")
    hopper = replace(hopper, name="arch_wgmma", body=WGMMA_FENCE + hopper.body)
    plain = _source(None)
    results = nvcc_check([hopper, plain], archs=("sm_80", "sm_90"), jobs=2, cache_dir=tmp_path)
    assert sorted((r.arch, tuple(r.names), r.ok) for r in results) == [
        ("sm_80", ("arch_fp4_m1",), True), ("sm_90", ("arch_fp4_m1",), True), ("sm_90a", ("arch_wgmma",), True)]
    # without the attribute the same text is compiled for plain sm_80 / sm_90, which have no wgmma
    unmarked = replace(hopper, attrs={k: v for k, v in hopper.attrs.items() if k != "cuda_arch"})
    failed = nvcc_check([unmarked], archs=("sm_90",), jobs=1, cache_dir=tmp_path)
    assert [r.ok for r in failed] == [False] and "wgmma" in failed[0].log
