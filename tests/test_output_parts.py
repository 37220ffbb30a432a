"""`Gemm.outputs` through `marlin-dsl compile` on both targets: the verification table passes
(interpreter and the emitted text on the CPU harness), and the shipped Metal launcher module
returns the parts, run with a stand-in `mx.fast.metal_kernel` that executes the shipped text on
the Metal CPU harness (tests/metal_standin.py)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl.cli import main as cli_main
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.kernel_args import to_kernel_layout
from marlin_dsl.targets.metal.cpu_harness import find_compiler
from marlin_dsl.targets.metal.printer import print_metal

sys.path.insert(0, str(Path(__file__).resolve().parent))
from metal_standin import MetalStandIn  # noqa: E402

SPEC = '''from marlin_dsl import Gemm, builtin_format, tuned_schedule
fmt = builtin_format("fp4")
qkv = Gemm("fp4_qkv_parts", fmt, tuned_schedule(fmt, 1), "f16", outputs=(64, 16, 24))
'''
WIDTHS = (64, 16, 24)


@pytest.mark.parametrize("target", ["metal", "cuda"])
def test_compile_checks_and_ships_a_parts_kernel(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  target: str) -> None:
    spec = tmp_path / "parts.py"
    spec.write_text(SPEC)
    assert cli_main(["compile", str(spec), "--target", target, "-o", str(tmp_path / "out")]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("fp4_qkv_parts ")]
    assert len(row) == 1 and row[0].rstrip().endswith("PASS"), row  # interpreter and the text on the CPU


@pytest.mark.skipif(find_compiler() is None, reason="no C++ compiler (g++) for the Metal CPU harness")
def test_shipped_metal_launcher_returns_the_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tmp_path / "parts.py"
    spec.write_text(SPEC)
    assert cli_main(["compile", str(spec), "--no-check", "-o", str(tmp_path / "out")]) == 0
    folder = tmp_path / "out" / "parts" / "fp4_qkv_parts"
    module_spec = importlib.util.spec_from_file_location("fp4_qkv_parts_launcher", folder / "fp4_qkv_parts.py")
    launcher = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(launcher)  # type: ignore[union-attr]
    fmt = md.builtin_format("fp4")
    gemm = md.Gemm("fp4_qkv_parts", fmt, md.tuned_schedule(fmt, 1), "f16", outputs=WIDTHS)
    kernel = compile_gemm(gemm, md.METAL).kernel
    standin = MetalStandIn(lambda name: print_metal(kernel))
    monkeypatch.setattr(mx.fast, "metal_kernel", standin)
    rng = np.random.default_rng(3)
    packed = md.pack(fmt, rng.standard_normal((256, sum(WIDTHS))))
    arrays = to_kernel_layout(kernel.attrs, packed).arrays
    for m in (1, 3):
        x = rng.standard_normal((m, 256)).astype(np.float16)
        parts = launcher.launch(mx.array(x), *(mx.array(arrays[n]) for n in launcher.INPUT_NAMES[1:-1]))
        assert [tuple(p.shape) for p in parts] == [(m, w) for w in WIDTHS]
        got = np.concatenate([np.array(p.astype(mx.float32)) for p in parts], axis=1).astype(np.float64)
        want = md.reference_matmul(x.astype(np.float64), packed)
        assert not np.isnan(got).any()
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-3
