"""Every example compiles; its IR round-trips after every stage; output is deterministic and
equals the committed generated/ folder byte for byte."""
from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

from marlin_dsl.cli import main
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.errors import ScheduleError
from marlin_dsl.ir.text import parse_kernel, print_kernel
from marlin_dsl.spec import load_spec
from marlin_dsl.machine import CUDA, METAL

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
GEMMS = [(spec_path, gemm) for spec_path in EXAMPLES for gemm in load_spec(spec_path).gemms]


def _round_trip(kernel, source: str) -> None:
    text = print_kernel(kernel)
    assert print_kernel(parse_kernel(text, source=source)) == text, source


@pytest.mark.sweep
@pytest.mark.parametrize("target", [METAL, CUDA], ids=lambda t: t.name)
@pytest.mark.parametrize("spec_path,gemm", GEMMS, ids=[g.name for _, g in GEMMS])
def test_compiled_ir_round_trips(spec_path: Path, gemm, target) -> None:
    """Every example Gemm compiles for every target its schedule declares (an example states
    what is true of it: a schedule only one target runs says `targets=`), and compile_gemm
    refuses the others."""
    if not gemm.schedule.runs_on(target):
        with pytest.raises(ScheduleError, match=rf"declares targets=.*not compiled for {target.name}"):
            compile_gemm(gemm, target)
        return
    kernel = compile_gemm(gemm, target).kernel
    _round_trip(kernel, f"{gemm.name}.{target.name}")


# Parsing is lark-bound (about 5,000 lines a second), so every intermediate stage is
# round-tripped for a dense and a sparse kernel rather than for all of them.
STAGED = [(p, g) for p, g in GEMMS if g.name in ("fp4_g128_fused", "fp4_2of4_g128_db")]


@pytest.mark.parametrize("spec_path,gemm", STAGED, ids=[g.name for _, g in STAGED])
def test_ir_round_trips_after_every_stage(spec_path: Path, gemm) -> None:
    stages: list[str] = []

    def dump(stage: str, kernel, notes: list[str]) -> None:
        _round_trip(kernel, f"{gemm.name}@{stage}")
        stages.append(stage)

    compile_gemm(gemm, METAL, dump=dump)
    assert stages == ["lower", "specialise", "unroll", "fold", "cse", "dce", "interleave"]


def test_every_example_declares_a_kernel() -> None:
    for spec_path in EXAMPLES:
        assert load_spec(spec_path).gemms, spec_path.name


def test_compilation_is_deterministic() -> None:
    """The same spec, loaded afresh, compiles to the same text (names, order, schedule)."""
    spec_path = ROOT / "examples" / "sparse_2of4.py"
    first = [print_kernel(compile_gemm(g, METAL).kernel) for g in load_spec(spec_path).gemms]
    again = [print_kernel(compile_gemm(g, METAL).kernel) for g in load_spec(spec_path).gemms]
    assert first == again


def test_generated_folder_matches_a_fresh_compile(tmp_path: Path) -> None:
    assert main(["compile", *map(str, EXAMPLES), "--no-check", "-o", str(tmp_path)]) == 0
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    committed = sorted(p.relative_to(ROOT / "generated") for p in (ROOT / "generated").rglob("*")
                       if p.is_file())
    assert fresh == committed, "regenerate with: marlin-dsl compile examples/*.py --no-check -o generated"
    match, mismatch, errors = filecmp.cmpfiles(tmp_path, ROOT / "generated", [str(p) for p in fresh], shallow=False)
    assert not mismatch and not errors, f"stale files in generated/: {mismatch + errors}"


def test_dump_ir_prints_the_requested_stage(capsys: pytest.CaptureFixture[str]) -> None:
    spec = str(ROOT / "examples" / "dense_fp4.py")
    assert main(["compile", spec, "--no-check", "--dump-ir", "unroll"]) == 0
    out = capsys.readouterr().out
    assert "after unroll ----" in out and "after lower ----" not in out
    assert out.count("kernel @") == len(load_spec(spec).gemms)
    # after unroll no constant-trip loop is left: the only for ops are the K loops
    assert main(["compile", spec, "--no-check", "--dump-ir", "all"]) == 0
    out = capsys.readouterr().out
    for stage in ("lower", "specialise", "unroll", "fold", "cse", "dce", "interleave"):
        assert f"after {stage} ----" in out
    assert "// interleave: kernel" in out


def test_stop_after_ends_the_pipeline(capsys: pytest.CaptureFixture[str]) -> None:
    spec = str(ROOT / "examples" / "block_pattern.py")
    assert main(["compile", spec, "--stop-after", "specialise", "--dump-ir", "all", "--no-check"]) == 0
    out = capsys.readouterr().out
    assert "after specialise ----" in out and "after unroll ----" not in out
    assert "switch" in out  # the block-pattern loops are dispatched on their count
    assert main(["compile", spec, "--stop-after", "nonsense"]) == 2
    assert "not in the pipeline" in capsys.readouterr().err


