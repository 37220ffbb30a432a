"""Executors for printed kernels off their target hardware (test harnesses)."""
from .metal_cpu import (
    CompiledMetal,
    MetalCPUError,
    compile_many,
    compile_metal,
    find_compiler,
    run_metal_cpu,
    shim_path,
)

__all__ = ["CompiledMetal", "MetalCPUError", "compile_many", "compile_metal", "find_compiler",
           "run_metal_cpu", "shim_path"]