def test_schedule_errors_name_the_spec_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "bad_schedule.py"
    spec.write_text(
        "from marlin_dsl import Gemm, Schedule, builtin_format\n"
        "fmt = builtin_format('fp4_2of4')\n"
        "bad = Schedule('k16', tile_k=16)\n"
        "g = Gemm('g', fmt, bad)\n"
    )
    assert main(["compile", str(spec)]) == 3  # bad input
    err = capsys.readouterr().err
    assert f"{spec}:3:" in err and "tile_k=16" in err and "granule 32" in err
    spec.write_text(
        "from marlin_dsl import Gemm, Schedule, builtin_format\n"
        "fmt = builtin_format('fp4')\n"
        "\n"
        "big = Schedule('big', tile_m=128, tile_n=128, tile_k=32, warps_m=4, warps_n=2)\n"
        "g = Gemm('g', fmt, big)\n"
    )
    assert main(["compile", str(spec)]) == 3  # bad input
    err = capsys.readouterr().err
    assert f"{spec}:4:" in err and "threadgroup memory" in err and "32768" in err


def test_generated_launcher_drives_the_shipped_metal_text(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The vendored launcher (MLX only) run end to end on Linux: mx.fast.metal_kernel is
    replaced by a stand-in that compiles the header and body the launcher hands it, inside
    MLX's signature, with the CPU harness, and executes it on the launcher's arguments."""
    import importlib.util
    import json

    import mlx.core as mx
    import numpy as np

    from marlin_dsl import pack, reference_matmul
    from marlin_dsl.targets.metal.printer import print_metal
    from marlin_dsl.targets.metal.cpu_harness import compile_metal, find_compiler

    if find_compiler() is None:
        pytest.skip("no C++ compiler to run the Metal text on the CPU")
    spec = load_spec(ROOT / "examples" / "dense_fp4.py")
    gemm = next(g for g in spec.gemms if g.name == "fp4_g128_striped")
    folder = ROOT / "generated" / "dense_fp4" / gemm.name
    manifest = json.loads((folder / "manifest.json").read_text())
    calls = []

    def fake_metal_kernel(name, input_names, output_names, source: str, header: str):
        assert (name, input_names, output_names) == (manifest["kernel"]["name"],
                                                      [i["name"] for i in manifest["inputs"]],
                                                      [o["name"] for o in manifest["outputs"]])
        src = print_metal(compile_gemm(gemm, METAL).kernel)
        assert (header, source) == (src.header, src.body)  # exactly the text between the markers
        cpu = compile_metal(src, shipped_text=(folder / f"{gemm.name}.metal").read_text())

        def launch(inputs, grid, threadgroup, output_shapes, output_dtypes, init_value=None):
            calls.append((grid, threadgroup, init_value))
            buffers = {n: np.array(a) for n, a in zip(input_names, inputs)}
            dims = buffers.pop("dims")
            for n, shape, dtype in zip(output_names, output_shapes, output_dtypes):
                buffers[n] = np.zeros(shape, dtype=np.dtype(str(dtype).split(".")[-1]))
            scalars = dict(zip(("M", "N", "K"), (int(v) for v in dims)))
            groups = (grid[0] // threadgroup[0], grid[1], grid[2])
            out = cpu.run({k: v.ravel() for k, v in buffers.items()}, scalars, groups, threadgroup[0])
            return [mx.array(out[n]) for n in output_names]
        return launch

    monkeypatch.setattr(mx.fast, "metal_kernel", fake_metal_kernel)
    module_spec = importlib.util.spec_from_file_location("vendored_launcher", folder / f"{gemm.name}.py")
    launcher = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(launcher)
    rng = np.random.default_rng(7)
    m, k, n = 5, 256, 96
    packed = pack(gemm.format, rng.standard_normal((k, n)))
    x = rng.standard_normal((m, k)).astype(np.float16)
    y = launcher.launch(mx.array(x), mx.array(packed["qweight"]), mx.array(packed["scales"]))
    expected = reference_matmul(x.astype(np.float64), packed)
    rel = np.linalg.norm(np.array(y).astype(np.float64) - expected) / np.linalg.norm(expected)
    assert y.shape == (m, n) and rel < 2e-3
    # 16 threadgroups of 128 threads (the schedule's groups); striped: counters start at zero
    assert calls == [((16 * 128, 1, 1), (128, 1, 1), 0)]
    assert manifest["kernel"]["threadgroups"] == ["16", "1", "1"] and manifest["kernel"]["init_value"] == 0
